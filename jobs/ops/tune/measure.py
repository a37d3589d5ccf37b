"""Measuring one configuration: a real job on the sample, read back from its ledger and summary."""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from overnight.jobs.dataset import storage
from overnight.jobs.errors import OvernightError
from overnight.jobs.ops.plan import (
    WorkerProfile,
)
from overnight.jobs.ops.tune.grid import Candidate
from overnight.jobs.spec import build_spec


@dataclass
class Measurement:
    """One configuration on the sample. ``status``: ok | failed | not_run."""

    name: str
    options: dict[str, Any]
    status: str = "ok"
    reason: str = ""
    unit: str = "audio_s"  # what `work` counts: audio_s | documents
    run_id: str = ""
    output: str = ""
    elapsed_s: float = 0.0
    items: int = 0
    failed_items: int = 0
    work: float = 0.0  # audio seconds of the items that succeeded (or documents)
    busy_s: float = 0.0  # the model worker's busy seconds
    pipeline_s: float = 0.0
    resource: str = "cpu"
    units_per_worker: float = 1.0
    price_per_unit_hour_usd: float = 0.0
    sample_cost_usd: float = 0.0
    other_cost_per_unit_usd: float = 0.0
    effective: dict[str, Any] = field(default_factory=dict)  # device, compute_type as run
    wer: float | None = None  # error rate: WER, or label disagreement for classification
    scored_items: int = 0
    labels: bool = False  # the outputs are labels (classification), compared exactly
    texts: dict[str, str] = field(default_factory=dict)  # item key -> transcript (ok items)
    reused: bool = False  # measured by an earlier run of the same tuning (resumed)

    @property
    def throughput(self) -> float:
        return self.work / self.busy_s if self.busy_s > 0 else 0.0

    @property
    def rtfx_wall(self) -> float | None:
        return self.work / self.pipeline_s if self.pipeline_s > 0 else None

    @property
    def sample_cost_per_unit(self) -> float | None:
        if not self.work:
            return None
        return self.sample_cost_usd / (self.work / 60.0 if self.unit == "audio_s" else self.work)

    def profile(self, kind: str, hardware: str, source: str) -> WorkerProfile:
        return WorkerProfile(
            name=self.name,
            kind=kind,
            unit=self.unit,
            resource=self.resource,
            units_per_worker=self.units_per_worker,
            throughput=self.throughput,
            price_per_unit_hour_usd=self.price_per_unit_hour_usd,
            utilization=None,  # a sample is too short to measure steady-state utilization
            other_cost_per_unit_usd=self.other_cost_per_unit_usd,
            hardware=hardware,
            source=source,
            options={**self.options, **self.effective},
            accuracy={"wer": self.wer, "scored_items": self.scored_items},
        )

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("texts")
        out.update(
            throughput=self.throughput,
            rtfx_wall=self.rtfx_wall,
            sample_cost_per_unit=self.sample_cost_per_unit,
        )
        return out


@dataclass(frozen=True)
class Context:
    """What every configuration's run shares."""

    sample_input: str
    base: dict[str, Any]  # the job file's data (sections), overrides come on top
    workdir: storage.Location
    stamp: str
    device: str
    address: str | None = None
    kind: str = "transcribe"


def _reason(exc: BaseException) -> str:
    """The line of a (possibly Ray-wrapped) failure that says what went wrong."""
    text = storage.scrub_secrets(str(exc))
    for pattern in (
        r"ModelLoadError: (.+)",
        r"(Requested \S+ compute type.+)",
        r"(CUDA out of memory.*)",
        r"(out of memory.*)",
        r"ValueError: (.+)",
        r"RuntimeError: (.+)",
    ):
        found = re.search(pattern, text)
        if found:
            return found.group(1).strip()[:300]
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return f"{type(exc).__name__}: {first}"[:300]


