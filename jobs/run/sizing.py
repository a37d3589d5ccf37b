"""``auto`` pool sizing: how many model actors, and what each holds, from what Ray reports.

One rule for the Whisper pool (transcribe, chain, tune) and the LLM pool (process):

- On GPU nodes, one actor per GPU (``gpus_per_actor`` 1), one CPU each; the node's other
  cores are left to the CPU stage (decode or text extraction), whose tasks take 0.5 CPU.
- On CPU-only nodes, the model gets the cores the CPU stage does not need: one actor per node,
  holding the node's CPUs less a reserve of max(0.5, CPUs / 8) for the CPU stage's tasks
  (0.25 CPU each) and Ray Data. The reserve was measured on 2 cores: decode needs a small
  share of what the model does (a 1.5-CPU actor with 0.25-CPU decode tasks ran 2.74x a plain
  faster-whisper loop, the spec's old 1-CPU actor 1.5-1.8x), and a pool holding every core
  leaves no slot for a decode task, so the model would starve.
- A model actor runs one model worker per core it holds, one thread each, on CPU (two
  one-thread CTranslate2 workers outran one two-thread worker), and ``gpu_model_workers`` on a
  GPU: 1, or 2 for a Whisper with a light decoder (``workers.whisper_options``).

An explicit value always wins; ``auto`` fills only what the user left unset, and what it
chose is printed at start and recorded in the run summary's ``options``. ``overnight plan``
prices the recorded values, and ``overnight tune`` measures through the same jobs, so both
see the sizing a run really had.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

# CPU-stage task reservations (Ray logical CPUs). Small on CPU nodes, where the model is the
# bottleneck; larger on GPU nodes, where the CPU stage must keep the GPU fed and has the
# node's cores to itself.
CPU_TASK_CPUS, GPU_NODE_TASK_CPUS = 0.25, 0.5


@dataclass(frozen=True)
class Node:
    cpus: float
    gpus: float = 0.0


def nodes_of_cluster() -> list[Node]:
    """The alive nodes of the Ray cluster this process is connected to."""
    import ray

    out = []
    for n in ray.nodes():
        if n.get("Alive", n.get("alive")):
            res = n.get("Resources") or {}
            out.append(Node(float(res.get("CPU", 0.0)), float(res.get("GPU", 0.0))))
    return out


def _quarter_down(x: float) -> float:
    return math.floor(x * 4 + 1e-9) / 4


def model_share(cpus: float) -> float:
    """What a node of ``cpus`` can give the model: its cores less the CPU stage's reserve."""
    return max(0.0, _quarter_down(cpus - max(0.5, cpus / 8)))


@dataclass(frozen=True)
class Pool:
    """A resolved model pool: every field concrete; ``auto`` names the fields sizing chose."""

    actors: int
    cpus_per_actor: float
    gpus_per_actor: float
    task_cpus: float
    model_workers: int
    threads: int
    auto: tuple[str, ...] = ()
    basis: str = ""
    names: dict[str, str] = field(default_factory=dict, compare=False)

    def describe(self, model: str, stage: str) -> str:
        held = (
            f"{self.gpus_per_actor:g} GPU + {self.cpus_per_actor:g} CPU"
            if self.gpus_per_actor
            else f"{self.cpus_per_actor:g} CPU"
        )
        workers = (
            f", {self.model_workers} model worker{'s' if self.model_workers != 1 else ''}"
            f" x {self.threads} thread{'s' if self.threads != 1 else ''}"
        )
        chosen = ", ".join(self.names.get(k, k) for k in self.auto)
        how = f"auto ({chosen}) from {self.basis}" if self.auto else "as configured"
        return (
            f"{self.actors} {model} actor{'s' if self.actors != 1 else ''} of {held}{workers}; "
            f"{stage} tasks of {self.task_cpus:g} CPU; {how}"
        )


