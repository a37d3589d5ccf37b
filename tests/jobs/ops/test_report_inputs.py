"""Specifications for what ``overnight report`` is given: outputs that share run ids, run
summaries with figures out of range, windows that cut a night, flags that disagree, paths
that are not outputs, and selections that hold nothing. Each figure stays right, and each
bad input is one line with its exit status, never a traceback."""

from __future__ import annotations

import json
import math
import unicodedata
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow.dataset as pads
import pytest

from overnight.jobs.cli import main
from overnight.jobs.errors import ConfigError
from overnight.jobs.ops.report import build_report, load, parse_since, parse_until
from tests.jobs.ops.test_report import DAY1, _speech_rows, _write_run
from tests.jobs.ops.test_report_engine import _move_into_partition


def _ledger(out: Path) -> list[dict]:
    return pads.dataset(str(out / "costs"), format="parquet").to_table().to_pylist()


def _width(line: str) -> int:
    """Terminal columns, counted apart from the report's code: wide 2, combining 0."""
    return sum(
        0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1
        for c in line
    )


def _one_error_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


# -- 1: runs of one id in two outputs -----------------------------------------------------------


def test_runs_of_one_id_in_two_outputs_are_two_runs_each_priced_by_its_own_summary(tmp_path):
    one, five = tmp_path / "out1", tmp_path / "out5"
    s1 = _write_run(one, "a-new", "transcribe", _speech_rows("a-new", 5, 1, DAY1, "cpu"), DAY1, 9)
    s5 = _write_run(
        five, "a-new", "transcribe", _speech_rows("a-new", 7, 2, DAY1, "h100"), DAY1, 30
    )
    (tmp_path / "again").symlink_to(one)  # the same output listed twice: still counted once
    report = build_report(load([str(one), str(five), str(tmp_path / "again")]), by="run")
    rows = {r["run"]: r for r in report.main.to_pylist()}
    assert sorted(rows) == [f"a-new ({one})", f"a-new ({five})"]
    for out, summary in ((one, s1), (five, s5)):
        row = rows[f"a-new ({out})"]
        assert row["cost_usd"] == math.fsum(r["cost_usd"] for r in _ledger(out))
        assert row["items"] == summary["items"]
        assert row["reserved_cost_usd"] == pytest.approx(summary["reserved_cost_usd"], rel=1e-12)
    both = _ledger(one) + _ledger(five)
    assert report.totals["cost_usd"] == math.fsum(r["cost_usd"] for r in both)
    assert report.totals["items"] == 12
    # only out1's rows were given twice
    assert report.notes == [
        f"{len(_ledger(one))} ledger rows given twice (the same output listed twice) were "
        "counted once"
    ]


# -- 2: run summaries with figures out of range ---------------------------------------------------


@pytest.mark.parametrize("value", ["abc", [1], float("nan"), -5.0], ids=repr)
@pytest.mark.parametrize("key", ["reserved_cost_usd", "accelerator_reserved_seconds"])
def test_a_run_summary_with_a_figure_out_of_range_is_skipped_with_a_warning_naming_it(
    tmp_path, capsys, key, value
):
    out = tmp_path / "out"
    _write_run(out, "bad-run", "transcribe", _speech_rows("bad-run", 4, 1, DAY1, "cpu"), DAY1, 9)
    _write_run(out, "good-run", "transcribe", _speech_rows("good-run", 3, 2, DAY1, "cpu"), DAY1, 9)
    path = out / "runs" / "bad-run.json"
    summary = json.loads(path.read_text())
    summary[key] = value
    path.write_text(json.dumps(summary))
    assert main(["report", str(out), "--by", "run", "--json"]) == 0
    captured = capsys.readouterr()
    warning = _one_error_line(captured.err)
    assert "warning: skipped the summary of run bad-run" in warning and key in warning
    rows = {r["group"] if "group" in r else r["run"]: r for r in json.loads(captured.out)["rows"]}
    assert rows["bad-run"]["reserved_cost_usd"] is None  # not priced from the bad figure
    assert rows["bad-run"]["utilization"] is None
    assert rows["good-run"]["reserved_cost_usd"] > 0


