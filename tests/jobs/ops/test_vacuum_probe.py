"""Retention defects a hostile tester found in ``overnight vacuum``: a leftover intent that
took a later run's originals and audio, a run id reused across nights whose summary went
with its old night, spans under a day, a dry run that named only partitions, a damaged
intent, and OUTPUTs that are a file, not an output, or hold a foreign file. Each test states
what must hold.

Outputs are built with pyarrow directly, as a job lays them out (no Ray): a night is its
transcripts/ and run_table/ partitions, its summary and manifest, its originals in
transcripts_unredacted/ and its FLACs in redacted_audio/.
"""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from overnight.jobs.cli import main
from overnight.jobs.dataset import storage
from overnight.jobs.ops.vacuum import vacuum
from overnight.jobs.redaction import audio_name

TODAY = datetime.now(UTC).date()
OLD, KEPT = TODAY - timedelta(days=10), TODAY  # --older-than 5d removes OLD, keeps KEPT


def _row(item: str) -> dict:
    return {"item_id": item, "source_uri": f"s3://calls/{item}.wav"}


def flac(item: str) -> str:
    return audio_name(_row(item))


def _night(out: Path, day: date, run: str, items: list[str]) -> None:
    """What a redacting run with kept originals and redacted audio leaves for ``items``."""
    part = f"run_date={day.isoformat()}"
    rows = [_row(i) | {"run_id": run} for i in items]
    for folder in ("transcripts", "run_table", "runs", "_manifests", "transcripts_unredacted"):
        (out / folder / part if folder in ("transcripts", "run_table") else out / folder).mkdir(
            parents=True, exist_ok=True
        )
    pq.write_table(pa.Table.from_pylist(rows), out / "transcripts" / part / f"part-{run}.parquet")
    pq.write_table(pa.table({"run_id": [run]}), out / "run_table" / part / f"{run}.parquet")
    (out / "runs" / f"{run}.json").write_text(json.dumps({"run_id": run}))
    pq.write_table(pa.table({"item_id": items}), out / "_manifests" / f"{run}.parquet")
    originals = [{"item_id": i, "run_id": run, "text": f"card of {i}"} for i in items]
    pq.write_table(
        pa.Table.from_pylist(originals),
        out / "transcripts_unredacted" / f"part-{run}-{day}.parquet",
    )
    (out / "redacted_audio").mkdir(exist_ok=True)
    for item in items:
        (out / "redacted_audio" / flac(item)).write_bytes(f"{run} {item}".encode())


def _originals(out: Path) -> set[tuple[str, str]]:
    return {
        (r["item_id"], r["run_id"])
        for f in (out / "transcripts_unredacted").glob("*.parquet")
        for r in pq.read_table(f).to_pylist()
    }


class _Killed(Exception):
    pass


def _vacuum_killed_before_it_deletes_its_intent(out: Path, before: date) -> None:
    """A vacuum that died after its last prune, with its intent still there."""
    real = storage.delete

    def delete(loc):
        if loc.path.endswith("_vacuum.json"):
            raise _Killed
        real(loc)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(storage, "delete", delete)
        with pytest.raises(_Killed):
            vacuum(str(out), before)
    assert (out / "_vacuum.json").exists()


# -- 1: a leftover intent and a run since -------------------------------------------------------


def test_a_leftover_intent_removes_only_its_own_runs_originals_and_keeps_what_a_later_run_wrote(
    tmp_path: Path,
):
    out = tmp_path / "out"
    _night(out, OLD, "old", ["a", "b"])
    _night(out, OLD + timedelta(days=1), "other", ["c"])
    _vacuum_killed_before_it_deletes_its_intent(out, OLD + timedelta(days=1))
    # Its index entry gone, recording a is new work again: tonight's run transcribes it anew.
    _night(out, KEPT, "tonight", ["a"])
    vacuum(str(out), OLD - timedelta(days=30))  # a shorter span: the intent's cutoff still holds
    assert _originals(out) == {("c", "other"), ("a", "tonight")}
    assert sorted(p.name for p in (out / "redacted_audio").iterdir()) == [flac("a"), flac("c")]
    assert (out / "redacted_audio" / flac("a")).read_bytes() == b"tonight a"
    assert (out / "runs" / "tonight.json").exists()
    assert not (out / "_vacuum.json").exists()


