"""``LLMWorker``: the Ray Data ``map_batches`` callable that runs one LLM task over documents.

Use it with ``batch_format="pyarrow"`` and an actor pool, e.g.::

    ds.map_batches(LLMWorker, fn_constructor_kwargs={"config": config},
                   batch_format="pyarrow", batch_size=64,
                   compute=ray.data.ActorPoolStrategy(size=1), num_gpus=1)

The model loads once per actor in ``__init__``; nothing loads at import or on the driver.
Every input row comes out once, in order: rows already in error pass through untouched,
per-item failures become error rows, and only engine failures (the model cannot load,
CUDA out of memory at load) and a task whose reply cap leaves a document no room in the
model's context (``NoRoomForDocuments``, at load) raise.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from overnight.schemas.errors import ErrorCode
from overnight.schemas.stages import LLM_OUTPUT
from overnight.schemas.tables import STATUS_FIELDS
from overnight.workers.devices import worker_id
from overnight.workers.llm.adapter import BackendConfigError, LLMBackend, load_backend
from overnight.workers.llm.engine_options import EngineOptions
from overnight.workers.llm.tasks.run import reply_room_problem, run_task, scaffolding_tokens
from overnight.workers.llm.tasks.spec import STATUS_ERROR, NoRoomForDocuments, TaskInput, TaskSpec

# Columns this worker writes (typed as in schemas.DOCUMENT_RESULTS) and the status it sets.
OUTPUT_FIELDS = tuple(LLM_OUTPUT)
_STATUS_FIELDS = tuple(STATUS_FIELDS)
# Never offered to prompt templates as metadata.
_NOT_METADATA = frozenset(
    {"text", "metadata", "segments"}
    | {f.name for f in OUTPUT_FIELDS}
    | {f.name for f in _STATUS_FIELDS}
)


@dataclass(frozen=True)
class LLMWorkerConfig:
    """Everything an LLM actor needs; immutable and picklable.

    task: what to do with each document (see ``workers.llm.tasks``).
    engine: which engine runs which model, and how (``EngineOptions``, the spec's own
    fields; ``auto`` backend: vllm where it is installed, else ctranslate2).
    model_path: a local copy of the hub model ``engine.model`` (fetched on the driver), used
    where this node sees it; ``engine.model`` stays the provenance recorded on rows.
    cpu_threads: the model's threads on CPU, either engine (0: its default).
    max_new_tokens: overrides the task's cap on generated tokens per call.

    What the worker holds and is priced at (``llm_resource``, ``llm_units``) is the job
    runner's to write (``jobs.run.stage``), as it is for every stage; the worker writes ``llm_s``,
    each document's share of its model batches by tokens, finer than the runner can time.
    """

    task: TaskSpec
    engine: EngineOptions = dataclasses.field(default_factory=EngineOptions)
    model_path: str | None = None
    cpu_threads: int = 0
    max_new_tokens: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.task, TaskSpec):
            raise BackendConfigError(f"task={self.task!r}: must be a TaskSpec")
        if not isinstance(self.engine, EngineOptions):
            raise BackendConfigError(f"engine={self.engine!r}: must be an EngineOptions")
        if type(self.engine) is not EngineOptions:  # the spec's whole section: keep the engine's
            object.__setattr__(self, "engine", self.engine.engine_only())
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise BackendConfigError(f"max_new_tokens={self.max_new_tokens}: must be >= 1")

    @property
    def effective_task(self) -> TaskSpec:
        if self.max_new_tokens is None:
            return self.task
        values = {k: getattr(self.task, k) for k in self.task.__dataclass_fields__}
        values["max_new_tokens"] = self.max_new_tokens
        return TaskSpec(**values)

    def options(self) -> dict[str, Any]:
        """The effective options, as JSON-ready data, for the rows' ``options`` column."""
        # Flat, as the rows have always recorded it: the engine's fields beside the worker's.
        data: dict[str, Any] = self.engine.model_dump()
        data.update(
            (f.name, getattr(self, f.name)) for f in dataclasses.fields(self) if f.name != "engine"
        )
        data["task"] = self.effective_task.options()
        return data


