"""The tuning run: sample, references, the grid measured within the budget, the decision."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from overnight.jobs.choices import TUNE_KINDS as KINDS
from overnight.jobs.dataset import storage
from overnight.jobs.errors import ConfigError, OvernightError
from overnight.jobs.ops.tune.accuracy import (
    _is_reference_file,
    accuracy_rank,
    read_references,
    score,
)
from overnight.jobs.ops.tune.decide import Decision, decide
from overnight.jobs.ops.tune.grid import Candidate, default_grid
from overnight.jobs.ops.tune.measure import (
    Context,
    Measurement,
    _item_key,
    measure_process,
    measure_transcribe,
)
from overnight.jobs.ops.tune.outputs import _throughput, write_outputs
from overnight.jobs.ops.tune.sla import SLA
from overnight.jobs.spec import build_spec

# Files in a sample folder that are not recordings.
_NOT_MEDIA = (
    ".txt",
    ".tsv",
    ".json",
    ".jsonl",
    ".csv",
    ".md",
    ".toml",
    ".yaml",
    ".yml",
    ".parquet",
)


@dataclass
class TuneResult:
    decision: Decision
    measurements: list[Measurement]
    sample_items: int
    elapsed_s: float
    budget_s: float
    files: dict[str, str]
    hardware: str


Runner = Callable[[Candidate, int, Context], Measurement]


def _hardware(device: str, resource: str) -> str:
    if device == "cuda":
        return f"{resource} GPU"
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"cpu: {model or 'unknown model'}, {os.cpu_count()} logical cores on this host"


def check_max_items(max_items: int | None) -> None:
    """A ConfigError unless ``max_items`` is None or a whole number >= 1: ``rows[:-1]``
    silently measured all the sample's items but the last, ``rows[:0]`` none."""
    if max_items is not None and (
        isinstance(max_items, bool) or not isinstance(max_items, int) or max_items < 1
    ):
        raise ConfigError(f"--max-items must be a whole number at least 1 (got {max_items!r})")


@dataclass
class _Sample:
    """The sample as the tuning runs it: a manifest's rows (None: a transcripts dataset used
    as it is, ``files``), the references a ``reference`` column holds, and what identifies
    it for a resumed tuning (each item's uri, size and ETag or mtime)."""

    rows: list[dict[str, Any]] | None
    refs: dict[str, str]
    files: list[str]
    identity: list[Any]


def _write_sample(
    sample: str, found: _Sample, workdir: storage.Location
) -> tuple[str, int, dict[str, str]]:
    """The sample as the jobs read it (a manifest in the tuning's folder), its item count,
    and the references a manifest's ``reference`` column holds."""
    if found.rows is None:
        return sample, len(found.files), {}
    loc = workdir.join("sample.jsonl")
    storage.write_bytes_atomic(loc, "".join(json.dumps(r) + "\n" for r in found.rows).encode())
    return loc.url(), len(found.rows), found.refs


def _object_identity(uri: str) -> list[Any]:
    """Size and ETag (or mtime) of one object: a file replaced under the same name differs.
    Unknown (None) where it cannot be read here: the job makes that item's error row."""
    try:
        info = storage.stat(uri)
    except (OvernightError, OSError, ValueError):
        return [None, None]
    return [info.size, info.etag]


def _read_sample(sample: str, max_items: int | None, kind: str) -> _Sample:
    """The sample's items, and the references a manifest's ``reference`` column holds.
    Reference files are left out; for transcription also notes and tables (anything not
    audio); for documents a transcripts dataset is used as it is. Nothing is written: a
    folder holding another tuning is refused before its sample.jsonl is touched."""
    from overnight.jobs.dataset.manifest import is_manifest, records_from_manifest

    if kind == "process" and not is_manifest(sample):
        from overnight.jobs.documents import transcripts_dataset

        transcripts = transcripts_dataset(sample)
        if transcripts is not None:
            files = storage.list_files(transcripts, ".parquet")
            ident = [[f, *_object_identity(transcripts.url(f))] for f in files]
            return _Sample(None, {}, files, ident)
    if is_manifest(sample):
        records = records_from_manifest(sample)
        rows = [
            {
                # absolute: this manifest is written elsewhere than the one it copies
                "uri": storage.resolve(r["uri"]).url(),
                **dict(r.get("metadata") or []),
                **{
                    k: r[k]
                    for k in ("tenant", "submission_id", "external_id", "language")
                    if r.get(k)
                },
                **(
                    {"channel_labels": ",".join(r["channel_labels"])}
                    if r.get("channel_labels")
                    else {}
                ),
            }
            for r in records
        ]
    else:
        rows = [
            {"uri": o.uri}
            for o in storage.list_objects(sample)
            if not _is_reference_file(o.uri)
            and (kind == "process" or not o.uri.lower().endswith(_NOT_MEDIA))
        ]
    if max_items is not None:
        check_max_items(max_items)
        rows = rows[:max_items]
    refs = {_item_key(r["uri"]): str(r.pop("reference")) for r in rows if r.get("reference")}
    if not rows:
        raise ConfigError(f"the sample {storage.scrub_secrets(sample)!r} holds nothing to {kind}")
    # A recording replaced under the same name is another sample: its size and ETag (or mtime).
    ident = [[r, *_object_identity(r["uri"])] for r in rows]
    return _Sample(rows, refs, [], ident)


