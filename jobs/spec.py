"""The job spec: one validated, documented, immutable model.

Precedence: defaults < job file (TOML or YAML) < command-line flags. Every field carries its
documentation in ``Field(description=...)``; ``overnight config`` prints the reference.
Validation happens once, here, and its messages name the field, the value and the fix.
"""

from __future__ import annotations

import copy
import difflib
import json
import math
import re
import secrets
import tomllib
from collections.abc import Mapping
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from overnight.jobs.config_model import ConfigModel, config_error, reject_boolean_numbers
from overnight.jobs.errors import ConfigError
from overnight.schemas.errors import ERROR_CODES
from overnight.workers.llm.engine_options import EngineOptions
from overnight.workers.whisper_options import DecodingOptions

# USD per hour for one unit (one GPU, or one CPU core). Sources, December 2026:
# H100: the price the product is sized against (GPU clouds list $2.7-4/h; AWS p5 ~$6.88/h);
# CPU: AWS c7i on-demand, us-east-1, $0.0425 per vCPU-hour (c7i.large: $0.085/h, 2 vCPU).
DEFAULT_PRICES: dict[str, float] = {
    "cpu": 0.0425,
    "h100": 2.69,
    "h200": 3.50,
    "a100": 1.79,
    "l4": 0.80,
    "a10g": 1.01,
    "t4": 0.53,
    "gpu": 2.69,
}


_Model = ConfigModel

_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


RAY_ADDRESS_FORMS = "HOST:PORT (the head node's GCS port, 6379 by default), ray://HOST:PORT or auto"


def _comma_list(value: Any) -> Any:
    """A list field given as one text, as its flag takes it (``channel_labels = "agent,customer"``
    as ``--channel-labels agent,customer``): split at commas. It was "Input should be a valid
    list" for these, while ``redact = "pci,ssn"`` was read."""
    return value.split(",") if isinstance(value, str) else value


def _one_item_list(value: Any) -> Any:
    """A list field whose entries may hold commas (a glob, a phrase), given as one text: that
    text is the one entry."""
    return [value] if isinstance(value, str) else value


def ray_host_port(address: str | None) -> tuple[str, int] | None:
    """The host and port of a Ray address (``HOST:PORT`` or ``ray://HOST:PORT``); None for
    none, ``auto`` or ``local`` (Ray's to resolve); ``ValueError`` for any other form."""
    if not address or address in ("auto", "local"):
        return None
    if address.startswith(("http://", "https://")):
        # The dashboard's URL, which ``overnight submit`` takes: read as HOST:PORT it was
        # "cannot reach the Ray cluster at 'http://...' (Name or service not known)".
        raise ValueError(
            f"is the Ray Jobs API (dashboard) address: a run joins a cluster at {RAY_ADDRESS_FORMS}; "
            "to run the job on the cluster from here, use `overnight submit JOBFILE --address "
            f"{address}`"
        )
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not (sep and host and port.isdigit() and 0 < int(port) < 65536):
        raise ValueError(f"is not {RAY_ADDRESS_FORMS}")
    return host.strip("[]"), int(port)


