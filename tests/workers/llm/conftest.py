"""The converted bundled LLM and a CTranslate2 backend on it, for the tests of workers/llm/."""

from __future__ import annotations

from pathlib import Path

import pytest

from overnight.workers.llm.adapter import LLMBackend, load_backend
from overnight.workers.llm.prepare import prepare_ctranslate2_from_gguf, smollm2_gguf_path


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Shared through the session's base temp dir: other test modules find it converted.
    cache = tmp_path_factory.getbasetemp() / "llm-models"
    return prepare_ctranslate2_from_gguf(smollm2_gguf_path(), cache_dir=cache)


@pytest.fixture(scope="module")
def backend(model_dir: Path) -> LLMBackend:
    return load_backend("ctranslate2", str(model_dir), device="cpu")