# What a tuning's folder remembers between runs: which tuning it is, and each configuration
# measured so far (written after each one), so that a rerun resumes it.
STATE = "tune-state.json"
_STATE_VERSION = 1


def _fingerprint(
    kind: str,
    device: str,
    address: str | None,
    base: dict[str, Any],
    candidates: list[Candidate],
    found: _Sample,
    refs: dict[str, str],
) -> str:
    """What makes two tunings the same measurements: the job, the grid, the sample's items
    (each one's size and ETag or mtime), the references, the device and cluster."""
    doc = {
        "kind": kind,
        "device": device,
        "address": address,
        "base": base,
        "grid": [[c.name, c.options] for c in candidates],
        "sample": found.identity,
        "references": sorted(refs.items()),
    }
    text = json.dumps(doc, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _reusable(m: Measurement) -> bool:
    """A measurement a rerun takes as it is: it finished, and every item succeeded (a failed
    one, or one with failed items, may have been cut by the interrupt: it runs again)."""
    return m.status == "ok" and m.failed_items == 0


def _resume(workdir: storage.Location, out: str, fingerprint: str) -> dict[str, Measurement]:
    """The configurations this folder measured before for the same tuning (by index, ``NN``);
    a ConfigError when it holds another tuning's runs, which must not be mixed with these."""
    where = storage.scrub_secrets(out)
    loc = workdir.join(STATE)
    if not storage.exists(loc):
        if storage.exists(workdir.join("configs")):
            raise ConfigError(
                f"--out {where} holds configuration runs of a tuning this one cannot resume "
                f"(no {STATE}); use a new --out"
            )
        return {}
    try:
        state = json.loads(storage.read_location(loc))
        if state.get("version") != _STATE_VERSION:
            raise ValueError(state.get("version"))
        same = state["fingerprint"] == fingerprint
        stored = state.get("measurements") or {}
        measured = {k: Measurement(**{**v, "reused": True}) for k, v in stored.items() if same}
    except (ValueError, TypeError, KeyError, AttributeError):
        raise ConfigError(f"--out {where}: its {STATE} cannot be read; use a new --out") from None
    if not same:
        raise ConfigError(
            f"--out {where} holds a tuning of another sample, grid, references, job file or "
            "device; use a new --out"
        )
    # Only runs whose output folder is still there: the report reads them.
    return {k: m for k, m in measured.items() if storage.exists(workdir.join("configs", k))}


def _save_state(
    workdir: storage.Location, fingerprint: str, measured: dict[str, Measurement]
) -> None:
    doc = {
        "version": _STATE_VERSION,
        "fingerprint": fingerprint,
        "measurements": {
            k: {f: v for f, v in asdict(m).items() if f not in ("wer", "scored_items", "reused")}
            for k, m in sorted(measured.items())
        },
    }
    storage.write_bytes_atomic(workdir.join(STATE), json.dumps(doc, indent=1).encode())


def _clear(loc: storage.Location) -> None:
    """Remove a configuration's output folder (an earlier, unfinished run of it)."""
    if storage.exists(loc):
        storage.with_retries(f"remove {loc.url()}", lambda: loc.fs.rm(loc.path, recursive=True))


def tune(
    sample: str,
    sla: SLA,
    *,
    kind: str = "transcribe",
    grid: list[Candidate] | None = None,
    budget_s: float = 600.0,
    out: str = "tune-output",
    base: dict[str, Any] | None = None,
    references: str | None = None,
    max_items: int | None = None,
    address: str | None = None,
    runner: Runner | None = None,
    clock: Callable[[], float] = time.monotonic,
    echo: Callable[[str], None] | None = None,
) -> TuneResult:
    """Measure the grid on the sample within the budget, decide, write the outputs."""
    if kind not in KINDS:
        raise ConfigError(f"--kind {kind!r}: choose one of {', '.join(KINDS)}")
    check_max_items(max_items)
    from overnight.jobs.preflight import require_extra

    require_extra("eval", "overnight tune (it scores each configuration's word error rate)")
    started = clock()
    say = echo or (lambda _line: None)
    workdir = storage.resolve(out)
    base = dict(base or {})
    base.pop("job", None)  # the tuner sets input, output and run ids itself
    device = "cpu"
    if runner is None:
        from overnight.jobs.run.on_ray import cluster_has_gpu, ensure_ray
        from overnight.workers.devices import resolve_device

        ensure_ray(address)
        wanted = (base.get(kind) or {}).get("device", "auto")
        device = resolve_device(wanted, cluster_has_gpu)
    backend = str((base.get("process") or {}).get("backend", "auto"))
    candidates = grid if grid is not None else default_grid(device, kind, backend)
    if not candidates:
        raise ConfigError("the grid is empty")
    for c in candidates:  # validate every configuration before running any
        try:
            build_spec(
                base, {"job": {"kind": kind, "input": sample, "output": out}, kind: c.options}
            )
        except ConfigError as exc:
            raise ConfigError(f"grid configuration {c.name!r}: {exc}") from None
    refs, ref_source = read_references(sample, references)
    found = _read_sample(sample, max_items, kind)
    if found.refs:
        refs, ref_source = {**refs, **found.refs}, "the manifest's reference column"
    fingerprint = _fingerprint(kind, device, address, base, candidates, found, refs)
    # Measured before (a rerun after Ctrl-C or a failure): kept only for the same tuning.
    measured = _resume(workdir, out, fingerprint)
    _save_state(workdir, fingerprint, measured)
    sample_input, n_items, _ = _write_sample(sample, found, workdir)
    ctx = Context(
        sample_input,
        base,
        workdir,
        datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"),
        device,
        address,
        kind,
    )
    order = list(range(len(candidates)))
    if not refs:  # the reference configuration must be measured first
        order.sort(key=lambda i: tuple(-x for x in accuracy_rank(candidates[i].options)))
    results: dict[int, Measurement] = {}
    durations: list[float] = []
    run = runner or (measure_transcribe if kind == "transcribe" else measure_process)
    for i in order:
        c = candidates[i]
        before = measured.get(f"{i:02d}")
        if before is not None:
            results[i] = before
            durations.append(before.elapsed_s)
            say(f"[tune] {c.name}: measured before, reused ({_throughput(before)} per busy worker)")
            continue
        left = budget_s - (clock() - started)
        estimate = max(durations) if durations else 0.0
        if results and (left <= 0 or left < estimate):
            results[i] = Measurement(
                c.name,
                c.options,
                status="not_run",
                reason=f"time budget: {max(left, 0):.0f} s left, a configuration takes about {estimate:.0f} s",
            )
            say(f"[tune] {c.name}: not run (time budget)")
            continue
        say(f"[tune] {c.name}: running on {n_items} items ...")
        # Measured from a clean state: a run interrupted here left items that a new run
        # into the same folder would skip as already done.
        _clear(ctx.workdir.join("configs", f"{i:02d}"))
        t0 = clock()
        m = run(c, i, ctx)
        if m.status == "ok" or m.elapsed_s > 0:
            durations.append(clock() - t0)
        results[i] = m
        if _reusable(m):
            measured[f"{i:02d}"] = m
            _save_state(workdir, fingerprint, measured)
        say(
            f"[tune] {c.name}: {m.status}"
            + (
                f" ({m.reason})"
                if m.reason
                else f", {_throughput(m)} per busy worker, {clock() - t0:.0f} s"
            )
        )
    measurements = [results[i] for i in range(len(candidates))]
    basis = score(measurements, refs, ref_source)
    decision = decide(measurements, sla, basis)
    resource = next((m.resource for m in measurements if m.status == "ok"), "cpu")
    hardware = _hardware(device, resource)
    result = TuneResult(decision, measurements, n_items, clock() - started, budget_s, {}, hardware)
    result.files = write_outputs(result, workdir, sample, base, kind)
    return result
