"""The transcription job, for the runner (``jobs.run.runner``):

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
import time
from dataclasses import asdict, dataclass, fields
from typing import Any

import pyarrow as pa

from overnight.jobs import models, preflight, redaction
from overnight.jobs.accounting.ledger import Cost
from overnight.jobs.dataset import storage
from overnight.jobs.dataset.manifest import Selection, select_items
from overnight.jobs.run import console, on_ray, runner, sizing
from overnight.jobs.run.job import Build, Job, Prepared, Resolved, model_resource
from overnight.jobs.run.stage import Stage
from overnight.jobs.spec import JobSpec, TranscribeOptions
from overnight.schemas import MANIFEST, TRANSCRIPTS, TRANSCRIPTS_UNREDACTED
from overnight.schemas.errors import ErrorCode
from overnight.schemas.stages import DECODED, WHISPER_OUTPUT
from overnight.workers.audio import MEDIA_EXTENSIONS, AudioChunker, AudioOptions, DecodedAudio
from overnight.workers.diarize.diarize import DiarizeOptions, Diarizer
from overnight.workers.diarize.speech import diarize_chunks
from overnight.workers.whisper import WhisperWorker, WhisperWorkerConfig
from overnight.workers.whisper_models import ModelLoadError
from overnight.workers.whisper_options import (
    DecodingOptions,
    WhisperOptions,
    english_only,
    gpu_model_workers,
    is_english,
    resolve_engine,
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


def audio_options(
    opts: TranscribeOptions, feature_size: int, engine: str = "ctranslate2", device: str = "cpu"
) -> AudioOptions:
    """The spec's audio fields (the same names as ``AudioOptions``'), and the model's mel bins;
    a diarizing job keeps each chunk's speech samples for the speaker encoder. The torch engine
    on cuda (``engine`` resolved) computes the features on its GPU from the chunks' samples
    (``features_on_model``), so that the decode tasks' cores only decode; CTranslate2, and
    any engine on CPU, takes them from the decode stage as before."""
    names = {f.name for f in fields(AudioOptions)} - {
        "feature_size",
        "keep_speech",
        "features_on_model",
    }
    return AudioOptions(
        **opts.model_dump(include=names),
        feature_size=feature_size,
        keep_speech=opts.diarize,
        features_on_model=engine == "torch" and device == "cuda",
    )


def diarize_options(opts: TranscribeOptions) -> DiarizeOptions | None:
    """The spec's speaker settings as the diarizer takes them; None: the job does not diarize."""
    if not opts.diarize:
        return None
    return DiarizeOptions(
        speakers=opts.speakers, min_speakers=opts.min_speakers, max_speakers=opts.max_speakers
    )


# One speaker encoder per decode task process, loaded on its first diarized recording.
_DIARIZERS: dict[DiarizeOptions, Diarizer] = {}


def _diarize(row: dict[str, Any], decoded: DecodedAudio, options: DiarizeOptions) -> None:
    """A mono call's speaker turns (``_speaker_turns``) and their time (``diarize_s``): from
    its samples and finer speech regions where the decode kept them (``DecodedAudio.voice``),
    else from the speech its chunks cut out (a recording too long to keep decoded)."""
    t0 = time.perf_counter()
    diarizer = _DIARIZERS.get(options)
    if diarizer is None:
        diarizer = _DIARIZERS[options] = Diarizer(options)
    if decoded.voice is not None:
        found = diarizer(*decoded.voice)
    else:
        found = diarize_chunks(diarizer, decoded.chunks)
    row["_speaker_turns"] = found.records()
    row["diarize_s"] = time.perf_counter() - t0


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
    diarize: DiarizeOptions | None = None,
) -> pa.Table:
    """CPU stage: object bytes → feature chunks; every failure becomes the row's error.
    Each item's fetch, decode and (``diarize``: a mono call's) diarization are timed apart
    (``fetch_s``, ``decode_s``, ``diarize_s``): ledger stages finer than the time of the
    whole call the runner sees."""
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
        if split and decoded.num_channels == 1 and not decoded.error_code:
            # A one-channel (or dual-mono) recording has no channels to tell its parties
            # apart, also in a job that splits the stereo calls of a mixed queue: it is a
            # mono call, with no speaker unless diarization finds them. Labelled as the
            # first channel, the customer's words were counted as the agent's talk.
            row["_split"] = False
        if diarize is not None and not decoded.error_code and not row["_split"]:
            try:
                _diarize(row, decoded, diarize)
            except Exception as exc:  # one recording's failure, not the job's
                # Raised in a Ray Data task, it stopped the whole job with no row for any
                # item (``--speakers 4`` on a 2.5 s clip), and again on every rerun.
                row.update(
                    status="error",
                    error_code=ErrorCode.DIARIZATION_FAILED.value,
                    error_message=f"speaker diarization failed: {type(exc).__name__}: {exc}",
                    chunks=[],
                )
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


