"""The stage record: one step of a job's Ray Data chain, declared rather than wired by hand.

Like a ``ray.data.llm`` stage (callable, constructor arguments, ``map_batches`` arguments,
required columns) and a NeMo Curator stage (``inputs()``/``outputs()``, resources), a
``Stage`` carries its callable, its arguments, what it holds, how many run at once, its batch
size, where it runs (before, as, or after the model), the Arrow contracts it consumes and
produces (declared in ``schemas/``), and what it costs (``jobs.accounting.ledger.Cost``). The runner
(``jobs.run.runner``) turns a plan's stages into ``map_batches`` calls, each through
``run_task`` or ``Stage.start``: nothing calls a stage's callable another way, so every batch
in and out of every stage is checked against its record, and timed and priced by it, as
datatrove's pipeline steps get their timing from their base class.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa
import pyarrow.compute as pc

from overnight.jobs.accounting.ledger import Cost
from overnight.workers.devices import detect_gpu_kind

if TYPE_CHECKING:
    from overnight.jobs.run.sizing import Pool

# before: Ray tasks on the manifest blocks; model: the actor pool, whose actor commits each
# batch it finishes; after: Ray tasks the committing actor runs on each batch before that
# commit (``jobs.run.committing.CommittingActor``).
Placement = Literal["before", "model", "after"]
PLACEMENTS: tuple[Placement, ...] = ("before", "model", "after")


class StageContractError(Exception):
    """A batch into or out of a stage lacks a column its record declares, holds it with
    another type, or a stage returned another number of rows than it was given.

    A bug in the stage (or in its record), not in the data: found at the stage that broke
    its contract rather than at the Parquet write, several stages later. Not an
    ``OvernightError``: the job stops with the traceback (exit 1), to be reported.
    """


@dataclass(frozen=True)
class Stage:
    """One step: ``fn(batch, **kwargs)`` as Ray tasks, or, for the model stage (placement
    ``model``), ``fn(**kwargs)`` once per actor, returning the batch callable whose output
    the runner commits.

    name: for messages and the start-up line.
    fn: a batch function (task stage) or a worker factory (model stage).
    consumes, produces: the Arrow contracts of its input and output batches: each declared
    column must be there with that type (other columns may ride along); nullability is not
    checked, nor values. ``produces`` includes the cost columns the runner writes.
    kwargs: ``fn_kwargs`` of a task stage, the factory's arguments of the model stage.
    placement: before the model, the model itself (an actor pool), or after it.
    num_cpus, num_gpus, accelerator_type: what each task or actor holds.
    actors: the model stage's pool size.
    calls_per_actor: actor calls in flight at once (their work batched together inside).
    rows_per_call: rows per call (Ray Data's batch_size, not the model's batch); None: one manifest block per task.
    cost: its ledger stage, and the seconds, resource and units the runner writes into its
    output for it (those of its columns that ``produces`` declares); None: not priced.
    """

    name: str
    fn: Callable[..., Any]
    consumes: pa.Schema
    produces: pa.Schema
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    placement: Placement = "before"
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    accelerator_type: str | None = None
    actors: int | None = None
    calls_per_actor: int = 1
    rows_per_call: int | None = None
    cost: Cost | None = None

    def __post_init__(self) -> None:
        where = f"stage {self.name!r}"
        if self.placement not in PLACEMENTS:
            raise ValueError(f"{where}: placement {self.placement!r}, not one of {PLACEMENTS}")
        if (self.placement == "model") != (self.actors is not None):
            raise ValueError(f"{where}: the model stage, and only it, has an actor pool")
        if self.cost is not None and self.cost.model != (self.placement == "model"):
            # The ledger's ``model_stage`` is read off the record, not off a list of names.
            object.__setattr__(
                self, "cost", dataclasses.replace(self.cost, model=self.placement == "model")
            )
        if self.cost is not None:
            timed = [self.cost.seconds, *(f"{part}_s" for part in self.cost.parts)]
            missing = [name for name in timed if name not in self.produces.names]
            if missing:
                raise ValueError(f"{where} is priced by {missing}, which it does not produce")

    @classmethod
    def on_pool(
        cls,
        name: str,
        fn: Callable[..., Any],
        pool: Pool,
        *,
        consumes: pa.Schema,
        produces: pa.Schema,
        kwargs: Mapping[str, Any],
        accelerator_type: str | None = None,
        calls_per_actor: int = 1,
        rows_per_call: int | None = None,
        cost: Cost | None = None,
    ) -> Stage:
        """The model stage: an actor pool of the sized pool's shape (actors, CPUs, GPUs)."""
        return cls(
            name,
            fn,
            consumes,
            produces,
            kwargs,
            placement="model",
            num_cpus=pool.cpus_per_actor,
            num_gpus=pool.gpus_per_actor,
            accelerator_type=accelerator_type,
            actors=pool.actors,
            calls_per_actor=calls_per_actor,
            rows_per_call=rows_per_call,
            cost=cost,
        )

    def resources(self) -> dict[str, Any]:
        """The ``map_batches`` resource arguments."""
        held: dict[str, Any] = {"num_cpus": self.num_cpus}
        if self.num_gpus:
            held["num_gpus"] = self.num_gpus
        if self.accelerator_type:
            held["accelerator_type"] = self.accelerator_type
        return held

    def start(self) -> Callable[[pa.Table], pa.Table]:
        """The model stage's batch callable, in its actor: the worker loaded once, each call
        run as ``run_task`` runs a task stage's."""
        worker = self.fn(**self.kwargs)
        resource = self.resource()  # once: what an actor holds does not change
        return lambda batch: self.apply(worker, batch, resource)

    def resource(self) -> str | None:
        """The price-table key of what this process holds for the stage."""
        if self.cost is None:
            return None
        return self.cost.resource if self.cost.resource is not None else detect_gpu_kind()

    def apply(
        self, fn: Callable[[pa.Table], pa.Table], batch: pa.Table, resource: str | None = None
    ) -> pa.Table:
        """``fn(batch)``, timed and priced (``cost``), its contracts checked on the way in
        and out."""
        self.check(batch, self.consumes, "input")
        started = time.perf_counter()
        out = fn(batch)
        seconds = time.perf_counter() - started
        if out.num_rows != batch.num_rows:
            raise StageContractError(
                f"stage {self.name!r} returned {out.num_rows} rows for a batch of "
                f"{batch.num_rows}: a stage keeps one row per input row"
            )
        if self.cost is not None:
            out = self._priced(out, seconds, resource or self.resource())
        self.check(out, self.produces, "output")
        return out

    def check(self, batch: pa.Table, contract: pa.Schema, side: str) -> None:
        """Each column of ``contract`` is in ``batch`` with its type (names and types only:
        a per-batch cost of microseconds)."""
        for declared in contract:
            i = batch.schema.get_field_index(declared.name)
            if i < 0:
                raise StageContractError(
                    f"stage {self.name!r}: its {side} has no column {declared.name!r} "
                    f"({declared.type}), which the stage declares"
                )
            found = batch.schema.field(i).type
            if found != declared.type:
                raise StageContractError(
                    f"stage {self.name!r}: the column {declared.name!r} of its {side} is "
                    f"{found}, the stage declares {declared.type}"
                )

    def _priced(self, out: pa.Table, seconds: float, resource: str | None) -> pa.Table:
        """``out`` with the stage's cost columns: its seconds, shared evenly among the rows
        (unless its worker times each row), and, on the rows that spent time here (seconds
        not null), its resource and units; other rows keep what they had (a row that failed
        upstream, which the stage passed on untouched)."""
        cost, n = self.cost, out.num_rows
        assert cost is not None  # by apply
        if not cost.timed_by_worker:
            out = _put(out, self.produces.field(cost.seconds), [seconds / max(n, 1)] * n)
        spent = pc.is_valid(out[cost.seconds])
        for name, value in ((cost.resource_column, resource), (cost.units_column, cost.units)):
            if name not in self.produces.names:
                continue  # the result schema has no such column: priced as one cpu unit
            declared = self.produces.field(name)
            had = out[name] if name in out.column_names else None
            if had is None or had.type != declared.type:
                had = pa.nulls(n, declared.type)
            out = _put(out, declared, pc.if_else(spent, pa.scalar(value, declared.type), had))
        return out


def run_task(batch: pa.Table, *, stage: Stage) -> pa.Table:
    """A task stage's batch, as the runner runs it (``map_batches`` and ``ray.remote``
    take a function, not a bound method)."""
    return stage.apply(lambda b: stage.fn(b, **stage.kwargs), batch)


def _put(table: pa.Table, column: pa.Field, values: Any) -> pa.Table:
    """``table`` with ``column`` set to ``values``: in its place if it is there, else last."""
    if not isinstance(values, pa.Array | pa.ChunkedArray):
        values = pa.array(values, column.type)
    i = table.schema.get_field_index(column.name)
    if i < 0:
        return table.append_column(column, values)
    return table.set_column(i, column, values)