class LLMWorker:
    """Adds the LLM task's result columns to a batch of document rows (see module doc)."""

    def __init__(self, config: LLMWorkerConfig) -> None:
        self.config = config
        self.task = config.effective_task
        # EngineOptions' fields are load_backend's keywords, by name.
        self.backend: LLMBackend = load_backend(
            **config.engine.model_dump(),
            cpu_threads=config.cpu_threads,
            model_path=config.model_path,
        )
        self.worker_id = worker_id()
        self.model = f"{self.backend.name}:{self.backend.model_id}"
        # A reply cap that leaves a document no room in the context failed every document
        # with context_exceeded, each row counted done until --retry-errors: refused at load,
        # before any document. The job checks the cap before it starts where the model's
        # files tell the context; here the prompt's own tokens count too.
        problem = reply_room_problem(
            self.task, self.backend.context_length, scaffolding_tokens(self.backend, self.task)
        )
        if problem is not None:
            self.close()
            raise NoRoomForDocuments(problem)

    def close(self) -> None:
        """Stop the engine (vLLM's engine process) now rather than when the process dies."""
        close = getattr(getattr(self, "backend", None), "close", None)
        if callable(close):
            close()

    def __del__(self) -> None:  # Ray Data drops its UDF instance when the actor pool ends
        # The interpreter may be shutting down: then the engine dies with the process.
        with contextlib.suppress(Exception):
            self.close()

    def __call__(self, batch: pa.Table) -> pa.Table:
        if not isinstance(batch, pa.Table):
            raise TypeError(
                f"LLMWorker takes pyarrow tables (map_batches(..., batch_format='pyarrow')), "
                f"got {type(batch).__name__}"
            )
        rows = batch.num_rows
        names = set(batch.column_names)
        for required in ("item_id", "text", "status"):
            if required not in names:
                raise KeyError(f"LLMWorker input lacks the column {required!r}")
        item_ids = batch.column("item_id").to_pylist()
        texts = batch.column("text").to_pylist()
        status = batch.column("status").to_pylist()
        error_code = _column(batch, "error_code", rows)
        error_message = _column(batch, "error_message", rows)
        metadata = _metadata(batch)

        inputs: list[TaskInput] = []
        positions: list[int] = []
        for i in range(rows):
            if status[i] == STATUS_ERROR:
                continue
            if texts[i] is None:
                status[i] = STATUS_ERROR
                error_code[i] = ErrorCode.INVALID_INPUT.value
                error_message[i] = "no document text for an item not marked as failed"
                continue
            inputs.append(TaskInput(str(item_ids[i]), texts[i], metadata[i]))
            positions.append(i)

        out: dict[str, list[Any]] = {f.name: [None] * rows for f in OUTPUT_FIELDS}
        results = run_task(self.backend, self.task, inputs)
        for i, result in zip(positions, results, strict=True):
            out["task"][i] = self.task.task_name
            out["model"][i] = self.model
            out["worker"][i] = self.worker_id
            out["input_tokens"][i] = result.input_tokens
            out["output_tokens"][i] = result.output_tokens
            out["num_chunks"][i] = result.num_chunks
            out["llm_s"][i] = result.llm_s
            out["output_text"][i] = result.output_text
            out["output_json"][i] = result.output_json
            out["label"][i] = result.label
            out["label_score"][i] = result.label_score
            status[i] = result.status
            if result.status == STATUS_ERROR:
                error_code[i] = result.error_code
                error_message[i] = result.error_message

        table = batch
        for field, values in (
            *zip(_STATUS_FIELDS, (status, error_code, error_message), strict=True),
            *((f, out[f.name]) for f in OUTPUT_FIELDS),
        ):
            table = _put(table, field, pa.array(values, type=field.type))
        if table.num_rows != rows:
            raise RuntimeError("LLMWorker changed the number of rows: this is a bug")
        return table


def _column(batch: pa.Table, name: str, rows: int) -> list[Any]:
    return batch.column(name).to_pylist() if name in batch.column_names else [None] * rows


def _put(table: pa.Table, field: pa.Field, values: pa.Array) -> pa.Table:
    if field.name in table.column_names:
        return table.set_column(table.column_names.index(field.name), field, values)
    return table.append_column(field, values)


def _metadata(batch: pa.Table) -> list[dict[str, str]]:
    """Per row, the values prompt templates may use: scalar columns (tenant, source_uri,
    ...) and the entries of the ``metadata`` map column; columns win over map entries."""
    rows = batch.num_rows
    result: list[dict[str, str]] = [{} for _ in range(rows)]
    if "metadata" in batch.column_names:
        for i, entries in enumerate(batch.column("metadata").to_pylist()):
            for key, value in entries or []:
                if value is not None:
                    result[i][str(key)] = str(value)
    for field in batch.schema:
        if field.name in _NOT_METADATA:
            continue
        kind = field.type
        if not (
            pa.types.is_string(kind)
            or pa.types.is_large_string(kind)
            or pa.types.is_integer(kind)
            or pa.types.is_floating(kind)
            or pa.types.is_boolean(kind)
        ):
            continue
        for i, value in enumerate(batch.column(field.name).to_pylist()):
            if value is not None:
                result[i][field.name] = str(value)
    return result


def options_json(config: LLMWorkerConfig) -> str:
    """``config.options()`` as compact JSON (for the ``options`` provenance column)."""
    return json.dumps(config.options(), sort_keys=True, default=str)
