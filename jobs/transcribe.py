"""The transcription job: manifest → Ray Data (decode → Whisper actors → commit) → ledger.

Shape (one row per item from the manifest to the sink, map-only):

    manifest blocks (recorded in OUTPUT/_manifests/)    a few items per decode task
      → map_batches(fetch_and_decode)                    CPU tasks: bytes → feature chunks
      → map_batches(CommittingActor(WhisperWorker))     one model per actor, several calls
                                                         in flight, model batches filled across
                                                         them; each call committed as one
                                                         atomic Parquet file
      → driver iterates the slim commit rows             progress, counts, summary

Resume uses our own commit protocol rather than Ray Data's ``checkpoint_config``: each output
file is named by the hash of its item ids and appears atomically (rename on local disks, a
single PUT on object stores), so "committed" is exactly "in a file under transcripts/", the
driver can subtract it *before* starting (for totals, progress and the manifest), a retried
task rewrites the same file name instead of adding a second copy, and nothing needs a
pending-file cleanup pass that would delete files the driver already counted.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pyarrow as pa

from jobs import ledger, pipeline, preflight, sizing, storage
from jobs.manifest import Selection, committed_ids, manifest_table, select_items
from jobs.spec import JobSpec, TranscribeOptions
from schemas import MANIFEST, TRANSCRIPTS
from workers.audio import MEDIA_EXTENSIONS, AudioChunker, AudioOptions
from workers.whisper import (
    ModelLoadError,
    WhisperOptions,
    WhisperWorker,
    WhisperWorkerConfig,
)

_CHUNK = pa.struct(
    [
        pa.field("channel", pa.int16()),
        pa.field("clips", pa.list_(pa.list_(pa.float64()))),
        pa.field("feature_size", pa.int32()),
        pa.field("features", pa.large_binary()),
    ]
)
# In flight between decode and Whisper; never written to disk.
DECODED = pa.schema(
    [
        *MANIFEST,
        pa.field("status", pa.string()),
        pa.field("error_code", pa.string()),
        pa.field("error_message", pa.string()),
        pa.field("fetch_s", pa.float64()),
        pa.field("decode_s", pa.float64()),
        pa.field("decode_units", pa.float64()),
        pa.field("duration_s", pa.float64()),
        pa.field("speech_s", pa.float64()),
        pa.field("_split", pa.bool_()),
        pa.field("chunks", pa.list_(_CHUNK)),
    ]
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
]


def audio_options(opts: TranscribeOptions, feature_size: int) -> AudioOptions:
    return AudioOptions(
        chunk_length_s=opts.chunk_length_s,
        vad=opts.vad,
        vad_threshold=opts.vad_threshold,
        vad_min_silence_ms=opts.vad_min_silence_ms,
        vad_min_silence_split_ms=opts.vad_min_silence_split_ms,
        vad_speech_pad_ms=opts.vad_speech_pad_ms,
        split_channels=opts.split_channels,
        max_channels=opts.max_channels,
        turn_gap_s=opts.turn_gap_s,
        max_duration_s=opts.max_duration_s,
        decode_timeout_s=opts.decode_timeout_s,
        feature_size=feature_size,
    )


# The spec's names for the pool fields that jobs.sizing fills.
POOL_NAMES = {"task_cpus": "decode_cpus", "threads": "cpu_threads"}


def whisper_pool(opts: TranscribeOptions, device: str, nodes: list[sizing.Node]) -> sizing.Pool:
    return sizing.size_job_pool(
        opts,
        device,
        nodes,
        task_cpus=opts.decode_cpus,
        model_workers=opts.model_workers,
        names=POOL_NAMES,
    )


def whisper_options(opts: TranscribeOptions, device: str, pool: sizing.Pool) -> WhisperOptions:
    units = pool.gpus_per_actor if device == "cuda" else pool.cpus_per_actor
    return WhisperOptions(
        model=opts.model,
        device=device,
        compute_type=opts.compute_type,
        batch_size=opts.batch_size,
        beam_size=opts.beam_size,
        language=opts.language,
        timestamps=opts.timestamps,
        cpu_threads=pool.threads,
        model_workers=pool.model_workers,
        window_step_s=opts.window_step_s,
        encoder_batch_size=opts.encoder_batch_size,
        no_speech_threshold=opts.no_speech_threshold,
        log_prob_threshold=opts.log_prob_threshold,
        resource=opts.resource,
        units=float(units or 1.0),
    )


def model_cache_dir(url: str) -> Path:
    root = Path(os.environ.get("OVERNIGHT_CACHE") or Path.home() / ".cache" / "overnight")
    return root / "models" / hashlib.sha256(url.encode()).hexdigest()[:16]


def fetch_model(url: str, storage_config: storage.StorageConfig) -> str:
    """Copy a model folder from object storage into this node's cache, once per node."""
    target = model_cache_dir(url)
    if (target / "model.bin").is_file():
        return str(target)
    loc = storage.resolve(url, storage_config)
    tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    for path in storage.list_files(loc):
        local = tmp / path[len(loc.path) :].lstrip("/")
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_bytes(storage.read_bytes(loc.url(path), storage_config))
    try:
        os.replace(tmp, target)  # atomic; another actor on this node may have won the race
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return str(target)


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
        return WhisperWorker(config, fetch_model(model, storage_config))
    return WhisperWorker(config, local_copy if local_copy and os.path.isdir(local_copy) else None)


