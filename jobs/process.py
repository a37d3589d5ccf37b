"""The document job, for the runner (``jobs.run.runner``): documents or transcripts →
text → LLM actors → OUTPUT/results, costs, summary.

    manifest blocks (recorded in OUTPUT/_manifests/)    documents, or transcript rows
      → documents.fetch_and_extract                      CPU tasks: bytes → text
                                                         (``schemas.stages.DOC_INPUT``)
      → LLMWorker, actor pool                            one engine per actor; each call
                                                         committed as one Parquet file

Each result row is one (document, task); its ``item_id`` hashes the source item id and the
task, so several tasks over the same documents, reruns and resumes never collide. Tasks are
built by their registry (``workers.llm.tasks.registry.TASKS``). Each task is a run of its own; the
documents of a job of several tasks are fetched and extracted once, for all of them
(``extract_once``).

A chained job (``kind = "chain"``) transcribes first, then runs each task over the
transcripts just written: the dialogue of each call is the document.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow as pa

from overnight.jobs import documents, preflight
from overnight.jobs.accounting.ledger import Cost
from overnight.jobs.dataset import commits, storage
from overnight.jobs.dataset.manifest import Selection, select_items
from overnight.jobs.errors import ConfigError
from overnight.jobs.run import console, on_ray, runner, sizing
from overnight.jobs.run.job import Build, Job, Prepared, Resolved, model_resource
from overnight.jobs.run.stage import Stage
from overnight.jobs.spec import JobSpec, ProcessOptions
from overnight.schemas import DOCUMENT_RESULTS
from overnight.schemas.errors import ErrorCode
from overnight.schemas.stages import DOC_INPUT, LLM_OUTPUT
from overnight.workers.llm.adapter import EngineUnavailable, known_context_length
from overnight.workers.llm.tasks.registry import TaskParams, build_task
from overnight.workers.llm.tasks.run import reply_room_problem
from overnight.workers.llm.tasks.spec import NoRoomForDocuments, TaskSpec, TaskSpecError
from overnight.workers.llm.worker import LLMWorker, LLMWorkerConfig
from overnight.workers.text import DOCUMENT_EXTENSIONS

_SLIM = [
    "item_id",
    "status",
    "error_code",
    "input_tokens",
    "output_tokens",
    "llm_s",
    "llm_resource",
    "llm_units",
]


def read_schema(value: dict | str, what: str) -> dict:
    """The JSON schema ``value`` gives: itself, its JSON text, or the file it names (read
    here, also by ``overnight submit``, which ships the schema inside the job file)."""
    if isinstance(value, dict):
        return value
    try:
        data = (
            json.loads(Path(value).read_text())
            if not value.lstrip().startswith("{")
            else json.loads(value)
        )
    except OSError as exc:
        raise ConfigError(
            f"process.{what}: cannot read the JSON schema file {value!r} ({exc.strerror or exc})"
        ) from None
    except ValueError as exc:
        raise ConfigError(
            f"process.{what}: cannot read a JSON schema from {value!r}: {exc}"
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(f"process.{what}: the JSON schema must be an object")
    return data


def read_template(template: str | None) -> str | None:
    """The prompt template ``[process] prompt`` gives: the text of the file it names, or
    itself (also read by ``overnight submit``, which ships it inside the job file)."""
    if template and "{" not in template and not os.path.isfile(template):
        # No field, so it cannot be the template: it names a file that is not there (it was
        # taken as the template's text and refused as "must contain the {text} field").
        what = "a folder" if os.path.isdir(template) else "no file"
        raise ConfigError(
            f"process.prompt: {template!r} is {what}; give a template file (UTF-8 text with "
            "{text} where the document goes) or the template itself"
        )
    if template and os.path.isfile(template):
        try:
            template = Path(template).read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"process.prompt: the template file {template!r} is not UTF-8 text (byte "
                f"{exc.start}); save it as UTF-8"
            ) from None
        except OSError as exc:
            raise ConfigError(
                f"process.prompt: cannot read the template file {template!r}: {exc.strerror}"
            ) from None
    return template


def task_spec(name: str, opts: ProcessOptions) -> TaskSpec:
    """Build one validated task from the job's [process] section (files read here)."""
    template = read_template(opts.prompt)
    params = TaskParams(
        max_new_tokens=opts.max_new_tokens,
        instructions=opts.instructions,
        # Unset, each task keeps its own length (call_summary 80 words, summarize 100).
        summary_words=opts.summary_words if "summary_words" in opts.model_fields_set else None,
        json_schema=None if opts.schema_ is None else read_schema(opts.schema_, "schema"),
        labels=tuple(opts.labels),
        template=template,
        required_phrases=tuple(opts.required_phrases),
    )
    try:
        return build_task(name, params)
    except TaskSpecError as exc:
        raise ConfigError(f"process.{exc}") from None


