"""The transcription job, as a plan for the runner (``jobs.run.runner``):

    manifest blocks (recorded in OUTPUT/_manifests/)    a few items per decode task
      → fetch_and_decode                                 CPU tasks: bytes → feature chunks
                                                         (``schemas.stages.DECODED``)
      → WhisperWorker, one model per actor               several calls in flight, model
                                                         batches filled across them; each
                                                         call committed as one Parquet file
      → redact_batch (``redact`` set)                    CPU tasks on each finished call,
                                                         before its commit (jobs.redaction)
      → OUTPUT/transcripts, costs, runs/<run_id>.json

Claim, resume, commit, duplicate repair, ledger and summary are the runner's; this module
says which records, which stages, and what the summary adds.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from dataclasses import asdict, fields
from typing import Any

import pyarrow as pa

from overnight.jobs import models, preflight, redaction
from overnight.jobs.accounting.ledger import Cost
from overnight.jobs.dataset import storage
from overnight.jobs.dataset.manifest import Selection, select_items
from overnight.jobs.run import on_ray, runner, sizing
from overnight.jobs.run.stage import Stage
from overnight.jobs.spec import JobSpec, TranscribeOptions
from overnight.schemas import MANIFEST, TRANSCRIPTS, TRANSCRIPTS_UNREDACTED
from overnight.schemas.stages import DECODED, WHISPER_OUTPUT
from overnight.workers.audio import MEDIA_EXTENSIONS, AudioChunker, AudioOptions
from overnight.workers.whisper import WhisperWorker, WhisperWorkerConfig
from overnight.workers.whisper_models import ModelLoadError
from overnight.workers.whisper_options import (
    DecodingOptions,
    WhisperOptions,
    english_only,
    gpu_model_workers,
    is_english,
)

_SLIM = [
    "item_id",
    "status",
    "error_code",
    "duration_s",
    "speech_s",
    "asr_s",
    "asr_resource",
    "asr_units",
    "source_uri",
    "language_mismatch",
    "degenerate",
    "entities",  # types, offsets and times only: never text
]


def audio_options(opts: TranscribeOptions, feature_size: int) -> AudioOptions:
    """The spec's audio fields (the same names as ``AudioOptions``'), and the model's mel bins."""
    names = {f.name for f in fields(AudioOptions)} - {"feature_size"}
    return AudioOptions(**opts.model_dump(include=names), feature_size=feature_size)


# The spec's names for the pool fields that jobs.run.sizing fills.
POOL_NAMES = {"task_cpus": "decode_cpus", "threads": "cpu_threads"}


def whisper_pool(opts: TranscribeOptions, device: str, nodes: list[sizing.Node]) -> sizing.Pool:
    return sizing.size_job_pool(
        opts,
        device,
        nodes,
        task_cpus=opts.decode_cpus,
        model_workers=opts.model_workers,
        names=POOL_NAMES,
        gpu_model_workers=gpu_model_workers(opts.model),
    )


def whisper_options(opts: TranscribeOptions, device: str, pool: sizing.Pool) -> WhisperOptions:
    """The spec's decoding fields as they are, plus what sizing resolved for the actor."""
    units = pool.gpus_per_actor if device == "cuda" else pool.cpus_per_actor
    return WhisperOptions(
        **{
            **opts.model_dump(include=set(DecodingOptions.model_fields)),
            "device": device,
            "cpu_threads": pool.threads,
            "model_workers": pool.model_workers,
            "resource": opts.resource,
            "units": float(units or 1.0),
        }
    )


def whisper_worker(
    config: WhisperWorkerConfig,
    storage_config: storage.StorageConfig,
    local_copy: str | None = None,
) -> WhisperWorker:
    """Build the actor's Whisper worker; a model in object storage is fetched first (I/O stays
    here, in jobs, with the job's storage settings). ``local_copy``: the folder the driver
    fetched a hub model into (``jobs.preflight``), used where this node sees it."""
    model = config.whisper.model
    if "://" in model:
        return WhisperWorker(config, models.fetch_model(model, storage_config))
    return WhisperWorker(config, local_copy if local_copy and os.path.isdir(local_copy) else None)


@functools.lru_cache(maxsize=4)
def _chunker(options: AudioOptions) -> AudioChunker:
    return AudioChunker(options)