def announce(records: list[dict[str, Any]], opts: TranscribeOptions, progress: bool) -> None:
    """What the listing and the options mean for the run, once per run (not per item: a
    backlog of German calls is one message)."""
    mismatched = language_mismatches(records, opts)
    if mismatched:
        _say(
            f"warning: {mismatched} of {len(records)} items ask for a language other than "
            f"English, but {opts.model!r} is English-only: they are transcribed as English "
            "and marked language_mismatch (use a multilingual model, e.g. --model large-v3)"
        )
    if opts.redact and progress:
        _say(
            f"redacting {', '.join(opts.redact)} (CPU tasks after Whisper); word "
            f"timestamps {'on' if opts.word_timestamps else 'off'}"
            + (", originals kept in transcripts_unredacted/" if opts.keep_unredacted else "")
        )


def decode_stage(
    opts: TranscribeOptions, audio: AudioOptions, pool: sizing.Pool, **kwargs: Any
) -> Stage:
    """``fetch_and_decode`` as CPU tasks; ``kwargs``: its storage arguments."""
    return Stage(
        "decode",
        fetch_and_decode,
        consumes=MANIFEST,
        produces=DECODED,
        kwargs={
            "options": audio,
            "max_bytes": int(opts.max_file_mb * 2**20),
            "fetch_timeout_s": opts.fetch_timeout_s,
            "diarize": diarize_options(opts),
            **kwargs,
        },
        num_cpus=pool.task_cpus,
        # Diarization runs in the decode task, beside the model (never on the Whisper
        # actor's time): a ledger stage of its own, priced at the task's cores.
        cost=Cost(
            "decode",
            "decode",
            units=pool.task_cpus,
            timed_by_worker=True,
            parts=("fetch", "diarize") if opts.diarize else ("fetch",),
        ),
    )


def whisper_stage(
    job: TranscribeJob, config: WhisperWorkerConfig, at: Resolved, **kwargs: Any
) -> Stage:
    """The Whisper actor pool; ``kwargs``: ``whisper_worker``'s storage arguments."""
    whisper = config.whisper
    return Stage.on_pool(
        "whisper",
        whisper_worker,
        at.pool,
        consumes=DECODED,
        produces=WHISPER_OUTPUT,
        kwargs={"config": config, **kwargs},
        accelerator_type=job.opts.accelerator_type,
        calls_per_actor=job.calls_per_actor,
        rows_per_call=job.items_per_call,
        cost=Cost(
            "transcribe",
            "asr",
            resource=model_resource(whisper.resource, at.device),
            # Model workers share the actor: each batch holds its share of it.
            units=whisper.units / max(1, whisper.model_workers),
            timed_by_worker=True,  # a batch's time, shared by its recordings' audio
        ),
    )


def redact_stage(job: TranscribeJob, pool: sizing.Pool, **kwargs: Any) -> Stage:
    """``redaction.redact_batch`` as CPU tasks on each finished Whisper call, before its
    commit; ``kwargs``: its storage arguments."""
    opts, output = job.opts, storage.resolve(job.spec.job.output)
    return Stage(
        "redact",
        redaction.redact_batch,
        consumes=TRANSCRIPTS,
        produces=TRANSCRIPTS,
        placement="after",
        kwargs={
            "types": tuple(opts.redact),
            "run_id": job.run_id,
            "unredacted": output.join(redaction.UNREDACTED_DATASET)
            if opts.keep_unredacted
            else None,
            "audio": output.join(redaction.AUDIO_FOLDER) if opts.redact_audio else None,
            "max_bytes": int(opts.max_file_mb * 2**20),
            **kwargs,
        },
        num_cpus=pool.task_cpus,
        cost=Cost("redact", "redact", units=pool.task_cpus, timed_by_worker=True),
    )


@dataclass(kw_only=True)
class TranscribePrepared(Prepared):
    model: preflight.WhisperModelRef  # the checked model: its local copy, its mel bins