# -- 3: html into a folder -------------------------------------------------------------------------


def test_an_html_report_out_to_an_existing_folder_is_exit_11_in_one_line(tmp_path, capsys):
    out = tmp_path / "out"
    _write_run(out, "r1", "transcribe", _speech_rows("r1", 3, 1, DAY1, "cpu"), DAY1, 9)
    (tmp_path / "dd").mkdir()
    assert main(["report", str(out), "--format", "html", "--out", str(tmp_path / "dd")]) == 11
    assert "is a folder" in _one_error_line(capsys.readouterr().err)
    assert list((tmp_path / "dd").iterdir()) == []


# -- 4: windows that cut a night ------------------------------------------------------------------


def test_a_window_that_cuts_a_night_counts_its_rows_by_the_time_they_were_recorded(tmp_path):
    """Two runs of one night, at 16:01 and 16:12: ``--since 16:03`` is the second only, and
    ``--until 16:03`` the first; a date still counts the whole night."""
    out, early, late = tmp_path / "out", datetime(2026, 12, 7, 16, 1, tzinfo=UTC), None
    late = datetime(2026, 12, 7, 16, 12, tzinfo=UTC)
    for run, when in (("r1", early), ("r2", late)):
        flat = tmp_path / run
        _write_run(flat, run, "transcribe", _speech_rows(run, 4, 1, when, "cpu"), when, 9)
        (out / "runs").mkdir(parents=True, exist_ok=True)
        _move_into_partition(flat, out, "2026-12-07")

    def runs(since: str | None = None, until: str | None = None) -> list[str]:
        s, u = parse_since(since), parse_until(until)
        report = build_report(load([str(out)], s, u), by="run", since=s, until=u)
        return [r["run"] for r in report.main.to_pylist()]

    assert runs() == ["r1", "r2"]
    assert runs(since="2026-12-07T16:03") == ["r2"]
    assert runs(until="2026-12-07T16:03") == ["r1"]
    assert runs(since="2026-12-07") == ["r1", "r2"]
    assert runs(until="2026-12-07") == ["r1", "r2"]
    assert runs(since="2026-12-07T16:00", until="2026-12-07T16:05") == ["r1"]


def test_the_header_states_the_window_to_the_second_it_counts(tmp_path, capsys):
    out = tmp_path / "out"
    _write_run(out, "r1", "transcribe", _speech_rows("r1", 3, 1, DAY1, "cpu"), DAY1, 9)
    flags = ["--since", "2026-11-30T23:09:30", "--until", "2026-12-01T06:00"]
    assert main(["report", str(out), *flags]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert header.endswith(", since 2026-11-30 23:09:30 UTC, before 2026-12-01 06:00 UTC")


def test_since_takes_the_spans_plan_takes():
    now = datetime(2026, 12, 7, 16, 0, tzinfo=UTC)
    assert parse_since("1h30m", now) == now - timedelta(minutes=90)
    assert parse_since("7D", now) == now - timedelta(days=7)
    assert parse_since("90s", now) == now - timedelta(seconds=90)
    assert parse_until("1d", now) == now - timedelta(days=1)
    with pytest.raises(ConfigError, match="--until 'soon'"):
        parse_until("soon")


# -- 5: flags that disagree ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags",
    [
        ["--json", "--format", "html", "--out", "j.html"],
        ["--json", "--out", "j.html"],
        ["--json", "--format", "csv"],
        ["--out", "somewhere"],
        ["--format", "table", "--out", "t.txt"],
    ],
    ids=" ".join,
)
def test_flags_that_disagree_are_exit_2_in_one_line_and_write_nothing(
    tmp_path, capsys, monkeypatch, flags
):
    out = tmp_path / "out"
    _write_run(out, "r1", "transcribe", _speech_rows("r1", 3, 1, DAY1, "cpu"), DAY1, 9)
    monkeypatch.chdir(tmp_path)
    assert main(["report", str(out), *flags]) == 2
    captured = capsys.readouterr()
    _one_error_line(captured.err)
    assert captured.out == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_out_ending_in_html_writes_the_html_page_without_format(tmp_path, capsys):
    out = tmp_path / "out"
    _write_run(out, "r1", "transcribe", _speech_rows("r1", 3, 1, DAY1, "cpu"), DAY1, 9)
    assert main(["report", str(out), "--out", str(tmp_path / "r.html")]) == 0
    assert (tmp_path / "r.html").read_text().lstrip().lower().startswith("<!doctype html")
    assert capsys.readouterr().out == ""


