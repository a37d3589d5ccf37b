"""SLA-driven tuning: measure a grid of configurations on a sample, pick the cheapest that meets it.

``overnight tune SAMPLE --task transcribe --sla "deadline=6h,backlog_hours=2000,max_wer_increase=0.01"
[--grid FILE] [--budget 10m] [--config JOBFILE] [--out DIR]``

``--task process`` tunes the document job the same way: the grid sets ``[process]`` options
(default: compute type {int8, float32} x ``max_batch_size`` {4, 32} with CTranslate2 on CPU;
``max_num_seqs`` {64, 256} x ``max_num_batched_tokens`` {8192, 16384} with vLLM on GPU;
``max_new_tokens``, ``model`` and quantized models go in a grid file), the job file's
``[process]`` names the task (its first task is tuned), throughput is documents per busy
second, and accuracy is the label disagreement of a classification (else the word error
rate of the generated text) against ``references.tsv`` labels/texts or the most accurate
configuration. The SLA takes ``backlog_documents`` and ``max_error_increase``/``max_error``.

1. **Grid.** Each configuration is a set of ``[transcribe]`` options laid over the job file's
   (``--config``), validated up front. ``--grid FILE`` (TOML, YAML or JSON) holds ``base``
   (options for all), ``grid`` (option -> list of values, crossed) and/or ``configs`` (a
   list of option tables, each with an optional ``name``). Without a file: beam size {1, 5}
   x batch size {4, 16} x compute type {int8, float32} on CPU; {float16, int8_float16} x
   batch {16, 64} x beam {1, 5} on GPU (model sizes go in a grid file: they download).
2. **Measure.** Each configuration runs the real transcription job on the sample into its own
   output folder (``DIR/configs/NN/``), with its own run id, so ``overnight report`` works on
   them too. From its ledger: throughput per worker while busy (audio seconds of the items
   that succeeded / busy seconds of the Whisper actor: what ``plan`` sizes with), the
   worker's resource, units and price, the CPU (fetch/decode) cost per audio second, and
   the sample's cost per audio minute; from its summary the wall real-time factor.
   A configuration that fails (unsupported compute type, model not found, out of memory,
   every item failed) is recorded with its reason and the tuning goes on. Compute types the
   driver's CTranslate2 cannot run on CPU are skipped before starting anything.
3. **Accuracy.** Word error rate (lower-cased, punctuation stripped, corpus-level: all edits
   / all reference words) against references when the sample has them: a ``reference``
   column in a manifest, or ``references.tsv`` (name TAB text), ``references.jsonl``
   (``{"name"|"uri"|"id": ..., "text"|"reference": ...}``) or a LibriSpeech
   ``*trans.txt`` (id SPACE-or-TAB text) in the sample folder, or ``--references FILE``.
   Items are matched by file name or stem; only items with a reference are scored. Without
   references the most accurate configuration of the grid by construction (largest model,
   most precise compute type, widest beam) runs first and its transcripts are the
   reference; its own WER is 0.
4. **Budget.** ``--budget`` bounds the tuning's wall time: before each configuration, if the
   time left is less than the longest configuration so far took, it is not started (and is
   listed as not run). The first configuration always runs: there is nothing to estimate
   from before it; keep samples small (``--max-items``).
5. **Choice.** The SLA: ``deadline`` and the backlog (``backlog_hours`` of audio) say what
   the nightly run must do; ``max_wer_increase`` (absolute, 0.01 = one point of WER) over
   the best WER measured, and/or ``max_wer``, bound accuracy; ``max_workers`` bounds how
   many workers can be had; ``headroom``, ``utilization``, ``startup`` as in ``plan``.
   Each configuration is sized for the backlog with ``plan``'s arithmetic: workers needed,
   finish time, cost of the backlog. The cheapest configuration meeting accuracy and
   deadline wins (ties: the faster). Without ``max_workers`` any configuration meets any
   deadline by adding workers, so the deadline only bites through rounding and start-up; a
   worker limit is what makes a tight deadline pay for a faster, pricier configuration.
6. **Outputs.** ``DIR/chosen.toml``: a job spec whose ``[transcribe]`` holds the chosen
   options (device and compute type pinned to what was measured), loadable by
   ``overnight transcribe INPUT OUTPUT --config DIR/chosen.toml``; ``DIR/profile.json``: a
   throughput profile of every measured configuration for ``overnight plan``;
   ``DIR/measurements.json``: everything measured and decided.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import re
import string
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jobs import storage
from jobs import wer as one_wer
from jobs.errors import ConfigError, OvernightError
from jobs.plan import (
    DEFAULT_HEADROOM,
    Option,
    WorkerProfile,
    fmt_duration,
    parse_duration,
    profile_document,
    size_option,
)
from jobs.spec import TranscribeOptions, build_spec, read_job_file

TASKS = ("transcribe", "process")
DEFAULT_BUDGET = "10m"
CPU_GRID: dict[str, list[Any]] = {
    "beam_size": [1, 5],
    "batch_size": [4, 16],
    "compute_type": ["int8", "float32"],
}
GPU_GRID: dict[str, list[Any]] = {
    "compute_type": ["float16", "int8_float16"],
    "batch_size": [16, 64],
    "beam_size": [1, 5],
}
# The document job: vLLM on GPU and, where it is installed, on CPU; CTranslate2 otherwise.
PROCESS_VLLM_CPU_GRID: dict[str, list[Any]] = {
    "max_num_seqs": [16, 128],
}
PROCESS_CPU_GRID: dict[str, list[Any]] = {
    "compute_type": ["int8", "float32"],
    "max_batch_size": [4, 32],
}
PROCESS_GPU_GRID: dict[str, list[Any]] = {
    "max_num_seqs": [64, 256],
    "max_num_batched_tokens": [8192, 16384],
}
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
_REFERENCE_FILES = ("references.tsv", "references.jsonl", "references.txt")


# -- the SLA ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SLA:
    deadline_s: float
    backlog: float  # audio seconds (transcribe) or documents (process)
    unit: str
    max_wer_increase: float | None = 0.01
    max_wer: float | None = None
    max_workers: int | None = None
    headroom: float = DEFAULT_HEADROOM
    utilization: float | None = None
    startup_s: float = 0.0
    text: str = ""

    @property
    def _err(self) -> str:
        return "WER" if self.unit == "audio_s" else "error rate"

    def describe(self) -> str:
        work = (
            f"{self.backlog / 3600:,.6g} audio hours"
            if self.unit == "audio_s"
            else f"{self.backlog:,.6g} documents"
        )
        parts = [f"{work} within {fmt_duration(self.deadline_s)}"]
        if self.max_wer_increase is not None:
            parts.append(f"{self._err} at most {self.max_wer_increase:g} above the best measured")
        if self.max_wer is not None:
            parts.append(f"{self._err} at most {self.max_wer:g}")
        parts.append(
            f"at most {self.max_workers} workers" if self.max_workers else "any number of workers"
        )
        parts.append(f"{self.headroom:.0%} headroom")
        return ", ".join(parts)


_SLA_KEYS = {
    "deadline",
    "backlog_hours",
    "backlog_documents",
    "documents",
    "max_wer_increase",
    "max_wer",
    "max_error_increase",
    "max_error",
    "max_workers",
    "workers",
    "headroom",
    "utilization",
    "startup",
}


def parse_sla(text: str, task: str = "transcribe") -> SLA:
    """``"deadline=6h,backlog_hours=2000,max_wer_increase=0.01[,max_workers=8]"``."""
    values: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        if not sep or key not in _SLA_KEYS:
            raise ConfigError(
                f"--sla: {part!r} is not KEY=VALUE with a known key ({', '.join(sorted(_SLA_KEYS))})"
            )
        # Documents: the same bounds on the error rate (label disagreement or word errors).
        key = {"max_error_increase": "max_wer_increase", "max_error": "max_wer"}.get(key, key)
        values[key] = value.strip()

    def number(key: str, cast: Callable[[str], Any] = float) -> Any:
        try:
            return cast(values[key])
        except ValueError:
            raise ConfigError(f"--sla: {key}={values[key]!r} is not a number") from None

    if "deadline" not in values:
        raise ConfigError("--sla needs deadline=DURATION (e.g. deadline=6h)")
    if task == "transcribe":
        if "backlog_hours" not in values:
            raise ConfigError(
                "--sla needs backlog_hours=N for --task transcribe (hours of audio per run)"
            )
        backlog, unit = number("backlog_hours") * 3600.0, "audio_s"
    else:
        key = "backlog_documents" if "backlog_documents" in values else "documents"
        if key not in values:
            raise ConfigError("--sla needs backlog_documents=N for --task process")
        backlog, unit = number(key), "documents"
    if backlog <= 0:
        raise ConfigError("--sla: the backlog must be larger than zero")
    workers_key = "max_workers" if "max_workers" in values else "workers"
    sla = SLA(
        deadline_s=parse_duration(values["deadline"], "--sla deadline"),
        backlog=backlog,
        unit=unit,
        max_wer_increase=number("max_wer_increase")
        if "max_wer_increase" in values
        else (None if "max_wer" in values else 0.01),
        max_wer=number("max_wer") if "max_wer" in values else None,
        max_workers=number(workers_key, int) if workers_key in values else None,
        headroom=number("headroom") if "headroom" in values else DEFAULT_HEADROOM,
        utilization=number("utilization") if "utilization" in values else None,
        startup_s=parse_duration(values["startup"], "--sla startup")
        if "startup" in values
        else 0.0,
        text=text,
    )
    if sla.max_workers is not None and sla.max_workers < 1:
        raise ConfigError("--sla: max_workers must be at least 1")
    return sla


# -- the grid ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    name: str
    options: dict[str, Any]


def _cross(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    keys = list(grid)
    for k in keys:
        if not isinstance(grid[k], list) or not grid[k]:
            raise ConfigError(f"grid: {k} must be a non-empty list of values (got {grid[k]!r})")
    return [
        dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(grid[k] for k in keys))
    ]


def _names(configs: list[dict[str, Any]]) -> list[Candidate]:
    keys = list(dict.fromkeys(k for c in configs for k in c if k != "name"))
    varying = [
        k for k in keys if len({json.dumps(c.get(k), sort_keys=True) for c in configs}) > 1
    ] or keys
    out, seen = [], set()
    for i, c in enumerate(configs):
        options = {k: v for k, v in c.items() if k != "name"}
        name = str(
            c.get("name") or " ".join(f"{k}={options.get(k)}" for k in varying) or f"config-{i}"
        )
        if name in seen:
            name = f"{name} #{i}"
        seen.add(name)
        out.append(Candidate(name, options))
    return out


def default_grid(device: str, task: str = "transcribe", backend: str = "auto") -> list[Candidate]:
    if task == "process":
        if device == "cuda":
            return _names(_cross(PROCESS_GPU_GRID))
        if backend == "auto":
            from jobs.spec import default_llm_backend

            backend = default_llm_backend()
        return _names(_cross(PROCESS_VLLM_CPU_GRID if backend == "vllm" else PROCESS_CPU_GRID))
    return _names(_cross(GPU_GRID if device == "cuda" else CPU_GRID))


def read_grid(path: str) -> list[Candidate]:
    """A grid file: ``base`` + ``grid`` (crossed) and/or ``configs`` (listed)."""
    if path.endswith(".json"):
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"grid file {path!r}: {exc}") from None
    else:
        data = read_job_file(path)
    unknown = set(data) - {"base", "grid", "configs"}
    if unknown or not isinstance(data, dict):
        raise ConfigError(
            f"grid file {path!r}: use the sections base, grid and configs (got {sorted(unknown)})"
        )
    base = data.get("base") or {}
    configs = _cross(data["grid"]) if data.get("grid") else []
    configs += list(data.get("configs") or [])
    if not configs:
        raise ConfigError(f"grid file {path!r} holds no configuration: add [grid] or [[configs]]")
    return _names([{**base, **c} for c in configs])


# -- measurements -----------------------------------------------------------------------------


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

    def profile(self, task: str, hardware: str, source: str) -> WorkerProfile:
        return WorkerProfile(
            name=self.name,
            task=task,
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
    task: str = "transcribe"


def _reason(exc: BaseException) -> str:
    """The line of a (possibly Ray-wrapped) failure that says what went wrong."""
    text = storage.redact(str(exc))
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
    """Why CTranslate2 here cannot run this compute type on this device (None: it can, or unknown)."""
    compute = options.get("compute_type", "auto")
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


def measure_transcribe(candidate: Candidate, index: int, ctx: Context) -> Measurement:
    """Run the transcription job on the sample with one configuration and measure it."""
    from jobs.ledger import read_results
    from jobs.transcribe import run_transcribe

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
    t0 = time.monotonic()
    try:
        summary = run_transcribe(spec)
    except OvernightError as exc:
        m.status, m.reason, m.elapsed_s = "failed", _reason(exc), time.monotonic() - t0
        return m
    m.elapsed_s = time.monotonic() - t0
    m.items, m.failed_items, m.pipeline_s = (
        summary["items"],
        summary["failed"],
        summary["pipeline_seconds"],
    )
    if summary["succeeded"] == 0:
        m.status = "failed"
        m.reason = f"every item failed ({', '.join(f'{k}: {v}' for k, v in summary['errors_by_code'].items())})"
        return m
    rows = read_results(
        out.join("transcripts"),
        ["item_id", "run_id", "source_uri", "status", "text", "options"],
        run_id=run_id,
    )
    costs = read_results(out.join("costs"), run_id=run_id)
    ok_rows = [r for r in (rows.to_pylist() if rows is not None else []) if r["status"] == "ok"]
    ok_ids = {r["item_id"] for r in ok_rows}
    ledger_rows = costs.to_pylist() if costs is not None else []
    model_rows = [r for r in ledger_rows if r["stage"] == "transcribe"]
    m.work = sum(r["audio_s"] or 0.0 for r in model_rows if r["item_id"] in ok_ids)
    m.busy_s = sum(r["seconds"] for r in model_rows)
    m.sample_cost_usd = sum(r["cost_usd"] for r in ledger_rows)
    other = sum(r["cost_usd"] for r in ledger_rows if r["stage"] != "transcribe")
    m.other_cost_per_unit_usd = other / m.work if m.work else 0.0
    if model_rows:
        m.resource = model_rows[0]["resource"]
        m.units_per_worker = float(model_rows[0]["units"] or 1.0)
        m.price_per_unit_hour_usd = float(model_rows[0]["price_per_hour_usd"] or 0.0)
    with contextlib.suppress(ValueError, TypeError, IndexError):
        effective = json.loads(ok_rows[0]["options"])
        m.effective = {k: effective[k] for k in ("device", "compute_type") if k in effective}
    m.effective.update(_pool_as_run(summary, ("decode_cpus", "model_workers", "cpu_threads")))
    for r in ok_rows:
        m.texts[_item_key(r["source_uri"])] = r["text"] or ""
    if m.busy_s <= 0:
        m.status, m.reason = "failed", "no busy time was measured (nothing reached the model)"
    return m


def _pool_as_run(summary: dict[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    """The model pool's shape as the measured run had it (``auto`` resolved, jobs/sizing.py),
    so that the chosen configuration runs what was measured, on any cluster."""
    opts = summary.get("options") or {}
    keep = ("cpus_per_actor", "gpus_per_actor", *fields)
    return {k: opts[k] for k in keep if opts.get(k) is not None}


def measure_process(candidate: Candidate, index: int, ctx: Context) -> Measurement:
    """Run the document job's first task on the sample with one configuration and measure it.

    Throughput is documents (that succeeded) per busy second of the LLM actor; the outputs
    compared for accuracy are the labels of a classification, else the generated JSON or text.
    """
    from jobs.ledger import read_results
    from jobs.process import run_process

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
    t0 = time.monotonic()
    try:
        summary = run_process(spec)
    except OvernightError as exc:
        m.status, m.reason, m.elapsed_s = "failed", _reason(exc), time.monotonic() - t0
        return m
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
        return m
    rows = read_results(
        out.join("results"),
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
    costs = read_results(out.join("costs"), run_id=m.run_id)
    ok_rows = [r for r in (rows.to_pylist() if rows is not None else []) if r["status"] == "ok"]
    ledger_rows = costs.to_pylist() if costs is not None else []
    model_rows = [r for r in ledger_rows if r["stage"] == "generate"]
    m.work = float(len(ok_rows))
    m.busy_s = sum(r["seconds"] for r in model_rows)
    m.sample_cost_usd = sum(r["cost_usd"] for r in ledger_rows)
    m.other_cost_per_unit_usd = (
        sum(r["cost_usd"] for r in ledger_rows if r["stage"] != "generate") / m.work
    )
    if model_rows:
        m.resource = model_rows[0]["resource"]
        m.units_per_worker = float(model_rows[0]["units"] or 1.0)
        m.price_per_unit_hour_usd = float(model_rows[0]["price_per_hour_usd"] or 0.0)
    with contextlib.suppress(ValueError, TypeError, IndexError):
        effective = json.loads(ok_rows[0]["options"])
        m.effective = {k: effective[k] for k in ("device", "compute_type") if k in effective}
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


# -- accuracy ---------------------------------------------------------------------------------


def _words(text: str) -> list[str]:
    text = text.lower().replace("-", " ")
    return text.translate(str.maketrans("", "", string.punctuation)).split()


def edit_distance(ref: list[str], hyp: list[str]) -> int:
    d = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, d[0] = d[0], i
        for j, h in enumerate(hyp, 1):
            cur = min(d[j] + 1, d[j - 1] + 1, prev + (r != h))
            prev, d[j] = d[j], cur
    return d[len(hyp)]


def corpus_wer(references: dict[str, str], hypotheses: dict[str, str]) -> tuple[float | None, int]:
    """All word edits / all reference words over the items that have a reference.

    An item with a reference but no transcript (it failed in this configuration) counts as
    all words deleted.
    """
    # One metric for tune, the tests and the benchmarks: jobs.wer (Whisper's normaliser, jiwer).
    return one_wer.corpus_wer(references, hypotheses)


def label_disagreement(
    references: dict[str, str], labels: dict[str, str]
) -> tuple[float | None, int]:
    """Share of referenced items whose label differs (case and spaces ignored); a missing
    label counts as wrong."""
    if not references:
        return None, 0
    wrong = sum(
        labels.get(k, "").strip().lower() != ref.strip().lower() for k, ref in references.items()
    )
    return wrong / len(references), len(references)


def error_rate(m: Measurement, references: dict[str, str]) -> tuple[float | None, int]:
    return label_disagreement(references, m.texts) if m.labels else corpus_wer(references, m.texts)


def read_references(sample: str, explicit: str | None = None) -> tuple[dict[str, str], str]:
    """References keyed by file name (and stem), and where they came from."""
    if explicit:
        files = [explicit]
    else:
        loc = storage.resolve(sample)
        if sample.lower().endswith((".csv", ".jsonl", ".parquet")) or not loc.fs.isdir(loc.path):
            return {}, ""
        names = [p.rsplit("/", 1)[-1] for p in storage.list_files(loc)]
        picked = [n for n in names if _is_reference_file(n)]
        files = [loc.join(n).url() for n in picked]
    refs: dict[str, str] = {}
    for url in files:
        text = storage.read_bytes(url).decode("utf-8-sig")
        for line in text.splitlines():
            if not line.strip():
                continue
            if url.endswith(".jsonl"):
                row = json.loads(line)
                key = str(row.get("name") or row.get("uri") or row.get("id") or "")
                value = str(row.get("text") or row.get("reference") or "")
            else:
                key, _, value = line.partition("\t") if "\t" in line else line.partition(" ")
            key = _item_key(key.strip())
            refs[key] = value.strip()
            refs.setdefault(_stem(key), value.strip())
    return refs, ", ".join(f.rsplit("/", 1)[-1] for f in files)


def _is_reference_file(uri: str) -> bool:
    name = _item_key(uri)
    return name in _REFERENCE_FILES or name.endswith("trans.txt")


def _match(refs: dict[str, str], keys: set[str]) -> dict[str, str]:
    out = {}
    for key in keys:
        ref = refs.get(key, refs.get(_stem(key)))
        if ref is not None:
            out[key] = ref
    return out


_MODEL_RANK = (
    ("tiny", 1),
    ("base", 2),
    ("small", 3),
    ("medium", 4),
    ("distil", 4.5),
    ("turbo", 5),
    ("large", 6),
)
_PRECISION = {
    "float32": 5,
    "bfloat16": 4,
    "float16": 4,
    "int8_float32": 3,
    "int8_bfloat16": 2.5,
    "int8_float16": 2.5,
    "auto": 2,
    "int8": 1,
}


def accuracy_rank(options: dict[str, Any]) -> tuple:
    """How accurate a configuration is by construction (larger is more accurate).

    Transcription: model size, then compute precision, then beam width. Documents: compute
    precision, then the token budget (a configured model is ranked by its name's size).
    """
    if "beam_size" not in options and any(
        k in options for k in ("max_batch_size", "max_num_seqs", "max_new_tokens", "backend")
    ):
        model = str(options.get("model") or "").lower()
        return (
            next((rank for key, rank in _MODEL_RANK if key in model), 3),
            _PRECISION.get(str(options.get("compute_type", "auto")), 2),
            int(options.get("max_new_tokens") or 0),
        )
    model = str(options.get("model", TranscribeOptions.model_fields["model"].default)).lower()
    size = next((rank for key, rank in _MODEL_RANK if key in model), 3)
    return (
        size,
        _PRECISION.get(str(options.get("compute_type", "auto")), 2),
        int(options.get("beam_size", TranscribeOptions.model_fields["beam_size"].default)),
    )


def score(measurements: list[Measurement], references: dict[str, str], source: str) -> str:
    """Fill in every ok measurement's WER; returns what accuracy is measured against."""
    ok = [m for m in measurements if m.status == "ok"]
    if not ok:
        return "nothing (no configuration succeeded)"
    keys = {k for m in ok for k in m.texts}
    refs = _match(references, keys)
    if refs:
        for m in ok:
            m.wer, m.scored_items = error_rate(m, refs)
        return f"references ({source}; {len(refs)} items)"
    best = max(ok, key=lambda m: accuracy_rank(m.options))
    for m in ok:
        m.wer, m.scored_items = error_rate(m, {k: v for k, v in best.texts.items() if v.strip()})
    return f"the most accurate configuration of the grid ({best.name}), as there are no references"


# -- the decision -----------------------------------------------------------------------------


@dataclass
class Row:
    measurement: Measurement
    option: Option | None = None
    meets_accuracy: bool = False
    meets_deadline: bool = False
    frontier: bool = False
    why: str = ""

    @property
    def cost_per_unit(self) -> float | None:
        if self.option is None:
            return None
        if self.measurement.unit == "audio_s":
            return self.option.cost_per_audio_minute_usd
        return self.option.cost_per_unit_usd


@dataclass
class Decision:
    sla: SLA
    rows: list[Row]
    chosen: Row | None
    best_wer: float | None
    allowed_wer: float | None
    accuracy_basis: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "sla": {**asdict(self.sla)},
            "accuracy_basis": self.accuracy_basis,
            "best_wer": self.best_wer,
            "allowed_wer": self.allowed_wer,
            "chosen": self.chosen.measurement.name if self.chosen else None,
            "configurations": [
                {
                    **r.measurement.to_dict(),
                    "plan": r.option.to_dict() if r.option else None,
                    "meets_accuracy": r.meets_accuracy,
                    "meets_deadline": r.meets_deadline,
                    "pareto_frontier": r.frontier,
                    "why": r.why,
                }
                for r in self.rows
            ],
        }


