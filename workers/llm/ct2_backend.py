"""CTranslate2 backend: ``ctranslate2.Generator`` on CPU (int8) or CUDA (float16).

No constrained decoding: ``json_schema`` replies are generated freely and validated by the
task layer; ``choices`` are scored exactly with ``Generator.score_batch``, each label's
probability normalised over the label set.
"""

from __future__ import annotations

import atexit
import itertools
import json
import math
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from overnight.workers.llm import contract
from overnight.workers.llm.prepare import METADATA_FILE

# When a model directory does not say (CTranslate2's config.json has no context length).
_DEFAULT_CONTEXT_LENGTH = 2048
# Batch planning costs, in units of one sequence's share of a decoding step. A step also
# has a fixed part (weights read once per step, whatever the batch size), and a prompt token
# fed in the one-pass prefill is far cheaper than one fed as a step. Measured on CPU with
# SmolLM2-135M float32, one thread: a step costs about 66 ms + 28 ms per sequence, a prefill
# token 4.6 ms (docs/benchmarks-process.md). On CUDA the fixed part dominates (an estimate,
# not measured: batching there is nearly free).
_STEP_FIXED_COST = {"cpu": 2.5, "cuda": 32.0}
_PREFILL_TOKEN_COST = {"cpu": 0.15, "cuda": 0.01}
# A shared prompt prefix shorter than this is not worth a separate forward pass.
_MIN_SHARED_PREFIX = 16
# CTranslate2's prefill on CPU holds a layer's attention scores whole (batch x heads x
# prompt length^2 floats): one SmolLM2 prompt of 2k tokens peaked at 0.7 GB, 4k at 1.6 GB,
# 7.8k at 3.6 GB (and took 5.7, 19.8, 62.9 s: the same quadratic). A 30-page summary in
# two 7.9k-token chunks peaked at 4.3 GB. So on CPU a document is cut into chunks of at
# most CPU_CHUNK_TOKENS (more map calls, each cheaper), and a batch holds at most
# MAX_BATCH_TOKENS prompt tokens (a single longer prompt still runs, alone).
CPU_CHUNK_TOKENS = 2048
MAX_BATCH_TOKENS = 8192


class ChatTemplate:
    """A Hugging Face style chat template rendered with jinja2, sandboxed as transformers does."""

    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = "") -> None:
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise jinja2.exceptions.TemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        self._template = env.from_string(source)
        self._bos = bos_token
        self._eos = eos_token

    def render(self, messages: list[dict[str, str]]) -> str:
        return self._template.render(
            messages=messages,
            add_generation_prompt=True,
            bos_token=self._bos,
            eos_token=self._eos,
        )


def _load_model_metadata(model_dir: Path) -> dict[str, Any]:
    """Chat template, special tokens and context length of a CTranslate2 model directory.

    Ours (prepared from GGUF) carry ``overnight_llm.json``; directories made by
    ``ct2-transformers-converter --copy_files tokenizer.json tokenizer_config.json`` carry
    the Hugging Face files instead.
    """
    ours = model_dir / METADATA_FILE
    if ours.is_file():
        meta: dict[str, Any] = json.loads(ours.read_text())
        return meta
    config = json.loads((model_dir / "config.json").read_text())
    tok_config_path = model_dir / "tokenizer_config.json"
    tok_config = json.loads(tok_config_path.read_text()) if tok_config_path.is_file() else {}

    def token(value: Any) -> str | None:
        return value.get("content") if isinstance(value, dict) else value

    eos = token(tok_config.get("eos_token")) or config.get("eos_token")
    template = tok_config.get("chat_template")
    if not template:
        raise contract.BackendConfigError(
            f"model directory {model_dir} has no chat template: copy tokenizer_config.json "
            "into it (ct2-transformers-converter --copy_files tokenizer.json tokenizer_config.json)"
        )
    context = tok_config.get("model_max_length")
    if not isinstance(context, int) or context > 10_000_000:
        context = _DEFAULT_CONTEXT_LENGTH
    end_of_turn = [eos] if eos else []
    for marker in ("<|im_end|>", "<|eot_id|>", "<end_of_turn>"):
        if marker in template and marker not in end_of_turn:
            end_of_turn.append(marker)
    return {
        "chat_template": template,
        "bos_token": token(tok_config.get("bos_token")) or config.get("bos_token") or "",
        "eos_token": eos or "",
        "end_of_turn_tokens": end_of_turn,
        "context_length": context,
    }


