"""The driver's view of a Whisper model: found or refused, and its mel bins, without loading
it or importing an engine."""

from __future__ import annotations

import json

import pytest

from overnight.workers.whisper_models import (
    BUNDLED_MODEL,
    ModelLoadError,
    check_model_reference,
    feature_size_for,
)
from tests.conftest import loaded_by


def test_a_missing_model_is_refused_before_any_work(tmp_path):
    with pytest.raises(ModelLoadError, match="not found"):
        check_model_reference(str(tmp_path / "no-such-model"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match=r"model\.bin"):
        check_model_reference(str(tmp_path / "empty"))
    check_model_reference("large-v3-turbo")  # a faster-whisper name: fine, loads from the hub later
    check_model_reference("Systran/faster-whisper-small.en")  # a hub id: checked by jobs.preflight
    check_model_reference(BUNDLED_MODEL)


def test_mel_bins_come_from_the_folder_else_from_the_name(tmp_path):
    assert feature_size_for(BUNDLED_MODEL) == 80
    assert feature_size_for("large-v3") == feature_size_for("large-v3-turbo") == 128
    assert feature_size_for("small.en") == 80
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"feature_size": 128}))
    assert feature_size_for(str(tmp_path)) == 128


def test_importing_the_model_helpers_loads_no_engine_and_no_pydantic():
    heavy = ["faster_whisper", "ctranslate2", "av", "numpy", "pyarrow", "pydantic"]
    assert loaded_by("import overnight.workers.whisper_models", heavy) == []
