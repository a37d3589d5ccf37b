"""The runner on its own: a toy job of plain Python stages, no model, on a local Ray.

What a job declares is its stages (``jobs.run.stage.Stage``); claim, manifest, the chain of
``map_batches``, commit, publish and summary are the runner's. These tests hold the runner
to its record: every batch into and out of every stage is checked against what the stage
declares, wherever the stage runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pads
import pytest

from overnight.jobs.accounting.ledger import Cost
from overnight.jobs.run import runner, sizing
from overnight.jobs.run.stage import Stage, StageContractError
from overnight.jobs.spec import build_spec
from overnight.schemas import MANIFEST

pytestmark = pytest.mark.usefixtures("ray_local")

ITEMS = pa.schema([*MANIFEST, pa.field("n", pa.int64())])
# The stages' cost columns: the runner writes them (seconds, resource, units), not the stages.
DOUBLED = pa.schema([*ITEMS, pa.field("twice", pa.int64()), pa.field("double_s", pa.float64())])
SUMMED = pa.schema(
    [
        pa.field("item_id", pa.string()),
        pa.field("status", pa.string()),
        pa.field("error_code", pa.string()),
        pa.field("total", pa.int64()),
        pa.field("add_s", pa.float64()),
        pa.field("add_resource", pa.string()),
        pa.field("add_units", pa.float64()),
    ]
)
RESULTS = pa.schema(
    [
        *SUMMED,
        DOUBLED.field("double_s"),
        pa.field("source_uri", pa.string()),
        pa.field("label", pa.string()),
        pa.field("run_id", pa.string()),
    ]
)


def double(batch: pa.Table) -> pa.Table:
    return batch.append_column("twice", pa.array([2 * n for n in batch["n"].to_pylist()]))


def drop_twice(batch: pa.Table) -> pa.Table:
    """A stage that lost a column it declares (a refactoring gone wrong)."""
    return double(batch).drop_columns(["twice"])


class Adder:
    """The toy's 'model': loaded once per actor, adds ``plus`` to each row's ``twice``."""

    def __init__(self, plus: int, drop: str | None = None):
        self.plus, self.drop = plus, drop

    def __call__(self, batch: pa.Table) -> pa.Table:
        out = pa.table(
            {
                "item_id": batch["item_id"],
                "status": pa.array(["ok"] * batch.num_rows),
                "error_code": pa.nulls(batch.num_rows, pa.string()),
                "total": pa.array([t + self.plus for t in batch["twice"].to_pylist()]),
            }
        )
        return out.drop_columns([self.drop]) if self.drop else out


def label(batch: pa.Table, *, drop: str | None = None) -> pa.Table:
    labels = pa.array(
        [
            f"{i}={t}"
            for i, t in zip(batch["item_id"].to_pylist(), batch["total"].to_pylist(), strict=True)
        ]
    )
    out = batch.set_column(batch.schema.get_field_index("label"), "label", labels)
    return out.drop_columns([drop]) if drop else out


class ToyJob(runner.Job[runner.Prepared]):
    """Three items through a task stage, the model stage and a stage after it; ``broken``
    names the stage that drops a column it declares. All a job is: what it lists, how big its
    pool is, its stages; the runner does the rest."""

    kind = "toy"
    dataset = "toy_results"
    schema = RESULTS
    slim = ("item_id", "status", "error_code")
    manifest_schema = ITEMS
    device = "cpu"

    def __init__(self, output: Path, run_id: str, broken: str | None = None):
        super().__init__(
            build_spec(
                overrides={
                    "job": {"input": "listed", "output": str(output), "run_id": run_id}
                    | {"progress": False}
                }
            )
        )
        self.broken = broken

    def prepare(self, dry: bool) -> runner.Prepared:
        return runner.Prepared(
            [{"item_id": f"i{n}", "uri": f"toy://{n}", "n": n} for n in range(3)]
        )

    def pool(self, device: str, nodes: list[sizing.Node]) -> sizing.Pool:
        return sizing.Pool(
            1,
            cpus_per_actor=0.5,
            gpus_per_actor=0.0,
            task_cpus=0.5,
            model_workers=1,
            threads=1,
            basis="a toy",
        )

    def stages(self, at: runner.Resolved, prepared: runner.Prepared) -> runner.Build:
        broken = self.broken
        stages = [
            Stage(
                "double",
                drop_twice if broken == "double" else double,
                ITEMS,
                DOUBLED,
                num_cpus=0.5,
                cost=Cost("double", "double", units=0.5),
            ),
            Stage.on_pool(
                "add",
                Adder,
                at.pool,
                consumes=DOUBLED,
                produces=SUMMED,
                kwargs={"plus": 1, "drop": "total" if broken == "add" else None},
                cost=Cost("add", "add", units=at.pool.cpus_per_actor),
            ),
            Stage(
                "label",
                label,
                RESULTS,
                RESULTS,
                placement="after",
                num_cpus=0.5,
                kwargs={"drop": "label" if broken == "label" else None},
            ),
        ]
        return runner.Build(stages, model_units=0.5, options={})

    def summarize(self, rows: list[dict[str, Any]], prepared: runner.Prepared) -> dict[str, Any]:
        return {"done": sorted(r["item_id"] for r in rows if r["status"] == "ok")}


def test_a_toy_job_of_plain_python_stages_runs_through_the_runner(tmp_path):
    summary = runner.run(ToyJob(tmp_path, "toy-1"))
    assert (summary["kind"], summary["items"], summary["succeeded"]) == ("toy", 3, 3)
    # The job's own summary fields, the runner's around them.
    assert summary["done"] == ["i0", "i1", "i2"] and summary["device"] == "cpu"
    assert summary["accelerator"] == "cpu" and summary["options"]["actors"] == 1
    table = pads.dataset(str(tmp_path / "toy_results"), partitioning="hive").to_table()
    rows = sorted(table.to_pylist(), key=lambda r: r["item_id"])
    assert [(r["total"], r["label"], r["source_uri"], r["run_id"]) for r in rows] == [
        (1, "i0=1", "toy://0", "toy-1"),
        (3, "i1=3", "toy://1", "toy-1"),
        (5, "i2=5", "toy://2", "toy-1"),
    ]
    # Timed and priced by the runner: a call's time shared by its rows; what the stage held.
    assert all(r["double_s"] > 0 and r["add_s"] > 0 for r in rows)
    assert {(r["add_resource"], r["add_units"]) for r in rows} == {("cpu", 0.5)}
    # And in the ledger, under the names the stages' records give: nothing else declares them.
    costs = pads.dataset(str(tmp_path / "costs"), partitioning="hive").to_table().to_pylist()
    priced = {(c["item_id"], c["stage"]): c for c in costs}
    assert sorted(priced) == [(i, s) for i in ("i0", "i1", "i2") for s in ("add", "double")]
    assert {(c["resource"], c["units"]) for c in costs if c["stage"] == "add"} == {("cpu", 0.5)}
    add = priced["i0", "add"]
    assert add["seconds"] == rows[0]["add_s"] and add["cost_usd"] > 0
    # Resumed as any job: nothing left to do, nothing started.
    assert runner.run(ToyJob(tmp_path, "toy-2"))["items"] == 0


@pytest.mark.parametrize(
    ("stage", "column"), [("double", "twice"), ("add", "total"), ("label", "label")]
)
def test_a_stage_that_drops_a_declared_column_fails_at_that_stage_naming_it(
    tmp_path, stage, column
):
    """Before the model, as the model, after it: the error names the stage and the column,
    instead of a cast error at the Parquet write or a KeyError in a later stage."""
    with pytest.raises(StageContractError, match=rf"stage '{stage}'.*column '{column}'"):
        runner.run(ToyJob(tmp_path, f"drift-{stage}", broken=stage))
    assert not (tmp_path / "toy_results").exists() or not list(
        (tmp_path / "toy_results").rglob("*.parquet")
    )


def test_a_column_of_another_type_than_declared_fails_with_both_types():
    stage = Stage("double", double, ITEMS, pa.schema([pa.field("twice", pa.int32())]))
    batch = pa.Table.from_pylist([{"item_id": "a", "uri": "u", "n": 1}], schema=ITEMS)
    with pytest.raises(
        StageContractError, match=r"column 'twice' of its output is int64, the stage declares int32"
    ):
        stage.apply(double, batch)


def test_a_stage_that_loses_a_row_fails():
    stage = Stage("double", double, ITEMS, ITEMS)
    batch = pa.Table.from_pylist([{"item_id": i, "uri": "u", "n": 1} for i in "ab"], schema=ITEMS)
    with pytest.raises(StageContractError, match="returned 1 rows for a batch of 2"):
        stage.apply(lambda b: b.slice(0, 1), batch)


def test_the_ledger_reads_a_jobs_costs_off_its_stages_without_ray(tmp_path, monkeypatch):
    """A killed run's rows are priced at the claim, before Ray starts: the costs come from
    the stages as a run with nothing to do builds them (no nodes, no cluster asked)."""
    import ray

    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("Ray started"))
    job = ToyJob(tmp_path, "costs-1")
    priced = runner.costs(job, job.prepare(dry=True))
    assert [(c.name, c.seconds, c.units) for c in priced] == [
        ("double", "double_s", 0.5),
        ("add", "add_s", 0.5),
    ]


@pytest.mark.parametrize(
    ("address", "section", "expected"),
    [
        (None, {}, "cpu"),  # this machine: what it has
        ("10.0.0.1:6379", {}, "cpu"),  # a cluster, no GPU asked: CPU, and a warning
        ("10.0.0.1:6379", {"gpus_per_actor": 1}, "cuda"),
        # A Ray resource, which a CPU node type may carry: no GPU asked (a warning).
        ("10.0.0.1:6379", {"accelerator_type": "H100"}, "cpu"),
        (None, {"accelerator_type": "H100"}, "cpu"),  # a local run sees its own GPUs
    ],
)
def test_device_auto_on_a_cluster_whose_gpu_nodes_start_from_zero_follows_the_spec(
    monkeypatch, capsys, address, section, expected
):
    from overnight.jobs.run import console, on_ray
    from overnight.jobs.transcribe import TranscribeJob
    from overnight.workers.devices import resolve_device

    monkeypatch.setattr(on_ray, "cluster_has_gpu", lambda: False)  # no GPU node up yet
    # The warning in text, whatever format an earlier test left the events logger in.
    monkeypatch.delenv("OVERNIGHT_LOG_FORMAT", raising=False)
    monkeypatch.setattr(console, "_events", None)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # a joined cluster only where named
    spec = build_spec(
        overrides={
            "job": {"kind": "transcribe", "input": "in", "output": "out", "ray_address": address},
            "transcribe": section,
        }
    )
    job = TranscribeJob(spec)
    assert resolve_device("auto", lambda: runner._cluster_gpu(job)) == expected
    warned = 'set device = "cuda"' in capsys.readouterr().err
    assert warned is (address is not None and expected == "cpu")
