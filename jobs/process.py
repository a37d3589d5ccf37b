"""The document job: documents or transcripts → text → LLM actors → results, costs, summary.

Same shape and guarantees as the transcription job (``jobs.pipeline``):

    manifest blocks (recorded in OUTPUT/_manifests/)           documents, or transcript rows
      → map_batches(fetch_and_extract)                         CPU tasks: bytes → text
      → map_batches(CommittingActor(LLMWorker), actor pool)    one model per actor; whole
                                                               batches through the engine;
                                                               each batch committed atomically
      → driver: progress, one-row-per-item check, ledger, summary

Each result row is one (document, task); its ``item_id`` hashes the source item id and the
task, so several tasks over the same documents, reruns and resumes never collide.

A chained job (``kind = "chain"``) transcribes first, then runs each task over the
transcripts just written: the dialogue of each call is the document.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa

from jobs import ledger, pipeline, preflight, sizing, storage
from jobs.errors import ConfigError
from jobs.manifest import Listing, Selection, committed_ids, select_items
from jobs.spec import JobSpec, ProcessOptions
from schemas import DOCUMENT_RESULTS, MANIFEST, ErrorCode
from workers.llm.adapter import EngineUnavailable
from workers.llm.tasks import READY_TASKS, TaskSpec, TaskSpecError
from workers.llm.worker import LLMWorker, LLMWorkerConfig
from workers.text import DOCUMENT_EXTENSIONS, TextOptions, extract_text

# In flight from the manifest to the LLM stage: the manifest plus the document's text and
# state. For transcript inputs the text is already there and extraction is skipped.
DOC_INPUT = pa.schema(
    [
        *MANIFEST,
        pa.field("source_item_id", pa.string()),
        pa.field("text", pa.large_string()),
        pa.field("status", pa.string()),
        pa.field("error_code", pa.string()),
        pa.field("error_message", pa.string()),
        pa.field("fetch_s", pa.float64()),
        pa.field("extract_s", pa.float64()),
        pa.field("extract_resource", pa.string()),
        pa.field("document_chars", pa.int64()),
    ]
)
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


def _load_json_or_path(value: dict | str, what: str) -> dict:
    if isinstance(value, dict):
        return value
    try:
        data = (
            json.loads(Path(value).read_text())
            if not value.lstrip().startswith("{")
            else json.loads(value)
        )
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"process.{what}: cannot read a JSON schema from {value!r}: {exc}"
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(f"process.{what}: the JSON schema must be an object")
    return data


def task_spec(name: str, opts: ProcessOptions) -> TaskSpec:
    """Build one validated task from the job's [process] section."""
    common: dict[str, Any] = {"max_new_tokens": opts.max_new_tokens}
    try:
        if name in READY_TASKS:
            if name == "compliance":
                return READY_TASKS[name](opts.required_phrases, **common)
            if name == "call_summary":
                return READY_TASKS[name](opts.summary_words, **common)
            return READY_TASKS[name](**common)
        if name == "summarize":
            return TaskSpec(
                kind="summarize",
                summary_words=opts.summary_words,
                instructions=opts.instructions,
                **common,
            )
        if name == "extract":
            if opts.schema_ is None:
                raise ConfigError(
                    "process.schema: the extract task needs the fields as a JSON schema (--schema FILE)"
                )
            return TaskSpec(
                kind="extract",
                json_schema=_load_json_or_path(opts.schema_, "schema"),
                instructions=opts.instructions,
                **common,
            )
        if name == "classify":
            return TaskSpec(
                kind="classify", labels=tuple(opts.labels), instructions=opts.instructions, **common
            )
        if name == "prompt":
            if not opts.prompt:
                raise ConfigError(
                    "process.prompt: the prompt task needs a template with {text} (--prompt FILE)"
                )
            template = Path(opts.prompt).read_text() if os.path.isfile(opts.prompt) else opts.prompt
            return TaskSpec(
                kind="prompt", template=template, instructions=opts.instructions, **common
            )
    except TaskSpecError as exc:
        raise ConfigError(f"process: {exc}") from None
    raise ConfigError(
        f"process.task: unknown task {name!r}; use summarize, extract, classify, prompt or one of "
        f"{', '.join(READY_TASKS)}"
    )


def result_id(source_item_id: str, task: str) -> str:
    return hashlib.sha256(f"{source_item_id}\n{task}".encode()).hexdigest()[:32]


