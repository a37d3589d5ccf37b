"""The Ray side of the runner (``jobs.run.runner``): Ray start-up, fetching an item's bytes, the
run's manifest as Ray Data blocks, progress, the start-up timeline, the run loop with its
one-row-per-item invariant, and turning Ray's wrapped errors back into ours. The commit
protocol is ``jobs.dataset.commits``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from overnight.jobs.dataset import storage
from overnight.jobs.errors import (
    ClusterUnreachable,
    ConfigError,
    EngineFailed,
    ModelNotFound,
    OvernightError,
)
from overnight.jobs.run import console
from overnight.jobs.run.committing import ACTOR_STARTED, MODEL_READY
from overnight.jobs.run.stage import StageContractError
from overnight.schemas import ErrorCode

log = logging.getLogger(__name__)


def _below_error(record: logging.LogRecord) -> bool:
    return record.levelno < logging.ERROR


# Loggers of Ray's start-up and Ray Data notices that every run printed and a user read as
# failures: a new local cluster's token authentication (on by default; the notice says how
# to turn it off), and "Progress bars disabled" (ours replace them).
_RAY_NOTICES = (
    "ray._private.authentication.authentication_token_setup",
    "ray.data._internal.progress",
)


# True while this process runs a local Ray that ensure_ray started quietly: the command
# line stops it with stop_local_ray.
_STARTED_HERE = False
_RAY_START = threading.Lock()

# A local Ray's raylet connects to its own object store as soon as it has started the
# store's thread. When the store's socket is not listening yet (about every second start
# here) the client waits Ray's 1,000 ms retry interval, and ray.init took 3.1 s instead of
# 2.1 s. The same patience (10 s in all), retried every 50 ms. Only for a Ray this process
# starts: a cluster's own settings are its operator's.
LOCAL_RAY_SYSTEM_CONFIG = {
    "raylet_client_connect_timeout_milliseconds": 50,
    "raylet_client_num_connect_attempts": 200,
}


def local_run(address: str | None) -> bool:
    """Whether Ray starts here (its actors see this machine's files, its nodes are this
    machine's) rather than joining a cluster (``--address``, or ``RAY_ADDRESS`` as Ray Jobs
    sets it)."""
    return not (address or os.environ.get("RAY_ADDRESS"))


def check_reachable(address: str | None, timeout_s: float = 5.0) -> None:
    """``ClusterUnreachable`` when nothing answers at a Ray address's host and port (``HOST:PORT``
    or ``ray://HOST:PORT``; ``auto`` is Ray's to resolve; another form is a ``ConfigError``,
    read by ``spec.ray_host_port`` as the spec reads it). ``ray.init``
    retries such an address for minutes, printing its core's reconnect lines, and a
    submission's record stayed ``running`` with an attempt spent."""
    from overnight.jobs.spec import ray_host_port

    try:
        target = ray_host_port(address)
    except ValueError as exc:  # ray.init raised "Unable to parse port number" in a traceback
        raise ConfigError(f"Ray address {address!r} {exc}") from None
    if target is None:
        return
    host, port = target
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as exc:
        raise ClusterUnreachable(
            f"cannot reach the Ray cluster at {address!r} ({exc.strerror or exc}): check that "
            f"its head node is up and that this machine can reach port {port} (the GCS port, "
            "6379 by default; ray:// addresses use the client port, 10001), then rerun. "
            "Nothing was started."
        ) from None


def _python_handler(signum: int) -> Any:
    """The Python handler of ``signum`` when there is one and this is the main thread (the
    only one that may set handlers), else None."""
    if threading.current_thread() is not threading.main_thread():
        return None
    handler = signal.getsignal(signum)
    return handler if callable(handler) else None