class TranscribeOptions(DecodingOptions):
    """``[transcribe]``: speech recognition. The model and decoding fields are
    ``workers.whisper_options.DecodingOptions`` (declared there once, passed to the worker as
    they are); the fields below shape decoding, the pool and the run."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, populate_by_name=True, allow_inf_nan=False
    )

    @field_validator("*", mode="before")
    @classmethod
    def no_boolean_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        return reject_boolean_numbers(cls, value, info)

    chunk_length_s: int = Field(
        30, ge=5, le=30, description="longest chunk of speech fed to the model"
    )
    vad: bool = Field(
        True, description="Silero VAD: skip silence, and never hallucinate text on noise"
    )
    vad_threshold: float = Field(0.5, gt=0, lt=1, description="speech probability threshold")
    vad_min_silence_ms: int = Field(
        2000, ge=0, description="silence that splits speech (plain faster-whisper's default)"
    )
    vad_min_silence_split_ms: int = Field(
        160,
        ge=0,
        description="the same on split-channel calls, where pauses must split clips well "
        "below turn_gap_s for the dialogue to come back in order",
    )
    vad_speech_pad_ms: int = Field(400, ge=0, description="padding kept around speech")
    split_channels: bool = Field(
        False, description="transcribe each channel separately (stereo call recordings)"
    )
    channel_labels: list[str] | None = Field(
        None,
        description="speaker names of the channels in order, e.g. ['agent', 'customer'] "
        "(--channel-labels agent,customer); implies split_channels. A manifest's "
        "`channel_labels` column wins per item",
    )
    max_channels: int = Field(
        8,
        ge=1,
        le=64,
        description="split channels: more channels fail with error_code=too_many_channels "
        "(each channel is decoded, searched for speech and transcribed on its own)",
    )
    turn_gap_s: float = Field(
        1.0,
        gt=0,
        description="split channels: a pause this long on one channel ends a dialogue turn",
    )
    max_duration_s: float = Field(
        4 * 3600, gt=0, description="longer recordings fail with error_code=too_long"
    )
    max_file_mb: float = Field(
        2048, gt=0, description="larger files fail with error_code=too_large"
    )
    fetch_timeout_s: float = Field(
        600, gt=0, description="reading one object longer fails with error_code=fetch_timeout"
    )
    decode_timeout_s: float = Field(
        900,
        gt=0,
        description="decode, VAD and features of one recording longer fail with "
        "error_code=decode_timeout",
    )
    cpu_threads: int = Field(
        0,
        ge=0,
        description="CTranslate2 threads per model worker on CPU (0: the actor's cores / model_workers)",
    )
    model_workers: int = Field(
        0,
        ge=0,
        description="model batches an actor runs at once (0: on CPU one per core it holds, "
        "on a GPU 1); on CPU several one-thread workers outrun one multi-thread worker",
    )
    actors: int | None = Field(
        None,
        ge=1,
        description="Whisper actors, one model each (unset: auto, one per GPU, or one per "
        "CPU-only node; see jobs/run/sizing.py)",
    )
    gpus_per_actor: float | None = Field(
        None, ge=0, description="GPUs per actor; default 1 when device is cuda, else 0"
    )
    cpus_per_actor: float | None = Field(
        None,
        gt=0,
        description="CPU cores reserved per Whisper actor (unset: auto, 1 on a GPU node; on "
        "a CPU-only node its cores less max(0.5, cores/8) for decoding)",
    )
    decode_cpus: float | None = Field(
        None, gt=0, description="CPU cores per decode task (unset: 0.25 on CPU, 0.5 on GPU nodes)"
    )
    items_per_call: int = Field(
        0, ge=0, description="recordings per actor call; 0: 8 (one decode task's output)"
    )
    calls_per_actor: int = Field(
        0,
        ge=0,
        le=64,
        description="actor calls in flight at once; the worker fills each model batch from "
        "all of them, so the model starts on the first decoded recordings (0: enough calls "
        "for 4 model batches)",
    )
    accelerator_type: str | None = Field(
        None, description="Ray accelerator type for actors, e.g. H100"
    )
    resource: str | None = Field(
        None, description="price-table key of what an actor holds; default detected"
    )

    redact: list[str] = Field(
        default_factory=list,
        description="entity types replaced by [TYPE] tags in text, segments and words, "
        "e.g. ['card_number', 'ssn'] or a preset: 'pci' (card_number, cvv, expiry, "
        "bank_account), 'all' (also ssn, phone, email, person, address, date_of_birth). "
        "Found entities go to `entities`; nothing unredacted is written (see "
        "keep_unredacted). Turns word_timestamps on unless it is set to false",
    )
    keep_unredacted: bool = Field(
        False,
        description="redact: also write the original text and segments to "
        "OUTPUT/transcripts_unredacted/, apart, for storage policy to guard",
    )
    redact_audio: bool = Field(
        False,
        description="redact: write each recording again under OUTPUT/redacted_audio/ with "
        "every redacted word's time range silenced (FLAC; same channels and sample rate)",
    )

    diarize: bool = Field(
        False,
        description="mono recordings: find who spoke when (speaker embeddings of the speech, "
        "clustered), give every word its speaker, split segments where the speaker changes, "
        "write the text as dialogue and fill `analytics`. Split-channel calls are left as "
        "they are (a channel is a speaker); a one-channel recording in a job that splits "
        "channels is diarized. Turns word_timestamps on, which it needs (word_timestamps = "
        "false with it is refused)",
    )
    speakers: int | None = Field(
        None,
        ge=1,
        le=16,
        description="diarize: exactly this many speakers (min_speakers and max_speakers, "
        "which bound the estimate, then do not apply); default: estimated",
    )
    min_speakers: int = Field(1, ge=1, le=16, description="diarize: at least this many speakers")
    max_speakers: int = Field(
        8,
        ge=1,
        le=16,
        description="diarize: at most this many speakers (the estimate prefers 2, a "
        "contact-center call, unless another count is clearly better)",
    )
    speaker_roles: list[str] | None = Field(
        None,
        description="diarize: names for the speakers in the order they first speak, e.g. "
        "['agent', 'customer'] (the agent greets first); default SPEAKER_00, SPEAKER_01, ...",
    )

    _names_as_text = field_validator("channel_labels", "speaker_roles", mode="before")(
        classmethod(lambda cls, value: _comma_list(value))
    )

    @field_validator("channel_labels", "speaker_roles")
    @classmethod
    def _distinct_names(cls, value: list[str] | None) -> list[str] | None:
        from overnight.workers.analytics import speaker_names_problem

        if value is None:
            return None
        problem = speaker_names_problem(value)
        if problem:
            raise ValueError(problem)
        return [name.strip() for name in value] or None

    @field_validator("redact", mode="before")
    @classmethod
    def _known_types(cls, value: Any) -> Any:
        from overnight.workers.redact.types import resolve_types

        if value is None:
            return []
        names = value.split(",") if isinstance(value, str) else list(value)
        if names and not any(str(n).strip() for n in names):
            # "" or [""], as an unset variable gives: redaction was silently off.
            raise ValueError(
                "names no entity type (an unset variable?): give types such as pci,ssn or "
                "all, or leave redact out for none"
            )
        return list(resolve_types(names))

    @model_validator(mode="before")
    @classmethod
    def _labels_split_channels(cls, data: Any) -> Any:
        # Labels name channels, so a job that gives them transcribes the channels apart; the
        # recorded options say so too.
        if isinstance(data, dict) and data.get("channel_labels"):
            data = {**data, "split_channels": True}
        # Redaction times its entities (and silences audio) by words; call analytics of a
        # split-channel call are finer with words than with segments. An explicit false wins.
        if (
            isinstance(data, dict)
            and data.get("word_timestamps") is None
            and (data.get("redact") or data.get("split_channels") or data.get("diarize"))
        ):
            data = {**data, "word_timestamps": True}
        return data

    @model_validator(mode="after")
    def _redaction_needs(self) -> TranscribeOptions:
        if (self.keep_unredacted or self.redact_audio) and not self.redact:
            raise ValueError(
                "keep_unredacted and redact_audio need `redact` (e.g. redact = ['pci'] or "
                "--redact pci): without it nothing is redacted"
            )
        if self.redact_audio and not self.word_timestamps:
            raise ValueError(
                "redact_audio silences the redacted words' time ranges: it needs "
                "word_timestamps = true"
            )
        if self.diarize and not self.word_timestamps:
            # Speakers are given word by word: without word timings the whole call came out
            # as one turn of one speaker, silently wrong (text redaction alone, which falls
            # back to segment timings, keeps working without them).
            raise ValueError(
                "diarize gives every word its speaker: it needs word_timestamps = true (leave "
                "word_timestamps out and diarize turns it on), or leave diarize out"
            )
        if self.min_speakers > self.max_speakers:
            raise ValueError(
                f"min_speakers = {self.min_speakers} is more than max_speakers = "
                f"{self.max_speakers}"
            )
        if (self.speakers or self.speaker_roles) and not self.diarize:
            raise ValueError(
                "speakers and speaker_roles are options of `diarize` (diarize = true or "
                "--diarize): without it no speakers are found"
            )
        fields = type(self).model_fields
        bounds = [
            name
            for name in ("min_speakers", "max_speakers")
            if getattr(self, name) != fields[name].default
        ]
        if bounds and not self.diarize:
            # Accepted and recorded in the run's options, they changed nothing.
            raise ValueError(
                f"{' and '.join(bounds)} {'are options' if len(bounds) > 1 else 'is an option'} "
                "of `diarize` (diarize = true or --diarize): without it no speakers are found"
            )
        return self


# A [process] field read by one task alone: (field, task, how the user gave it).
_TASK_SETTINGS = (
    ("labels", "classify", "labels (--labels)"),
    ("schema_", "extract", "schema (--schema)"),
    ("prompt", "prompt", "prompt (--prompt)"),
    ("required_phrases", "compliance", "required_phrases"),
)


class ProcessOptions(EngineOptions):
    """``[process]``: documents and transcripts through an LLM. The engine fields are
    ``workers.llm.engine_options.EngineOptions`` (declared there once, passed to the worker as
    they are); the fields below choose the task, the pool and the run."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, populate_by_name=True, allow_inf_nan=False
    )

    @field_validator("*", mode="before")
    @classmethod
    def no_boolean_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        return reject_boolean_numbers(cls, value, info)

    task: str | list[str] = Field(
        "summarize",
        description="a task of workers.llm.tasks.registry.TASKS (listed below); a list runs "
        "each (one result row per document and task)",
    )
    schema_: dict[str, Any] | str | None = Field(
        None,
        alias="schema",
        description="extract: the fields as a JSON schema (a table, or a path to a .json file)",
    )
    labels: list[str] = Field(
        default_factory=list,
        description="classify: the label set, each label named (a job without the classify "
        "task refuses labels: no other task reads them, disposition has its own)",
    )
    prompt: str | None = Field(
        None, description="prompt: a template with {text} and metadata fields, or a path to one"
    )
    instructions: str = Field("", description="trusted guidance added to the system prompt")
    summary_words: int = Field(
        100,
        ge=5,
        description="summarize: target length in words (call_summary: 80 unless this is set)",
    )
    required_phrases: list[str] = Field(
        default_factory=list, description="compliance: phrases the agent must say"
    )
    max_new_tokens: int | None = Field(
        None,
        ge=1,
        description="cap on generated tokens per call (None: the task's own); one that leaves "
        "a document no room in the model's context is refused before any document",
    )
    actors: int | None = Field(
        None,
        ge=1,
        description="LLM actors, one model each (unset: auto, one per GPU, or one per "
        "CPU-only node; see jobs/run/sizing.py)",
    )
    gpus_per_actor: float | None = Field(None, ge=0, description="default 1 on cuda, else 0")
    cpus_per_actor: float | None = Field(
        None,
        gt=0,
        description="CPU cores reserved per LLM actor (unset: auto, 1 on a GPU node; on a "
        "CPU-only node its cores less max(0.5, cores/8) for text extraction)",
    )
    cpu_threads: int = Field(
        0, ge=0, description="ctranslate2 threads on CPU (0: one per core held)"
    )
    extract_cpus: float | None = Field(
        None,
        gt=0,
        description="CPU cores per text-extraction task (unset: 0.25 on CPU, 0.5 on GPU nodes)",
    )
    extract_timeout_s: float = Field(
        60.0, gt=0, description="per-document extraction limit → extract_timeout"
    )
    extract_memory_mb: int = Field(
        2048,
        ge=64,
        description="memory the extractor child may add for one document → too_large",
    )
    max_file_mb: float = Field(256, gt=0, description="larger files → too_large")
    max_chars: int = Field(2_000_000, ge=1, description="longer extracted text → too_large")
    json_text_field: str = Field("text", description=".json/.jsonl: the field holding the text")
    pdf_password_env: str = Field(
        "OVERNIGHT_PDF_PASSWORD",
        description="environment variable holding the password for encrypted PDFs",
    )
    items_per_call: int | None = Field(
        None,
        ge=1,
        description="documents per actor call, each call committed when it ends "
        "(None: 4 with vllm, 64 with ctranslate2)",
    )
    calls_per_actor: int | None = Field(
        None,
        ge=1,
        description="calls each LLM actor runs at once, their requests batched together by "
        "vLLM's scheduler (None: 32 with vllm; ctranslate2 runs one)",
    )
    accelerator_type: str | None = Field(
        None, description="Ray accelerator type for actors, e.g. H100"
    )
    resource: str | None = Field(
        None, description="price-table key of what an actor holds; default detected"
    )

    @property
    def call_shape(self) -> tuple[int, int]:
        """(documents per call, calls in flight per actor). With vLLM, many small calls: a
        call commits when its slowest document is done, so a long document holds back only
        the few documents of its own call, while the engine still batches every request of
        every call in flight. CTranslate2 batches within one call only."""
        if self.backend == "vllm":
            return self.items_per_call or 4, self.calls_per_actor or 32
        return self.items_per_call or 64, 1

    @property
    def tasks(self) -> list[str]:
        return [self.task] if isinstance(self.task, str) else list(self.task)

    @field_validator("task")
    @classmethod
    def _known_tasks(cls, task: str | list[str]) -> str | list[str]:
        from overnight.workers.llm.tasks.registry import TASK_NAMES  # only to validate

        for name in [task] if isinstance(task, str) else task:
            if name not in TASK_NAMES:
                raise ValueError(f"unknown task {name!r}; use one of {', '.join(TASK_NAMES)}")
        return task

    _labels_as_text = field_validator("labels", mode="before")(
        classmethod(lambda cls, value: _comma_list(value))
    )
    _phrases_as_text = field_validator("required_phrases", mode="before")(
        classmethod(lambda cls, value: _one_item_list(value))
    )

    @field_validator("labels")
    @classmethod
    def _named_labels(cls, labels: list[str]) -> list[str]:
        # An empty label (a doubled or trailing comma, an unset variable) was dropped without
        # a word, and the job classified into a set nobody wrote.
        for position, label in enumerate(labels, start=1):
            if not label.strip():
                raise ValueError(
                    f"label {position} is empty (a doubled or trailing comma?): name every "
                    "label, e.g. billing,support"
                )
        return [label.strip() for label in labels]

    @model_validator(mode="after")
    def _settings_need_their_task(self) -> ProcessOptions:
        # Each of these is read by one task alone: with summarize alone, labels, a schema or
        # a prompt were ignored without a word (disposition classifies into its own six).
        for field, task, option in _TASK_SETTINGS:
            if getattr(self, field) and task not in self.tasks:
                raise ValueError(
                    f"{field.rstrip('_')} applies to the {task} task only, and this job's "
                    f"tasks ({', '.join(self.tasks)}) do not use it: add {task} to the tasks "
                    f"(--task {task}) or leave {option} out"
                )
        return self

    @model_validator(mode="after")
    def _gpu_share_fits(self) -> ProcessOptions:
        # vLLM takes gpu_memory_utilization of the whole card whatever share Ray gave the
        # actor: two actors of 0.5 GPU at 0.9 each would ask for 180% of its memory.
        share = self.gpus_per_actor
        if (
            self.backend == "vllm"
            and share is not None
            and 0 < share < 1
            and self.gpu_memory_utilization > share
        ):
            raise ValueError(
                f"gpus_per_actor={share} with gpu_memory_utilization="
                f"{self.gpu_memory_utilization}: vLLM would take more of the GPU than the "
                f"actor's share; set gpu_memory_utilization to at most {share * 0.9:.2f}"
            )
        return self