def fetch_and_decode(
    batch: pa.Table,
    *,
    options: AudioOptions,
    max_bytes: int,
    storage_config: storage.StorageConfig,
    fetch_timeout_s: float = on_ray.FETCH_TIMEOUT_S,
    allowed_input_prefixes: list[str] | None = None,
) -> pa.Table:
    """CPU stage: object bytes → feature chunks; every failure becomes the row's error.
    Each item's fetch and decode are timed apart (``fetch_s``, ``decode_s``): two ledger
    stages, finer than the time of the whole call the runner sees."""
    chunker = _chunker(options)
    out = []
    for row in batch.to_pylist():
        row = dict(row)
        split = bool(row.get("channel_labels")) or options.split_channels
        row.update(
            status="ok",
            error_code=None,
            error_message=None,
            fetch_s=0.0,
            decode_s=0.0,
            duration_s=None,
            speech_s=None,
            _split=split,
            chunks=[],
        )
        data = on_ray.fetch_item(
            row, max_bytes, storage_config, fetch_timeout_s, allowed_input_prefixes
        )
        if data is None:
            out.append(row)
            continue
        t1 = time.perf_counter()
        decoded = chunker(data, split_channels=split)
        row["decode_s"] = time.perf_counter() - t1
        row.update(decoded.fields())
        out.append(row)
    return pa.Table.from_pylist(out, schema=DECODED)


def with_channel_labels(records: list[dict[str, Any]], labels: list[str] | None) -> None:
    """The job's ``channel_labels`` on every record whose manifest row names none (a row's
    own labels win); labels make the decode stage split the channels."""
    if labels:
        for r in records:
            r["channel_labels"] = r.get("channel_labels") or list(labels)


def language_mismatches(records: list[dict[str, Any]], opts: TranscribeOptions) -> int:
    """Items whose language hint (their manifest ``language``, else the job's) is not English
    while the model is English-only: the worker decodes them as English and marks the row
    ``language_mismatch``."""
    if not english_only(opts.model):
        return 0
    return sum(1 for r in records if not is_english(r.get("language") or opts.language))


def run_transcribe(spec: JobSpec) -> dict[str, Any]:
    """Run the job; returns the run summary (also written to OUTPUT/runs/<run_id>.json)."""
    return runner.run(transcribe_plan(spec))