def ensure_ray(address: str | None, verbose: bool = False) -> None:
    """Join ``address`` (or RAY_ADDRESS, as Ray Jobs sets it), else start Ray locally.

    Quiet unless ``verbose``: Ray's notices (token authentication, disabled progress bars)
    are not printed, its workers' output and Ray Data's plan stay in the session's log files
    (/tmp/ray/session_latest/logs); ``jobs.run.console`` handles the lines Ray's C++ core
    writes to stderr. ``verbose`` shows all of it on the terminal.
    """
    import ray

    for name in _RAY_NOTICES:
        logging.getLogger(name).setLevel(logging.NOTSET if verbose else logging.ERROR)
    # One start per process: two scheduler threads calling the API at once both saw no Ray
    # and the second ray.init raised "Perhaps you called ray.init twice by accident?".
    with _RAY_START:
        if ray.is_initialized():
            _check_connected(address)
        else:
            _start(address, verbose)
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    # Ray Data stops a job in which no block moved for 30 minutes. One item may take longer
    # than that and be fine (a 117-page thesis on two cores, a two-hour call on a CPU
    # worker with a large model), and the job lost everything in flight. Our stages bound
    # their own waits instead: fetch, decode and extraction time out per item, and a dead
    # engine raises in its actor.
    context.execution_no_progress_timeout_s = -1
    # Ray Data wraps a map function's exception in a UserCodeException that keeps only its
    # text, so a superseded run or a storage outage in a task looked like a crashed engine
    # (exit 6). Raised as it is, it reaches the driver as RayTaskError(<our class>) with the
    # original in ``cause``, and the CLI exits with that error's documented code.
    context.raise_original_map_exception = True
    if verbose:
        return
    _quiet_raylet_echo()
    # Our own progress lines replace Ray Data's per-operator log dumps.
    data_logger = logging.getLogger("ray.data")
    data_logger.setLevel(logging.WARNING)
    # A failed task's traceback stays in Ray's session log file; on the terminal the CLI
    # says what failed and what to do, in one paragraph.
    for handler in data_logger.handlers:
        terminal = isinstance(handler, logging.StreamHandler) and not isinstance(
            handler, logging.FileHandler
        )
        if terminal and _below_error not in handler.filters:
            handler.addFilter(_below_error)


def _start(address: str | None, verbose: bool) -> None:
    """Join ``address`` or start Ray here (``ensure_ray``, under its lock)."""
    import ray

    global _STARTED_HERE
    term = _python_handler(signal.SIGTERM)
    joining = bool(address or os.environ.get("RAY_ADDRESS"))
    try:
        if address:
            check_reachable(address)
            ray.init(address=address, log_to_driver=verbose)
        else:
            # Under Ray Jobs, RAY_ADDRESS names the cluster and ray.init joins it: Ray refuses
            # a _system_config there, and the cluster is not this process's to stop.
            ray.init(
                include_dashboard=False,
                log_to_driver=verbose,
                configure_logging=verbose,
                _system_config=None if joining else LOCAL_RAY_SYSTEM_CONFIG,
            )
            _STARTED_HERE = not verbose and not joining
    except (OvernightError, KeyboardInterrupt):
        raise
    except Exception as exc:
        # On a loaded machine the local node's start timed out ("The current node timed out
        # during startup"), a 41-line traceback from inside ray.init.
        first = storage.one_line(str(exc).strip().splitlines()[0] if str(exc).strip() else "")
        where = (
            f"join the Ray cluster at {address or os.environ.get('RAY_ADDRESS')!r}"
            if joining
            else "start on this machine"
        )
        raise ClusterUnreachable(
            f"Ray could not {where} ({type(exc).__name__}: {first[:300]}). Nothing was run; "
            "finished items are kept. "
            + (
                "Check that the cluster's Ray version matches this one and that it is up, then "
                "rerun."
                if joining
                else "A machine under heavy load or with a full /tmp is the usual cause: rerun "
                "when it is quieter; Ray's own logs are under /tmp/ray/session_latest/logs."
            )
        ) from None
    # Ray's core worker takes SIGTERM (what Airflow, Kubernetes and systemd send to stop a
    # job) for a C++ stack dump; the command's own handler stops it as Ctrl-C does.
    if term is not None:
        signal.signal(signal.SIGTERM, term)


