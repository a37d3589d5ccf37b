"""Specifications for the docs site (mkdocs.yml, docs/, scripts/gen_docs.py).

The site builds with warnings as errors, so a broken link or anchor, a page left out of the
navigation, or a reference page the code no longer matches fails here. The reference pages
are generated from the code by the build itself, never kept as files.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO, load_script

GENERATED = ("cli", "config", "schemas", "error-codes", "exit-codes", "python-api")


def gen_docs():
    return load_script("gen_docs")


def test_the_site_builds_with_warnings_as_errors_and_holds_the_generated_reference(tmp_path):
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (pip install -e '.[dev]')")
    pytest.importorskip("material", reason="mkdocs-material is not installed (the dev extra)")
    pytest.importorskip("mkdocstrings", reason="mkdocstrings is not installed (the dev extra)")
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=REPO,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    for page in GENERATED:
        assert (site / "reference" / page / "index.html").is_file(), page
    cli = (site / "reference" / "cli" / "index.html").read_text()
    assert "overnight transcribe" in cli and "--max-error-rate" in cli
    api = (site / "reference" / "python-api" / "index.html").read_text()
    assert "RunSummary" in api  # mkdocstrings rendered the docstrings
    assert (site / "how-to" / "kuberay" / "index.html").read_text().count("RayCronJob") > 0


def test_no_generated_reference_page_is_kept_as_a_file_under_docs():
    for page in GENERATED:
        assert not (REPO / "docs" / "reference" / f"{page}.md").exists(), page


def test_the_schema_reference_lists_every_column_with_its_comment():
    from overnight.schemas import COSTS, TRANSCRIPTS

    page = gen_docs().schemas_reference()
    for field in [*TRANSCRIPTS, *COSTS]:
        assert f"| `{field.name}` |" in page, field.name
    # a comment written above the field in schemas/tables.py, and one at the end of its line
    assert "Seconds the VAD kept (summed over channels when split)." in page
    assert "| `work` | `string` | yes | audio \\| documents |" in page
    assert "| `segments[].words[].probability` | `float` | yes |" in page


def test_the_config_reference_has_every_field_of_the_spec():
    from overnight.jobs.spec import ProcessOptions, RunOptions, TranscribeOptions

    page = gen_docs().config_reference()
    for model in (RunOptions, TranscribeOptions, ProcessOptions):
        for name, field in model.model_fields.items():
            assert f"| `{field.alias or name}` |" in page, name


def test_the_error_code_reference_has_every_code_with_its_meaning():
    from overnight.schemas.errors import ERROR_CODES

    page = gen_docs().error_codes_reference()
    for code in ERROR_CODES:
        row = next(line for line in page.splitlines() if line.startswith(f"| `{code}` |"))
        assert row.split("|")[2].strip(), f"{code} has no meaning in schemas/errors.py"