class TranscribeJob(Job[TranscribePrepared]):
    """Recordings → transcripts: decode tasks, the Whisper actor pool, redaction after it."""

    kind = "transcribe"
    dataset = "transcripts"
    schema = TRANSCRIPTS
    slim = _SLIM
    load_errors = (ModelLoadError,)
    pacing_options = frozenset(
        {
            "device",
            "batch_size",
            "encoder_batch_size",
            "items_per_call",
            "calls_per_actor",
            "fetch_timeout_s",
            "decode_timeout_s",
            "accelerator_type",
            "resource",
        }
    )

    def __init__(self, spec: JobSpec):
        super().__init__(spec)
        self.opts = opts = spec.transcribe
        self.device = opts.device
        # Small calls, many in flight: the model starts as soon as one decode task is done,
        # and its batches are filled from every call in flight (workers.whisper's batcher).
        self.items_per_call = opts.items_per_call or 8
        self.calls_per_actor = opts.calls_per_actor or min(
            64, -(-4 * opts.batch_size // self.items_per_call)
        )
        self.rows_per_block = max(1, min(8, self.items_per_call))
        if opts.keep_unredacted:
            self.side_datasets = [(redaction.UNREDACTED_DATASET, TRANSCRIPTS_UNREDACTED)]

    def prepare(self, dry: bool) -> TranscribePrepared:
        """``dry``: the model is checked as a cluster run checks it (the cache, else the hub's
        metadata), never downloaded."""
        job = self.spec.job
        if self.opts.redact:
            preflight.require_extra("redact", "redaction (redact / --redact)")
        if self.opts.diarize:
            preflight.speaker_encoder()
        preflight.check_output(job.output)
        download = not dry and on_ray.local_run(job.ray_address)
        model = preflight.whisper_model(self.opts.model, download=download, progress=job.progress)
        selection = Selection.of(MEDIA_EXTENSIONS, "media", job.include, job.exclude)
        listing = select_items(job.input, selection, output=job.output)
        with_channel_labels(listing.items, self.opts.channel_labels)
        announce(listing.items, self.opts, job.progress)
        return TranscribePrepared(
            listing.items, listing.skipped, listing.skipped_examples, model=model
        )

    def pool(self, device: str, nodes: list[sizing.Node]) -> sizing.Pool:
        return whisper_pool(self.opts, device, nodes)

    def describe(self, pool: sizing.Pool) -> str:
        return pool.describe("Whisper", "decode")

    def stages(self, at: Resolved, prepared: TranscribePrepared) -> Build:
        opts = self.opts
        whisper = whisper_options(opts, at.device, at.pool)
        engine = resolve_engine(whisper.engine)
        audio = audio_options(opts, prepared.model.feature_size, engine, at.device)
        extra = tuple(sorted((f"audio.{k}", v) for k, v in asdict(audio).items()))
        diarize = diarize_options(opts)
        if diarize is not None:
            extra += tuple(sorted((f"diarize.{k}", v) for k, v in asdict(diarize).items()))
        config = WhisperWorkerConfig(
            whisper=whisper, extra_options=extra, speaker_roles=tuple(opts.speaker_roles or ())
        )
        held = {"storage_config": storage.StorageConfig.from_env()}
        within = self.spec.job.allowed_input_prefixes
        stages = [
            decode_stage(opts, audio, at.pool, allowed_input_prefixes=within, **held),
            whisper_stage(self, config, at, local_copy=prepared.model.path, **held),
            *([redact_stage(self, at.pool, **held)] if opts.redact else []),
        ]
        shape = {"items_per_call": self.items_per_call, "calls_per_actor": self.calls_per_actor}
        return Build(
            stages,
            model_units=whisper.units,
            options={**opts.model_dump(), **shape},
            model_resource=whisper.resource,
        )

    def summarize(self, rows: list[dict[str, Any]], prepared: TranscribePrepared) -> dict[str, Any]:
        return {
            "input": storage.scrub_secrets(self.spec.job.input),
            "model": self.opts.model,
            "speech_seconds": round(sum(r["speech_s"] or 0.0 for r in rows), 3),
            "no_speech": sum(1 for r in rows if r["status"] == "ok" and not (r["speech_s"] or 0)),
            "skipped": prepared.skipped,
            "skipped_examples": prepared.skipped_examples,
            "language_mismatch": sum(1 for r in rows if r.get("language_mismatch")),
            # Transcripts with a segment the decoder looped on at every temperature: stored
            # with the repetition cut and marked (`degenerate`), not clean text.
            "degenerate": sum(1 for r in rows if r.get("degenerate")),
            # Items decoded with their manifest's initial_prompt/hotwords (each row's
            # `options` holds the values); the job's own are in `options`.
            "items_with_own_prompt": sum(
                1 for r in prepared.records if r.get("initial_prompt") or r.get("hotwords")
            ),
            **({"redacted_entities": _entity_counts(rows)} if self.opts.redact else {}),
        }


def run_transcribe(spec: JobSpec) -> dict[str, Any]:
    """Run the job; returns the run summary (also written to OUTPUT/runs/<run_id>.json)."""
    return runner.run(TranscribeJob(spec))


def _say(message: str) -> None:
    console.event("notice", message)


def _entity_counts(rows: list[dict[str, Any]]) -> dict[str, int]:
    """Entities redacted in this run, by type (counts only: the summary never holds text)."""
    counts: dict[str, int] = {}
    for row in rows:
        for entity in row.get("entities") or []:
            counts[entity["type"]] = counts.get(entity["type"], 0) + 1
    return dict(sorted(counts.items()))