def test_json_carries_the_reports_notes(tmp_path, capsys):
    out = tmp_path / "out"
    _write_run(out, "r1", "transcribe", _speech_rows("r1", 3, 1, DAY1, "cpu"), DAY1, 9)
    (tmp_path / "again").symlink_to(out)
    assert main(["report", str(out), str(tmp_path / "again"), "--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert len(notes) == 1 and "given twice" in notes[0]


# -- 6: a path that is not an output --------------------------------------------------------------


def test_a_file_given_as_output_is_exit_4_saying_output_must_be_a_folder(tmp_path, capsys):
    manifest = tmp_path / "m1.jsonl"
    manifest.write_text('{"uri": "a.wav"}\n')
    assert main(["report", str(manifest)]) == 4
    line = _one_error_line(capsys.readouterr().err)
    assert "OUTPUT must be an output folder" in line and "m1.jsonl" in line


# -- 7: selections that hold nothing --------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--tenant", "nobody"], "of tenant 'nobody'"),
        (["--since", "2027-01-01"], "since 2027-01-01 00:00 UTC"),
    ],
)
def test_a_selection_that_matches_nothing_says_so_in_one_line(tmp_path, capsys, flags, says):
    out = tmp_path / "out"
    _write_run(out, "r1", "transcribe", _speech_rows("r1", 3, 1, DAY1, "cpu"), DAY1, 9)
    assert main(["report", str(out), *flags]) == 0
    printed = capsys.readouterr().out
    (line,) = [x for x in printed.splitlines() if x.startswith("nothing to report")]
    assert says in line
    assert main(["report", str(out), *flags, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["notes"] == [line]


def test_since_after_until_is_exit_2_in_one_line(tmp_path, capsys):
    out = tmp_path / "out"
    _write_run(out, "r1", "transcribe", _speech_rows("r1", 3, 1, DAY1, "cpu"), DAY1, 9)
    assert main(["report", str(out), "--since", "2026-12-08", "--until", "2026-12-01"]) == 2
    assert "is not before --until" in _one_error_line(capsys.readouterr().err)


def test_tenant_none_selects_the_items_without_a_tenant_as_the_report_by_tenant_labels_them(
    tmp_path,
):
    out = tmp_path / "out"
    _write_run(out, "r1", "transcribe", _speech_rows("r1", 9, 1, DAY1, "h100"), DAY1, 9)
    whole = {r["tenant"]: r for r in build_report(load([str(out)]), by="tenant").main.to_pylist()}
    only = build_report(load([str(out)]), by="tenant", tenant="(none)")
    assert [r["tenant"] for r in only.main.to_pylist()] == ["(none)"]
    assert only.main.to_pylist()[0] == whole["(none)"]
    assert whole["(none)"]["items"] == 3


# -- tables on a terminal -------------------------------------------------------------------------


def test_table_columns_stay_aligned_with_wide_and_combining_characters_in_names(tmp_path):
    from overnight.jobs.ops.report import render_table

    rows = _speech_rows("r1", 6, 0, DAY1, "h100")
    names = ["東京支社", "party 🎉", "cafe\u0301", "acme"]
    for i, row in enumerate(rows):
        row["tenant"] = names[i % len(names)]
    _write_run(tmp_path / "out", "r1", "transcribe", rows, DAY1, 5.0)
    text = render_table(build_report(load([str(tmp_path / "out")]), by="tenant"))
    table = text.split("\n\n")[1].splitlines()
    assert {_width(line) for line in table} == {_width(table[0])}, text
