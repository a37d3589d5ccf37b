"""The defects a hostile probe found (issue #35): run ids used as paths, a restored object
that got a second row, retention that could not finish after a crash or kept redacted
audio, manifests that copied transcript text, tenants whose paths overlap, and a span too
long for a date. Each test states what must hold."""

from __future__ import annotations

import itertools
import json
import shutil
from datetime import date
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tomli_w

from overnight.jobs.cli import main
from overnight.jobs.dataset import commits, storage
from overnight.jobs.errors import ConfigError
from overnight.jobs.spec import build_spec

SCHEMA = pa.schema([("item_id", pa.string()), ("run_id", pa.string())])


@pytest.mark.parametrize("run_id", ["nightly/2026-12-06", "", "../../x", "a b", "x" * 129])
def test_a_run_id_that_is_no_safe_file_name_is_refused_with_exit_2(run_id, tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["transcribe", str(tmp_path), str(out), "--run-id", run_id, "--quiet"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "job.run_id" in err and "letters, digits" in err and "Traceback" not in err
    assert not out.exists()  # nothing written, least of all outside OUTPUT
    # The spec model refuses it, so job files and the Python API do too.
    with pytest.raises(ConfigError, match="run_id"):
        build_spec(overrides={"job": {"input": "in", "output": "out", "run_id": run_id}})


def test_a_run_id_of_letters_digits_dots_dashes_and_underscores_is_taken():
    spec = build_spec(
        overrides={"job": {"input": "i", "output": "o", "run_id": "Nightly_2026.12-06"}}
    )
    assert spec.run_id == "Nightly_2026.12-06"


def test_a_staged_file_that_publish_cannot_reach_is_not_done(tmp_path):
    """Staged under a run id with a '/' (a nested folder) or an empty one (the date's own
    folder), as runs did before run ids were checked: publish never takes such a file, so its
    items must be pending work, not done without a row."""
    dataset = storage.resolve(str(tmp_path / "out" / "transcripts"))
    day = date(2026, 12, 6)
    for run, item in (("nightly/2026-12-06", "nested"), ("", "flat")):
        table = pa.table({"item_id": [item], "run_id": [run]}, schema=SCHEMA)
        commits.CommittedDataset(
            commits.CommittedDataset(dataset).staging_dir(day, run)
        ).write_table(table)
    commits.CommittedDataset(
        commits.CommittedDataset(dataset).staging_dir(day, "good")
    ).write_table(
        pa.table({"item_id": ["good"], "run_id": ["good"]}, schema=SCHEMA),
    )
    among = {"nested", "flat", "good"}
    assert commits.CommittedDataset(dataset).committed_ids(among=among) == {"good"}
    assert commits.CommittedDataset(dataset).publish(SCHEMA, "next").rows == 1
    assert commits.CommittedDataset(dataset).committed_ids(among=among) == {"good"}


@pytest.mark.parametrize(("command", "flag"), [("vacuum", "--older-than"), ("report", "--since")])
def test_a_span_back_before_the_year_1_is_refused_in_one_line_with_exit_2(
    command, flag, tmp_path, capsys
):
    code = main([command, str(tmp_path), flag, "3000000d"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and "before the year 1" in err and "Traceback" not in err


def _tenants(**changes: Any) -> dict:
    """acme and globex apart; ``changes`` ("tenant.key" or "state") move one place."""
    data: dict = {
        "submissions": {"state": "s3://state/subs"},
        "tenants": {
            name: {
                "allowed_input_prefixes": [f"s3://{name}-calls/rec/"],
                "inbox": f"s3://inbox/{name}/",
                "output": f"s3://{name}-out/overnight/",
            }
            for name in ("acme", "globex")
        },
    }
    for where, url in changes.items():
        if where == "state":
            data["submissions"]["state"] = url
        else:
            tenant, key = where.split("__")
            data["tenants"][tenant][key] = url
    return data


@pytest.mark.parametrize(
    "changes",
    [
        # acme's results under globex's inputs (spelt otherwise: normalized as URIs are)
        {"acme__output": "s3://GLOBEX-calls/rec/acme/"},
        # globex may read all of acme's results
        {"globex__allowed_input_prefixes": ["s3://globex-calls/rec/", "s3://acme-out/"]},
        {"acme__inbox": "s3://globex-calls/rec/./inbox/"},
        {"state": "s3://globex-calls/rec/state"},
        {"state": "s3://acme-out/overnight/state/"},
        {"state": "s3://acme-calls/"},
    ],
    ids=["output", "output-below", "inbox", "state-in-input", "state-in-output", "state-above"],
)
def test_a_tenant_config_whose_places_lie_in_another_tenants_inputs_is_refused_with_exit_2(
    changes, tmp_path, capsys
):
    path = tmp_path / "tenants.toml"
    path.write_text(tomli_w.dumps(_tenants(**changes)))
    code = main(["submissions", "list", "--config", str(path)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "overlap" in err and "Traceback" not in err


def test_a_tenants_results_under_its_own_input_prefix_are_its_own_to_read(tmp_path):
    from overnight.jobs.ops.submissions.config import TenantsConfig

    data = _tenants(acme__output="s3://acme-calls/rec/results/")
    assert sorted(TenantsConfig.model_validate(data).tenants) == ["acme", "globex"]


SECRET_TEXT = "the customer's card is four five three nine and the meeting is on Thursday"


@pytest.mark.usefixtures("ray_local")
def test_a_process_job_over_transcripts_records_a_manifest_without_their_text(tmp_path):
    from overnight.jobs.process import run_process
    from overnight.schemas import TRANSCRIPTS

    out = tmp_path / "out"
    transcripts = storage.resolve(str(out / "transcripts"))
    row = {"item_id": "call-1", "source_uri": "/calls/1.wav", "status": "ok", "text": SECRET_TEXT}
    commits.CommittedDataset(
        commits.CommittedDataset(transcripts).staging_dir(date(2026, 12, 6), "night")
    ).write_table(
        pa.Table.from_pylist([{**row, "run_id": "night"}], schema=TRANSCRIPTS),
    )
    commits.CommittedDataset(transcripts).publish(TRANSCRIPTS, "night")
    spec = build_spec(
        overrides={
            "job": {"kind": "process", "input": str(out), "output": str(out), "progress": False},
            "process": {"task": "classify", "labels": ["schedule", "billing"]}
            | {"backend": "ctranslate2", "max_new_tokens": 8},
        }
    )
    summary = run_process(spec)
    assert summary["succeeded"] == 1  # the model read the transcript's text
    [manifest] = (out / "_manifests").iterdir()
    assert "text" not in pq.read_schema(manifest).names
    assert b"Thursday" not in manifest.read_bytes()
    assert "Thursday" not in json.dumps(pq.read_table(manifest).to_pylist())


NIGHT_ONE, NIGHT_TWO = "2026-11-01", "2026-11-02"


@pytest.fixture(scope="module")
def two_redacted_nights(tmp_path_factory, ray_local):
    """A card-number call transcribed on night one and a second recording on night two,
    redacted with the originals kept and redacted audio written: every kind of file a
    night leaves under OUTPUT."""
    from overnight.jobs.ops.demo import espeak_available, stereo_dialogue, write_wav
    from overnight.jobs.transcribe import run_transcribe
    from tests.jobs.test_redaction_job import TURNS

    if not espeak_available():
        pytest.skip("espeak-ng is not installed")
    root = tmp_path_factory.mktemp("redacted-nights")
    calls, out = root / "calls", root / "out"
    calls.mkdir()
    write_wav(calls / "card.wav", stereo_dialogue(TURNS, gap_s=0.4)[0])
    runs = []
    for night in (NIGHT_ONE, NIGHT_TWO):
        if night == NIGHT_TWO:
            shutil.copy(calls / "card.wav", calls / "later.wav")
        spec = build_spec(
            overrides={
                "job": {"input": str(calls), "output": str(out)}
                | {"run_date": night, "progress": False},
                "transcribe": {"channel_labels": ["agent", "customer"], "redact": ["pci"]}
                | {"keep_unredacted": True, "redact_audio": True},
            }
        )
        runs.append(run_transcribe(spec))
    assert [r["succeeded"] for r in runs] == [1, 1]
    return out, runs


def _tree(root: Path) -> dict[str, str]:
    """Every file under ``root`` by its path there, Parquet files as their rows."""
    from tests.jobs.test_redaction_job import every_file

    return {str(Path(p).relative_to(root)): text for p, text in every_file(root).items()}


def _night_rows(root: Path, dataset: str) -> list[dict]:
    files = sorted((root / dataset).rglob("*.parquet"))
    return [r for f in files for r in pq.read_table(f).to_pylist()]


def test_vacuum_removes_a_nights_redacted_audio_and_originals_and_keeps_the_other_nights(
    two_redacted_nights, tmp_path
):
    from overnight.jobs.ops.vacuum import vacuum

    built, (one, two) = two_redacted_nights
    out = tmp_path / "out"
    shutil.copytree(built, out)
    before = _tree(out)
    ids = {r["run_id"]: r["item_id"] for r in _night_rows(out, "transcripts")}
    flacs = {f"card-{ids[one['run_id']][:12]}.flac", f"later-{ids[two['run_id']][:12]}.flac"}
    assert {p.name for p in (out / "redacted_audio").iterdir()} == flacs
    vacuum(str(out), date.fromisoformat(NIGHT_TWO))
    after = _tree(out)
    gone = set(before) - set(after)
    assert [p.name for p in (out / "redacted_audio").iterdir()] == [
        f"later-{ids[two['run_id']][:12]}.flac"
    ]
    assert f"redacted_audio/card-{ids[one['run_id']][:12]}.flac" in gone
    assert [r["item_id"] for r in _night_rows(out, "transcripts_unredacted")] == [
        ids[two["run_id"]]
    ]
    assert {f"runs/{one['run_id']}.json", f"_manifests/{one['run_id']}.parquet"} <= gone
    assert not [p for p in after if NIGHT_ONE in p]
    assert not (out / "_vacuum.json").exists()
    # What the kept night wrote is there as it was.
    kept = [p for p in before if NIGHT_TWO in p or two["run_id"] in p or "later-" in p]
    assert kept and {p: after.get(p) for p in kept} == {p: before[p] for p in kept}


def test_a_vacuum_killed_at_any_write_is_finished_by_the_next_vacuum(two_redacted_nights, tmp_path):
    """Vacuum learned which runs a night held from run_table/ and deleted that first: killed
    after it, the night's originals and summaries stayed forever, and a rerun found nothing
    to do. Killed at each of its writes in turn, a rerun ends as one uninterrupted vacuum."""
    from overnight.jobs.ops.vacuum import vacuum
    from tests.conftest import killed_at_write

    built, _ = two_redacted_nights
    cutoff = date.fromisoformat(NIGHT_TWO)
    whole = tmp_path / "whole"
    shutil.copytree(built, whole)
    vacuum(str(whole), cutoff)
    expected = _tree(whole)
    points = []
    for n in itertools.count():
        out = tmp_path / f"killed-{n}"
        shutil.copytree(built, out)
        with killed_at_write(n) as point:
            vacuum(str(out), cutoff)
        if point.name is None:
            break
        points.append(point.name)
        vacuum(str(out), cutoff)
        assert _tree(out) == expected, f"killed at write {n}: {point.name}"
        shutil.rmtree(out)
    # The intent, the original, the night's audio, summary and manifest, the partitions,
    # the index and run_table/: every one was a point a kill came at.
    places = ("_vacuum.json", "transcripts_unredacted", "redacted_audio", "runs/", "_manifests")
    places += (f"transcripts/run_date={NIGHT_ONE}", "_index/", f"run_table/run_date={NIGHT_ONE}")
    for where in places:
        assert any(where in p for p in points), (where, points)
