"""An output folder inside the input folder is never read back as input.

``overnight process IN IN/out`` listed ``IN/out/runs/process-….json`` as a document on its
second run (a ``no_text`` error row), one more summary each run, so it never reached
"nothing to do"; ``overnight process OUT x`` listed OUT's run summaries too.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from overnight.jobs.dataset import manifest
from overnight.jobs.dataset.manifest import Selection, select_items, skipped_lines
from overnight.jobs.errors import InputNotFound
from overnight.workers.audio import MEDIA_EXTENSIONS
from overnight.workers.text.formats import DOCUMENT_EXTENSIONS
from tests.conftest import upload_folder

DOCS = Selection.of(DOCUMENT_EXTENSIONS, "document")
MEDIA = Selection.of(MEDIA_EXTENSIONS, "media")
INSIDE_OUTPUT = "inside_output"  # the skip reason, as the summary's JSON spells it


def _write(root: Path, *names: str) -> None:
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("{}" if name.endswith(".json") else "a refund, please")


# What an overnight output holds after a run: bookkeeping folders starting with _, and
# results, costs and run summaries that do not.
_OUTPUT = (
    "_manifests/process-1.parquet",
    "_claims/results.json",
    "_index/results/seg-1.parquet",
    "runs/process-1.json",
    "costs/run_date=2026-12-07/process-1.json",
    "results/run_date=2026-12-07/part-0.parquet",
    "transcripts/run_date=2026-12-07/part-0.txt",
)


def _names(listing, root: Path) -> list[str]:
    return sorted(os.path.relpath(i["uri"], root) for i in listing.items)


def test_a_listing_leaves_out_every_file_of_an_overnight_output_inside_the_input(tmp_path):
    _write(tmp_path, "doc0.txt", "doc1.txt", "_notes.txt", *(f"out/{n}" for n in _OUTPUT))
    listing = select_items(str(tmp_path), DOCS)
    assert _names(listing, tmp_path) == ["doc0.txt", "doc1.txt"]
    # Every file of the output, its bookkeeping too, counted apart from other hidden files.
    assert listing.skipped == {"hidden": 1, INSIDE_OUTPUT: len(_OUTPUT)}
    assert "out/" in listing.skipped_examples


def test_a_users_own_underscore_folders_do_not_make_their_folder_an_output(tmp_path):
    _write(tmp_path, "site/a.txt", "site/_index/b.txt", "site/_claims/c.txt", "site/_index.md")
    listing = select_items(str(tmp_path), DOCS)
    assert _names(listing, tmp_path) == ["site/a.txt"]
    assert listing.skipped == {"hidden": 3}


def test_the_jobs_own_output_under_the_input_is_left_out_before_it_has_bookkeeping(tmp_path):
    # A first run that stopped before writing _manifests/ left results behind: the output
    # the job names is left out whatever it holds, however it is spelled.
    _write(tmp_path, "doc0.txt", "out/runs/process-1.json", "out/notes.txt")
    for output in (
        str(tmp_path / "out"),
        f"file://{tmp_path}/out/",
        f"{tmp_path}/sub/../out",
    ):
        listing = select_items(str(tmp_path), DOCS, output=output)
        assert _names(listing, tmp_path) == ["doc0.txt"], output
        assert listing.skipped == {INSIDE_OUTPUT: 2}, output
    # A sibling whose name starts the same is not inside it.
    listing = select_items(str(tmp_path / "out"), DOCS, output=str(tmp_path / "ou"))
    assert len(listing.items) == 2


def test_an_output_reached_through_a_symlinked_input_is_still_inside_it(tmp_path):
    real = tmp_path / "real"
    _write(real, "doc0.txt", "out/runs/process-1.json")
    (tmp_path / "link").symlink_to(real)
    listing = select_items(str(tmp_path / "link"), DOCS, output=str(real / "out"))
    assert _names(listing, tmp_path / "link") == ["doc0.txt"]
    assert listing.skipped == {INSIDE_OUTPUT: 1}


def test_an_input_that_is_an_overnight_output_holds_no_documents_and_says_why(tmp_path):
    _write(tmp_path, *_OUTPUT)
    with pytest.raises(InputNotFound, match="it is an overnight output folder") as caught:
        select_items(str(tmp_path), DOCS)
    assert "overnight process OUT OUT" in str(caught.value)
    with pytest.raises(InputNotFound, match="it is an overnight output folder"):
        select_items(str(tmp_path), DOCS, output=str(tmp_path))


def test_a_transcribe_listing_counts_an_outputs_files_as_inside_it_not_as_non_media(tmp_path):
    _write(tmp_path, "call.wav", *(f"out/{n}" for n in _OUTPUT))
    listing = select_items(str(tmp_path), MEDIA)
    assert _names(listing, tmp_path) == ["call.wav"]
    assert listing.skipped == {INSIDE_OUTPUT: len(_OUTPUT)}


def test_the_summary_and_dry_run_say_how_many_files_inside_an_output_were_left_out(tmp_path):
    _write(tmp_path, "doc0.txt", "notes.bin", "_x.txt", *(f"out/{n}" for n in _OUTPUT))
    listing = select_items(str(tmp_path), DOCS)
    lines = skipped_lines(listing.skipped, listing.skipped_examples)
    assert len(lines) == 3, lines
    chosen, hidden, inside = lines
    assert "1 file of the listing (1 not_document_extension): notes.bin;" in chosen
    assert "out/" not in chosen and "out/" not in hidden and "_x.txt" in hidden
    assert inside.startswith(f"skipped      {len(_OUTPUT)} file(s) inside an overnight output")
    assert "(out/)" in inside


def test_an_s3_output_under_the_input_prefix_is_left_out_and_a_sibling_prefix_is_not(s3, tmp_path):
    _write(tmp_path / "docs", "doc0.txt", "doc1.txt")
    _write(tmp_path / "runs", "process-1.json")
    upload_folder(s3, "calls", tmp_path / "docs", "in")
    upload_folder(s3, "calls", tmp_path / "runs", "in/out/runs")
    upload_folder(s3, "calls", tmp_path / "docs", "input2")
    listing = select_items("s3://calls/in", DOCS, output="s3://calls/in/out")
    assert sorted(i["uri"] for i in listing.items) == [
        "s3://calls/in/doc0.txt",
        "s3://calls/in/doc1.txt",
    ]
    assert listing.skipped == {INSIDE_OUTPUT: 1}
    assert manifest._output_under("s3://calls/in", "s3://calls/input2") is None
    assert manifest._output_under("s3://calls/in/", "s3://calls/in") == ""
    assert manifest._output_under("s3://calls/in", "/tmp/in/out") is None


def test_overnight_process_into_a_folder_inside_its_input_lists_only_the_documents(tmp_path):
    # The second run's view: the first left results and a run summary in IN/out.
    from tests.jobs.cli.test_cli_messages import overnight

    left = ("_manifests/process-1.parquet", "runs/process-1.json", "costs/process-1.json")
    _write(tmp_path / "in", "doc0.txt", "doc1.txt", *(f"out/{n}" for n in left))
    status, output = overnight(
        "process",
        str(tmp_path / "in"),
        str(tmp_path / "in" / "out"),
        "--task",
        "classify",
        "--labels",
        "refund,complaint,other",
        "--backend",
        "ctranslate2",
        "--dry-run",
    )
    assert status == 0, output
    assert "2 listed" in output, output
    assert "skipped 3 file(s) inside an overnight output folder (out/)" in output


def test_an_input_that_is_also_the_output_keeps_its_own_files_and_leaves_out_the_outputs(
    tmp_path,
):
    # `overnight process IN IN`: the output's datasets and bookkeeping sit beside the
    # documents, which stay items run after run.
    _write(tmp_path, "doc0.txt", "notes/doc1.txt", *_OUTPUT)
    for output in (None, str(tmp_path)):
        listing = select_items(str(tmp_path), DOCS, output=output)
        assert _names(listing, tmp_path) == ["doc0.txt", "notes/doc1.txt"]
        assert listing.skipped == {INSIDE_OUTPUT: len(_OUTPUT)}
        [line] = skipped_lines(listing.skipped, listing.skipped_examples)
        assert "(the input itself)" in line, line


def test_a_manifest_row_repeating_an_earlier_rows_item_is_counted_and_said(tmp_path):
    # "3 listed" of 4 rows, the second row's tenant dropped without a word.
    import json

    (tmp_path / "a.wav").write_bytes(b"RIFF")
    (tmp_path / "b.wav").write_bytes(b"RIFF")
    rows = [
        {"uri": "a.wav", "tenant": "acme"},
        {"uri": "b.wav", "tenant": "acme"},
        {"uri": "a.wav", "tenant": "globex"},
    ]
    manifest = tmp_path / "calls.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    listing = select_items(str(manifest), MEDIA)
    assert [(os.path.basename(i["uri"]), i["tenant"]) for i in listing.items] == [
        ("a.wav", "acme"),
        ("b.wav", "acme"),
    ]
    assert listing.skipped == {"duplicate_row": 1}
    [line] = skipped_lines(listing.skipped, listing.skipped_examples)
    assert "1 manifest row(s) repeating an earlier row's item" in line
    assert "first row's metadata" in line
