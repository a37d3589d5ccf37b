"""The ready call tasks as a job configures them: the job's instructions reach every task,
call_summary keeps its own length, compliance's prompt names its phrases as the keys they
are, and the messages about a context too small say what to change."""

from __future__ import annotations

import json
from typing import Any

import pytest

from overnight.workers.llm import contract, vllm_backend
from overnight.workers.llm.prepare import smollm2_gguf_path
from overnight.workers.llm.tasks.prompts import extract_messages
from overnight.workers.llm.tasks.registry import READY_TASKS, TaskParams, build_task
from overnight.workers.llm.tasks.run import reply_room_problem, run_task
from overnight.workers.llm.tasks.spec import TaskInput, TaskSpecError

PHRASES = ("this call is recorded", "mini-Miranda disclosure")


@pytest.mark.parametrize("name", sorted(READY_TASKS))
def test_every_ready_task_adds_the_jobs_instructions_after_its_own(name: str) -> None:
    params = TaskParams(instructions="Answer in French.", required_phrases=PHRASES)
    task = build_task(name, params)
    own = build_task(name, TaskParams(required_phrases=PHRASES)).instructions
    assert own and task.instructions == f"{own} Answer in French."


def test_call_summary_keeps_its_80_words_unless_the_job_sets_summary_words() -> None:
    assert build_task("call_summary", TaskParams()).summary_words == 80
    assert build_task("call_summary", TaskParams(summary_words=30)).summary_words == 30
    assert build_task("summarize", TaskParams()).summary_words == 100


def test_the_compliance_prompt_quotes_each_phrase_and_asks_for_every_key() -> None:
    task = build_task("compliance", TaskParams(required_phrases=PHRASES))
    system, user = (m["content"] for m in extract_messages(task, "agent: hello"))
    assert "Leave out" not in system and "leave out" not in system
    keys = '"this call is recorded", "mini-Miranda disclosure"'
    assert f"Give every key, each one always: {keys}." in system
    shape = '{"this call is recorded": true or false, "mini-Miranda disclosure": true or false}'
    assert shape in user


def test_promise_to_pay_may_leave_out_only_the_keys_it_does_not_require() -> None:
    task = build_task("promise_to_pay", TaskParams())
    system = extract_messages(task, "agent: hello")[0]["content"]
    assert 'Always give "promised"; leave out any other key you cannot fill.' in system
    assert '"amount" = the promised amount' in system


def test_compliance_refuses_two_phrases_that_differ_only_in_case() -> None:
    params = TaskParams(required_phrases=("This call is recorded", "this call is recorded"))
    with pytest.raises(TaskSpecError, match="differ only in case; give each phrase once"):
        build_task("compliance", params)


def test_compliance_without_phrases_says_where_to_set_them() -> None:
    with pytest.raises(TaskSpecError) as err:
        build_task("compliance", TaskParams())
    assert "required_phrases = [" in str(err.value) and "--config" in str(err.value)


def test_a_default_reply_cap_with_no_room_names_a_setting_and_advice_that_fits_it() -> None:
    task = build_task("promise_to_pay", TaskParams())  # its own cap: 256 tokens
    message = reply_room_problem(task, 256) or ""
    assert message.startswith("max_new_tokens (unset: the promise_to_pay task's 256)")
    assert "set max_new_tokens to at most 232" in message and "well below" not in message
    named = reply_room_problem(task, 256, context_setting="max_model_len = 256") or ""
    assert named.startswith("max_model_len = 256 leaves no room for a document")
    assert "raise max_model_len" in named


class _Words:
    """An engine whose tokens are words and which never gets to generate."""

    name = model_id = "words"
    device = "cpu"
    structured_outputs = False
    max_chunk_tokens = None
    special_tokens = ()

    def __init__(self, context_length: int) -> None:
        self.context_length = context_length

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def render_chat(self, conversation: list[dict[str, str]]) -> str:
        return "\n".join(m["content"] for m in conversation)

    def generate(self, *args, **kwargs):
        raise AssertionError("a document that does not fit is never generated from")


def test_a_document_past_the_context_says_how_to_make_it_fit() -> None:
    task = build_task("disposition", TaskParams())
    engine: Any = _Words(400)
    [out] = run_task(engine, task, [TaskInput("a", "word " * 600, {})])
    assert out.error_code == "context_exceeded"
    message = out.error_message or ""
    assert "raise max_model_len" in message and "lower max_new_tokens" in message
    assert "call_summary or summarize, which read a long document in chunks" in message


def test_the_bundled_models_own_context_is_read_from_its_gguf_header() -> None:
    assert vllm_backend.own_context_length(str(smollm2_gguf_path())) == 8192


def test_vllms_refusal_of_a_long_max_model_len_blames_the_setting_not_the_files(
    monkeypatch, tmp_path
) -> None:
    pytest.importorskip("vllm")
    refusal = (
        "1 validation error for ModelConfig Value error, User-specified max_model_len "
        "(100000) is greater than the derived max_model_len (max_position_embeddings=8192.0 "
        "or model_max_length=None in model's config.json). To allow overriding this maximum, "
        "set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1."
    )

    def refuse(*args, **kwargs):
        raise ValueError(refusal)

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setattr(vllm_backend, "_Engine", refuse)
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 8192}))
    with pytest.raises(contract.EngineUnavailable) as err:
        vllm_backend.VLLMBackend(str(tmp_path), max_model_len=100000)
    message = str(err.value)
    assert "max_model_len = 100000 is more than the model's own context" in message
    assert "lower max_model_len" in message
    assert "download" not in message and "VLLM_ALLOW_LONG_MAX_MODEL_LEN" not in message