def _check_connected(address: str | None) -> None:
    """``ConfigError`` when this process's Ray is not the cluster ``address`` names. A
    process holds one Ray: after a first API call started one here (or the caller's own
    ``ray.init``), a later call's ``ray_address`` was ignored and the job ran on the Ray
    already there, saying nothing."""
    import ray

    from overnight.jobs.spec import ray_host_port

    try:
        target = ray_host_port(address)
    except ValueError as exc:
        raise ConfigError(f"Ray address {address!r} {exc}") from None
    if target is None or address is None or address.startswith("ray://"):
        return  # auto, local, or a client connection: Ray's to resolve
    try:
        connected = ray.get_runtime_context().gcs_address
    except Exception:  # an older Ray or a client session: nothing to compare
        return
    host, _, port = connected.rpartition(":")

    def ip(name: str) -> str:
        try:
            return socket.gethostbyname(name)
        except OSError:
            return name

    if (ip(target[0]), target[1]) != (ip(host), int(port) if port.isdigit() else -1):
        raise ConfigError(
            f"this process is already connected to the Ray at {connected}, not {address!r}: a "
            "process holds one Ray. Run the job against the cluster from a new process (or "
            "call ray.shutdown() first); nothing was started"
        )


def stop_local_ray() -> None:
    """Stop the local Ray that ``ensure_ray`` started in this process, at a command's end.

    Ray's exit hook did it in about 2.1 s after the run's summary (0.6 s this way; 8 s in
    all for a 5-file job): it sleeps 0.5 s so that worker log lines finish printing (they
    are not echoed unless verbose), then stops its processes one at a time, giving each up
    to 1 s to exit on SIGTERM. Its autoscaler monitor, which a single-node cluster started
    by ``ray.init`` does not use, takes all of that second: its SIGTERM handler reports its
    death to the GCS, stopped just before it. It is killed first, so it reports nothing.
    A cluster this process joined, or one started verbose, is left to Ray's hook. Ray's
    node handle is private API: without it, this is ``ray.shutdown()``.
    """
    global _STARTED_HERE
    if not _STARTED_HERE:
        return
    _STARTED_HERE = False
    import ray
    from ray._private import ray_constants, worker

    node = getattr(worker, "_global_node", None)
    processes = getattr(node, "all_processes", None) or {}
    for info in processes.get(ray_constants.PROCESS_TYPE_MONITOR, ()):
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            info.process.kill()
            info.process.wait(timeout=1)
    ray.shutdown()


# Ray's report of a worker process that died in a task, and its notices of the retries that
# follow (one per call the dead actor held, then a "[repeated Nx across cluster]" summary).
_WORKER_DIED = "A worker died or was killed while executing a task"
_WORKER_PID = re.compile(r"Worker PID: (\d+)")
_WILL_RETRY = "so the task will be retried"