def test_a_recording_a_kept_night_transcribed_again_keeps_its_flac_when_its_old_night_goes(
    tmp_path: Path,
):
    out = tmp_path / "out"
    _night(out, OLD, "old", ["a", "b"])
    _night(out, KEPT, "tonight", ["a"])
    vacuum(str(out), KEPT)
    assert _originals(out) == {("a", "tonight")}
    assert [p.name for p in (out / "redacted_audio").iterdir()] == [flac("a")]


def test_an_intent_an_older_overnight_left_by_recording_not_by_run_is_still_finished(
    tmp_path: Path,
):
    out = tmp_path / "out"
    _night(out, OLD, "old", ["a"])
    _night(out, KEPT, "tonight", ["b"])
    for folder in ("transcripts", "run_table"):  # what it had removed before it died
        for f in (out / folder / f"run_date={OLD}").iterdir():
            f.unlink()
        (out / folder / f"run_date={OLD}").rmdir()
    intent = {"before": str(KEPT), "runs": ["old"], "items": ["a"], "audio": [flac("a")]}
    (out / "_vacuum.json").write_text(json.dumps(intent))
    vacuum(str(out), OLD)
    assert _originals(out) == {("b", "tonight")}
    assert [p.name for p in (out / "redacted_audio").iterdir()] == [flac("b")]
    assert sorted(p.name for p in (out / "runs").iterdir()) == ["tonight.json"]
    assert not (out / "_vacuum.json").exists()


# -- 2: a run id used on more than one night ---------------------------------------------------


def test_a_run_id_reused_on_a_kept_night_keeps_its_summary_and_manifest(tmp_path: Path, capsys):
    out = tmp_path / "out"
    _night(out, OLD, "nightly", ["a"])
    _night(out, KEPT, "nightly", ["b"])  # run_id = "nightly" fixed, as the docs allow
    done = vacuum(str(out), KEPT)
    assert done.runs == []
    assert (out / "runs" / "nightly.json").exists()
    assert (out / "_manifests" / "nightly.parquet").exists()
    assert not (out / "run_table" / f"run_date={OLD}").exists()
    assert (out / "run_table" / f"run_date={KEPT}" / "nightly.parquet").exists()
    # The old night's originals and audio still go: only the kept night's stay.
    assert _originals(out) == {("b", "nightly")}
    assert [p.name for p in (out / "redacted_audio").iterdir()] == [flac("b")]


# -- 4: retention spans are whole days ---------------------------------------------------------