def _is_transcripts(url: str) -> storage.Location | None:
    """The transcripts dataset an input points at (OUTPUT/ or OUTPUT/transcripts/), if any."""
    if "://" not in url and os.path.isfile(url):
        return None
    loc = storage.resolve(url)
    for candidate in (loc, loc.join("transcripts")):
        files = storage.list_files(candidate, ".parquet")
        if not files or any("/_manifests/" in f for f in files):
            continue
        import pyarrow.parquet as pq

        with candidate.fs.open(files[0], "rb") as f:
            meta = pq.read_schema(f).metadata or {}
        if meta.get(b"overnight.table") == b"transcripts":
            return candidate
    return None


def _transcript_records(dataset: storage.Location, task: str) -> list[dict[str, Any]]:
    table = ledger.read_results(
        dataset,
        [
            "item_id",
            "source_uri",
            "source_size",
            "source_etag",
            "tenant",
            "submission_id",
            "external_id",
            "metadata",
            "language",
            "channel_labels",
            "status",
            "error_code",
            "text",
        ],
    )
    records = []
    for row in table.to_pylist() if table is not None else []:
        text, status, code, message = row["text"], "ok", None, None
        if row["status"] != "ok":
            status, code = "error", ErrorCode.INVALID_INPUT.value
            message = f"the transcription of this recording failed ({row['error_code']})"
        elif not (text or "").strip():
            status, code, message = (
                "error",
                ErrorCode.NO_TEXT.value,
                "the call has no speech to process",
            )
        records.append(
            {
                "item_id": result_id(row["item_id"], task),
                "source_item_id": row["item_id"],
                "uri": row["source_uri"],
                "size": row["source_size"],
                "etag": row["source_etag"],
                "tenant": row["tenant"],
                "submission_id": row["submission_id"],
                "external_id": row["external_id"],
                "metadata": row["metadata"],
                "language": row["language"],
                "channel_labels": row["channel_labels"],
                "text": text if status == "ok" else None,
                "status": status,
                "error_code": code,
                "error_message": message,
                "fetch_s": 0.0,
                "extract_s": 0.0,
                "extract_resource": "cpu",
                "document_chars": len(text or ""),
            }
        )
    return records


def _document_records(listing: Listing, task: str) -> list[dict[str, Any]]:
    records = []
    for r in listing.items:
        records.append(
            {
                **r,
                "source_item_id": r["item_id"],
                "item_id": result_id(r["item_id"], task),
                "text": None,
                "status": None,
                "error_code": None,
                "error_message": None,
                "fetch_s": None,
                "extract_s": None,
                "extract_resource": "cpu",
                "document_chars": None,
            }
        )
    return records


def fetch_and_extract(
    batch: pa.Table, *, options: TextOptions, max_bytes: int, storage_config: storage.StorageConfig
) -> pa.Table:
    """CPU stage: object bytes → text. Rows that already carry text or a status pass through."""
    out = []
    for row in batch.to_pylist():
        if row["status"] is not None:
            out.append(row)
            continue
        row.update(status="ok", fetch_s=0.0, extract_s=0.0)
        data = pipeline.fetch_item(row, max_bytes, storage_config)
        if data is None:
            out.append(row)
            continue
        result = extract_text(data, row["uri"].rsplit("/", 1)[-1], options)
        row["extract_s"] = result.seconds
        if result.error_code:
            row.update(
                status="error", error_code=result.error_code, error_message=result.error_message
            )
        else:
            row["text"], row["document_chars"] = result.text, len(result.text or "")
        out.append(row)
    return pa.Table.from_pylist(out, schema=DOC_INPUT)


class _ResultRows:
    """LLMWorker plus the provenance columns of a results row."""

    def __init__(self, config: LLMWorkerConfig, run_id: str, options_json: str):
        self.worker = LLMWorker(config)
        self.run_id, self.options_json = run_id, options_json

    def __call__(self, batch: pa.Table) -> pa.Table:
        out = self.worker(batch)
        n = out.num_rows
        # Rows that failed before the model (extraction, transcription) still name their task.
        for name, value in (("task", self.worker.task.task_name), ("model", self.worker.model)):
            column = out.column_names.index(name)
            out = out.set_column(column, name, pa.array([value] * n, pa.string()))
        out = out.append_column("source_uri", out["uri"]).append_column("source_size", out["size"])
        out = out.append_column("source_etag", out["etag"])
        out = out.append_column("run_id", pa.array([self.run_id] * n, pa.string()))
        out = out.append_column("options", pa.array([self.options_json] * n, pa.string()))
        now = pa.array([datetime.now(UTC)] * n, pa.timestamp("us", tz="UTC"))
        return out.append_column("processed_at", now)