class RunOptions(_Model):
    """``[job]``: where, and as what."""

    kind: Literal["transcribe", "process", "chain", "probe"] = Field(
        "transcribe",
        description="which job (probe: read each recording's container header into probes/)",
    )
    input: str = Field(
        ...,
        description="folder, file, URL prefix (s3://, gs://, file://) or manifest (.csv, .jsonl, .parquet)",
    )
    output: str = Field(..., description="folder or URL prefix for transcripts/, costs/, runs/")
    run_id: str | None = Field(
        None,
        description="default: <kind>-<UTC time>-<random>; set it for deterministic scheduled "
        "runs: 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit",
    )
    run_date: date | None = Field(
        None,
        description="the run's logical date (YYYY-MM-DD): the run_date= partition of its "
        "rows in transcripts/, results/, costs/ and run_table/; default: today (UTC). Set it "
        "for backfills",
    )
    ray_address: str | None = Field(
        None, description="join this Ray cluster; default: start a local one"
    )
    max_items: int | None = Field(
        None, ge=1, description="process at most this many pending items (samples, tests)"
    )
    max_error_rate: float | None = Field(
        None,
        ge=0,
        le=1,
        description="fail the run (exit 12) when more than this share of its items ended as "
        "error rows; the rows and the summary are written first. Default: never",
    )
    retry_errors: list[str] | None = Field(
        None,
        description="redo the listed items whose committed row is an error with one of these "
        "codes (['all']: any code), e.g. ['encrypted'] once the PDF password is set, or "
        "['fetch_failed', 'worker_crashed'] after an outage; their error rows and done-index "
        "entries go, the new rows replace them (the cost rows of the failed tries stay: that "
        "work was done). Default: error rows count as done",
    )
    notify: str | None = Field(
        None,
        description="http(s) URL to POST a JSON note to when the run ends: its summary, or "
        "the error and exit status of a run that stopped (no transcript text, credentials "
        "scrubbed; the URL itself is never printed). A few tries within 20 s; never fails the "
        "run",
    )

    @field_validator("ray_address")
    @classmethod
    def _ray_address_form(cls, value: str | None) -> str | None:
        # ray.init raised "Unable to parse port number" in a traceback, after the claim.
        ray_host_port(value)
        return value

    @field_validator("input", "output")
    @classmethod
    def _not_empty(cls, value: str) -> str:
        # An unset template variable gives "", which read as the working directory: a run
        # wrote its datasets into it, or transcribed every recording under it.
        if not value.strip():
            raise ValueError(
                "is empty (an unset variable?): give a folder, file or URL prefix; '.' for "
                "the working directory"
            )
        return value

    progress: bool = Field(True, description="print progress lines while running")
    verbose: bool = Field(
        False,
        description="also show Ray's own log lines on the terminal (they are always in Ray's "
        "session logs under /tmp/ray)",
    )
    include: list[str] | None = Field(
        None,
        description="folder/prefix inputs: take the files these globs match (path under the "
        "input or file name, case-insensitive; '*': every file); default: the job's known "
        "extensions (transcribe: audio and video, process: documents). Manifest rows are "
        "always items",
    )
    exclude: list[str] | None = Field(
        None, description="folder/prefix inputs: leave out the files these globs match"
    )
    allowed_input_prefixes: list[str] | None = Field(
        None,
        description="read no local file whose real path, checked on the opened file, lies "
        "outside these folders (tenant submissions set their tenant's); others: fetch_failed",
    )

    @field_validator("run_id")
    @classmethod
    def _safe_run_id(cls, run_id: str | None) -> str | None:
        # The run id names files and folders (runs/<id>.json, _manifests/, the run's staging
        # folder): a '/' made a nested staging folder that publish never read, '' staged
        # into the date's folder itself, and '../x' wrote outside OUTPUT.
        if run_id is not None and not _RUN_ID.fullmatch(run_id):
            raise ValueError(
                "a run id names the run's files under OUTPUT, so it must be 1-128 letters, "
                "digits, '.', '_' or '-', starting with a letter or digit (no '/', no spaces, "
                "not empty: an unset template variable gives an empty one); e.g. "
                "nightly-2026-12-06"
            )
        return run_id

    @field_validator("notify")
    @classmethod
    def _http_url(cls, url: str | None) -> str | None:
        if url is not None and not re.match(r"https?://[^/\s]+", url):
            # The value itself is not repeated: a webhook URL carries its token.
            raise ValueError("notify must be an http:// or https:// URL")
        return url

    _codes_as_text = field_validator("retry_errors", mode="before")(
        classmethod(lambda cls, value: _comma_list(value))
    )
    _globs_as_text = field_validator("include", "exclude", mode="before")(
        classmethod(lambda cls, value: _one_item_list(value))
    )

    @field_validator("retry_errors")
    @classmethod
    def _known_codes(cls, codes: list[str] | None) -> list[str] | None:
        if codes is None:
            return None
        codes = [c.strip() for c in codes if c.strip()]
        unknown = [c for c in codes if c != "all" and c not in ERROR_CODES]
        if unknown or not codes:
            raise ValueError(
                (f"unknown error code(s) {unknown}" if unknown else "no error code given")
                + f"; use 'all' or codes of: {', '.join(ERROR_CODES)}"
            )
        return ["all"] if "all" in codes else codes