class _TaskRows:
    """LLMWorker whose rows all name their task and model, also those failed upstream
    (extraction, transcription): a results row always says what it was for."""

    def __init__(self, config: LLMWorkerConfig):
        try:
            self.worker = LLMWorker(config)
        except NoRoomForDocuments as exc:
            # A setting, not the model: exit 2 as the driver's own check says it
            # (``check_reply_room``); the runner rebuilds our error from the actor's traceback.
            raise ConfigError(f"process.{exc}") from None

    def __call__(self, batch: pa.Table) -> pa.Table:
        out = self.worker(batch)
        for name, value in (("task", self.worker.task.task_name), ("model", self.worker.model)):
            column = pa.array([value] * out.num_rows, pa.string())
            out = out.set_column(out.column_names.index(name), name, column)
        return out


# The spec's names for the pool fields that jobs.run.sizing fills.
POOL_NAMES = {"task_cpus": "extract_cpus", "threads": "cpu_threads"}


def llm_pool(opts: ProcessOptions, device: str, nodes: list[sizing.Node]) -> sizing.Pool:
    # One engine per actor: it batches on its own.
    return sizing.size_job_pool(
        opts, device, nodes, task_cpus=opts.extract_cpus, model_workers=1, names=POOL_NAMES
    )


def _worker_config(
    opts: ProcessOptions, task: TaskSpec, device: str, pool: sizing.Pool
) -> LLMWorkerConfig:
    return LLMWorkerConfig(
        task=task,
        # The device the job resolved for the cluster, not the spec's "auto".
        engine=opts.engine_only().model_copy(update={"device": device}),
        cpu_threads=pool.threads if device == "cpu" else 0,
    )


def run_process(spec: JobSpec, *, input_url: str | None = None) -> dict[str, Any]:
    """Run every task of ``[process]`` over the input; one summary, or one per task."""
    jobs = process_jobs(spec, input_url or spec.job.input)
    prepared = [job.prepare(dry=False) for job in jobs]
    extract_once(spec, jobs, prepared)
    stages = [runner.run(job, ready) for job, ready in zip(jobs, prepared, strict=True)]
    if len(stages) == 1:
        return stages[0]
    return {"run_id": spec.run_id, "kind": "process", "stages": stages}


def process_jobs(spec: JobSpec, input_url: str) -> list[ProcessJob]:
    """A job per task of ``[process]``, every task refused before any work if one is bad;
    the output and the LLM are checked once for all of them."""
    for name in spec.process.tasks:
        task_spec(name, spec.process)
    checked = functools.cache(lambda dry: check_process(spec, dry=dry))
    return [ProcessJob(spec, name, input_url, check=checked) for name in spec.process.tasks]


def check_process(spec: JobSpec, *, dry: bool = False) -> str | None:
    """Before Ray starts: the output can be written and the LLM can be had; returns the
    local copy of a hub model the driver fetched for the actors (``jobs.preflight``).
    ``dry`` (``--dry-run``): checked as on a cluster (the cache, else the hub's metadata),
    never downloaded."""
    preflight.check_output(spec.job.output)
    model_path = preflight.llm_model(
        spec.process.backend,
        spec.process.model,
        download=not dry and on_ray.local_run(spec.job.ray_address),
        progress=spec.job.progress,
        device=spec.process.device,
    )
    check_reply_room(spec.process, model_path)
    return model_path


