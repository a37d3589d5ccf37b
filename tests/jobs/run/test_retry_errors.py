"""``retry_errors``: a rerun redoes the items whose row is an error of the given codes, and
every item still ends as exactly one row."""

from __future__ import annotations

import itertools
import os
from datetime import date
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from overnight.jobs.accounting.ledger import Cost
from overnight.jobs.dataset import commits, storage
from overnight.jobs.errors import ConfigError
from overnight.jobs.ops.dryrun import dry_run
from overnight.jobs.ops.vacuum import vacuum
from overnight.jobs.process import run_process
from overnight.jobs.run import runner, sizing
from overnight.jobs.run.stage import Stage
from overnight.jobs.spec import JobSpec, build_spec
from overnight.jobs.transcribe import run_transcribe
from tests.conftest import killed_at_write

SCHEMA = pa.schema(
    [("item_id", pa.string()), ("run_id", pa.string()), ("status", pa.string()),
     ("error_code", pa.string())]
)  # fmt: skip


def _publish(dataset: storage.Location, day: date, run: str, rows: list[tuple[str, str | None]]):
    staged = commits.CommittedDataset(dataset).staging_dir(day, run)
    table = pa.table(
        {
            "item_id": [i for i, _ in rows],
            "run_id": [run] * len(rows),
            "status": ["ok" if code is None else "error" for _, code in rows],
            "error_code": [code for _, code in rows],
        },
        schema=SCHEMA,
    )
    commits.CommittedDataset(staged).write_table(table)
    commits.CommittedDataset(dataset).publish(SCHEMA, run)


def _rows(dataset: storage.Location) -> list[tuple[str, str, str | None]]:
    files = commits.CommittedDataset(dataset).published_files()
    table = pa.concat_tables([commits.CommittedDataset(dataset)._read_part(p) for p in files])
    columns = (table[c].to_pylist() for c in ("item_id", "status", "error_code"))
    return sorted(zip(*columns, strict=True))


@pytest.fixture(params=["local", "s3"])
def two_nights_with_errors(request, tmp_path):
    """Two nights of published rows, on a local disk and on moto's S3 endpoint."""
    if request.param == "s3":
        client = request.getfixturevalue("s3")
        bucket = f"retry-{tmp_path.name.lower().replace('_', '-')[-40:]}"
        client.create_bucket(Bucket=bucket)
        url = f"s3://{bucket}/out/results"
    else:
        url = str(tmp_path / "out" / "results")
    dataset = storage.resolve(url)
    _publish(dataset, date(2026, 11, 1), "night-1", [("a", None), ("b", "fetch_failed")])
    _publish(dataset, date(2026, 11, 2), "night-2", [("c", "encrypted"), ("d", "fetch_failed")])
    return dataset


def test_forgetting_takes_only_the_error_rows_of_the_codes_asked_out_of_rows_and_index(
    two_nights_with_errors,
):
    dataset = two_nights_with_errors
    listed = {"a", "b", "c", "d"}
    assert commits.CommittedDataset(dataset).committed_ids(among=listed) == listed
    # Only items of this input are looked at: "d" is not listed this time.
    assert commits.CommittedDataset(dataset).forget(
        commits.CommittedDataset(dataset).error_rows({"a", "b", "c"}, ["fetch_failed"]),
    ) == {"b"}
    assert commits.CommittedDataset(dataset).committed_ids(among=listed) == {"a", "c", "d"}
    assert _rows(dataset) == [("a", "ok", None), ("c", "error", "encrypted"), ("d", "error", "fetch_failed")]  # fmt: skip
    # Any code; an ok row is never forgotten.
    assert commits.CommittedDataset(dataset).forget(
        commits.CommittedDataset(dataset).error_rows(listed, None)
    ) == {
        "c",
        "d",
    }
    assert _rows(dataset) == [("a", "ok", None)]
    assert commits.CommittedDataset(dataset).committed_ids(among=listed) == {"a"}
    assert not storage.exists(commits.CommittedDataset(dataset)._retry_intent())


