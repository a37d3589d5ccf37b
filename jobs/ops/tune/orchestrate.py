"""The tuning run: sample, references, the grid measured within the budget, the decision."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from overnight.jobs.choices import TUNE_KINDS as KINDS
from overnight.jobs.dataset import storage
from overnight.jobs.errors import ConfigError
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


def _sample_input(
    sample: str, workdir: storage.Location, max_items: int | None, kind: str = "transcribe"
) -> tuple[str, int, dict[str, str]]:
    """The sample as a manifest of its items, and the references a manifest's ``reference``
    column holds. Reference files are left out; for transcription also notes and tables
    (anything not audio); for documents a transcripts dataset is used as it is."""
    from overnight.jobs.dataset.manifest import is_manifest, records_from_manifest

    if kind == "process" and not is_manifest(sample):
        from overnight.jobs.documents import transcripts_dataset

        transcripts = transcripts_dataset(sample)
        if transcripts is not None:
            return sample, len(storage.list_files(transcripts, ".parquet")), {}
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
    loc = workdir.join("sample.jsonl")
    storage.write_bytes_atomic(loc, "".join(json.dumps(r) + "\n" for r in rows).encode())
    return loc.url(), len(rows), refs


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
    sample_input, n_items, manifest_refs = _sample_input(sample, workdir, max_items, kind)
    if manifest_refs:
        refs, ref_source = {**refs, **manifest_refs}, "the manifest's reference column"
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
        t0 = clock()
        m = run(c, i, ctx)
        if m.status == "ok" or m.elapsed_s > 0:
            durations.append(clock() - t0)
        results[i] = m
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