class JobSpec(_Model):
    job: RunOptions
    transcribe: TranscribeOptions = TranscribeOptions()
    process: ProcessOptions = ProcessOptions()
    prices: dict[str, float] = Field(
        default_factory=lambda: dict(DEFAULT_PRICES), description="USD per hour per unit"
    )

    @field_validator("prices")
    @classmethod
    def _prices_complete(cls, prices: dict[str, float]) -> dict[str, float]:
        merged = {**DEFAULT_PRICES, **prices}
        bad = {k: v for k, v in merged.items() if not math.isfinite(v) or v < 0}
        if bad:
            # NaN passed "< 0" and came out as NaN costs, and as JSON no parser reads.
            raise ValueError(f"prices must be finite and >= 0, got {bad}")
        return merged

    @model_validator(mode="after")
    def _prices_known(self) -> JobSpec:
        from overnight.workers.devices import GPU_KINDS

        # A typo (cpuu) priced nothing and left the default in place, without a word.
        named = {r for r in (self.transcribe.resource, self.process.resource) if r}
        known: set[str] = {*DEFAULT_PRICES, *GPU_KINDS, *named}
        unknown = sorted(set(self.prices) - known)
        if unknown:
            hint = difflib.get_close_matches(unknown[0], sorted(known), n=1)
            raise ValueError(
                f"prices: no resource {unknown[0]!r}"
                + (f" (did you mean {hint[0]!r}?)" if hint else "")
                + ": a price names cpu, gpu, a GPU kind (h100, l40s, ...) or the resource a "
                "job's `resource` option names"
            )
        return self

    @model_validator(mode="after")
    def _run_id(self) -> JobSpec:
        if self.job.run_id is None:
            stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
            object.__setattr__(
                self,
                "job",
                self.job.model_copy(
                    update={"run_id": f"{self.job.kind}-{stamp}-{secrets.token_hex(3)}"}
                ),
            )
        return self

    @property
    def run_id(self) -> str:
        assert self.job.run_id is not None  # set by the validator
        return self.job.run_id


