"""The model stage's actor: a model worker plus the commit of each batch it finishes.

It lives with the runner, not with the committed-dataset protocol it calls
(``jobs.dataset.commits``): it runs the "after" stages (``jobs.run.stage``), so keeping it
there made the protocol import the stage machinery, an arrow pointing up.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

from overnight.jobs.dataset import storage
from overnight.jobs.dataset.commits import CommittedDataset, Provenance, with_provenance
from overnight.jobs.run import metrics
from overnight.jobs.run.stage import Stage, run_task
from overnight.schemas.errors import ErrorCode

# Ray Data restarts a model actor whose process died and runs the calls it held again,
# without limit. An input that kills the process every time (a crash inside the engine,
# memory it cannot have) would then loop for the rest of the night. So each call counts the
# deaths it was in flight for: after the first, it runs again alone among such calls (fresh
# calls still run beside it), so that the next death names the call that causes it; a call
# in flight for DEATHS_PER_CALL deaths is not run again, its items become ``worker_crashed``
# error rows, and the job goes on. A node lost under a call (a preempted instance) counts
# too: the call then runs alone once more, and only a second loss costs its items.
DEATHS_PER_CALL = 2


class _CallDeaths:
    """Per call of this run (the claim's token and the call's item ids): how many times it
    started and did not finish, in the Ray cluster's key-value store, which outlives the
    actor's process. Outside Ray (the actor called as a plain class) nothing is counted."""

    def __init__(self, token: str):
        self.token = token
        self._kv: Any = None
        try:
            from ray.experimental import internal_kv

            if internal_kv._internal_kv_initialized():
                self._kv = internal_kv
        except ImportError:
            pass

    def key(self, batch: pa.Table) -> bytes:
        ids = "\n".join(sorted(str(i) for i in batch.column("item_id").to_pylist()))
        digest = hashlib.sha256(ids.encode()).hexdigest()[:32]
        return f"call-deaths:{self.token}:{digest}".encode()

    # A guard, not a commit: when the store cannot answer, the call runs as it always did.
    def get(self, key: bytes) -> int:
        with contextlib.suppress(Exception):
            if self._kv is not None:
                value = self._kv._internal_kv_get(key, namespace="overnight")
                return int(value) if value else 0
        return 0

    def put(self, key: bytes, count: int) -> None:
        with contextlib.suppress(Exception):
            if self._kv is not None:
                self._kv._internal_kv_put(key, str(count).encode(), namespace="overnight")

    def forget(self, key: bytes) -> None:
        with contextlib.suppress(Exception):
            if self._kv is not None:
                self._kv._internal_kv_del(key, namespace="overnight")


def _crashed_rows(batch: pa.Table, deaths: int) -> pa.Table:
    """The call's rows as ``worker_crashed`` errors (rows already in error keep theirs)."""
    n = batch.num_rows
    names = batch.column_names
    status = batch.column("status").to_pylist() if "status" in names else ["ok"] * n
    codes = batch.column("error_code").to_pylist() if "error_code" in names else [None] * n
    messages = batch.column("error_message").to_pylist() if "error_message" in names else [None] * n
    message = (
        f"the model's process died {deaths} times while this call of {n} items was in "
        "flight (killed, out of memory, or crashed), so its items were not run again; one of "
        "them is likely the cause (if not, a rerun with --retry-errors worker_crashed redoes "
        "them)"
    )
    for i in range(n):
        if status[i] != "error":
            status[i], codes[i], messages[i] = "error", ErrorCode.WORKER_CRASHED.value, message
    return pa.table(
        {
            "item_id": batch.column("item_id"),
            "status": pa.array(status, pa.string()),
            "error_code": pa.array(codes, pa.string()),
            "error_message": pa.array(messages, pa.string()),
        }
    )


class CommittingActor:
    """A model worker plus the commit of each batch it finishes.

    Committing inside the actor call, rather than in a later stage, makes every finished
    batch durable at once: Ray Data coalesces small output rows into large blocks, so a
    separate sink stage would only see (and write) them when the whole task ends, and a
    killed run would lose all of it.

    ``after``: task stages between the model and the commit (redaction), on the rows as they
    will be committed. Each runs as a Ray task holding its own CPUs, never on the actor's:
    the actor's other calls keep the model busy while this one waits for it.
    """

    def __init__(
        self,
        make_worker: Callable[[], Callable[[pa.Table], pa.Table]],
        dataset: CommittedDataset,
        schema: pa.Schema,
        slim: Sequence[str],
        token: str,
        provenance: Provenance | None = None,
        after: Sequence[Stage] = (),
        into: storage.Location | None = None,
    ):
        # Wall-clock times (epoch seconds, comparable across the cluster's processes) of
        # the actor's start and of its model being ready: the start-up the first result
        # waits for, reported in the run summary's ``startup``.
        self.started_at = time.time()
        self.worker = make_worker()
        self.ready_at = time.time()
        self.dataset, self.schema, self.slim, self.token = dataset, schema, tuple(slim), token
        self.provenance = provenance
        self.after: list[tuple[Any, Stage]] = []
        if after:
            import ray

            task: Callable[..., Any] = run_task  # ray.remote's typing knows no keyword-only args
            self.after = [(ray.remote(**s.resources(), max_retries=3)(task), s) for s in after]
        # Where the batches are written (the run's staging folder); the claim is the dataset's.
        self.into = CommittedDataset(into) if into is not None else dataset
        self.deaths = _CallDeaths(token)
        self._suspects = threading.Lock()

    def __call__(self, batch: pa.Table) -> pa.Table:
        key = self.deaths.key(batch)
        deaths = self.deaths.get(key)
        if deaths >= DEATHS_PER_CALL:
            slim = self._commit(batch, _crashed_rows(batch, deaths))
        else:
            # One call at a time among those that have seen their process die.
            with self._suspects if deaths else contextlib.nullcontext():
                self.deaths.put(key, deaths + 1)
                slim = self._commit(batch, self.worker(batch))
        self.deaths.forget(key)
        return slim

    def _commit(self, batch: pa.Table, finished: pa.Table) -> pa.Table:
        if self.provenance is not None:
            finished = with_provenance(batch, finished, self.schema, self.provenance)
        if self.after:
            import ray

            # On the rows as they will be committed (source_uri and the run's provenance in).
            for task, stage in self.after:
                finished = ray.get(task.remote(finished, stage=stage))
        # Checked after the model, right before the write: the window a dying run's actor
        # has to commit after a new run's claim is one small read long.
        self.dataset.check_claim(self.token)
        slim = self.into.commit(finished, self.schema, self.slim)
        metrics.record_committed(self.dataset.name, finished)
        n = slim.num_rows
        slim = slim.append_column(ACTOR_STARTED, pa.array([self.started_at] * n, pa.float64()))
        return slim.append_column(MODEL_READY, pa.array([self.ready_at] * n, pa.float64()))


# Driver-only columns of the rows an actor returns (never committed): see CommittingActor.
ACTOR_STARTED, MODEL_READY = "_actor_started_at", "_model_ready_at"
