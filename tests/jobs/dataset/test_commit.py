"""The commit protocol: one writer per result dataset, and one row per item even when a dying
run's actor commits late (no Ray needed: the committing actor is a plain class)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from overnight.jobs.dataset import commits, storage
from overnight.jobs.dataset.commits import CommittedDataset
from overnight.jobs.dataset.manifest import manifest_table
from overnight.jobs.errors import StorageUnavailable, Superseded
from overnight.jobs.run import committing, on_ray
from tests.conftest import secrets_in

SCHEMA = pa.schema(
    [
        pa.field("item_id", pa.string()),
        pa.field("run_id", pa.string()),
        pa.field("status", pa.string()),
        pa.field("text", pa.string()),
    ]
)


def batch(run_id: str, *items: str) -> pa.Table:
    return pa.Table.from_pylist(
        [
            {"item_id": i, "run_id": run_id, "status": "ok", "text": f"{i} by {run_id}"}
            for i in items
        ],
        schema=SCHEMA,
    )


def actor(dataset: storage.Location, token: str) -> committing.CommittingActor:
    return committing.CommittingActor(
        lambda: lambda table: table,
        commits.CommittedDataset(dataset),
        SCHEMA,
        ["item_id", "status"],
        token,
    )


@pytest.fixture(params=["local", "s3"])
def dataset(request, tmp_path):
    if request.param == "local":
        return storage.resolve(str(tmp_path / "out" / "transcripts"))
    client = request.getfixturevalue("s3")
    if "results" not in {b["Name"] for b in client.list_buckets().get("Buckets", [])}:
        client.create_bucket(Bucket="results")
    return storage.resolve(f"s3://results/{tmp_path.name}/transcripts")  # the server is shared


def read_all(dataset: storage.Location) -> list[dict]:
    files = storage.list_files(dataset, ".parquet")
    return pads.dataset(files, filesystem=dataset.fs, format="parquet").to_table().to_pylist()


def test_a_writer_of_an_earlier_run_cannot_commit_once_a_new_run_has_claimed_the_dataset(
    dataset,
):
    old = actor(dataset, commits.CommittedDataset(dataset).claim("nightly"))
    assert old(batch("nightly", "a", "b")).num_rows == 2  # the holder of the claim commits

    # The rerun reuses the scheduled run id: the claim still tells the two attempts apart.
    new = actor(dataset, commits.CommittedDataset(dataset).claim("nightly"))
    with pytest.raises(Superseded) as err:
        old(batch("nightly", "c"))
    assert "nightly" in str(err.value) and "one job per output" in str(err.value)
    assert not secrets_in(str(err.value))
    assert sorted(r["item_id"] for r in read_all(dataset)) == ["a", "b"]  # nothing written

    new(batch("nightly", "c"))
    assert sorted(r["item_id"] for r in read_all(dataset)) == ["a", "b", "c"]
    # The claim lives beside the dataset: its folder holds only the Parquet files.
    assert all(p.endswith(".parquet") for p in storage.list_files(dataset))
    assert storage.exists(commits.CommittedDataset(dataset).claim_file())


def test_late_rows_of_a_killed_run_are_removed_and_the_current_runs_rows_kept(dataset):
    for part in (batch("run-2", "x", "z"), batch("run-1", "x", "y", "w"), batch("run-2", "y")):
        commits.CommittedDataset(dataset).commit(part, SCHEMA, ["item_id"])

    removed = commits.CommittedDataset(dataset).drop_duplicates(SCHEMA, keep_run="run-2")

    assert removed == 2
    rows = {r["item_id"]: r for r in read_all(dataset)}
    assert len(read_all(dataset)) == len(rows) == 4  # exactly one row per item
    assert rows["x"]["run_id"] == rows["y"]["run_id"] == "run-2"  # the ones the summary counted
    assert rows["w"]["text"] == "w by run-1"  # the killed run's other item is kept
    assert sorted(len(ids) for ids in CommittedDataset(dataset).committed_files().values()) == [
        1,
        1,
        2,
    ]
    assert (
        commits.CommittedDataset(dataset).drop_duplicates(SCHEMA, keep_run="run-2") == 0
    )  # nothing left to do


def test_duplicates_between_two_earlier_runs_keep_one_row_chosen_by_file_name(dataset):
    commits.CommittedDataset(dataset).commit(batch("run-1", "x"), SCHEMA, ["item_id"])
    commits.CommittedDataset(dataset).commit(batch("run-2", "x", "y"), SCHEMA, ["item_id"])
    first = CommittedDataset(dataset).committed_files()

    assert commits.CommittedDataset(dataset).drop_duplicates(SCHEMA, keep_run="run-3") == 1

    rows = read_all(dataset)
    assert sorted(r["item_id"] for r in rows) == ["x", "y"]
    keeper = min(p for p, ids in first.items() if "x" in ids)
    assert next(r for r in rows if r["item_id"] == "x")["run_id"] == (
        "run-1" if first[keeper] == ["x"] else "run-2"
    )


def _slow_call(batch):
    import time

    time.sleep(4)
    return batch


def test_an_item_longer_than_rays_no_progress_timeout_does_not_stop_the_job(ray_local):
    import ray
    from ray.data.exceptions import ExecutionTimeoutError

    context = ray.data.DataContext.get_current()
    # Ray Data's guard, scaled down from its 30 minutes: one slow call trips it ...
    context.execution_no_progress_timeout_s = 1
    with pytest.raises(ExecutionTimeoutError):
        ray.data.range(1).map_batches(_slow_call).take_all()
    # ... and a job's Ray set-up turns it off: the slow item ends as its row.
    on_ray.ensure_ray(None)
    assert ray.data.range(1).map_batches(_slow_call).take_all() == [{"id": 0}]


def _committed_after(batch):
    import time

    time.sleep(0.5 if batch["item_id"][0].as_py() == "first" else 8.0)
    return batch


def test_the_driver_counts_each_committed_block_when_it_is_done_not_when_the_next_one_is(
    ray_local,
):
    import time

    import ray

    table = pa.table({"item_id": ["first", "slow"], "status": ["ok", "ok"]})
    ds = ray.data.from_arrow([table.slice(0, 1), table.slice(1, 1)]).map_batches(
        _committed_after, batch_size=1, batch_format="pyarrow", num_cpus=0.5
    )
    seen: list[float] = []
    started = time.monotonic()
    outcome = on_ray.execute(
        ds,
        {"first", "slow"},
        on_ray.Progress(2, enabled=False),
        (),
        on_rows=lambda n: seen.append(time.monotonic() - started),
    )
    assert sorted(r["item_id"] for r in outcome.rows) == ["first", "slow"]
    # The first block is done after about 0.5 s (plus Ray Data's start); the second after
    # 8 s. Ray Data's default prefetch handed over the first only with the second.
    assert seen[0] < 5.0 < seen[1], seen


def test_progress_lines_keep_coming_while_nothing_is_committed_and_count_tokens(capsys):
    import time

    progress = on_ray.Progress(3, enabled=True, every_s=0.5)
    with progress:
        time.sleep(2.2)  # a long first document: no row yet
        progress.update([{"status": "ok", "input_tokens": 900, "output_tokens": 100}])
    lines = capsys.readouterr().err.splitlines()
    waiting = [line for line in lines if "0/3 items" in line]
    assert len(waiting) >= 3, lines
    assert "ETA after the first items" in waiting[0]
    progress.update([{"status": "error"}, {"status": "ok"}])
    last = capsys.readouterr().err.splitlines()[-1]
    assert "3/3 items (100%)" in last and "1000 tokens" in last and "1 errors" in last


def test_a_workers_own_columns_are_committed_with_the_source_metadata_and_run_provenance():
    schema = pa.schema(
        [
            pa.field("item_id", pa.string()),
            pa.field("source_uri", pa.string()),
            pa.field("tenant", pa.string()),
            pa.field("text", pa.string()),
            pa.field("options", pa.string()),
            pa.field("run_id", pa.string()),
            pa.field("processed_at", pa.timestamp("us", tz="UTC")),
        ]
    )
    inputs = pa.table({"item_id": ["a", "b"], "uri": ["/x/a", "/x/b"], "tenant": ["t1", None]})
    produced = pa.table({"item_id": ["a", "b"], "text": ["hello", "world"]})
    out = commits.with_provenance(inputs, produced, schema, commits.Provenance("r1", '{"k":1}'))
    assert out.schema.names == schema.names
    rows = out.to_pylist()
    assert [(r["source_uri"], r["tenant"], r["text"]) for r in rows] == [
        ("/x/a", "t1", "hello"),
        ("/x/b", None, "world"),
    ]
    assert {(r["run_id"], r["options"]) for r in rows} == {("r1", '{"k":1}')}
    assert all(r["processed_at"] is not None for r in rows)
    with pytest.raises(RuntimeError, match="one to one"):
        commits.with_provenance(inputs, produced.take([1, 0]), schema, commits.Provenance("r1"))


def test_a_duplicate_in_a_file_of_an_older_schema_version_is_repaired_in_its_own_schema(dataset):
    # A file written before the schema gained `text` (an upgrade: new nullable columns).
    old_schema = pa.schema([f for f in SCHEMA if f.name != "text"])
    old = pa.Table.from_pylist(
        [{"item_id": i, "run_id": "run-1", "status": "ok"} for i in ("x", "w")], schema=old_schema
    )
    commits.CommittedDataset(dataset).write_table(old)
    commits.CommittedDataset(dataset).commit(batch("run-2", "x"), SCHEMA, ["item_id"])

    assert commits.CommittedDataset(dataset).drop_duplicates(SCHEMA, keep_run="run-2") == 1

    rows = {r["item_id"]: r for r in read_all(dataset)}
    assert sorted(rows) == ["w", "x"] and rows["x"]["run_id"] == "run-2"
    assert rows["w"]["text"] is None  # the old file, rewritten as it was: no `text` column


class _StorageGoneAtStart:
    """An actor whose constructor meets one of our systemic errors (here, storage)."""

    def __init__(self):
        raise StorageUnavailable("cannot reach s3://night/out: check the endpoint and rerun")

    def __call__(self, batch):
        return batch


def test_our_error_raised_in_an_actors_constructor_stops_the_job_as_itself(ray_local):
    """Ray keeps only the text of an exception raised in an actor's constructor; the job
    still stops with our error, its exit code and its message, not as "the pipeline failed:
    SystemException" (exit 6)."""
    import ray

    ds = ray.data.from_arrow(pa.table({"item_id": ["a"], "status": ["ok"]})).map_batches(
        _StorageGoneAtStart, batch_format="pyarrow", concurrency=1, num_cpus=0.5
    )
    with pytest.raises(StorageUnavailable) as caught:
        on_ray.execute(ds, {"a"}, on_ray.Progress(1, enabled=False), ())
    assert str(caught.value) == "cannot reach s3://night/out: check the endpoint and rerun"
    assert caught.value.exit_code == StorageUnavailable.exit_code