def test_a_retry_killed_between_its_steps_is_finished_by_the_next_claim(
    two_nights_with_errors, monkeypatch
):
    dataset = two_nights_with_errors
    real_finish = commits.CommittedDataset.finish_forgetting
    # Killed right after the intent was written: nothing changed yet, all four stay done.
    monkeypatch.setattr(commits.CommittedDataset, "finish_forgetting", lambda self: None)
    assert commits.CommittedDataset(dataset).forget(
        commits.CommittedDataset(dataset).error_rows({"b", "d"}, None)
    ) == {"b", "d"}
    assert commits.CommittedDataset(dataset).committed_ids(among={"a", "b", "c", "d"}) == {
        "a",
        "b",
        "c",
        "d",
    }
    # Killed after the rows went, before the index entries: the items have no row but are
    # still indexed, so no run can do them a second time before the intent is finished.
    monkeypatch.setattr(commits.CommittedDataset, "index_segments", lambda self: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        real_finish(commits.CommittedDataset(dataset))
    assert _rows(dataset) == [("a", "ok", None), ("c", "error", "encrypted")]
    monkeypatch.undo()
    assert commits.CommittedDataset(dataset).committed_ids(among={"b", "d"}) == {"b", "d"}
    intent = commits.CommittedDataset(dataset)._retry_intent()
    if dataset.scheme == "file":  # retention never takes the intent, however old it is
        os.utime(intent.path, (0, 0))
        vacuum(str(Path(dataset.path).parent), before=date(2026, 10, 1))
        assert storage.exists(intent)
    commits.CommittedDataset(dataset).finish_forgetting()  # what the next claim does first
    assert commits.CommittedDataset(dataset).committed_ids(among={"a", "b", "c", "d"}) == {"a", "c"}
    assert not storage.exists(commits.CommittedDataset(dataset)._retry_intent())


def test_unknown_error_codes_are_refused_with_the_list_of_known_ones() -> None:
    job = {"input": "in", "output": "out"}
    with pytest.raises(ConfigError, match=r"fetch_faild.*fetch_failed"):
        build_spec(overrides={"job": {**job, "retry_errors": ["fetch_faild"]}})
    spec = build_spec(overrides={"job": {**job, "retry_errors": ["all", "encrypted"]}})
    assert spec.job.retry_errors == ["all"]


def _transcribe(input_: Path, output: Path, allowed: list[Path], retry: list[str] | None):
    return run_transcribe(_transcribe_spec(input_, output, allowed, retry))


def _transcribe_spec(input_: Path, output: Path, allowed: list[Path], retry: list[str] | None):
    return build_spec(
        overrides={
            "job": {
                "input": str(input_),
                "output": str(output),
                "progress": False,
                "allowed_input_prefixes": [str(p) for p in allowed],
                "retry_errors": retry,
            }
        }
    )


def _summarize_calls(output: Path) -> dict:
    spec = build_spec(
        overrides={
            "job": {"kind": "process", "input": str(output), "output": str(output)}
            | {"progress": False},
            "process": {"task": "call_summary", "backend": "ctranslate2", "max_new_tokens": 48},
        }
    )
    return run_process(spec)


@pytest.mark.usefixtures("ray_local")
def test_a_rerun_with_retry_errors_redoes_the_failed_recordings_and_leaves_one_row_each(
    synth_calls, tmp_path
):
    folder, refs = synth_calls
    calls, elsewhere, out = tmp_path / "calls", tmp_path / "elsewhere", tmp_path / "out"
    calls.mkdir()
    elsewhere.mkdir()
    first, second, third = sorted(refs)[:3]
    os.link(folder / first, calls / first)
    os.link(folder / second, calls / second)
    os.link(folder / third, elsewhere / third)
    # A link out of the tenant's folder: refused (fetch_failed) until that folder is allowed.
    (calls / third).symlink_to(elsewhere / third)

    one = _transcribe(calls, out, [calls], None)
    assert (one["succeeded"], one["errors_by_code"]) == (2, {"fetch_failed": 1})
    # A chained task over the transcripts: the failed recording is a transcript_failed row,
    # and stays one while its transcript is missing.
    summaries = _summarize_calls(out)
    assert (summaries["succeeded"], summaries["errors_by_code"]) == (2, {"transcript_failed": 1})
    assert _summarize_calls(out)["items"] == 0
    # Error rows count as done; a retry of other codes redoes nothing.
    assert _transcribe(calls, out, [calls, elsewhere], None)["items"] == 0
    assert _transcribe(calls, out, [calls, elsewhere], ["not_audio"])["items"] == 0

    # The dry run counts what the retry would redo, and changes nothing.
    spec = _transcribe_spec(calls, out, [calls, elsewhere], ["fetch_failed"])
    [stage] = dry_run(spec)["stages"]
    assert (stage["items_pending"], stage["errors_to_redo"]) == (1, 1)
    assert dry_run(spec)["stages"][0]["errors_to_redo"] == 1

    three = _transcribe(calls, out, [calls, elsewhere], ["fetch_failed"])
    assert (three["items"], three["succeeded"], three["errors_retried"]) == (1, 1, 1)
    table = pads.dataset(str(out / "transcripts"), partitioning="hive").to_table()
    rows = dict(zip(table["source_uri"].to_pylist(), table.to_pylist(), strict=True))
    assert len(rows) == table.num_rows == 3  # one row per recording
    assert {Path(uri).name: row["status"] for uri, row in rows.items()} == {
        first: "ok",
        second: "ok",
        third: "ok",
    }
    assert rows[str(calls / third)]["run_id"] == three["run_id"]
    said = set((rows[str(calls / third)]["text"] or "").lower().split())
    assert said & set(refs[third].lower().split())  # the real recording, transcribed
    # The failed try's cost row stays beside the new one: that work was done and paid for.
    costs = pads.dataset(str(out / "costs"), partitioning="hive").to_table().to_pylist()
    retried = rows[str(calls / third)]["item_id"]
    assert {c["run_id"] for c in costs if c["item_id"] == retried} == {
        one["run_id"],
        three["run_id"],
    }
    # Nothing left to redo.
    assert _transcribe(calls, out, [calls, elsewhere], ["fetch_failed"])["items"] == 0
    # The chained task redoes its transcript_failed row by itself now that the transcript is
    # there, and leaves one summary per call.
    again = _summarize_calls(out)
    assert (again["items"], again["succeeded"], again["errors_retried"]) == (1, 1, 1)
    summaries = pads.dataset(str(out / "results"), partitioning="hive").to_table().to_pylist()
    assert len({r["item_id"] for r in summaries}) == len(summaries) == 3
    assert {r["source_item_id"]: r["status"] for r in summaries}[retried] == "ok"
    assert _summarize_calls(out)["items"] == 0


@pytest.mark.usefixtures("ray_local")
def test_a_manifest_row_whose_object_was_missing_then_restored_ends_as_one_row(
    synth_calls, tmp_path
):
    """A missing object is listed without a size or ETag, so its item id differed from the
    restored object's: the retry added an ok row beside the fetch_failed one."""
    folder, refs = synth_calls
    audio, out = tmp_path / "audio", tmp_path / "out"
    audio.mkdir()
    first, late = sorted(refs)[:2]
    os.link(folder / first, audio / first)
    manifest = tmp_path / "night.csv"
    manifest.write_text(f"uri\naudio/{first}\naudio/late.wav\n")
    one = _transcribe(manifest, out, [tmp_path], None)
    assert (one["succeeded"], one["errors_by_code"]) == (1, {"fetch_failed": 1})

    os.link(folder / late, audio / "late.wav")  # restored
    # The row recorded while it was missing is still its row: error rows count as done.
    assert _transcribe(manifest, out, [tmp_path], None)["items"] == 0
    spec = _transcribe_spec(manifest, out, [tmp_path], ["fetch_failed"])
    [stage] = dry_run(spec)["stages"]
    assert (stage["items_pending"], stage["errors_to_redo"]) == (1, 1)
    again = run_transcribe(spec)
    assert (again["items"], again["succeeded"], again["errors_retried"]) == (1, 1, 1)
    table = pads.dataset(str(out / "transcripts"), partitioning="hive").to_table()
    status = {Path(r["source_uri"]).name: r["status"] for r in table.to_pylist()}
    assert table.num_rows == 2 and status == {first: "ok", "late.wav": "ok"}
    assert _transcribe(manifest, out, [tmp_path], ["fetch_failed"])["items"] == 0


COSTED = SCHEMA.append(pa.field("asr_s", pa.float64()))  # priced into costs/ at publish


def _no_model() -> None:
    """The retry below stages its rows itself: its job's model stage only declares a cost."""


class _Retry(runner.Job[runner.Prepared]):
    """A transcription job as far as the claim sees it: its records, its model stage's cost."""

    kind, dataset, schema, slim, device = "transcribe", "results", COSTED, ("item_id",), "cpu"

    def __init__(self, spec: JobSpec, records: list[dict]):
        super().__init__(spec)
        self.records = records

    def prepare(self, dry: bool) -> runner.Prepared:
        return runner.Prepared(self.records)

    def pool(self, device: str, nodes: list[sizing.Node]) -> sizing.Pool:
        return sizing.Pool(1, 1.0, 0.0, 1.0, 1, 1)

    def stages(self, at: runner.Resolved, prepared: runner.Prepared) -> runner.Build:
        model = Stage("model", _no_model, COSTED, COSTED, placement="model", actors=1,
                      cost=Cost("transcribe", "asr", timed_by_worker=True))  # fmt: skip
        return runner.Build([model], model_units=1.0, options={})


def _retry_run(output: Path, run_id: str, records: list[dict]) -> None:
    """A rerun with ``--retry-errors fetch_failed``, as ``runner.run`` does it, whose model
    makes every pending item an ok row: claim, finish what a killed run left, forget the
    error rows, stage the new rows, publish them with their cost rows."""
    spec = build_spec(
        overrides={
            "job": {"input": "listed", "output": str(output), "run_id": run_id}
            | {"run_date": "2026-11-03", "retry_errors": ["fetch_failed"]}
        }
    )
    job = _Retry(spec, records)
    claimed = runner.claim_and_subtract(job, job.prepare(dry=False))
    rows = [
        {"item_id": r["item_id"], "run_id": run_id, "status": "ok", "asr_s": 1.0}
        for r in claimed.pending
    ]
    staged = claimed.dataset.staging_dir(claimed.run_date, run_id)
    if rows:
        commits.CommittedDataset(staged).write_table(pa.Table.from_pylist(rows, schema=COSTED))
    claimed.dataset.publish(COSTED, run_id, claimed.price)


def test_a_retry_killed_at_any_write_is_finished_by_its_rerun_with_one_row_per_item(tmp_path):
    """Killed at each write of a retry in turn (forgetting the error rows, staging, and the
    publish of the retried items with their cost rows), the rerun of the same command ends
    with one row per listed item and one set of cost rows per retried item. ``e`` is a
    recording that was missing when its fetch_failed row was written, under its missing id."""
    records = [{"item_id": i} for i in "abc"] + [{"item_id": "e", "missing_id": "e-missing"}]
    expected = [("a", "ok", None), ("b", "ok", None), ("c", "error", "encrypted"), ("e", "ok", None)]  # fmt: skip
    points = []
    for n in itertools.count():
        output = tmp_path / f"killed-{n}"
        dataset = storage.resolve(str(output / "results"))
        _publish(dataset, date(2026, 11, 1), "night-1", [("a", None), ("b", "fetch_failed")])
        _publish(dataset, date(2026, 11, 2), "night-2", [("c", "encrypted"), ("e-missing", "fetch_failed")])  # fmt: skip
        with killed_at_write(n) as point:
            _retry_run(output, "retry-1", records)
        points.append(point.name)
        if point.name is not None:
            _retry_run(output, "retry-2", records)  # the same command again
        table = commits.CommittedDataset(dataset).read_results(["item_id", "status", "error_code"])
        assert table is not None
        rows = sorted(zip(*(table[c].to_pylist() for c in table.column_names), strict=True))
        assert rows == expected, f"killed at write {n}: {point.name}"
        index = [i for p in commits.CommittedDataset(dataset).index_segments() for i in pq.read_table(p)["item_id"].to_pylist()]  # fmt: skip
        assert sorted(index) == ["a", "b", "c", "e"], point.name
        costs = commits.CommittedDataset(storage.resolve(str(output / "costs"))).read_results(
            ["item_id"]
        )
        assert costs is not None and sorted(costs["item_id"].to_pylist()) == ["b", "e"], point.name
        assert not list(output.glob("_staging/**/*.*")), point.name
        assert not list(output.glob("_claims/*.retry.json")), point.name
        if point.name is None:
            break
    assert any("retry.json" in p for p in points[:-1]) and any("costs" in p for p in points[:-1])
