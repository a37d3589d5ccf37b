"""The driver's model checks: a hub download that holds no CTranslate2 model is refused in
one message that says what to use instead (the network itself is stubbed out)."""

from __future__ import annotations

import pytest

from overnight.jobs import preflight
from overnight.jobs.errors import ModelNotFound


def test_a_whisper_download_without_model_bin_says_to_use_a_faster_whisper_conversion(
    tmp_path, monkeypatch
):
    import faster_whisper.utils

    monkeypatch.setattr(faster_whisper.utils, "download_model", lambda model: str(tmp_path))
    with pytest.raises(ModelNotFound) as refused:
        preflight.whisper_model("small.en")
    assert str(refused.value) == (
        "the Whisper model small.en (hub repository Systran/faster-whisper-small.en) is on the "
        "hub but is not a CTranslate2 Whisper model (no model.bin): use a faster-whisper "
        "conversion (e.g. Systran/faster-whisper-small.en), or convert it with "
        "ct2-transformers-converter and pass the folder."
    )


def test_a_ctranslate2_llm_download_without_model_bin_says_to_use_vllm(tmp_path, monkeypatch):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda repo, **_: str(tmp_path))
    with pytest.raises(ModelNotFound) as refused:
        preflight.llm_model("ctranslate2", "org/chat-model")
    assert str(refused.value) == (
        "the LLM model org/chat-model is on the hub but is not a CTranslate2 model (no "
        "model.bin): use --backend vllm for a Hugging Face model, or convert it with "
        "ct2-transformers-converter and pass the folder."
    )


def test_a_download_with_model_bin_is_the_folder_the_actors_load(tmp_path, monkeypatch):
    import huggingface_hub

    (tmp_path / "model.bin").write_bytes(b"weights")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda repo, **_: str(tmp_path))
    assert preflight.llm_model("ctranslate2", "org/chat-model") == str(tmp_path)