def test_the_manifest_is_recorded_and_handed_to_ray_data_in_blocks_without_a_ray_task(
    ray_local, tmp_path, monkeypatch
):
    """Blocks come from the driver as they are: 8, 8 and 4 rows, in order; an empty
    manifest is one empty block of the manifest's schema. ``from_arrow`` ran one remote task
    per block to read back sizes the driver already had (0.35-0.42 s on the critical path
    of every run); Ray Data's remote functions are refused here."""
    import ray
    from ray.data import read_api

    def no_remote_task(fn, *args, **kwargs):
        raise AssertionError(f"a Ray task was started for the manifest: {fn.__name__}")

    monkeypatch.setattr(read_api, "cached_remote_fn", no_remote_task)

    records = [{"item_id": f"i{n:02d}", "uri": f"/in/{n}.wav"} for n in range(20)]
    table = manifest_table(records).append_column("status", pa.array(["ok"] * 20))
    output = storage.resolve(str(tmp_path / "out"))
    ds = on_ray.manifest_dataset(output, "run-1", table, rows_per_block=8)
    blocks = ray.get(ds.to_arrow_refs())
    assert [b.num_rows for b in blocks] == [8, 8, 4]
    assert pa.concat_tables(blocks).equals(table)
    recorded = pq.read_table(tmp_path / "out" / "_manifests" / "run-1.parquet")
    assert recorded.equals(manifest_table(records))  # the items, not the stage's columns

    empty = on_ray.manifest_dataset(output, "run-2", table.schema.empty_table())
    assert [b.schema for b in ray.get(empty.to_arrow_refs())] == [table.schema]