def transcribe_plan(spec: JobSpec, *, dry: bool = False) -> runner.JobPlan:
    """The job's plan. ``dry`` (``--dry-run``): the model is checked as a cluster run checks
    it (the cache, else the hub's metadata), never downloaded: a dry run writes nothing."""
    opts = spec.transcribe
    preflight.check_output(spec.job.output)
    model_ref = preflight.whisper_model(
        opts.model,
        download=not dry and preflight.local_run(spec.job.ray_address),
        progress=spec.job.progress,
    )
    selection = Selection.of(MEDIA_EXTENSIONS, "media", spec.job.include, spec.job.exclude)
    listing = select_items(spec.job.input, selection)
    with_channel_labels(listing.items, opts.channel_labels)
    mismatched = language_mismatches(listing.items, opts)
    if mismatched:
        # Once per run, not per item: a backlog of German calls is one message.
        print(
            f"[overnight] warning: {mismatched} of {len(listing.items)} items ask for a "
            f"language other than English, but {opts.model!r} is English-only: they are "
            "transcribed as English and marked language_mismatch (use a multilingual model, "
            "e.g. --model large-v3)",
            file=sys.stderr,
            flush=True,
        )
    own_prompts = sum(1 for r in listing.items if r.get("initial_prompt") or r.get("hotwords"))
    # Small calls, many in flight: the model starts as soon as one decode task is done, and
    # its batches are filled from every call in flight (workers.whisper.ContinuousBatcher).
    items_per_call = opts.items_per_call or 8
    calls_per_actor = opts.calls_per_actor or min(64, -(-4 * opts.batch_size // items_per_call))
    storage_config = storage.StorageConfig.from_env()
    output = storage.resolve(spec.job.output)
    if opts.redact and spec.job.progress:
        print(
            f"[overnight] redacting {', '.join(opts.redact)} (CPU tasks after Whisper); word "
            f"timestamps {'on' if opts.word_timestamps else 'off'}"
            + (", originals kept in transcripts_unredacted/" if opts.keep_unredacted else ""),
            file=sys.stderr,
            flush=True,
        )

    def build(at: runner.Resolved) -> runner.Build:
        pool = at.pool
        w_opts = whisper_options(opts, at.device, pool)
        a_opts = audio_options(opts, model_ref.feature_size)
        extra = {f"audio.{k}": v for k, v in asdict(a_opts).items()}
        config = WhisperWorkerConfig(whisper=w_opts, extra_options=tuple(sorted(extra.items())))
        decode = Stage(
            "decode",
            fetch_and_decode,
            consumes=MANIFEST,
            produces=DECODED,
            kwargs={
                "options": a_opts,
                "max_bytes": int(opts.max_file_mb * 2**20),
                "storage_config": storage_config,
                "fetch_timeout_s": opts.fetch_timeout_s,
                "allowed_input_prefixes": spec.job.allowed_input_prefixes,
            },
            num_cpus=pool.task_cpus,
            cost=Cost(
                "decode", "decode", units=pool.task_cpus, timed_by_worker=True, parts=("fetch",)
            ),
        )
        whisper = Stage.on_pool(
            "whisper",
            whisper_worker,
            pool,
            consumes=DECODED,
            produces=WHISPER_OUTPUT,
            kwargs={
                "config": config,
                "storage_config": storage_config,
                "local_copy": model_ref.path,
            },
            accelerator_type=opts.accelerator_type,
            calls_per_actor=calls_per_actor,
            rows_per_call=items_per_call,
            cost=Cost(
                "transcribe",
                "asr",
                # The GPU the actor finds (an "h100" row), or the price key the job names.
                resource=w_opts.resource or ("cpu" if at.device != "cuda" else None),
                # Model workers share the actor: each batch holds its share of it.
                units=w_opts.units / max(1, w_opts.model_workers),
                timed_by_worker=True,  # a batch's time, shared by its recordings' audio
            ),
        )
        stages = [decode, whisper]
        if opts.redact:
            stages.append(
                Stage(
                    "redact",
                    redaction.redact_batch,
                    consumes=TRANSCRIPTS,
                    produces=TRANSCRIPTS,
                    placement="after",
                    kwargs={
                        "types": tuple(opts.redact),
                        "run_id": spec.run_id,
                        "unredacted": output.join(redaction.UNREDACTED_DATASET)
                        if opts.keep_unredacted
                        else None,
                        "audio": output.join(redaction.AUDIO_FOLDER) if opts.redact_audio else None,
                        "storage_config": storage_config,
                        "max_bytes": int(opts.max_file_mb * 2**20),
                    },
                    num_cpus=pool.task_cpus,
                    cost=Cost("redact", "redact", units=pool.task_cpus, timed_by_worker=True),
                )
            )
        return runner.Build(
            stages=stages,
            model_resource=w_opts.resource or ("gpu" if at.device == "cuda" else "cpu"),
            model_units=w_opts.units,
            options={
                **opts.model_dump(),
                **sizing.record(pool),
                "items_per_call": items_per_call,
                "calls_per_actor": calls_per_actor,
            },
        )

    def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "input": storage.scrub_secrets(spec.job.input),
            "model": opts.model,
            "speech_seconds": round(sum(r["speech_s"] or 0.0 for r in rows), 3),
            "no_speech": sum(1 for r in rows if r["status"] == "ok" and not (r["speech_s"] or 0)),
            "skipped": listing.skipped,
            "skipped_examples": listing.skipped_examples,
            "language_mismatch": sum(1 for r in rows if r.get("language_mismatch")),
            # Transcripts with a segment the decoder looped on at every temperature: stored
            # with the repetition cut and marked (`degenerate`), not clean text.
            "degenerate": sum(1 for r in rows if r.get("degenerate")),
            # Items decoded with their manifest's initial_prompt/hotwords (each row's
            # `options` holds the values); the job's own are in `options`.
            "items_with_own_prompt": own_prompts,
            **({"redacted_entities": _entity_counts(rows)} if opts.redact else {}),
        }

    return runner.JobPlan(
        spec=spec,
        kind="transcribe",
        run_id=spec.run_id,
        dataset="transcripts",
        schema=TRANSCRIPTS,
        slim=_SLIM,
        records=listing.items,
        manifest_schema=MANIFEST,
        rows_per_block=max(1, min(8, items_per_call)),
        device=opts.device,
        size=lambda device, nodes: whisper_pool(opts, device, nodes),
        build=build,
        load_errors=(ModelLoadError,),
        describe=lambda pool: pool.describe("Whisper", "decode"),
        summary=summary,
        side_datasets=[(redaction.UNREDACTED_DATASET, TRANSCRIPTS_UNREDACTED)]
        if opts.keep_unredacted
        else [],
    )


def _entity_counts(rows: list[dict[str, Any]]) -> dict[str, int]:
    """Entities redacted in this run, by type (counts only: the summary never holds text)."""
    counts: dict[str, int] = {}
    for row in rows:
        for entity in row.get("entities") or []:
            counts[entity["type"]] = counts.get(entity["type"], 0) + 1
    return dict(sorted(counts.items()))