def size_pool(
    nodes: list[Node],
    device: Literal["cpu", "cuda"],
    *,
    actors: int | None = None,
    cpus_per_actor: float | None = None,
    gpus_per_actor: float | None = None,
    task_cpus: float | None = None,
    model_workers: int = 0,
    threads: int = 0,
    names: dict[str, str] | None = None,
    gpu_model_workers: int = 1,
) -> Pool:
    """Fill what is None (or 0 for workers and threads) from ``nodes``; keep the rest."""
    auto: list[str] = []
    cpu_nodes = [n for n in nodes if n.cpus > 0]
    total_gpus = sum(n.gpus for n in nodes)
    basis = (
        f"{sum(n.cpus for n in nodes):g} CPUs and {total_gpus:g} GPUs on "
        f"{len(nodes)} node{'s' if len(nodes) != 1 else ''}"
    )
    if device == "cuda":
        if gpus_per_actor is None:
            gpus_per_actor = 1.0
            auto.append("gpus_per_actor")
        if actors is None:
            actors = max(1, int(total_gpus // gpus_per_actor)) if gpus_per_actor else 1
            auto.append("actors")
        if cpus_per_actor is None:
            cpus_per_actor = 1.0
            auto.append("cpus_per_actor")
        if task_cpus is None:
            task_cpus = GPU_NODE_TASK_CPUS
            auto.append("task_cpus")
    else:
        gpus_per_actor = gpus_per_actor or 0.0
        # What each node can give the model: its cores less the CPU stage's reserve.
        shares = [model_share(n.cpus) for n in cpu_nodes if n.cpus >= 1]
        shares = [s for s in shares if s > 0]
        if cpus_per_actor is None:
            if not shares:
                cpus_per_actor = 1.0  # no node yet (an autoscaling cluster): Ray's default
            elif actors is None:
                cpus_per_actor = min(shares)  # one actor per node, the same shape everywhere
            else:
                # The model's CPUs spread over the actors asked for, each fitting on a node.
                cpus_per_actor = max(0.25, min(max(shares), _quarter_down(sum(shares) / actors)))
            auto.append("cpus_per_actor")
        if actors is None:
            actors = max(1, sum(int(s // cpus_per_actor) for s in shares)) if shares else 1
            auto.append("actors")
        if task_cpus is None:
            task_cpus = CPU_TASK_CPUS
            auto.append("task_cpus")
    cores = max(1, math.ceil(cpus_per_actor))
    if not model_workers:
        model_workers = gpu_model_workers if device == "cuda" else cores
        auto.append("model_workers")
    if not threads:
        threads = 0 if device == "cuda" else max(1, cores // model_workers)
        auto.append("threads")
    return Pool(
        actors=actors,
        cpus_per_actor=float(cpus_per_actor),
        gpus_per_actor=float(gpus_per_actor),
        task_cpus=float(task_cpus),
        model_workers=model_workers,
        threads=threads,
        auto=tuple(auto),
        basis=basis,
        names=names or {},
    )


def actors_that_fit(pool: Pool, nodes: list[Node]) -> int:
    """How many of ``pool``'s actors ``nodes`` can hold at once, each on one node, leaving
    each node the CPU stage's reserve (as sizing does): actors that took every core left the
    decode tasks none, and the run waited forever (2 actors of 1 CPU on 2 cores)."""
    total = 0
    for node in nodes:
        cpus = model_share(node.cpus)
        by_cpu = cpus / pool.cpus_per_actor if pool.cpus_per_actor > 0 else math.inf
        by_gpu = node.gpus / pool.gpus_per_actor if pool.gpus_per_actor > 0 else math.inf
        total += int(min(by_cpu, by_gpu, 1_000_000) + 1e-9)
    return total


class PoolOptions(Protocol):
    """The pool fields every job section has (``[transcribe]``, ``[process]``)."""

    @property
    def actors(self) -> int | None: ...
    @property
    def cpus_per_actor(self) -> float | None: ...
    @property
    def gpus_per_actor(self) -> float | None: ...
    @property
    def cpu_threads(self) -> int: ...


def size_job_pool(
    opts: PoolOptions,
    device: str,
    nodes: list[Node],
    *,
    task_cpus: float | None,
    model_workers: int,
    names: dict[str, str],
    gpu_model_workers: int = 1,
) -> Pool:
    """``size_pool`` for a job section: its own pool fields, its CPU stage's share."""
    return size_pool(
        nodes,
        "cuda" if device == "cuda" else "cpu",
        actors=opts.actors,
        cpus_per_actor=opts.cpus_per_actor,
        gpus_per_actor=opts.gpus_per_actor,
        task_cpus=task_cpus,
        model_workers=model_workers,
        threads=opts.cpu_threads,
        names=names,
        gpu_model_workers=gpu_model_workers,
    )


def record(pool: Pool) -> dict[str, Any]:
    """The pool as the job's option names, for the run summary's ``options``."""
    values: dict[str, float] = {
        "actors": pool.actors,
        "cpus_per_actor": pool.cpus_per_actor,
        "gpus_per_actor": pool.gpus_per_actor,
        "task_cpus": pool.task_cpus,
        "model_workers": pool.model_workers,
        "threads": pool.threads,
    }
    out: dict[str, Any] = {pool.names.get(k, k): v for k, v in values.items()}
    out["auto"] = sorted(pool.names.get(k, k) for k in pool.auto)
    return out