def check_reply_room(opts: ProcessOptions, model_path: str | None) -> None:
    """Each task's reply cap leaves a document room in the model's context, where the
    model's files on this machine tell the context (``known_context_length``); else each
    actor checks it at load, before any document, with the prompt's own tokens too. A cap
    of 100,000 tokens on an 8,192-token model made every document a context_exceeded row,
    each counted done until --retry-errors."""
    engine = opts.engine_only()
    asked = _asked_max_model_len(opts)
    if asked is not None:
        own = _vllm_own_context(opts, model_path)
        if own is not None and asked > own:
            # vLLM refused it at load, after Ray and the actor had started: exit 5, blaming
            # the model's files.
            raise ConfigError(
                f"process.max_model_len: {asked} exceeds the model's {own}-token context; "
                f"lower it to {own} or less, or leave it out to take the model's own"
            )
    context = known_context_length(**engine.model_dump(), model_path=model_path)
    if context is None:
        return
    setting = f"max_model_len = {asked}" if asked is not None else ""
    for name in opts.tasks:
        problem = reply_room_problem(task_spec(name, opts), context, context_setting=setting)
        if problem is not None:
            raise ConfigError(f"process.{problem}")


def _asked_max_model_len(opts: ProcessOptions) -> int | None:
    """The context the job asks of vLLM (``max_model_len``, or in ``engine_kwargs``)."""
    if opts.backend != "vllm":
        return None
    engine = opts.engine_only()
    asked = (engine.engine_kwargs or {}).get("max_model_len", engine.max_model_len)
    try:
        return None if asked is None else int(asked)
    except (TypeError, ValueError):
        return None  # vLLM's load says what is wrong with it


def _vllm_own_context(opts: ProcessOptions, model_path: str | None) -> int | None:
    """The vLLM model's own context where its files on this machine tell it; None for the
    default model before the device is known, or a hub model not fetched here."""
    from overnight.workers.llm import prepare, vllm_backend
    from overnight.workers.llm.contract import DEFAULT_VLLM_MODEL

    model = opts.model
    if model is not None and model_path is not None and os.path.isdir(model_path):
        model = model_path
    if model is None:
        if opts.device == "auto":
            return None
        model = str(prepare.smollm2_gguf_path()) if opts.device == "cpu" else DEFAULT_VLLM_MODEL
    try:
        return vllm_backend.own_context_length(model)
    except Exception:  # an unreadable model: its load says what is wrong, in its own words
        return None


# What the extract stage adds to a document's row: the same for every task over it.
_EXTRACTED = (
    "text",
    "status",
    "error_code",
    "error_message",
    "fetch_s",
    "extract_s",
    "extract_resource",
    "document_chars",
)