# The spec's names for the pool fields that jobs.sizing fills.
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
        backend=opts.backend,
        model=opts.model,
        device=device,
        compute_type=opts.compute_type,
        max_batch_size=opts.max_batch_size,
        max_num_seqs=opts.max_num_seqs,
        max_num_batched_tokens=opts.max_num_batched_tokens,
        gpu_memory_utilization=opts.gpu_memory_utilization,
        max_model_len=opts.max_model_len,
        engine_kwargs=tuple(sorted(opts.engine_kwargs.items())),
        cpu_threads=pool.threads if device == "cpu" else 0,
        resource=opts.resource,
        units=(pool.gpus_per_actor or 1.0) if device == "cuda" else pool.cpus_per_actor,
    )


def run_process(spec: JobSpec, *, input_url: str | None = None) -> dict[str, Any]:
    """Run every task of ``[process]`` over the input; one summary, or one per task."""
    for name in spec.process.tasks:
        task_spec(name, spec.process)  # refuse a bad task before any work
    model_path = check_process(spec)
    url = input_url or spec.job.input
    stages = [_run_task(spec, url, name, model_path) for name in spec.process.tasks]
    if len(stages) == 1:
        return stages[0]
    return {"run_id": spec.run_id, "kind": "process", "stages": stages}


def check_process(spec: JobSpec) -> str | None:
    """Before Ray starts: the output can be written and the LLM can be had; returns the
    local copy of a hub model the driver fetched for the actors (``jobs.preflight``)."""
    preflight.check_output(spec.job.output)
    return preflight.llm_model(
        spec.process.backend,
        spec.process.model,
        download=preflight.local_run(spec.job.ray_address),
        progress=spec.job.progress,
    )


def text_options(opts: ProcessOptions) -> TextOptions:
    """How documents are read; the PDF password comes from the environment variable the
    job names (``pdf_password_env``), and messages name that variable."""
    return TextOptions(
        pdf_password=os.environ.get(opts.pdf_password_env) or None,
        pdf_password_source=f"${opts.pdf_password_env}",
        timeout_s=opts.extract_timeout_s,
        max_chars=opts.max_chars,
        max_memory_mb=opts.extract_memory_mb,
        json_text_field=opts.json_text_field,
    )