@functools.lru_cache(maxsize=4)
def _chunker(options: AudioOptions) -> AudioChunker:
    return AudioChunker(options)


def fetch_and_decode(
    batch: pa.Table,
    *,
    options: AudioOptions,
    max_bytes: int,
    decode_units: float,
    storage_config: storage.StorageConfig,
    fetch_timeout_s: float = pipeline.FETCH_TIMEOUT_S,
    allowed_input_prefixes: list[str] | None = None,
) -> pa.Table:
    """CPU stage: object bytes → feature chunks; every failure becomes the row's error."""
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
            decode_units=decode_units,
            duration_s=None,
            speech_s=None,
            _split=split,
            chunks=[],
        )
        data = pipeline.fetch_item(
            row, max_bytes, storage_config, fetch_timeout_s, allowed_input_prefixes
        )
        if data is None:
            out.append(row)
            continue
        t1 = time.perf_counter()
        decoded = chunker(data, split_channels=split)
        row["decode_s"] = time.perf_counter() - t1
        if decoded.error_code:
            row.update(
                status="error", error_code=decoded.error_code, error_message=decoded.error_message
            )
        row["duration_s"], row["speech_s"] = decoded.duration_s, decoded.speech_s
        row["chunks"] = [
            {
                "channel": c.channel,
                "clips": [list(clip) for clip in c.clips],
                "feature_size": c.features.shape[0],
                "features": c.features.tobytes(),
            }
            for c in decoded.chunks
        ]
        out.append(row)
    return pa.Table.from_pylist(out, schema=DECODED)


