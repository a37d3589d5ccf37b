"""The Whisper worker's options, declared once: the job spec's ``[transcribe]`` section
inherits ``DecodingOptions`` (``jobs.spec.TranscribeOptions``), and the worker takes them as
they are plus what the job resolved for the actor (``WhisperOptions``). Adding a decoding
option is one field here plus its use in ``workers.whisper``.

Light on purpose (pydantic only): the spec, and so every command, imports it; the engine
(faster-whisper, CTranslate2, PyAV) loads only in ``workers.whisper``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from overnight.workers.devices import CT2_COMPUTE_TYPES, Device
from overnight.workers.whisper_models import (
    BUNDLED_MODEL,
    WHISPER_ENGINES,
    WhisperEngine,
    WhisperTask,
)

__all__ = [
    "WHISPER_ENGINES",
    "DecodingOptions",
    "WhisperEngine",
    "WhisperOptions",
    "resolve_engine",
]


_TORCH_TYPES = ("auto", "float32", "float16", "bfloat16")
# Any of CTranslate2's compute types, or its own defaults.
_CT2_TYPES = ("auto", "default", *CT2_COMPUTE_TYPES)


def resolve_engine(engine: str) -> str:
    """The engine that runs: ``auto`` is ``ctranslate2``."""
    return "ctranslate2" if engine == "auto" else engine


def english_only(model: str) -> bool:
    """Whether a model reference names an English-only Whisper (``tiny.en``, ``org/x.en``,
    ``bundled:tiny.en``): known from the name, before any model is loaded. The worker checks
    the loaded model too (``is_multilingual``), for folders named otherwise."""
    return model.rstrip("/").lower().endswith(".en")


# Models whose decoder is a few layers deep (large-v3-turbo: 4, distil-large-v3: 2).
_LIGHT_DECODER_MARKERS = ("turbo", "distil")


def gpu_model_workers(model: str) -> int:
    """Model workers per GPU when the job leaves it to ``auto``: 2 for a light-decoder model,
    else 1. Measured on an H200 with ``scripts/gpu_check_whisper.py`` (random weights, 96
    tokens per 30 s chunk, beam 5): two workers ran large-v3-turbo's shape 1.09-1.36x one at
    batch sizes 16-64, large-v3's (32 decoder layers) 1.06x at batch 16 and 0.93x at 32. A
    4-layer decoder's beam-search steps are too short to keep the GPU busy (300-470 W of
    700); a second worker's kernels fill the gaps."""
    return 2 if any(m in model.lower() for m in _LIGHT_DECODER_MARKERS) else 1


def is_english(language: str | None) -> bool:
    """Whether a language hint means English ("en", "en-US", "english"); None is no hint."""
    if not language:
        return True
    return language.strip().lower().replace("_", "-").split("-")[0] in ("en", "eng", "english")