@pytest.mark.parametrize(
    "span", ["1s", "1h", "3m", "90m", "1h30m", "6mo", "1y", "1.5d", "0d", "-3d"]
)
def test_a_retention_span_that_is_not_whole_days_or_weeks_is_refused_with_exit_2(
    span: str, tmp_path: Path, capsys
):
    out = tmp_path / "out"
    _night(out, OLD, "old", ["a"])
    _night(out, TODAY - timedelta(days=1), "yesterday", ["b"])
    before = sorted(str(p) for p in out.rglob("*"))
    assert main(["vacuum", str(out), f"--older-than={span}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert "whole days or weeks" in err and "90d" in err and "90m" not in err.replace(span, "")
    assert sorted(str(p) for p in out.rglob("*")) == before  # nothing removed


def test_a_retention_span_in_weeks_is_seven_days_each(tmp_path: Path, capsys):
    out = tmp_path / "out"
    _night(out, TODAY - timedelta(days=15), "three-weeks", ["a"])
    _night(out, TODAY - timedelta(days=13), "two-weeks", ["b"])
    assert main(["vacuum", str(out), "--older-than", "2w"]) == 0
    assert not (out / "runs" / "three-weeks.json").exists()
    assert (out / "runs" / "two-weeks.json").exists()


# -- 5: the dry run names what would go --------------------------------------------------------


def test_the_dry_run_names_the_files_it_would_remove_beside_the_partitions(tmp_path: Path, capsys):
    out = tmp_path / "out"
    _night(out, OLD, "old", ["a"])
    _night(out, KEPT, "tonight", ["b"])
    assert main(["vacuum", str(out), "--older-than", "5d", "--dry-run"]) == 0
    listed = capsys.readouterr().out
    for name in (flac("a"), "part-old-", "runs/old.json", "_manifests/old.parquet"):
        assert name in listed, (name, listed)
    assert "tonight" not in listed and flac("b") not in listed
    assert (out / "redacted_audio" / flac("a")).exists()  # a dry run removes nothing


def test_the_dry_run_lists_at_most_twenty_files_and_counts_the_rest(tmp_path: Path, capsys):
    out = tmp_path / "out"
    _night(out, OLD, "old", [f"item-{i:02d}" for i in range(30)])
    assert main(["vacuum", str(out), "--older-than", "5d", "--dry-run"]) == 0
    listed = capsys.readouterr().out.splitlines()
    # 30 FLACs, the originals' file, the summary and the manifest: 33, of which 20 named.
    assert listed[-1] == "... and 13 more file(s)"
    assert len([line for line in listed if "run_date=" not in line]) == 21


def test_the_dry_run_says_it_would_finish_an_interrupted_vacuum(tmp_path: Path, capsys):
    out = tmp_path / "out"
    _night(out, OLD, "old", ["a"])
    _night(out, KEPT, "tonight", ["b"])
    _vacuum_killed_before_it_deletes_its_intent(out, KEPT)
    assert main(["vacuum", str(out), "--older-than", "30d", "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert "interrupted" in err and "_vacuum.json" in err and str(KEPT) in err, err
    assert (out / "_vacuum.json").exists()


# -- 7: a damaged intent -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "",
        '{"before": "2026-11-0',
        '{"before": "2026-11-02"}',
        "[1, 2]",
        '{"before": "yesterday", "runs": [], "rows": {}, "audio": []}',
        '{"before": "2026-11-02", "runs": "old", "rows": {}, "audio": []}',
    ],
    ids=["empty", "cut", "keys-missing", "not-an-object", "bad-date", "bad-list"],
)
def test_a_damaged_intent_is_exit_4_in_one_line_naming_it_and_what_deleting_it_means(
    text: str, tmp_path: Path, capsys
):
    out = tmp_path / "out"
    _night(out, OLD, "old", ["a"])
    (out / "_vacuum.json").write_text(text)
    assert main(["vacuum", str(out), "--older-than", "5d"]) == 4
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert str(out / "_vacuum.json") in err and "Delete it" in err and "by hand" in err
    assert (out / "runs" / "old.json").exists()  # nothing removed


# -- 11: an OUTPUT that is no output -----------------------------------------------------------


def test_a_file_given_as_output_is_exit_4_saying_output_must_be_a_folder(tmp_path: Path, capsys):
    path = tmp_path / "calls.wav"
    path.write_bytes(b"RIFF")
    assert main(["vacuum", str(path), "--older-than", "5d"]) == 4
    err = capsys.readouterr().err
    assert "is a file" in err and "output folder" in err and "Traceback" not in err
    assert path.read_bytes() == b"RIFF"


def test_a_folder_without_overnights_datasets_is_exit_4_not_an_overnight_output(
    tmp_path: Path, capsys
):
    (tmp_path / "calls" / "2026").mkdir(parents=True)
    (tmp_path / "calls" / "2026" / "a.wav").write_bytes(b"RIFF")
    assert main(["vacuum", str(tmp_path / "calls"), "--older-than", "5d"]) == 4
    err = capsys.readouterr().err
    assert "not an overnight output" in err and "removed 0" not in err
    assert (tmp_path / "calls" / "2026" / "a.wav").exists()


# -- 12: a foreign file in a partition vacuum would remove ---------------------------------------


def test_a_foreign_parquet_file_in_an_old_run_table_partition_is_named_as_not_overnights(
    tmp_path: Path, capsys
):
    out = tmp_path / "out"
    _night(out, OLD, "old", ["a"])
    foreign = out / "run_table" / f"run_date={OLD}" / "notes.parquet"
    pq.write_table(pa.table({"foo": [1, 2, 3]}), foreign)
    assert main(["vacuum", str(out), "--older-than", "5d"]) == 4
    err = capsys.readouterr().err
    assert "notes.parquet" in err and "not overnight's" in err and "'run_id'" in err, err
    assert "damaged" not in err and "Traceback" not in err
    assert foreign.exists() and (out / "redacted_audio" / flac("a")).exists()  # nothing removed


def test_a_foreign_parquet_file_among_the_originals_is_skipped_with_a_warning_and_kept(
    tmp_path: Path, capsys
):
    out = tmp_path / "out"
    _night(out, OLD, "old", ["a"])
    foreign = out / "transcripts_unredacted" / "notes.parquet"
    pq.write_table(pa.table({"foo": [1, 2, 3]}), foreign)
    assert main(["vacuum", str(out), "--older-than", "5d"]) == 0
    err = capsys.readouterr().err
    assert "skipped" in err and "notes.parquet" in err and "Traceback" not in err
    assert foreign.exists() and _originals_without(foreign, out) == set()


def _originals_without(foreign: Path, out: Path) -> set[tuple[str, str]]:
    foreign.unlink()
    return _originals(out)
