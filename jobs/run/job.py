"""The job interface: what a job kind tells the runner (``jobs.run.runner``), and no more.

A job kind (``jobs.transcribe.TranscribeJob``, ``jobs.process.ProcessJob``,
``jobs.probe.ProbeJob``) is a small class: a few declarative attributes, and

    prepare(dry)            list the input and check what the run needs (the output, the
                            model); with ``dry`` nothing is downloaded and nothing started
    pool(device, nodes)     the model stage's actor pool for the resolved device
    stages(at, prepared)    its ``Stage`` records for that device and pool
    summarize(rows, ...)    the summary fields of its kind

The skeleton (claim → subtract done → manifest → stages → execute → repair → ledger →
summary) is the runner's, once for every kind; so are timing, checking and pricing the
stages. Constructing a job does no I/O: everything that reads or checks is in ``prepare``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

import pyarrow as pa

from overnight.jobs.run import sizing
from overnight.jobs.run.stage import Stage
from overnight.jobs.spec import JobSpec
from overnight.schemas import MANIFEST


@dataclass
class Prepared:
    """What ``prepare`` found: the records to run and what the summary says of the listing.
    A kind adds what its preflight found for its stages (a subclass: its model's local copy)."""

    records: list[dict[str, Any]]  # every listed item, as ``manifest_schema`` rows
    # Files of a folder listing that are not items: reason -> how many, and a few of them.
    skipped: dict[str, int] = field(default_factory=dict)
    skipped_examples: list[str] = field(default_factory=list)
    # Error codes that record an upstream failure: a row of one of them is redone by any run
    # whose listing has the item fine now (a chained task once its transcript is there).
    upstream_codes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Resolved:
    """What the runner resolved before the stages are built: the device and the pool."""

    device: str
    pool: sizing.Pool
    pending: int  # items this run will process (0: a no-op rerun, Ray never started)


@dataclass
class Build:
    """A job's stages for one placement, and what the summary says about them."""

    # Each stage's ``placement`` says where it runs; in order within a placement.
    stages: list[Stage]
    model_units: float
    # The summary's ``options``: the job's effective options; the runner adds the pool.
    options: dict[str, Any]
    # Price-table key of the model stage when no row names one; None: gpu or cpu by device.
    model_resource: str | None = None
    # JSON for the ``options`` column of rows whose worker does not report its own.
    row_options: str | None = None


P = TypeVar("P", bound=Prepared)


class Job(ABC, Generic[P]):
    """One run of one kind over one input. Subclasses set the class attributes below (or the
    instance ones in ``__init__``) and implement ``prepare``, ``pool`` and ``stages``."""

    kind: ClassVar[str]  # the summary's ``kind``
    dataset: ClassVar[str]  # OUTPUT/<dataset>/: transcripts, results, probes
    schema: ClassVar[pa.Schema]  # the result dataset's schema
    slim: ClassVar[Sequence[str]]  # columns the driver gets back per committed row
    manifest_schema: ClassVar[pa.Schema] = MANIFEST  # the rows of ``Prepared.records``
    # A model that cannot load: the job stops with exit 5 instead of retrying actors.
    load_errors: ClassVar[tuple[type[BaseException], ...]] = ()

    device: str = "auto"  # auto | cpu | cuda
    rows_per_block: int = 8  # manifest rows per Ray Data block (per CPU task)
    # Other datasets the stages commit to (OUTPUT/<name>/, schema), repaired like the result.
    side_datasets: Sequence[tuple[str, pa.Schema]] = ()
    # Options that pace or place the run but never change what a row holds (besides the
    # pool's, which the runner knows): a rerun that changes only these changed nothing done.
    pacing_options: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, spec: JobSpec, *, run_id: str | None = None):
        self.spec = spec
        self.run_id = run_id or spec.run_id

    @abstractmethod
    def prepare(self, dry: bool) -> P:
        """List the input and check what the run needs (``jobs.preflight``). ``dry``
        (``--dry-run``): checked as a cluster run checks it, nothing downloaded."""

    def asks_for_gpu(self) -> bool:
        """Whether the spec places its model actors on GPUs (``gpus_per_actor`` above 0): on
        a cluster whose GPU nodes start on demand (KubeRay from zero), ``device = "auto"``
        sees no GPU before the first actor asks for one. An ``accelerator_type`` alone is
        not: it is a Ray resource a CPU node type can carry too (the cluster tests' do)."""
        opts = getattr(self, "opts", None)
        return (getattr(opts, "gpus_per_actor", None) or 0) > 0

    @abstractmethod
    def pool(self, device: str, nodes: list[sizing.Node]) -> sizing.Pool:
        """The model stage's actor pool on these nodes (none: a run with nothing to do)."""

    @abstractmethod
    def stages(self, at: Resolved, prepared: P) -> Build:
        """The stages for the resolved device and pool. No I/O: the ledger reads their costs
        off a build for a run with nothing to do, before Ray starts."""

    def summarize(self, rows: list[dict[str, Any]], prepared: P) -> dict[str, Any]:
        """The summary fields of this kind, from this run's rows and the listing."""
        return {}

    def describe(self, pool: sizing.Pool) -> str | None:
        """The start-up line printed with progress; None: none."""
        return None


def model_resource(resource: str | None, device: str) -> str | None:
    """The model stage's ``Cost.resource``: the price key the job names, else "cpu" off a GPU,
    else None (the GPU the actor finds: an "h100" row)."""
    return resource or ("cpu" if device != "cuda" else None)