def _dominates(a: Row, b: Row) -> bool:
    ca, cb = a.cost_per_unit, b.cost_per_unit
    wa, wb = a.measurement.wer, b.measurement.wer
    if ca is None or cb is None or wa is None or wb is None:
        return False
    ta, tb = a.measurement.throughput, b.measurement.throughput
    return ca <= cb and wa <= wb and ta >= tb and (ca < cb or wa < wb or ta > tb)


def _money(v: float | None) -> str:
    from jobs.report import money

    return money(v)


def decide(measurements: list[Measurement], sla: SLA, accuracy_basis: str = "") -> Decision:
    """Size every measured configuration for the SLA and pick the cheapest that meets it."""
    rows = [Row(m) for m in measurements]
    scored = [r for r in rows if r.measurement.status == "ok" and r.measurement.wer is not None]
    best = min((r.measurement.wer for r in scored if r.measurement.wer is not None), default=None)
    allowed: float | None = None
    if best is not None:
        limits = []
        if sla.max_wer_increase is not None:
            limits.append(best + sla.max_wer_increase)
        if sla.max_wer is not None:
            limits.append(sla.max_wer)
        allowed = min(limits) if limits else None
    for r in rows:
        m = r.measurement
        if m.status != "ok" or m.throughput <= 0:
            continue
        r.option = size_option(
            m.profile("transcribe" if m.unit == "audio_s" else "process", "", ""),
            sla.backlog,
            sla.deadline_s,
            headroom=sla.headroom,
            utilization=sla.utilization,
            startup_s=sla.startup_s,
            max_workers=sla.max_workers,
        )
        r.meets_deadline = r.option.meets_deadline
        r.meets_accuracy = m.wer is not None and (allowed is None or m.wer <= allowed + 1e-12)
    eligible = [
        r
        for r in rows
        if r.meets_accuracy and r.meets_deadline and r.option and r.option.cost_usd is not None
    ]
    chosen = min(eligible, key=_cost_order) if eligible else None
    sized = [r for r in rows if r.option is not None and r.measurement.wer is not None]
    for r in sized:
        r.frontier = not any(_dominates(o, r) for o in sized if o is not r)
    for r in rows:
        r.why = _why(r, chosen, allowed)
    return Decision(sla, rows, chosen, best, allowed, accuracy_basis)