def _run_task(
    spec: JobSpec, input_url: str, task_name: str, model_path: str | None = None
) -> dict[str, Any]:
    """Run one task over every document of the input; returns the run summary."""
    import ray

    started = time.monotonic()
    startup = pipeline.Startup()
    opts = spec.process
    task = task_spec(task_name, opts)
    run_id = (
        spec.run_id
        if len(opts.tasks) == 1 and spec.job.kind == "process"
        else f"{spec.run_id}-{task_name}"
    )
    output = storage.resolve(spec.job.output)
    results = output.join("results")

    transcripts = _is_transcripts(input_url)
    listing = Listing([])
    if not transcripts:
        selection = Selection.of(
            DOCUMENT_EXTENSIONS, "document", spec.job.include, spec.job.exclude
        )
        listing = select_items(input_url, selection)
    records = (
        _transcript_records(transcripts, task_name)
        if transcripts
        else _document_records(listing, task_name)
    )
    token = pipeline.claim(results, run_id)  # before listing: see pipeline.claim
    done = committed_ids(results)
    todo = [r for r in records if r["item_id"] not in done]
    pending = todo[: spec.job.max_items] if spec.job.max_items is not None else todo
    startup.mark("list")

    if pending:
        pipeline.ensure_ray(spec.job.ray_address, verbose=spec.job.verbose)
        startup.mark("ray")
        device = (
            opts.device
            if opts.device != "auto"
            else ("cuda" if pipeline.cluster_has_gpu() else "cpu")
        )
        pool = llm_pool(opts, device, sizing.nodes_of_cluster())
    else:  # nothing to do: no Ray at all (it would take most of a no-op rerun's time)
        device = "cpu" if opts.device == "auto" else opts.device
        pool = llm_pool(opts, device, [])
    if spec.job.progress and pending:
        print(
            f"[overnight] {task_name} on {opts.backend}: {pool.describe('LLM', 'text extraction')}",
            file=sys.stderr,
            flush=True,
        )
    config = replace(_worker_config(opts, task, device, pool), model_path=model_path)
    items_per_call, calls_per_actor = opts.call_shape
    options_json = json.dumps(
        {
            **config.options(),
            "device": device,
            "input_kind": "transcripts" if transcripts else "documents",
            "items_per_call": items_per_call,
            "calls_per_actor": calls_per_actor,
        },
        sort_keys=True,
        default=str,
    )

    outcome = pipeline.Outcome()
    if pending:
        actor_args: dict[str, Any] = {
            "num_cpus": pool.cpus_per_actor,
            "num_gpus": pool.gpus_per_actor,
        }
        if opts.accelerator_type:
            actor_args["accelerator_type"] = opts.accelerator_type
        ds = (
            pipeline.manifest_dataset(
                output, run_id, pa.Table.from_pylist(pending, schema=DOC_INPUT)
            )
            .map_batches(
                fetch_and_extract,  # type: ignore[arg-type]  # Ray's stubs want one argument; fn_kwargs gives the rest
                fn_kwargs={
                    "options": text_options(opts),
                    "max_bytes": int(opts.max_file_mb * 2**20),
                    "storage_config": storage.StorageConfig.from_env(),
                },
                batch_format="pyarrow",
                batch_size=None,
                num_cpus=pool.task_cpus,
            )
            .map_batches(
                pipeline.CommittingActor,
                fn_constructor_kwargs={
                    "make_worker": functools.partial(_ResultRows, config, run_id, options_json),
                    "dataset": results,
                    "schema": DOCUMENT_RESULTS,
                    "slim": _SLIM,
                    "token": token,
                },
                batch_format="pyarrow",
                batch_size=items_per_call,
                compute=ray.data.ActorPoolStrategy(
                    size=pool.actors,
                    max_concurrent_calls_per_actor=calls_per_actor,
                    enable_true_multi_threading=calls_per_actor > 1,
                    max_tasks_in_flight_per_actor=2 * calls_per_actor,
                ),
                **actor_args,
            )
        )
        startup.mark("manifest")
        outcome = pipeline.execute(
            ds,
            {r["item_id"] for r in pending},
            pipeline.Progress(len(pending), spec.job.progress),
            (EngineUnavailable,),
        )

    rows = outcome.rows
    repaired = pipeline.drop_duplicates(results, DOCUMENT_RESULTS, run_id)
    costs = ledger.catch_up(output, "results", spec.prices, ledger.DOCUMENT_STAGES)
    resource = next((r["llm_resource"] for r in rows if r["llm_resource"]), None)
    summary = ledger.summarize_run(
        run_id=run_id,
        kind="process",
        rows=rows,
        ledger=costs,
        listed=len(records),
        already_done=len(records) - len(todo),
        wall_s=time.monotonic() - started,
        pipeline_wall_s=outcome.pipeline_s,
        model_actors=pool.actors if pending else 0,
        model_resource=resource or opts.resource or ("gpu" if device == "cuda" else "cpu"),
        model_units=config.units or 1.0,
        prices=spec.prices,
        extra={
            "task": task_name,
            "input": storage.redact(input_url),
            "output": storage.redact(spec.job.output),
            "input_kind": "transcripts" if transcripts else "documents",
            "duplicates_removed": repaired,
            "skipped": listing.skipped,
            "skipped_examples": listing.skipped_examples,
            "backend": opts.backend,
            "model": opts.model or f"{opts.backend}:default",
            "device": device,
            "startup": startup.report(outcome),
            "options": {
                **opts.model_dump(mode="json", by_alias=True),
                **sizing.record(pool),
                "items_per_call": items_per_call,
                "calls_per_actor": calls_per_actor,
            },
            "results": results.url(),
            "costs": output.join("costs").url(),
        },
    )
    summary["summary_path"] = ledger.write_summary(output, summary)
    return summary


def run_chain(spec: JobSpec) -> dict[str, Any]:
    """Transcribe, then run every [process] task over the transcripts just written."""
    from jobs.transcribe import run_transcribe

    check_process(spec)  # the LLM too, before the transcription runs
    first = run_transcribe(spec)
    then = run_process(spec, input_url=first["transcripts"])
    return {"run_id": spec.run_id, "kind": "chain", "stages": [first, *then.get("stages", [then])]}