def unsupported_compute_type(options: dict[str, Any], device: str) -> str | None:
    """Why this engine here cannot run this compute type on this device (None: it can, or
    unknown)."""
    compute = options.get("compute_type", "auto")
    if options.get("engine") == "torch":
        import importlib.util

        if importlib.util.find_spec("torch") is None:
            return "the torch engine needs PyTorch, which is not installed here"
        return None  # the engine's options refuse a compute type it cannot run
    dev = options.get("device", "auto")
    dev = device if dev == "auto" else dev
    if compute == "auto":
        return None
    import ctranslate2

    if dev == "cuda" and ctranslate2.get_cuda_device_count() == 0:
        return None  # the GPUs are on other nodes: let the run find out
    supported = ctranslate2.get_supported_compute_types(dev)
    if compute not in supported:
        return f"compute type {compute} is not supported on {dev} here (supported: {', '.join(sorted(supported))})"
    return None


def _run_job(
    m: Measurement, run: Callable[[Any], dict[str, Any]], spec: Any
) -> dict[str, Any] | None:
    """Run one configuration's job and record its time and counts on ``m``; None (with
    ``m.status`` failed and the reason) when the job failed or every item did."""
    t0 = time.monotonic()
    try:
        summary = run(spec)
    except OvernightError as exc:
        m.status, m.reason, m.elapsed_s = "failed", _reason(exc), time.monotonic() - t0
        return None
    m.elapsed_s = time.monotonic() - t0
    m.run_id = summary["run_id"]
    m.items, m.failed_items, m.pipeline_s = (
        summary["items"],
        summary["failed"],
        summary["pipeline_seconds"],
    )
    if summary["succeeded"] == 0:
        m.status = "failed"
        m.reason = f"every item failed ({', '.join(f'{k}: {v}' for k, v in summary['errors_by_code'].items())})"
        return None
    return summary


def measure_transcribe(candidate: Candidate, index: int, ctx: Context) -> Measurement:
    """Run the transcription job on the sample with one configuration and measure it."""
    from overnight.jobs.dataset.commits import CommittedDataset
    from overnight.jobs.transcribe import run_transcribe

    run_id = f"tune-{ctx.stamp}-{index:02d}"
    out = ctx.workdir.join("configs", f"{index:02d}")
    m = Measurement(candidate.name, candidate.options, run_id=run_id, output=out.url())
    why = unsupported_compute_type(candidate.options, ctx.device)
    if why:
        m.status, m.reason = "failed", why
        return m
    spec = build_spec(
        ctx.base,
        {
            "job": {
                "kind": "transcribe",
                "input": ctx.sample_input,
                "output": out.url(),
                "run_id": run_id,
                "progress": False,
                "ray_address": ctx.address,
                "max_items": None,
            },
            "transcribe": candidate.options,
        },
    )
    summary = _run_job(m, run_transcribe, spec)
    if summary is None:
        return m
    rows = CommittedDataset(out.join("transcripts")).read_results(
        ["item_id", "run_id", "source_uri", "status", "text", "options"],
        run_id=run_id,
    )
    costs = CommittedDataset(out.join("costs")).read_results(run_id=run_id)
    ok_rows = [r for r in (rows.to_pylist() if rows is not None else []) if r["status"] == "ok"]
    ok_ids = {r["item_id"] for r in ok_rows}
    ledger_rows = costs.to_pylist() if costs is not None else []
    model_rows = [r for r in ledger_rows if r["stage"] == "transcribe"]
    m.work = sum(r["audio_s"] or 0.0 for r in model_rows if r["item_id"] in ok_ids)
    m.busy_s = sum(r["seconds"] for r in model_rows)
    m.sample_cost_usd = sum(r["cost_usd"] for r in ledger_rows)
    other = sum(r["cost_usd"] for r in ledger_rows if r["stage"] != "transcribe")
    m.other_cost_per_unit_usd = other / m.work if m.work else 0.0
    _record_worker(m, model_rows, ok_rows)
    m.effective.update(_pool_as_run(summary, ("decode_cpus", "model_workers", "cpu_threads")))
    for r in ok_rows:
        m.texts[_item_key(r["source_uri"])] = r["text"] or ""
    if m.busy_s <= 0:
        m.status, m.reason = "failed", "no busy time was measured (nothing reached the model)"
    return m