def run_transcribe(spec: JobSpec) -> dict[str, Any]:
    """Run the job; returns the run summary (also written to OUTPUT/runs/<run_id>.json)."""
    import ray

    started = time.monotonic()
    startup = pipeline.Startup()
    opts, run_id = spec.transcribe, spec.run_id
    output = storage.resolve(spec.job.output)
    preflight.check_output(spec.job.output)
    model_ref = preflight.whisper_model(
        opts.model,
        download=preflight.local_run(spec.job.ray_address),
        progress=spec.job.progress,
    )
    feature_size = model_ref.feature_size

    selection = Selection.of(MEDIA_EXTENSIONS, "media", spec.job.include, spec.job.exclude)
    listing = select_items(spec.job.input, selection)
    records = listing.items
    transcripts = output.join("transcripts")
    token = pipeline.claim(transcripts, run_id)  # before listing: see pipeline.claim
    done = committed_ids(transcripts)
    todo = [r for r in records if r["item_id"] not in done]
    pending = todo[: spec.job.max_items] if spec.job.max_items is not None else todo
    startup.mark("list")

    if pending:
        pipeline.ensure_ray(spec.job.ray_address, verbose=spec.job.verbose)
        startup.mark("ray")
        device = opts.device
        if device == "auto":
            device = "cuda" if pipeline.cluster_has_gpu() else "cpu"
        pool = whisper_pool(opts, device, sizing.nodes_of_cluster())
    else:  # nothing to do: no Ray at all (it would take most of a no-op rerun's time)
        device = "cpu" if opts.device == "auto" else opts.device
        pool = whisper_pool(opts, device, [])
    if spec.job.progress and pending:
        print(f"[overnight] {pool.describe('Whisper', 'decode')}", file=sys.stderr, flush=True)
    w_opts = whisper_options(opts, device, pool)
    a_opts = audio_options(opts, feature_size)
    # Small calls, many in flight: the model starts as soon as one decode task is done, and
    # its batches are filled from every call in flight (workers.whisper.ContinuousBatcher).
    items_per_call = opts.items_per_call or 8
    calls_per_actor = opts.calls_per_actor or min(64, -(-4 * opts.batch_size // items_per_call))

    outcome = pipeline.Outcome()
    storage_config = storage.StorageConfig.from_env()
    if pending:
        extra = {f"audio.{k}": v for k, v in asdict(a_opts).items()}
        config = WhisperWorkerConfig(
            whisper=w_opts, run_id=run_id, extra_options=tuple(sorted(extra.items()))
        )
        actor_args: dict[str, Any] = {
            "num_cpus": pool.cpus_per_actor,
            "num_gpus": pool.gpus_per_actor,
        }
        if opts.accelerator_type:
            actor_args["accelerator_type"] = opts.accelerator_type
        ds = (
            pipeline.manifest_dataset(
                output, run_id, manifest_table(pending), max(1, min(8, items_per_call))
            )
            .map_batches(
                fetch_and_decode,  # type: ignore[arg-type]  # Ray's stubs want one argument; fn_kwargs gives the rest
                fn_kwargs={
                    "options": a_opts,
                    "max_bytes": int(opts.max_file_mb * 2**20),
                    "decode_units": pool.task_cpus,
                    "storage_config": storage_config,
                    "fetch_timeout_s": opts.fetch_timeout_s,
                    "allowed_input_prefixes": spec.job.allowed_input_prefixes,
                },
                batch_format="pyarrow",
                batch_size=None,
                num_cpus=pool.task_cpus,
            )
            .map_batches(
                pipeline.CommittingActor,
                fn_constructor_kwargs={
                    "make_worker": functools.partial(
                        whisper_worker, config, storage_config, model_ref.path
                    ),
                    "dataset": transcripts,
                    "schema": TRANSCRIPTS,
                    "slim": _SLIM,
                    "token": token,
                },
                batch_format="pyarrow",
                batch_size=items_per_call,
                # Several calls at once per actor, their chunks batched together by the
                # worker's ContinuousBatcher: the model starts on the first decoded items
                # instead of waiting for a whole big call, and batches fill across calls.
                compute=ray.data.ActorPoolStrategy(
                    size=pool.actors,
                    max_concurrent_calls_per_actor=calls_per_actor,
                    enable_true_multi_threading=True,
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
            (ModelLoadError,),
        )

    rows = outcome.rows
    repaired = pipeline.drop_duplicates(transcripts, TRANSCRIPTS, run_id)
    costs = ledger.catch_up(output, "transcripts", spec.prices)
    resource = next((r["asr_resource"] for r in rows if r["asr_resource"]), None)
    summary = ledger.summarize_run(
        run_id=run_id,
        kind="transcribe",
        rows=rows,
        ledger=costs,
        listed=len(records),
        already_done=len(records) - len(todo),
        wall_s=time.monotonic() - started,
        pipeline_wall_s=outcome.pipeline_s,
        model_actors=pool.actors if pending else 0,
        model_resource=resource or w_opts.resource or ("gpu" if device == "cuda" else "cpu"),
        model_units=w_opts.units,
        prices=spec.prices,
        extra={
            "input": storage.redact(spec.job.input),
            "output": storage.redact(spec.job.output),
            "model": opts.model,
            "device": device,
            "speech_seconds": round(sum(r["speech_s"] or 0.0 for r in rows), 3),
            "no_speech": sum(1 for r in rows if r["status"] == "ok" and not (r["speech_s"] or 0)),
            "duplicates_removed": repaired,
            "skipped": listing.skipped,
            "skipped_examples": listing.skipped_examples,
            "startup": startup.report(outcome),
            "options": {
                **opts.model_dump(),
                **sizing.record(pool),
                "items_per_call": items_per_call,
                "calls_per_actor": calls_per_actor,
            },
            "transcripts": transcripts.url(),
            "costs": output.join("costs").url(),
        },
    )
    summary["summary_path"] = ledger.write_summary(output, summary)
    return summary