def _quiet_raylet_echo() -> None:
    """Keep Ray's reports about its own machinery off the terminal (to the log), and say in
    our words what a user needs of them.

    Ray's driver prints every error its cluster reports straight to stdout, prefixed
    "(raylet)", whatever ``log_to_driver`` says: an actor's constructor failing came out as
    the whole remote traceback, above the CLI's own one-paragraph message, and a model actor
    killed mid-run (by the kernel's OOM killer, say) as a paragraph of Ray's ids followed by
    one "infinite retries remaining ... RpcError" line per call it held, the last of them
    after the run's summary. Reports with a traceback and retry notices go to this
    process's log at debug level (and stay in Ray's session logs); a dead worker becomes one
    line of ours; the others (a task killed for memory, say) are still printed as they are.
    Ray's printer is private API: left as it is when it is not where Ray 2.x keeps it.
    """
    from ray._private import worker

    printer = getattr(worker, "print_to_stdstream", None)
    if printer is None or getattr(printer, "_overnight_quiet", False):
        return

    def quiet(data: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        lines = data.get("lines") or ()
        if data.get("pid") != "raylet":
            printer(data, *args, **kwargs)
            return
        text = "\n".join(lines)
        if "Traceback" in text or _WILL_RETRY in text:
            log.debug("ray: %s", text)
            return
        if _WORKER_DIED in text:
            log.info("ray: %s", text)
            pid = _WORKER_PID.search(text)
            console.event(
                "worker_died",
                f"a Ray worker process{f' (pid {pid.group(1)})' if pid else ''} "
                "died while running a task: killed, out of memory (`dmesg` shows the kernel's "
                "OOM kills) or crashed. Ray restarts it and runs its unfinished items again.",
                level="warning",
                pid=int(pid.group(1)) if pid else None,
            )
            return
        printer(data, *args, **kwargs)

    quiet._overnight_quiet = True  # type: ignore[attr-defined]
    worker.print_to_stdstream = quiet


def cluster_has_gpu() -> bool:
    import ray

    return ray.cluster_resources().get("GPU", 0) > 0


# Reading one object: long enough for the largest allowed file over a slow link.
FETCH_TIMEOUT_S = 600.0
# What opening an object raises for an object that is missing, forbidden or a folder: the
# item's problem (``fetch_failed``), not the storage's.
READ_ERRORS = (FileNotFoundError, PermissionError, IsADirectoryError)


def read_failed(exc: OSError) -> dict[str, str]:
    """The error fields of an item whose object could not be read (one of ``READ_ERRORS``)."""
    return {
        "status": "error",
        "error_code": ErrorCode.FETCH_FAILED.value,
        "error_message": storage.scrub_secrets(
            f"cannot read the object: {type(exc).__name__}: {exc}"
        ),
    }


def fetch_item(
    row: dict[str, Any],
    max_bytes: int,
    storage_config: storage.StorageConfig,
    timeout_s: float = FETCH_TIMEOUT_S,
    within: Sequence[str] | None = None,
) -> bytes | None:
    """The item's object bytes; None when the item failed, with the row marked
    (``too_large`` before any read and again while reading, since an object may grow and a
    device reports size 0; ``not_a_file``, ``fetch_timeout``, ``fetch_failed`` for a missing
    or forbidden object). Sets ``fetch_s``. Storage that is down raises StorageUnavailable
    and stops the job."""
    t0 = time.perf_counter()
    try:
        if row["size"] is not None and row["size"] > max_bytes:
            row.update(
                status="error",
                error_code=ErrorCode.TOO_LARGE.value,
                error_message=f"file is {row['size']} bytes; the job's maximum is {max_bytes}",
            )
            return None
        data = storage.read_bytes(
            row["uri"], storage_config, max_bytes=max_bytes, timeout_s=timeout_s, within=within
        )
        if row["size"] and len(data) != row["size"]:
            # The item's id is of the object as listed; stored under it, the new content
            # was written twice (under the old id now, under the new one on the next run).
            row.update(
                status="error",
                error_code=ErrorCode.CHANGED_SINCE_LISTED.value,
                error_message=(
                    f"the file was {row['size']} bytes when listed and {len(data)} when read: it "
                    "changed during the run (rewritten, or still being written); the next run "
                    "takes it as a new item"
                ),
            )
            return None
        return data
    except storage.Unreadable as exc:
        row.update(
            status="error",
            error_code=exc.code.value,
            error_message=storage.scrub_secrets(f"cannot read {row['uri']}: {exc}"),
        )
        return None
    except READ_ERRORS as exc:
        row.update(read_failed(exc))
        return None
    finally:
        row["fetch_s"] = time.perf_counter() - t0


def manifest_dataset(
    output: storage.Location, run_id: str, table: pa.Table, rows_per_block: int = 8
):
    """Record what the run sets out to do (OUTPUT/_manifests/<run_id>.parquet) and hand Ray
    Data the same rows, ``rows_per_block`` items per block (one CPU task each).

    The blocks come from the driver, with no read tasks: Ray Data's file listing task asks
    for a whole CPU whatever the read's ``num_cpus``, so on a node whose cores the model
    actors hold it could never be scheduled and the job stalled before its first item (seen
    on 2 cores with a 1.5-CPU actor). ``from_blocks``, not ``from_arrow``: the latter runs one
    remote task per block to read back each block's size and schema, which the driver has in
    hand; the first such task waits for a worker, and the step took 0.35-0.42 s instead of
    0.03 s on the critical path of every run.
    """
    import ray

    from overnight.jobs.dataset.manifest import write_manifest

    write_manifest(output, run_id, table)
    blocks = [table.slice(i, rows_per_block) for i in range(0, table.num_rows, rows_per_block)]
    return ray.data.from_blocks(blocks or [table.schema.empty_table()])


class Progress:
    """Progress lines on stderr: at least every ``every_s`` seconds while work is in flight
    (a heartbeat, also when nothing was committed since the last line), and at the end.
    Items, errors, audio hours or tokens done, throughput and ETA."""

    def __init__(self, total: int, enabled: bool, every_s: float = 10.0):
        self.total, self.enabled, self.every_s = total, enabled, every_s
        self.done = self.errors = self.tokens = 0
        self.audio_s = 0.0
        self.start = self.last = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def update(self, rows: list[dict]) -> None:
        with self._lock:
            self.done += len(rows)
            self.errors += sum(1 for r in rows if r["status"] == "error")
            self.audio_s += sum(r.get("duration_s") or 0.0 for r in rows)
            self.tokens += sum(
                (r.get("input_tokens") or 0) + (r.get("output_tokens") or 0) for r in rows
            )
            if self.done == self.total or time.monotonic() - self.last >= self.every_s:
                self._print()

    def _print(self) -> None:
        now = self.last = time.monotonic()
        if not self.enabled:
            return
        elapsed = max(now - self.start, 1e-9)
        eta = (
            f"ETA {elapsed / self.done * (self.total - self.done):.0f} s"
            if self.done
            else "ETA after the first items"
        )
        work = ""
        if self.audio_s:
            work = f"{self.audio_s / 3600:.3f} h audio ({self.audio_s / elapsed:.1f}x real time), "
        elif self.tokens:
            work = f"{self.tokens} tokens ({self.tokens / elapsed:.0f} tokens/s), "
        console.event(
            "progress",
            f"{self.done}/{self.total} items "
            f"({100 * self.done / max(self.total, 1):.0f}%), {work}{self.errors} errors, "
            f"{elapsed:.0f} s, {eta}",
            done=self.done,
            total=self.total,
            errors=self.errors,
            audio_s=round(self.audio_s, 3),
            tokens=self.tokens,
            elapsed_s=round(elapsed, 1),
            eta_s=round(elapsed / self.done * (self.total - self.done), 1) if self.done else None,
        )

    def __enter__(self) -> Progress:
        def beat() -> None:
            while not self._stop.wait(min(1.0, self.every_s / 4)):
                with self._lock:
                    if time.monotonic() - self.last >= self.every_s:
                        self._print()

        threading.Thread(target=beat, name="overnight-progress", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()


def unwrap(exc: BaseException, load_errors: tuple[type[BaseException], ...]) -> BaseException:
    """Ray wraps worker exceptions; find ours (or a model load error) inside, else the
    innermost cause.

    A RayTaskError's text is a whole remote traceback, and Ray cannot make it an instance of
    our classes (their exit status is a class argument): go down to the original in
    ``cause``.
    """
    ours: tuple[type[BaseException], ...] = (OvernightError, *load_errors)
    seen = exc
    for _ in range(8):
        rebuilt = _actor_init_error(seen, load_errors)
        if rebuilt is not None:
            return rebuilt
        cause = getattr(seen, "cause", None) or seen.__cause__
        if isinstance(seen, ours) and not isinstance(cause, ours):
            return seen
        if cause is None:
            break
        seen = cause
    return seen


def _actor_init_error(
    exc: BaseException, load_errors: tuple[type[BaseException], ...]
) -> BaseException | None:
    """An error of ours raised in an actor's ``__init__``, rebuilt from the text Ray keeps.

    Ray turns an exception in an actor's constructor into ``ActorDiedError``, which keeps
    only the remote traceback's text, not the exception (Ray Data then chains a bare
    ``SystemException`` to it): a model that could not load read "the pipeline failed:
    SystemException: ." (exit 6). The traceback's last ``ClassName: message`` line naming
    one of the job's load errors or one of our ``OvernightError`` classes is that error;
    they are raised with one-line messages.
    """
    if not getattr(exc, "actor_init_failed", False):
        return None
    text = str(getattr(exc, "error_msg", None) or exc)
    candidates = {cls.__name__: cls for cls in (*_overnight_errors(), *load_errors)}
    names = "|".join(map(re.escape, candidates))  # ": " after a name: none is read as another
    matches = list(re.finditer(rf"(?<![\w])({names}): ([^\n]*)", text))
    if not matches:
        return None
    last = matches[-1]
    try:
        return candidates[last.group(1)](last.group(2).strip())
    except Exception:  # a class that needs other arguments: not rebuilt
        return None


def _overnight_errors() -> list[type[OvernightError]]:
    """``OvernightError`` and every subclass of it, at any depth."""
    found: list[type[OvernightError]] = [OvernightError]
    for cls in found:
        found.extend(cls.__subclasses__())
    return found


@dataclass
class Outcome:
    rows: list[dict[str, Any]] = field(default_factory=list)
    pipeline_s: float = 0.0
    # Epoch seconds: the pipeline's start, the first actor's start and model ready, and the
    # first committed result's arrival at the driver (None: nothing ran).
    started_at: float | None = None
    actor_started_at: float | None = None
    model_ready_at: float | None = None
    first_result_at: float | None = None


class Startup:
    """What the first result of a run waits for, step by step, in wall-clock seconds."""

    def __init__(self) -> None:
        self.t0 = time.time()
        self.marks: dict[str, float] = {}

    def mark(self, name: str) -> None:
        """``name`` ended now."""
        self.marks[name] = time.time()

    def report(self, outcome: Outcome) -> dict[str, float | None]:
        """Seconds of each step, in order, and the total to the first result. The actor's
        start and model load overlap the first decode (or extraction) tasks."""
        steps: dict[str, float | None] = {}
        last = self.t0
        for name, at in self.marks.items():
            steps[f"{name}_s"] = round(at - last, 3)
            last = at
        o = outcome
        steps["actor_start_s"] = (
            round(o.actor_started_at - o.started_at, 3)
            if o.actor_started_at and o.started_at
            else None
        )
        steps["model_load_s"] = (
            round(o.model_ready_at - o.actor_started_at, 3)
            if o.model_ready_at and o.actor_started_at
            else None
        )
        steps["first_result_s"] = (
            round(o.first_result_at - self.t0, 3) if o.first_result_at else None
        )
        return steps


def execute(
    ds,
    pending_ids: set[str],
    progress: Progress,
    load_errors: tuple[type[BaseException], ...],
    on_rows: Callable[[int], None] | None = None,
) -> Outcome:
    """Iterate the dataset's slim rows; map failures to our systemic errors; check that the
    run produced exactly one row per pending item. ``on_rows`` gets the count of rows so
    far after each block (the runner publishes from there on long runs)."""
    outcome = Outcome(started_at=time.time())
    t0 = time.monotonic()
    try:
        with progress:
            # No prefetch: with Ray Data's default (one batch ahead) the driver got a
            # committed block only once the next one was done too, so progress and the
            # first result lagged a whole call behind the commits (10 short documents
            # beside a 30-page one: committed at 175 s, seen at 197 s).
            for batch in ds.iter_batches(
                batch_size=None, batch_format="pyarrow", prefetch_batches=0
            ):
                if outcome.first_result_at is None:
                    outcome.first_result_at = time.time()
                slim = batch.to_pylist()
                for row in slim:
                    started, ready = row.pop(ACTOR_STARTED, None), row.pop(MODEL_READY, None)
                    first = outcome.actor_started_at
                    if started is not None and (first is None or started < first):
                        outcome.actor_started_at, outcome.model_ready_at = started, ready
                outcome.rows.extend(slim)
                progress.update(slim)
                if on_rows is not None:
                    on_rows(len(outcome.rows))
    except Exception as exc:
        inner = unwrap(exc, load_errors)
        # A stage that broke its declared contract is a bug, not the engine: raised as it is.
        if isinstance(inner, (OvernightError, StageContractError)):
            raise inner from None
        if isinstance(inner, load_errors):
            raise ModelNotFound(str(inner)) from None
        raise EngineFailed(
            storage.scrub_secrets(
                f"the pipeline failed: {type(inner).__name__}: {str(inner)[:2000]}. Finished items "
                "are committed; fix the cause and rerun the same command to resume."
            )
        ) from None
    outcome.pipeline_s = time.monotonic() - t0
    seen = [r["item_id"] for r in outcome.rows]
    if len(seen) != len(set(seen)) or set(seen) != pending_ids:
        raise EngineFailed(
            "invariant broken: the run did not produce exactly one row per pending item"
        )
    return outcome