class DecodingOptions(BaseModel):
    """Model and decoding options. Recorded on every row (``options`` column)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    model: str = Field(
        BUNDLED_MODEL,
        description="faster-whisper model: a size name (large-v3, large-v3-turbo, distil-large-v3), "
        "a hub repository id, a local CTranslate2 folder, or 'bundled:tiny.en' (the embedded default)",
    )
    device: Device = Field("auto", description="auto: cuda when a GPU is visible")
    engine: WhisperEngine = Field(
        "auto",
        description="who runs the model: ctranslate2 (faster-whisper's engine), or torch (a "
        "PyTorch Whisper for GPUs: bf16 SDPA encoder, static KV cache, CUDA-graph decoder "
        "steps; needs torch installed; the same model file and the same transcripts within "
        "0.3 WER points on tiny.en). auto: ctranslate2",
    )
    compute_type: str = Field(
        "auto",
        description="CTranslate2 compute type; auto: float16 on cuda, int8 on cpu. The torch "
        "engine takes auto (bfloat16 on cuda, float32 on cpu), float32, float16 or bfloat16",
    )
    batch_size: int = Field(
        16,
        ge=1,
        le=512,
        description="30-second chunks per model forward pass, filled across recordings",
    )
    beam_size: int = Field(5, ge=1, le=16, description="beam width (1 = greedy)")
    language: str | None = Field(
        None, description="force a language code; default: the item's `language`, else detect"
    )
    timestamps: bool = Field(
        False,
        description="segment timestamps inside a chunk (else one segment per VAD chunk). The "
        "batched decoder reads each 30 s window once, and a segment ending in a single "
        "timestamp ends the window's text: on tiny.en this raised the benchmark's WER from "
        "7.76% to 10.99% (docs/benchmarks.md, Transcription). For finer times prefer "
        "`word_timestamps`",
    )
    word_timestamps: bool = Field(
        False,
        description="per-word start/end/probability in `segments.words`, aligned in the same "
        "cross-recording model batch as the text (one more decoder pass over the batch's "
        "encoder output). Off by default; in a job it turns on with `redact` (entity times, "
        "redacted audio) or split channels (call analytics use words when a row has them, "
        "else the coarser segment timings) unless set to false",
    )
    window_step_s: int = Field(
        30,
        ge=0,
        le=30,
        description="encoder window: each chunk is padded to the next multiple of N s; 30 (or "
        "0): Whisper's trained 30 s, as faster-whisper does. 10: less encoder work on short "
        "calls (1.26x the job's throughput on 60 real-speech clips) at a cost in accuracy "
        "(WER 8.4% against 5.5%; +0.08 points on synthesized calls): an SLA trade for "
        "`overnight tune`, not a default (docs/benchmarks.md)",
    )
    encoder_batch_size: int = Field(
        0,
        ge=0,
        le=512,
        description="CPU: chunks per encoder pass, the batch still decoded at once (0: 1; the "
        "encoder's activations grow with batch x window and leave the caches: one at a time "
        "encoded 1.9x faster than whole batches of 32). A GPU always encodes the whole batch",
    )
    no_speech_threshold: float = Field(
        0.6, ge=0, le=1, description="drop a segment above this no-speech probability..."
    )
    log_prob_threshold: float = Field(
        -1.0, description="...when its average log-probability is also below this"
    )
    seed: int = Field(
        0,
        ge=0,
        le=2**32 - 1,
        description="random seed of the sampled fallback decode of a looping chunk "
        "(CTranslate2's or torch's generator, set when an actor loads its model): one model "
        "worker fed the same chunks in the same batches writes the same text on every run. "
        "A draw also depends on what that model sampled before, so where batches form "
        "otherwise (several model workers, as on CPU by default, several actors, or rows "
        "arriving in another order) a looping chunk may still be worded differently",
    )
    task: WhisperTask = Field(
        "transcribe",
        description="translate: English text from speech in any language (multilingual "
        "models only; an English-only .en model is refused)",
    )
    initial_prompt: str | None = Field(
        None,
        description="text the decoder sees as the previous window (spelling, names, style); a "
        "manifest `initial_prompt` column overrides it per item",
    )
    hotwords: str | None = Field(
        None,
        description="words or phrases to favour (product names, people); a manifest `hotwords` "
        "column overrides it per item. Items with different prompts batch apart",
    )

    @model_validator(mode="after")
    def _known_compute_type(self) -> DecodingOptions:
        # A misspelt type passed the spec and the dry run, and failed in the model actor's
        # load after Ray had started, with the output claimed.
        if self.compute_type not in _CT2_TYPES:
            raise ValueError(
                f"compute_type {self.compute_type!r} is not a compute type: use "
                f"{', '.join(_CT2_TYPES)}"
            )
        return self

    @model_validator(mode="after")
    def _torch_takes_float_types(self) -> DecodingOptions:
        if resolve_engine(self.engine) == "torch" and self.compute_type not in _TORCH_TYPES:
            raise ValueError(
                f"compute_type {self.compute_type!r} is not one the torch engine runs: use "
                f"{', '.join(_TORCH_TYPES)}, or engine = 'ctranslate2' for integer types"
            )
        return self

    @model_validator(mode="after")
    def _translate_needs_multilingual(self) -> DecodingOptions:
        if self.task == "translate" and english_only(self.model):
            raise ValueError(
                f"task = 'translate' needs a multilingual model; {self.model!r} is English-only "
                "(.en): choose e.g. model = 'large-v3' or 'small', or task = 'transcribe'"
            )
        return self


class WhisperOptions(DecodingOptions):
    """What one Whisper actor runs with: the decoding options plus the job's resolved pool
    share (``jobs.run.sizing``) and pricing labels."""

    # CTranslate2 intra-op threads per model worker on CPU (0: its default).
    cpu_threads: int = 0
    # Model batches the actor runs at once (CTranslate2 ``num_workers``), each on its own
    # ``cpu_threads`` threads. On CPU, two one-thread workers decode more per second than one
    # two-thread worker: a beam-search step is too small to keep two threads busy.
    model_workers: int = 1
    resource: str | None = None  # price-table key; None: detected (h100, cpu, ...)
    units: float = 1.0  # GPUs (or CPU cores) the actor holds, for pricing