def extract_once(spec: JobSpec, jobs: list[ProcessJob], prepared: list[ProcessPrepared]) -> None:
    """Fetch and extract each document that any task still has to do once, for all of them.

    Each task stays a run of its own (its rows, manifest, ledger and summary, one row per
    document); its records of these documents then carry their text or their error, as a
    chained task's records carry the transcript's, and its extract stage passes them
    through. Without this every task fetched and extracted every document again. The time
    is priced once, on the rows of the first task that does the document; the other tasks'
    rows fetched nothing and say 0 s. The texts wait on the driver until the last task has
    run, as a chained job's transcripts do. With one task nothing is shared: its extract
    stage feeds the LLM as documents are read, instead of all of them first. A record the
    run's own subtraction finds pending beyond these is still extracted by its extract stage.
    """
    if len(jobs) < 2:
        return
    output = storage.resolve(spec.job.output)
    limit = spec.job.max_items
    # The records each run will do, as the runner subtracts them: the same dicts as
    # prepared.records, so what is filled in here is what the run's manifest gets.
    pending = []
    for job, ready in zip(jobs, prepared, strict=True):
        todo, _ = runner.left_to_do(job, ready, commits.CommittedDataset(output.join(job.dataset)))
        todo = todo if limit is None else todo[:limit]
        pending.append([r for r in todo if r["status"] is None])  # not yet read
    documents_to_read: dict[str, dict[str, Any]] = {}
    for records in pending:
        for record in records:
            documents_to_read.setdefault(record["source_item_id"], record)
    if not documents_to_read:
        return
    if spec.job.progress:
        console.event(
            "extract_once",
            f"reading {len(documents_to_read)} documents once for the {len(jobs)} tasks",
            documents=len(documents_to_read),
            tasks=len(jobs),
        )
    rows = runner.run_task_stages(jobs[0], prepared[0], list(documents_to_read.values()))
    read = {row["source_item_id"]: row for row in rows}
    priced: set[str] = set()
    for records in pending:
        for record in records:
            source = record["source_item_id"]
            record.update({name: read[source][name] for name in _EXTRACTED})
            if source in priced:
                record.update(fetch_s=0.0, extract_s=0.0)
            priced.add(source)


def extract_stage(opts: ProcessOptions, pool: sizing.Pool) -> Stage:
    """``documents.fetch_and_extract`` as CPU tasks: each document's own fetch and
    extraction (in a child process of its own) timed and priced."""
    return Stage(
        "extract",
        documents.fetch_and_extract,
        consumes=DOC_INPUT,
        produces=DOC_INPUT,
        kwargs={
            "options": documents.text_options(opts),
            "max_bytes": int(opts.max_file_mb * 2**20),
            "storage_config": storage.StorageConfig.from_env(),
        },
        num_cpus=pool.task_cpus,
        cost=Cost("extract", "extract", timed_by_worker=True, parts=("fetch",), bought=None),
    )


def llm_stage(job: ProcessJob, config: LLMWorkerConfig, at: Resolved) -> Stage:
    """The LLM actor pool, one engine per actor; a call is one manifest block (see
    ``ProcessJob.rows_per_block``)."""
    pool = at.pool
    return Stage.on_pool(
        "llm",
        _TaskRows,
        pool,
        consumes=DOC_INPUT,
        produces=pa.schema([*DOC_INPUT, *LLM_OUTPUT]),
        kwargs={"config": config},
        accelerator_type=job.opts.accelerator_type,
        calls_per_actor=job.calls_per_actor,
        rows_per_call=None,
        cost=Cost(
            "generate",
            "llm",
            resource=model_resource(job.opts.resource, at.device),
            units=(pool.gpus_per_actor or 1.0) if at.device == "cuda" else pool.cpus_per_actor,
            timed_by_worker=True,  # a model batch's time, shared by its documents' tokens
            bought="tokens",
        ),
    )


@dataclass(kw_only=True)
class ProcessPrepared(Prepared):
    task: TaskSpec
    input_kind: str  # documents | transcripts
    model_path: str | None  # the driver's local copy of a hub model, for the actors