def model_context_length(model_dir: str | Path) -> int:
    """The context length the backend has on ``model_dir``, from its metadata alone (nothing
    loaded): what the job checks the reply cap against before it starts."""
    return _context_length(_load_model_metadata(Path(model_dir)))


def _context_length(meta: dict[str, Any]) -> int:
    return int(meta.get("context_length") or _DEFAULT_CONTEXT_LENGTH)


def _stop_after_json(batch_size: int, done: set[int]) -> Any:
    """A generate_batch callback that ends a reply once its first JSON object is complete.

    Without constrained decoding, small models often keep talking after the object; those
    tokens cost time and are thrown away by the parser anyway. Byte-level BPE tokens spell
    ASCII punctuation as itself, so braces, quotes and backslashes can be tracked on the
    token strings directly.
    """
    depth = [0] * batch_size
    in_string = [False] * batch_size
    escaped = [False] * batch_size

    def callback(step: Any) -> bool:
        b = step.batch_id
        for char in step.token:
            if in_string[b]:
                if escaped[b]:
                    escaped[b] = False
                elif char == "\\":
                    escaped[b] = True
                elif char == '"':
                    in_string[b] = False
            elif char == '"' and depth[b] > 0:
                in_string[b] = True
            elif char == "{":
                depth[b] += 1
            elif char == "}" and depth[b] > 0:
                depth[b] -= 1
                if depth[b] == 0:
                    done.add(b)
                    return True
        return False

    return callback


def _release(ref: weakref.ReferenceType[CTranslate2Backend]) -> None:
    backend = ref()
    if backend is not None:
        backend.close()


