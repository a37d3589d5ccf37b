"""A damaged ``.gguf`` model: one paragraph before any work (exit 5), never "SystemException: .".

Random bytes, a file cut inside its header (``GGUF\\x03\\0\\0\\0`` and little else) and a file
cut inside its weights used to reach the actors' conversion, where gguf's reader raised a
bare IndexError that the user saw as "the pipeline failed: SystemException: ." (exit 6).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from overnight.jobs import errors, preflight
from overnight.workers.llm import prepare
from tests.jobs.cli.test_cli_messages import assert_one_clean_paragraph, overnight

pytest.importorskip("gguf")


@pytest.fixture
def bundled() -> Path:
    try:
        return prepare.smollm2_gguf_path()
    except prepare.ModelPreparationError as exc:
        pytest.skip(str(exc))


def _random_bytes(folder: Path) -> Path:
    path = folder / "junk.gguf"
    path.write_bytes(bytes(range(256)) * 400)
    return path


def _cut_in_header(folder: Path) -> Path:
    path = folder / "trunc.gguf"
    path.write_bytes(b"GGUF\x03\0\0\0" + b"\x07" * 5000)
    return path


def _cut_in_weights(folder: Path, bundled: Path) -> Path:
    path = folder / "half.gguf"
    data = bundled.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


@pytest.fixture(params=["random bytes", "cut in its header", "cut in its weights"])
def damaged(request, tmp_path, bundled) -> Path:
    if request.param == "random bytes":
        return _random_bytes(tmp_path)
    if request.param == "cut in its header":
        return _cut_in_header(tmp_path)
    return _cut_in_weights(tmp_path, bundled)


def test_the_bundled_model_passes_the_header_check(bundled):
    prepare.check_gguf(bundled)


def test_a_damaged_gguf_fails_the_header_check_saying_it_is_not_a_valid_gguf_file(damaged):
    with pytest.raises(prepare.ModelPreparationError, match="is not a valid GGUF file"):
        prepare.check_gguf(damaged)


def test_a_damaged_gguf_is_model_not_found_in_preflight_before_ray(damaged):
    for backend in ("ctranslate2", "vllm"):
        with pytest.raises(errors.ModelNotFound) as caught:
            preflight.llm_model(backend, str(damaged), download=False)
        message = str(caught.value)
        assert caught.value.exit_code == 5
        assert str(damaged) in message and "not a valid GGUF file" in message
        assert "Download it again" in message and "Nothing was run or written" in message


def test_the_converter_wraps_the_gguf_readers_own_errors_for_api_callers(tmp_path, damaged):
    # The API path (prepare_ctranslate2_from_gguf without the CLI's preflight): the reader's
    # IndexError / ValueError becomes the one-paragraph ModelPreparationError.
    with pytest.raises(prepare.ModelPreparationError, match="is not a valid GGUF file"):
        prepare.prepare_hf_from_gguf(damaged, cache_dir=tmp_path / "cache")
    assert not any((tmp_path / "cache").glob("*/" + prepare.METADATA_FILE))


def test_overnight_process_with_a_damaged_gguf_is_exit_5_in_one_paragraph_before_any_work(
    tmp_path, bundled
):
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(2):
        (docs / f"doc{i}.txt").write_text(f"Document {i} asks for a refund.")
    for model in (_random_bytes(tmp_path), _cut_in_header(tmp_path)):
        out = tmp_path / f"out-{model.stem}"
        status, output = overnight(
            "process",
            str(docs),
            str(out),
            "--task",
            "classify",
            "--labels",
            "a,b",
            "--backend",
            "ctranslate2",
            "--model",
            str(model),
        )
        assert status == errors.ModelNotFound.exit_code == 5, output
        assert_one_clean_paragraph(output)
        assert "not a valid GGUF file" in output and "SystemException" not in output
        assert not out.exists(), output  # before any work: nothing written