class ProcessJob(Job[ProcessPrepared]):
    """One task over documents or transcripts: extract tasks, then the LLM actor pool."""

    kind = "process"
    dataset = "results"
    schema = DOCUMENT_RESULTS
    slim = _SLIM
    manifest_schema = DOC_INPUT
    load_errors = (EngineUnavailable,)
    pacing_options = frozenset(
        {
            "device",
            "max_batch_size",
            "max_num_seqs",
            "max_num_batched_tokens",
            "gpu_memory_utilization",
            "extract_cpus",
            "extract_timeout_s",
            "extract_memory_mb",
            "items_per_call",
            "calls_per_actor",
            "accelerator_type",
            "resource",
        }
    )

    def __init__(
        self,
        spec: JobSpec,
        task_name: str,
        input_url: str | None = None,
        *,
        check: Callable[[bool], str | None] | None = None,
    ):
        single = len(spec.process.tasks) == 1 and spec.job.kind == "process"
        super().__init__(spec, run_id=spec.run_id if single else f"{spec.run_id}-{task_name}")
        self.opts, self.task_name = spec.process, task_name
        self.input_url = input_url or spec.job.input
        # The output and the LLM checked (``check_process``): once for all the job's tasks.
        self.check = check or (lambda dry: check_process(spec, dry=dry))
        self.device = self.opts.device
        self.items_per_call, self.calls_per_actor = self.opts.call_shape
        # One call per Ray task, a task being one manifest block (the LLM stage takes whole
        # blocks). A task runs its batches one after another: blocks of 8, or a batch_size
        # with which Ray Data bundled a 3-row block into the next 4-row one, made a task two
        # calls in a row, the second call's short documents behind the first call's long
        # one (120 s later on 10 short documents and a 30-page one).
        self.rows_per_block = max(1, min(8, self.items_per_call))

    def prepare(self, dry: bool) -> ProcessPrepared:
        model_path = self.check(dry)
        task = task_spec(self.task_name, self.opts)
        transcripts = documents.transcripts_dataset(self.input_url)
        if transcripts:
            return ProcessPrepared(
                documents.transcript_records(transcripts, self.task_name),
                upstream_codes=(ErrorCode.TRANSCRIPT_FAILED.value,),
                task=task,
                input_kind="transcripts",
                model_path=model_path,
            )
        job = self.spec.job
        selection = Selection.of(DOCUMENT_EXTENSIONS, "document", job.include, job.exclude)
        listing = select_items(self.input_url, selection, output=job.output)
        return ProcessPrepared(
            documents.document_records(listing, self.task_name),
            listing.skipped,
            listing.skipped_examples,
            task=task,
            input_kind="documents",
            model_path=model_path,
        )

    def pool(self, device: str, nodes: list[sizing.Node]) -> sizing.Pool:
        return llm_pool(self.opts, device, nodes)

    def describe(self, pool: sizing.Pool) -> str:
        what = pool.describe("LLM", "text extraction")
        return f"{self.task_name} on {self.opts.backend}: {what}"

    def stages(self, at: Resolved, prepared: ProcessPrepared) -> Build:
        opts = self.opts
        config = replace(
            _worker_config(opts, prepared.task, at.device, at.pool), model_path=prepared.model_path
        )
        llm = llm_stage(self, config, at)
        shape = {"items_per_call": self.items_per_call, "calls_per_actor": self.calls_per_actor}
        units = llm.cost.units if llm.cost is not None else None
        # What rows have always recorded beside the worker's options.
        row_options = {
            **config.options(),
            "resource": opts.resource,
            "units": units,
            "device": at.device,
            "input_kind": prepared.input_kind,
            **shape,
        }
        return Build(
            [extract_stage(opts, at.pool), llm],
            model_units=units or 1.0,
            options={**opts.model_dump(mode="json", by_alias=True), **shape},
            model_resource=opts.resource,
            row_options=json.dumps(row_options, sort_keys=True, default=str),
        )

    def summarize(self, rows: list[dict[str, Any]], prepared: ProcessPrepared) -> dict[str, Any]:
        return {
            "task": self.task_name,
            "input": storage.scrub_secrets(self.input_url),
            "input_kind": prepared.input_kind,
            "skipped": prepared.skipped,
            "skipped_examples": prepared.skipped_examples,
            "backend": self.opts.backend,
            "model": self.opts.model or f"{self.opts.backend}:default",
        }


def run_chain(spec: JobSpec) -> dict[str, Any]:
    """Transcribe, then run every [process] task over the transcripts just written."""
    from overnight.jobs.transcribe import run_transcribe

    check_process(spec)  # the LLM too, before the transcription runs
    first = run_transcribe(spec)
    then = run_process(spec, input_url=first["transcripts"])
    return {"run_id": spec.run_id, "kind": "chain", "stages": [first, *then.get("stages", [then])]}