def _cost_order(r: Row) -> tuple[float, float, str]:
    cost = r.option.cost_usd if r.option is not None and r.option.cost_usd is not None else math.inf
    return (cost, -r.measurement.throughput, r.measurement.name)


def _why(r: Row, chosen: Row | None, allowed: float | None) -> str:
    m = r.measurement
    if m.status == "not_run":
        return f"not run: {m.reason}"
    if m.status == "failed":
        return f"skipped: {m.reason}"
    if r is chosen:
        return "chosen: the cheapest configuration that meets the deadline and the accuracy bound"
    faster = chosen is not None and m.throughput > chosen.measurement.throughput
    tag = "faster" if faster else "slower"
    if m.wer is None:
        return f"{tag}, but its accuracy could not be measured (no item to score)"
    if not r.meets_accuracy:
        metric = "WER" if m.unit == "audio_s" else "error rate"
        return f"{tag}, but its {metric} {m.wer:.3f} is above the allowed {allowed:.3f}"
    if not r.meets_deadline and r.option is not None:
        return f"{tag}, but it misses the deadline: {r.option.reason}"
    if chosen is None or r.option is None or chosen.option is None:
        return "meets the SLA"
    mine, theirs = r.cost_per_unit, chosen.cost_per_unit
    if r.option.cost_usd == chosen.option.cost_usd:
        return f"{tag}, and the same cost as the chosen one"
    extra = (r.option.cost_usd or 0) / (chosen.option.cost_usd or 1) - 1
    unit = "per audio minute" if m.unit == "audio_s" else "per document"
    if faster:
        return (
            f"faster ({m.throughput:,.1f} vs {chosen.measurement.throughput:,.1f} per busy second per worker) "
            f"but more expensive: {_money(mine)} {unit} at this SLA vs {_money(theirs)} (+{extra:.0%}); "
            "the chosen one already meets the deadline"
        )
    return f"slower and more expensive: {_money(mine)} {unit} vs {_money(theirs)} (+{extra:.0%})"