class CTranslate2Backend:
    name = "ctranslate2"
    structured_outputs = False

    def __init__(
        self,
        model_dir: str | Path,
        *,
        model_id: str | None = None,
        device: str = "cpu",
        compute_type: str = "int8",
        max_batch_size: int = 32,
        cpu_threads: int = 0,
    ) -> None:
        import ctranslate2
        from tokenizers import Tokenizer

        model_dir = Path(model_dir)
        tokenizer_path = model_dir / "tokenizer.json"
        if not tokenizer_path.is_file():
            raise contract.BackendConfigError(f"model directory {model_dir} lacks tokenizer.json")
        meta = _load_model_metadata(model_dir)
        self.model_id = model_id or str(model_dir)
        self.device = device
        self.compute_type = compute_type
        self.context_length = _context_length(meta)
        self.max_chunk_tokens = CPU_CHUNK_TOKENS if device == "cpu" else None
        self.max_batch_size = max_batch_size
        self._tokenizer = Tokenizer.from_file(str(tokenizer_path))
        # Every added token of the vocabulary: untrusted text must not spell any of them.
        self.special_tokens = tuple(
            t.content for t in self._tokenizer.get_added_tokens_decoder().values()
        )
        self._template = ChatTemplate(
            meta["chat_template"],
            bos_token=meta.get("bos_token") or "",
            eos_token=meta.get("eos_token") or "",
        )
        self._end_tokens: list[str] = list(meta.get("end_of_turn_tokens") or [meta["eos_token"]])
        self._end_ids = {self._tokenizer.token_to_id(t) for t in self._end_tokens}
        self._end_ids.discard(None)
        self._generator = ctranslate2.Generator(
            str(model_dir), device=device, compute_type=compute_type, intra_threads=cpu_threads
        )
        self.cpu_threads = cpu_threads
        # One decoding step inside the load, as the Whisper worker does: CTranslate2's CUDA
        # build opens cuBLAS only when it first computes, so a missing libcublas.so.12 (seen
        # on an H200 with a CUDA 13 image) would otherwise fail every document as an error
        # row instead of stopping the job at load with its reason.
        try:
            self._generator.generate_batch([self._tokenizer.encode("ok").tokens], max_length=1)
        except Exception as exc:
            self._generator = None
            raise contract.EngineUnavailable(
                f"CTranslate2 cannot run {self.model_id!r} on {device} ({compute_type}): {exc}"
            ) from exc
        # Release the generator before interpreter shutdown: after a callback has stopped a
        # generation early, CTranslate2 4.8 sometimes aborts ("terminate called without an
        # active exception") when it is destroyed during finalization (about 1 exit in 3
        # here); destroying it from an atexit hook never did.
        atexit.register(_release, weakref.ref(self))

    def close(self) -> None:
        """Free the model now (it is also freed at interpreter exit)."""
        self._generator = None

    # -- text ------------------------------------------------------------------------------

    def _tokens(self, text: str) -> list[str]:
        return list(self._tokenizer.encode(text, add_special_tokens=False).tokens)

    def count_tokens(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def split_by_tokens(self, text: str, max_tokens: int) -> list[str]:
        encoding = self._tokenizer.encode(text, add_special_tokens=False)
        starts = [start for start, _ in encoding.offsets]
        return contract.split_on_offsets(text, starts, max_tokens, self.count_tokens)

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        return self._template.render(messages)

    # -- generation ------------------------------------------------------------------------

    def generate(
        self, conversations: list[list[dict[str, str]]], params: contract.GenerationParams
    ) -> list[contract.Generation]:
        if params.choices is not None:
            return [g for _, _, g in self.choose_scored(conversations, params.choices)]
        prompts = [self._tokens(self.render_chat(c)) for c in conversations]
        results: list[contract.Generation | None] = [None] * len(prompts)
        runnable = []
        for i, prompt in enumerate(prompts):
            if len(prompt) >= self.context_length:
                results[i] = contract.Generation(
                    "", len(prompt), 0, contract.FINISH_CONTEXT_EXCEEDED
                )
            else:
                runnable.append(i)
        lengths = [len(p) for p in prompts]
        for batch in self._batches(runnable, lengths, params.max_new_tokens):
            # One max_length per batch: an item close to the context limit only shortens
            # the replies of its own batch.
            max_length = min(
                params.max_new_tokens,
                *(self.context_length - len(prompts[i]) for i in batch),
            )
            options: dict[str, Any] = (
                {"sampling_topk": 0, "sampling_temperature": params.temperature}
                if params.temperature > 0
                else {"sampling_topk": 1}
            )
            options["repetition_penalty"] = params.repetition_penalty
            inputs = [prompts[i] for i in batch]
            shared = self._shared_prefix(inputs)
            if shared:
                # The task's system prompt and instructions: one forward pass for the whole
                # batch instead of one per prompt. Not cached across calls (the prefix of a
                # call depends on its documents, and the cache would only grow).
                options["static_prompt"] = inputs[0][:shared]
                options["cache_static_prompt"] = False
                inputs = [p[shared:] for p in inputs]
            json_done: set[int] = set()
            if params.json_schema is not None:
                options["callback"] = _stop_after_json(len(batch), json_done)
            outputs = self._generator.generate_batch(
                inputs,
                max_length=max_length,
                include_prompt_in_result=False,
                end_token=self._end_tokens,
                return_end_token=True,
                **options,
            )
            for b, (i, output) in enumerate(zip(batch, outputs, strict=True)):
                ids = list(output.sequences_ids[0])
                ended = bool(ids) and ids[-1] in self._end_ids
                stopped = ended or b in json_done
                text_ids = ids[:-1] if ended else ids
                results[i] = contract.Generation(
                    text=self._tokenizer.decode(text_ids, skip_special_tokens=True),
                    input_tokens=len(prompts[i]),
                    output_tokens=len(ids),
                    finish_reason=contract.FINISH_STOP if stopped else contract.FINISH_LENGTH,
                )
        return self._complete(results)

    @staticmethod
    def _complete(results: list[contract.Generation | None]) -> list[contract.Generation]:
        done = [r for r in results if r is not None]
        if len(done) != len(results):
            raise RuntimeError("CTranslate2 backend lost replies: this is a bug")
        return done

    @property
    def _exact_mixed_batches(self) -> bool:
        """Whether a reply is the same whatever the other prompts of its batch (see _batches)."""
        return "int8" not in self.compute_type

    def _shared_prefix(self, prompts: list[list[str]]) -> int:
        """Length of the token prefix all ``prompts`` share, when worth a separate pass; 0
        otherwise. Every prompt keeps at least one token of its own."""
        if len(prompts) < 2 or not self._exact_mixed_batches:
            return 0
        first, shortest = prompts[0], min(len(p) for p in prompts)
        n = 0
        while n < shortest - 1 and all(p[n] == first[n] for p in prompts):
            n += 1
        return n if n >= _MIN_SHARED_PREFIX else 0

    def _batches(
        self, indices: list[int], lengths: list[int], max_new_tokens: int
    ) -> list[list[int]]:
        """Batches of at most ``max_batch_size`` prompts of similar length and at most
        MAX_BATCH_TOKENS prompt tokens.

        CTranslate2 feeds the prompt tokens beyond the shortest prompt of a batch one step
        at a time (OpenNMT/CTranslate2#1349), each step costing as much as a decoding step
        of the whole batch. So one length-sorted batch of mixed lengths is slower than
        running the prompts one by one (measured: 4.6x the CPU time for 8 prompts of
        189-430 tokens), while batching equal lengths shares every decoding step's fixed
        cost. The sorted prompts are cut where the estimated total cost is lowest (dynamic
        programming over cut points; see _STEP_FIXED_COST).

        With int8 compute, only prompts of exactly equal length share a batch: with int8
        the stepwise path gives different logits from the one-pass prefill: measured on
        SmolLM2, "What is the capital of France?" batched with a 3-token-shorter prompt
        answered in broken French instead of "Paris". Equal-length batches give exactly
        the single-prompt result, so an item's output never depends on its batch mates.
        float32 replies are the same either way (48 of 48 summaries identical to the
        one-at-a-time loop in scripts/bench_process.py); float16 on CUDA is taken to behave
        like float32 here, which has not been checked on a GPU.
        """
        return [
            part
            for batch in self._batches_by_cost(indices, lengths, max_new_tokens)
            for part in _within_tokens(batch, lengths, MAX_BATCH_TOKENS)
        ]

    def _batches_by_cost(
        self, indices: list[int], lengths: list[int], max_new_tokens: int
    ) -> list[list[int]]:
        ordered = sorted(indices, key=lambda i: lengths[i])
        if not self._exact_mixed_batches:
            groups = [list(g) for _, g in itertools.groupby(ordered, key=lambda i: lengths[i])]
            return [
                group[lo : lo + self.max_batch_size]
                for group in groups
                for lo in range(0, len(group), self.max_batch_size)
            ]
        fixed = _STEP_FIXED_COST.get(self.device, _STEP_FIXED_COST["cpu"])
        token = _PREFILL_TOKEN_COST.get(self.device, _PREFILL_TOKEN_COST["cpu"])
        size = [lengths[i] for i in ordered]

        def cost(lo: int, hi: int) -> float:
            count = hi - lo
            steps = size[hi - 1] - size[lo] + max_new_tokens
            return steps * (fixed + count) + token * count * size[lo]

        best = [0.0] + [math.inf] * len(ordered)
        cut = [0] * (len(ordered) + 1)
        for hi in range(1, len(ordered) + 1):
            for lo in range(max(0, hi - self.max_batch_size), hi):
                total = best[lo] + cost(lo, hi)
                if total < best[hi]:
                    best[hi], cut[hi] = total, lo
        batches: list[list[int]] = []
        hi = len(ordered)
        while hi > 0:
            batches.append(ordered[cut[hi] : hi])
            hi = cut[hi]
        return batches[::-1]

    def choose(
        self, conversations: list[list[dict[str, str]]], choices: Sequence[str]
    ) -> list[str]:
        return [label for label, _, _ in self.choose_scored(conversations, choices)]

    def choose_scored(
        self, conversations: list[list[dict[str, str]]], choices: Sequence[str]
    ) -> list[tuple[str, float | None, contract.Generation]]:
        """The label of each conversation (the likeliest as the whole reply), with its
        probability normalised over the label set: the classify task's ``label_score``
        (see :meth:`label_probabilities`). A prompt past the context gets no label."""
        prompts = [self._tokens(self.render_chat(c)) for c in conversations]
        runnable = [i for i, p in enumerate(prompts) if len(p) < self.context_length]
        shares = dict(
            zip(
                runnable,
                self._label_shares([prompts[i] for i in runnable], tuple(choices)),
                strict=True,
            )
        )
        out: list[tuple[str, float | None, contract.Generation]] = []
        for i, prompt in enumerate(prompts):
            if i not in shares:
                exceeded = contract.FINISH_CONTEXT_EXCEEDED
                out.append(("", None, contract.Generation("", len(prompt), 0, exceeded)))
                continue
            label = max(shares[i], key=shares[i].__getitem__)  # first of equals: choices order
            reply = contract.Generation(
                text=label,
                input_tokens=len(prompt),
                output_tokens=self.count_tokens(label) + 1,
                finish_reason=contract.FINISH_STOP,
            )
            out.append((label, shares[i][label], reply))
        return out

    def label_probabilities(
        self, conversations: list[list[dict[str, str]]], choices: Sequence[str]
    ) -> list[dict[str, float]]:
        """Per conversation, each label's probability normalised over the label set: the
        softmax of the labels' log-probabilities as the whole reply (the label's tokens and
        the end-of-turn token, so a label that is a prefix of another is not favoured). The
        values sum to 1; a label's raw probability as the whole reply after a long prompt is
        tiny (1e-6 to 3e-4 was seen on SmolLM2), not comparable with vLLM's or thresholdable."""
        prompts = [self._tokens(self.render_chat(c)) for c in conversations]
        return self._label_shares(prompts, tuple(choices))

    def _label_shares(
        self, prompts: list[list[str]], choices: tuple[str, ...]
    ) -> list[dict[str, float]]:
        if not prompts:
            return []
        end = self._end_tokens[0]
        continuations = [[*self._tokens(choice), end] for choice in choices]
        sequences = [prompt + cont for prompt in prompts for cont in continuations]
        scores = self._generator.score_batch(
            sequences, max_batch_size=MAX_BATCH_TOKENS, batch_type="tokens", max_input_length=0
        )
        shares: list[dict[str, float]] = []
        for p in range(len(prompts)):
            log_probs = [
                float(sum(scores[p * len(choices) + c].log_probs[-len(cont) :]))
                for c, cont in enumerate(continuations)
            ]
            top = max(log_probs)
            weights = [math.exp(x - top) for x in log_probs]
            total = sum(weights)
            shares.append({c: w / total for c, w in zip(choices, weights, strict=True)})
        return shares


def _within_tokens(batch: list[int], lengths: list[int], budget: int) -> list[list[int]]:
    """``batch`` cut, in order, into runs of at most ``budget`` prompt tokens (a longer
    prompt alone)."""
    parts: list[list[int]] = []
    run: list[int] = []
    total = 0
    for i in batch:
        if run and total + lengths[i] > budget:
            parts.append(run)
            run, total = [], 0
        run.append(i)
        total += lengths[i]
    if run:
        parts.append(run)
    return parts
