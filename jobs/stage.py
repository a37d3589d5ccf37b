"""The stage record: one step of a job's Ray Data chain, declared rather than wired by hand.

Like a ``ray.data.llm`` stage (callable, constructor arguments, ``map_batches`` arguments,
required columns) and a NeMo Curator stage (``inputs()``/``outputs()``, resources), a
``Stage`` carries its callable, its arguments, what it holds, how many run at once, its batch
size, and the Arrow contracts it consumes and produces (declared in ``schemas/``). The runner
(``jobs.runner``) turns a plan's stages into ``map_batches`` calls; nothing else does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

if TYPE_CHECKING:
    from overnight.jobs.sizing import Pool


@dataclass(frozen=True)
class Stage:
    """One step: ``fn(batch, **kwargs)`` as Ray tasks, or, for the model stage (``actors``
    set), ``fn(**kwargs)`` once per actor, returning the batch callable whose output the
    runner commits.

    name: for messages and the start-up line.
    fn: a batch function (task stage) or a worker factory (actor stage).
    kwargs: ``fn_kwargs`` of a task stage, the factory's arguments of an actor stage.
    num_cpus, num_gpus, accelerator_type: what each task or actor holds.
    actors: the actor pool's size; None makes this a task stage.
    calls_per_actor: actor calls in flight at once (their work batched together inside).
    batch_size: rows per call; None: one manifest block per task.
    consumes, produces: the Arrow contracts of its input and output rows.
    """

    name: str
    fn: Callable[..., Any]
    consumes: pa.Schema
    produces: pa.Schema
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    accelerator_type: str | None = None
    actors: int | None = None
    calls_per_actor: int = 1
    batch_size: int | None = None

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
        batch_size: int | None = None,
    ) -> Stage:
        """The model stage: an actor pool of the sized pool's shape (actors, CPUs, GPUs)."""
        return cls(
            name,
            fn,
            consumes,
            produces,
            kwargs,
            num_cpus=pool.cpus_per_actor,
            num_gpus=pool.gpus_per_actor,
            accelerator_type=accelerator_type,
            actors=pool.actors,
            calls_per_actor=calls_per_actor,
            batch_size=batch_size,
        )

    @property
    def is_actor(self) -> bool:
        return self.actors is not None

    def resources(self) -> dict[str, Any]:
        """The ``map_batches`` resource arguments."""
        held: dict[str, Any] = {"num_cpus": self.num_cpus}
        if self.num_gpus:
            held["num_gpus"] = self.num_gpus
        if self.accelerator_type:
            held["accelerator_type"] = self.accelerator_type
        return held