def _deep_merge(base: dict, over: dict) -> dict:
    """``over`` wins; its None values mean "not given" at any depth."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if value is None:
            continue
        if isinstance(value, dict):
            current = out.get(key)
            out[key] = _deep_merge(current if isinstance(current, dict) else {}, value)
        else:
            out[key] = copy.deepcopy(value)
    return out


# The section a kind's own options go to; a probe has none ([job] holds what all share).
_KIND_SECTIONS: dict[str, tuple[str, type[BaseModel]]] = {
    "transcribe": ("transcribe", TranscribeOptions),
    "process": ("process", ProcessOptions),
    "chain": ("process", ProcessOptions),
}


def overrides(
    kind: str | None,
    options: Mapping[str, Any],
    *,
    input: str | None = None,
    output: str | None = None,
    who: str,
) -> dict[str, Any]:
    """``build_spec``'s overrides from options named as the spec's fields, the one way the
    command line (its flags) and the Python API (its keyword arguments) build them: a field
    of ``[job]`` goes there, a field (or alias) of the kind's section to that section,
    ``prices`` to ``[prices]``; None is "not given". Without a ``kind`` only ``[job]``
    fields are known (``overnight run``: the job file names the kind). An unknown name is a
    ``ConfigError`` from ``who`` that suggests the closest field."""
    known = {name: "job" for name in RunOptions.model_fields}
    for name in ("kind", "input", "output"):  # the arguments, not options
        del known[name]
    if kind in _KIND_SECTIONS:
        section, model = _KIND_SECTIONS[kind]
        for name, field in model.model_fields.items():
            known[name] = known[field.alias or name] = section
    sections: dict[str, Any] = {"job": {"kind": kind, "input": input, "output": output}}
    for name, value in options.items():
        if name == "prices":
            if not isinstance(value, Mapping):  # dict(1.0) was a TypeError
                raise ConfigError(
                    f"{who}: prices must be a mapping of the [prices] fields "
                    f"(prices={{'h100': 2.69, 'cpu': 0.0425}}: USD per hour per unit), got {value!r}"
                )
            sections["prices"] = dict(value)
            continue
        if name not in known:
            close = difflib.get_close_matches(name, list(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{who} has no option {name!r}{hint}")
        sections.setdefault(known[name], {})[name] = value
    return sections


def read_job_file(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read job file {str(path)!r}: {exc.strerror}") from None
    # By suffix, any case: a .json or .YAML file was parsed as TOML, and the message named
    # the format it was not read as.
    kind = {".yaml": "YAML", ".yml": "YAML", ".json": "JSON"}.get(path.suffix.lower(), "TOML")
    try:
        if kind == "YAML":
            import yaml

            data = yaml.safe_load(text) or {}
        elif kind == "JSON":
            data = json.loads(text)
        else:
            data = tomllib.loads(text)
    except Exception as exc:
        raise ConfigError(f"job file {str(path)!r} is not valid {kind}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"job file {str(path)!r} must hold a table of sections ([job], [transcribe], ...)"
        )
    return data


def build_spec(
    file_data: dict[str, Any] | None = None, overrides: dict[str, Any] | None = None
) -> JobSpec:
    """Validate defaults < file < overrides into a JobSpec; never mutates its arguments."""
    merged = _deep_merge(file_data or {}, overrides or {})
    try:
        return JobSpec.model_validate(merged)
    except ValidationError as exc:
        raise config_error(exc, "invalid job spec", "(job)") from None


def reference() -> str:
    """The config reference, generated from the models' field descriptions."""
    lines = []
    for section, model in (
        ("job", RunOptions),
        ("transcribe", TranscribeOptions),
        ("process", ProcessOptions),
    ):
        lines.append(f"[{section}]")
        for name, field in model.model_fields.items():
            default = (
                "required"
                if field.is_required()
                else repr(field.get_default(call_default_factory=True, validated_data={}))
            )
            lines.append(f"  {field.alias or name} = {default}  # {field.description}")
        lines.append("")
    from overnight.workers.llm.tasks.registry import TASK_NAMES

    lines.append(f"[process] tasks: {', '.join(TASK_NAMES)}")
    lines.append("")
    lines.append("[prices]  # USD per hour per unit; defaults:")
    lines.extend(f"  {k} = {v}" for k, v in DEFAULT_PRICES.items())
    return "\n".join(lines)
