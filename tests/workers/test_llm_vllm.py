"""The vLLM backend on a real GPU (marked ``gpu``: deselected by default).

Run on a GPU machine with the ``gpu`` extra::

    OVERNIGHT_GPU_TEST_MODEL=HuggingFaceTB/SmolLM2-135M-Instruct pytest -m gpu tests/workers

The model is a hub name or a local directory; the default is small enough to load in
seconds and is the same model the CPU tests run through CTranslate2.
"""

from __future__ import annotations

import json
import os

import pytest

from workers.llm.adapter import GenerationParams, LLMBackend, load_backend
from workers.llm.tasks import DISPOSITION_LABELS, TaskInput, TaskSpec, disposition, run_task

pytestmark = pytest.mark.gpu

MODEL = os.environ.get("OVERNIGHT_GPU_TEST_MODEL", "HuggingFaceTB/SmolLM2-135M-Instruct")
NAME_AMOUNT = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "amount": {"type": "number"}},
    "required": ["name", "amount"],
}
CALL = (
    "Agent: Hello, I am calling about your overdue balance of 120 dollars. "
    "Customer: I can pay 50 dollars on Friday. Agent: Noted, thank you."
)


@pytest.fixture(scope="module")
def backend() -> LLMBackend:
    pytest.importorskip("vllm")
    return load_backend(
        "vllm",
        MODEL,
        gpu_memory_utilization=0.5,
        max_num_seqs=64,
        max_num_batched_tokens=8192,
        max_model_len=4096,
    )


def _items(*texts: str) -> list[TaskInput]:
    return [TaskInput(str(i), text) for i, text in enumerate(texts)]


def test_vllm_generate_counts_tokens_and_keeps_order(backend: LLMBackend) -> None:
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


def test_vllm_summarize_short_and_map_reduce(backend: LLMBackend) -> None:
    long_text = " ".join(
        f"Sentence {i} says the shipment number {i} arrived late." for i in range(80)
    )
    spec = TaskSpec(kind="summarize", summary_words=20, chunk_tokens=200)
    short, long_ = run_task(backend, spec, _items("The cat sat on the mat all day.", long_text))
    assert short.status == "ok" and short.output_text
    assert long_.status == "ok" and long_.num_chunks > 1 and long_.output_text


def test_vllm_extract_is_schema_valid_by_construction(backend: LLMBackend) -> None:
    spec = TaskSpec(kind="extract", json_schema=NAME_AMOUNT)
    [out] = run_task(backend, spec, _items("My name is Alice and I will pay 50 dollars on Friday"))
    assert out.status == "ok", out.error_message
    assert set(json.loads(out.output_json or "")) <= {"name", "amount"}


def test_vllm_classify_uses_guided_choice_within_the_label_set(backend: LLMBackend) -> None:
    outs = run_task(backend, disposition(), _items(CALL, "Who is this? Wrong number."))
    assert all(o.status == "ok" and o.label in DISPOSITION_LABELS for o in outs)