# -- orchestration ----------------------------------------------------------------------------


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


def _sample_input(
    sample: str, workdir: storage.Location, max_items: int | None, task: str = "transcribe"
) -> tuple[str, int, dict[str, str]]:
    """The sample as a manifest of its items, and the references a manifest's ``reference``
    column holds. Reference files are left out; for transcription also notes and tables
    (anything not audio); for documents a transcripts dataset is used as it is."""
    from jobs.manifest import is_manifest, records_from_manifest

    if task == "process" and not is_manifest(sample):
        from jobs.process import _is_transcripts

        transcripts = _is_transcripts(sample)
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
            and (task == "process" or not o.uri.lower().endswith(_NOT_MEDIA))
        ]
    if max_items is not None:
        rows = rows[:max_items]
    refs = {_item_key(r["uri"]): str(r.pop("reference")) for r in rows if r.get("reference")}
    if not rows:
        raise ConfigError(f"the sample {storage.redact(sample)!r} holds nothing to {task}")
    loc = workdir.join("sample.jsonl")
    storage.write_bytes_atomic(loc, "".join(json.dumps(r) + "\n" for r in rows).encode())
    return loc.url(), len(rows), refs


def tune(
    sample: str,
    sla: SLA,
    *,
    task: str = "transcribe",
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
    if task not in TASKS:
        raise ConfigError(f"--task {task!r}: choose one of {', '.join(TASKS)}")
    started = clock()
    say = echo or (lambda _line: None)
    workdir = storage.resolve(out)
    base = dict(base or {})
    base.pop("job", None)  # the tuner sets input, output and run ids itself
    device = "cpu"
    if runner is None:
        from jobs.pipeline import cluster_has_gpu, ensure_ray

        ensure_ray(address)
        wanted = (base.get(task) or {}).get("device", "auto")
        device = ("cuda" if cluster_has_gpu() else "cpu") if wanted == "auto" else wanted
    backend = str((base.get("process") or {}).get("backend", "auto"))
    candidates = grid if grid is not None else default_grid(device, task, backend)
    if not candidates:
        raise ConfigError("the grid is empty")
    for c in candidates:  # validate every configuration before running any
        try:
            build_spec(
                base, {"job": {"kind": task, "input": sample, "output": out}, task: c.options}
            )
        except ConfigError as exc:
            raise ConfigError(f"grid configuration {c.name!r}: {exc}") from None
    refs, ref_source = read_references(sample, references)
    sample_input, n_items, manifest_refs = _sample_input(sample, workdir, max_items, task)
    if manifest_refs:
        refs, ref_source = {**refs, **manifest_refs}, "the manifest's reference column"
    ctx = Context(
        sample_input,
        base,
        workdir,
        datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"),
        device,
        address,
        task,
    )
    order = list(range(len(candidates)))
    if not refs:  # the reference configuration must be measured first
        order.sort(key=lambda i: tuple(-x for x in accuracy_rank(candidates[i].options)))
    results: dict[int, Measurement] = {}
    durations: list[float] = []
    run = runner or (measure_transcribe if task == "transcribe" else measure_process)
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
    result.files = write_outputs(result, workdir, sample, base, task)
    return result


def _throughput(m: Measurement) -> str:
    if m.unit == "audio_s":
        return f"{m.throughput:,.1f}x real time"
    return f"{m.throughput:,.3g} documents/s"


def _toml_value(value: Any) -> str:
    import tomli_w

    return tomli_w.dumps({"v": value}).split("=", 1)[1].strip()


def chosen_toml(result: TuneResult, sample: str, base: dict[str, Any], task: str) -> str:
    """The chosen configuration as a job spec (the job file's sections, the chosen options on top)."""
    d = result.decision
    assert d.chosen is not None and d.chosen.option is not None  # only called with a choice
    m, o = d.chosen.measurement, d.chosen.option
    section = {**(base.get(task) or {}), **m.options, **m.effective}
    # A plan's worker is one model worker; an actor runs model_workers of them at once.
    per_actor = int(section.get("model_workers") or 1)
    actors = max(1, -(-(o.workers or 1) // per_actor))
    per_unit = (
        f"{_money(o.cost_per_audio_minute_usd)} per audio minute"
        if m.unit == "audio_s"
        else f"{_money(o.cost_per_unit_usd)} per document"
    )
    metric = "WER" if m.unit == "audio_s" else ("label disagreement" if m.labels else "word error")
    lines = [
        f"# Written by `overnight tune` on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC: the cheapest",
        "# configuration of the grid that meets the SLA.",
        f"# SLA: {d.sla.text}",
        f"# measured on {result.hardware}: {_throughput(m)} per busy worker, "
        f"{metric} {m.wer:.3f} against {d.accuracy_basis}",
        f"# plan: {o.workers} workers of {m.units_per_worker:g} x {m.resource} finish the backlog in "
        f"{fmt_duration(o.finish_s or 0)}, ${o.cost_usd:,.2f} ({per_unit})",
        f"# Run the backlog: overnight {task} INPUT OUTPUT --config chosen.toml --actors {actors}",
        f"# ({o.workers} workers: actors of {per_actor} model worker(s) each, on a cluster that "
        "has them; see `overnight plan`)",
        "",
        "[job]",
        f'kind = "{task}"',
        f"input = {_toml_value(storage.redact(sample))}  # replace with the backlog",
        'output = "overnight-output"  # replace with the output',
    ]
    for name, values in (("transcribe", base.get("transcribe")), ("process", base.get("process"))):
        values = section if name == task else values
        if values:
            lines += ["", f"[{name}]"] + [
                f"{k} = {_toml_value(v)}" for k, v in values.items() if v is not None
            ]
    prices = base.get("prices")
    if prices:
        lines += ["", "[prices]"] + [f"{k} = {_toml_value(v)}" for k, v in prices.items()]
    return "\n".join(lines) + "\n"


def write_outputs(
    result: TuneResult, out: storage.Location, sample: str, base: dict[str, Any], task: str
) -> dict[str, str]:
    d = result.decision
    files = {}
    source = f"overnight tune on {storage.redact(sample)} ({result.sample_items} items)"
    profiles = []
    for r in d.rows:
        if r.option is None:
            continue
        p = r.measurement.profile(task, result.hardware, source)
        accuracy = {**p.accuracy, "allowed_wer": d.allowed_wer, "acceptable": r.meets_accuracy}
        profiles.append(replace(p, accuracy=accuracy))
    doc = profile_document(
        profiles,
        task,
        d.sla.unit,
        chosen=d.chosen.measurement.name if d.chosen else None,
        measured_at=datetime.now(UTC).isoformat(),
        sla=d.sla.text,
    )
    loc = out.join("profile.json")
    storage.write_bytes_atomic(loc, json.dumps(doc, indent=2).encode())
    files["profile"] = loc.url()
    loc = out.join("measurements.json")
    body = {
        **d.to_dict(),
        "elapsed_s": result.elapsed_s,
        "budget_s": result.budget_s,
        "hardware": result.hardware,
        "sample_items": result.sample_items,
    }
    storage.write_bytes_atomic(loc, json.dumps(body, indent=2, default=str).encode())
    files["measurements"] = loc.url()
    if d.chosen is not None:
        loc = out.join("chosen.toml")
        storage.write_bytes_atomic(loc, chosen_toml(result, sample, base, task).encode())
        files["chosen"] = loc.url()
    return files


def render(result: TuneResult) -> str:
    d = result.decision
    audio = d.sla.unit == "audio_s"
    err = "WER" if audio else "error"
    per = "$/min" if audio else "$/doc"
    w = max([len("configuration"), *(len(r.measurement.name) for r in d.rows)])
    lines = [
        f"sample: {result.sample_items} items; accuracy against {d.accuracy_basis}",
        f"SLA: {d.sla.describe()}"
        + (
            f"; allowed {err} {d.allowed_wer:.3f} (best measured {d.best_wer:.3f})"
            if d.allowed_wer is not None and d.best_wer is not None
            else ""
        ),
        f"hardware: {result.hardware}",
        "",
    ]
    header = (
        f"{'configuration':<{w}} {'x RT/worker' if audio else 'docs/s/wkr':>11} {err:>6} "
        f"{'sample ' + per:>12} {'workers':>7} {'finish':>9} {per + ' @SLA':>11} {'backlog $':>10}  verdict"
    )
    lines += [header, "-" * len(header)]
    for r in d.rows:
        m, o = r.measurement, r.option
        if o is None:
            lines.append(
                f"{m.name:<{w}} {'-':>11} {'-':>6} {'-':>12} {'-':>7} {'-':>9} {'-':>11} {'-':>10}  {m.status}"
            )
            continue
        verdict = (
            "CHOSEN"
            if r is d.chosen
            else (
                "ok"
                if r.meets_accuracy and r.meets_deadline
                else "fails "
                + " and ".join(
                    x
                    for x, ok in (("accuracy", r.meets_accuracy), ("deadline", r.meets_deadline))
                    if not ok
                )
            )
        )
        lines.append(
            f"{m.name:<{w}} {m.throughput:>11,.{1 if audio else 3}f} "
            f"{m.wer if m.wer is not None else float('nan'):>6.3f} "
            f"{_money(m.sample_cost_per_unit):>12} {o.workers if o.workers is not None else '-':>7} "
            f"{fmt_duration(o.finish_s) if o.finish_s is not None else '-':>9} {_money(r.cost_per_unit):>11} "
            f"{_money(o.cost_usd):>10}  {verdict}{' *' if r.frontier else ''}"
        )
    lines.append(
        f"* on the Pareto frontier of cost per {'audio minute' if audio else 'document'}, {err} and throughput"
    )
    lines.append("")
    if d.chosen is not None and d.chosen.option is not None:
        c, o = d.chosen.measurement, d.chosen.option
        lines.append(f"chosen: {c.name}")
        lines.extend(f"  {line}" for line in o.arithmetic)
    else:
        lines.append(
            "no configuration meets the SLA: loosen it, allow more workers, or add faster configurations"
        )
    lines += ["", "why not the others:"]
    lines += [f"  {r.measurement.name}: {r.why}" for r in d.rows if r is not d.chosen]
    lines += ["", f"tuning took {result.elapsed_s:.0f} s of a {result.budget_s:.0f} s budget"]
    lines += [f"wrote {path}" for path in result.files.values()]
    return "\n".join(lines)


# -- command line -----------------------------------------------------------------------------


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "tune",
        help="measure a grid of configurations on a sample; pick the cheapest that meets an SLA",
        description="Run a grid of configurations on a sample of the real workload, measure throughput, "
        "accuracy and cost, and write the cheapest one meeting the SLA as a job spec plus a profile for plan.",
    )
    p.add_argument(
        "sample",
        help="folder, prefix or manifest of sample recordings (references alongside, optional)",
    )
    p.add_argument("--task", choices=TASKS, default="transcribe")
    p.add_argument(
        "--sla",
        required=True,
        help='e.g. "deadline=6h,backlog_hours=2000,max_wer_increase=0.01[,max_workers=8,headroom=0.2]"',
    )
    p.add_argument("--grid", help="grid file (TOML/YAML/JSON: base, grid, configs)")
    p.add_argument(
        "--budget",
        default=DEFAULT_BUDGET,
        help=f"time budget of the tuning (default {DEFAULT_BUDGET})",
    )
    p.add_argument(
        "--config", help="the job file to tune (its [transcribe] and [prices] are the base)"
    )
    p.add_argument("--references", help="reference transcripts (tsv: name TAB text, or jsonl)")
    p.add_argument("--max-items", type=int, help="use at most this many recordings of the sample")
    p.add_argument(
        "--out",
        help="folder for chosen.toml, profile.json, measurements.json and each run's output",
    )
    p.add_argument("--address", help="Ray cluster address (default: start Ray locally)")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    import sys

    sla = parse_sla(args.sla, args.task)
    out = args.out or f"tune-{datetime.now(UTC):%Y%m%dT%H%M%SZ}"
    result = tune(
        args.sample,
        sla,
        task=args.task,
        grid=read_grid(args.grid) if args.grid else None,
        budget_s=parse_duration(args.budget, "--budget"),
        out=out,
        base=read_job_file(args.config) if args.config else None,
        references=args.references,
        max_items=args.max_items,
        address=args.address,
        echo=lambda line: print(line, file=sys.stderr, flush=True),
    )
    print(render(result))
    return 0 if result.decision.chosen is not None else 1
