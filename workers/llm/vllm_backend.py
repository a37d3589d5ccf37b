"""vLLM backend: the offline ``vllm.LLM`` engine on one GPU, whole batches per call.

``vllm`` (and with it torch) is imported only when a backend is constructed, so this module
imports on machines without the ``gpu`` extra. Structured outputs use
``StructuredOutputsParams`` (vLLM >= 0.10.2; ``guided_*`` fields were removed in 0.12) and
fall back to ``GuidedDecodingParams`` on older releases.
"""

from __future__ import annotations

from collections.abc import Sequence
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

_DTYPES = {"auto": "auto", "float16": "float16", "bfloat16": "bfloat16", "float32": "float32"}


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as exc:
        raise EngineUnavailable(
            "the vllm backend needs vLLM and a CUDA GPU: pip install 'overnight[gpu]' "
            "(or pip install vllm); on CPU use backend ctranslate2"
        ) from exc
    return vllm


def _structured(vllm_sampling: Any, params: GenerationParams) -> dict[str, Any]:
    """SamplingParams keyword arguments that constrain the reply, for this vLLM version."""
    if params.json_schema is None and params.choices is None:
        return {}
    constraint: dict[str, Any] = (
        {"json": params.json_schema}
        if params.json_schema is not None
        else {"choice": list(params.choices or ())}
    )
    if hasattr(vllm_sampling, "StructuredOutputsParams"):
        return {"structured_outputs": vllm_sampling.StructuredOutputsParams(**constraint)}
    return {"guided_decoding": vllm_sampling.GuidedDecodingParams(**constraint)}


class VLLMBackend:
    name = "vllm"
    structured_outputs = True
    device = "cuda"

    def __init__(
        self,
        model: str,
        *,
        compute_type: str = "auto",
        max_num_seqs: int = 256,
        max_num_batched_tokens: int = 8192,
        gpu_memory_utilization: float = 0.9,
        max_model_len: int | None = None,
    ) -> None:
        if compute_type not in _DTYPES:
            raise BackendConfigError(
                f"compute_type={compute_type!r} with backend vllm: use one of {', '.join(_DTYPES)}"
            )
        if not 0 < gpu_memory_utilization <= 1:
            raise BackendConfigError(
                f"gpu_memory_utilization={gpu_memory_utilization}: must be in (0, 1]"
            )
        vllm = _import_vllm()
        import vllm.sampling_params as vllm_sampling

        self._vllm_sampling = vllm_sampling
        self._SamplingParams = vllm.SamplingParams
        kwargs: dict[str, Any] = {
            "model": model,
            "max_num_seqs": max_num_seqs,
            "max_num_batched_tokens": max_num_batched_tokens,
            "enable_prefix_caching": True,
            "gpu_memory_utilization": gpu_memory_utilization,
            "dtype": _DTYPES[compute_type],
        }
        if max_model_len is not None:
            kwargs["max_model_len"] = max_model_len
        self._llm = vllm.LLM(**kwargs)
        self._tokenizer = self._llm.get_tokenizer()
        self.model_id = model
        self.context_length = self._max_model_len(max_model_len)

    def _max_model_len(self, requested: int | None) -> int:
        for owner in (self._llm, getattr(self._llm, "llm_engine", None)):
            config = getattr(owner, "model_config", None)
            value = getattr(config, "max_model_len", None)
            if isinstance(value, int):
                return value
        if requested is not None:
            return requested
        raise RuntimeError("cannot read max_model_len from this vLLM version")

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

    def generate(
        self, conversations: list[list[dict[str, str]]], params: GenerationParams
    ) -> list[Generation]:
        # Token prompts: the template is rendered once, here, and the counts below are
        # exactly what the engine runs (no second BOS from re-tokenizing text).
        prompts = [
            self._tokenizer.encode(self.render_chat(c), add_special_tokens=False)
            for c in conversations
        ]
        results: list[Generation | None] = [None] * len(prompts)
        runnable: list[int] = []
        sampling: list[Any] = []
        structured = _structured(self._vllm_sampling, params)
        for i, ids in enumerate(prompts):
            room = self.context_length - len(ids)
            if room < 1:
                results[i] = Generation("", len(ids), 0, FINISH_CONTEXT_EXCEEDED)
                continue
            runnable.append(i)
            sampling.append(
                self._SamplingParams(
                    temperature=params.temperature,
                    max_tokens=min(params.max_new_tokens, room),
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
                results[i] = Generation(
                    text=completion.text,
                    input_tokens=len(output.prompt_token_ids),
                    output_tokens=len(completion.token_ids),
                    finish_reason=FINISH_LENGTH
                    if reason == "length"
                    else FINISH_STOP
                    if reason == "stop"
                    else str(reason),
                )
        done = [r for r in results if r is not None]
        if len(done) != len(prompts):
            raise RuntimeError("vLLM backend lost replies: this is a bug")
        return done

    def choose(
        self, conversations: list[list[dict[str, str]]], choices: Sequence[str]
    ) -> list[str]:
        choices = tuple(choices)
        longest = max(self.count_tokens(c) for c in choices)
        params = GenerationParams(max_new_tokens=longest + 8, choices=choices)
        labels = []
        for generation in self.generate(conversations, params):
            label = generation.text.strip()
            if label not in choices:
                # Guided choice makes this impossible; if an engine change breaks it, fail
                # loudly rather than write an out-of-set label.
                raise RuntimeError(
                    f"vLLM guided choice returned {generation.text!r}, not one of {choices}"
                )
            labels.append(label)
        return labels