def _record_worker(
    m: Measurement, model_rows: list[dict[str, Any]], ok_rows: list[dict[str, Any]]
) -> None:
    """The model worker's resource and price (from its ledger rows) and the device and
    compute type it really ran with (from a result row's effective options)."""
    if model_rows:
        m.resource = model_rows[0]["resource"]
        m.units_per_worker = float(model_rows[0]["units"] or 1.0)
        m.price_per_unit_hour_usd = float(model_rows[0]["price_per_hour_usd"] or 0.0)
    with contextlib.suppress(ValueError, TypeError, IndexError):
        effective = json.loads(ok_rows[0]["options"])
        m.effective = {k: effective[k] for k in ("device", "compute_type") if k in effective}


def _pool_as_run(summary: dict[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    """The model pool's shape as the measured run had it (``auto`` resolved, jobs/run/sizing.py),
    so that the chosen configuration runs what was measured, on any cluster."""
    opts = summary.get("options") or {}
    keep = ("cpus_per_actor", "gpus_per_actor", *fields)
    return {k: opts[k] for k in keep if opts.get(k) is not None}


def measure_process(candidate: Candidate, index: int, ctx: Context) -> Measurement:
    """Run the document job's first task on the sample with one configuration and measure it.

    Throughput is documents (that succeeded) per busy second of the LLM actor; the outputs
    compared for accuracy are the labels of a classification, else the generated JSON or text.
    """
    from overnight.jobs.dataset.commits import CommittedDataset
    from overnight.jobs.process import run_process

    run_id = f"tune-{ctx.stamp}-{index:02d}"
    out = ctx.workdir.join("configs", f"{index:02d}")
    m = Measurement(
        candidate.name, candidate.options, unit="documents", run_id=run_id, output=out.url()
    )
    options = {**(ctx.base.get("process") or {}), **candidate.options}
    if options.get("backend", "ctranslate2") == "ctranslate2":
        why = unsupported_compute_type(options, ctx.device)
        if why:
            m.status, m.reason = "failed", why
            return m
    job = {
        "kind": "process",
        "input": ctx.sample_input,
        "output": out.url(),
        "run_id": run_id,
        "progress": False,
        "ray_address": ctx.address,
    }
    # One task per measurement: the job file's first (run_process runs every configured task).
    first = build_spec(ctx.base, {"job": job, "process": candidate.options}).process.tasks[0]
    spec = build_spec(ctx.base, {"job": job, "process": {**candidate.options, "task": first}})
    summary = _run_job(m, run_process, spec)
    if summary is None:
        return m
    rows = CommittedDataset(out.join("results")).read_results(
        [
            "item_id",
            "run_id",
            "source_uri",
            "status",
            "label",
            "output_json",
            "output_text",
            "options",
        ],
        run_id=m.run_id,
    )
    costs = CommittedDataset(out.join("costs")).read_results(run_id=m.run_id)
    ok_rows = [r for r in (rows.to_pylist() if rows is not None else []) if r["status"] == "ok"]
    ledger_rows = costs.to_pylist() if costs is not None else []
    model_rows = [r for r in ledger_rows if r["stage"] == "generate"]
    m.work = float(len(ok_rows))
    m.busy_s = sum(r["seconds"] for r in model_rows)
    m.sample_cost_usd = sum(r["cost_usd"] for r in ledger_rows)
    m.other_cost_per_unit_usd = (
        sum(r["cost_usd"] for r in ledger_rows if r["stage"] != "generate") / m.work
    )
    _record_worker(m, model_rows, ok_rows)
    m.effective.update(_pool_as_run(summary, ("extract_cpus", "cpu_threads")))
    m.labels = bool(ok_rows) and all(r["label"] is not None for r in ok_rows)
    for r in ok_rows:
        m.texts[_item_key(r["source_uri"])] = (
            r["label"] or r["output_json"] or r["output_text"] or ""
        )
    if m.busy_s <= 0:
        m.status, m.reason = "failed", "no busy time was measured (nothing reached the model)"
    return m


def _item_key(uri: str) -> str:
    return uri.rstrip("/").rsplit("/", 1)[-1]


def _stem(name: str) -> str:
    return name.rsplit(".", 1)[0] if "." in name else name