def _dies_on_poison() -> Callable[[pa.Table], pa.Table]:
    def work(table: pa.Table) -> pa.Table:
        if "poison" in table.column("item_id").to_pylist():
            os._exit(1)  # as the kernel's OOM killer or a crash in the engine ends the process
        time.sleep(0.3)  # long enough that other calls are in flight when it dies
        return table

    return work


@pytest.mark.timeout(120)  # without the bound, Ray runs the call again forever
def test_a_call_that_kills_its_model_process_every_time_ends_as_error_rows_and_the_job_goes_on(
    ray_local, tmp_path
):
    """Ray Data restarts a dead actor and runs its calls again without limit: an input that
    kills the process every time looped forever. The call is run again once, alone among the
    calls that saw a death; after its second death its items are ``worker_crashed`` rows, and
    every other item, in flight beside it or not, is committed as it should be."""
    import ray

    schema = SCHEMA.append(pa.field("error_code", pa.string())).append(
        pa.field("error_message", pa.string())
    )
    dataset = storage.resolve(str(tmp_path / "out" / "transcripts"))
    token = commits.CommittedDataset(dataset).claim("nightly")
    items = [f"item-{i}" for i in range(10)]
    items[4:6] = ["poison", "mate"]  # one call of two: the poison and an innocent item
    blocks = [batch("nightly", *items[i : i + 2]) for i in range(0, len(items), 2)]
    ds = ray.data.from_blocks(blocks).map_batches(
        committing.CommittingActor,
        fn_constructor_kwargs={
            "make_worker": _dies_on_poison,
            "dataset": commits.CommittedDataset(dataset),
            "schema": schema,
            "slim": ["item_id", "status"],
            "token": token,
            "provenance": commits.Provenance("nightly"),
        },
        batch_format="pyarrow",
        batch_size=2,
        compute=ray.data.ActorPoolStrategy(
            size=1, max_concurrent_calls_per_actor=3, enable_true_multi_threading=True
        ),
        num_cpus=0.5,
    )
    outcome = on_ray.execute(ds, set(items), on_ray.Progress(len(items), enabled=False), ())
    assert sorted(r["item_id"] for r in outcome.rows) == sorted(items)
    rows = {r["item_id"]: r for r in read_all(dataset)}
    assert sorted(rows) == sorted(items)  # each item committed once
    failed = {i for i, r in rows.items() if r["status"] == "error"}
    assert failed == {"poison", "mate"}, rows
    assert {rows[i]["error_code"] for i in failed} == {"worker_crashed"}
    assert (
        "died 2 times while this call of 2 items was in flight" in rows["poison"]["error_message"]
    )
