"""Prometheus metrics of running jobs, through ``ray.util.metrics``.

Ray exports them with its own at each node's metrics port (``ray_`` prefixed, e.g.
``ray_overnight_items_total``); the KubeRay manifests (``infra/``) let Prometheus scrape it.
They count as the work is committed, so a dashboard or an alert sees a night's progress and
its failures while it runs, not only in the summary at its end:

- ``overnight_items_total{dataset, status, error_code}``: items committed, by outcome;
- ``overnight_audio_seconds_total{dataset}``: audio of the items committed ok;
- ``overnight_tokens_total{dataset, direction}``: LLM tokens in and out;
- ``overnight_cost_usd_total{dataset, stage}``: what the ledger priced, as it is published.

Labels are few and bounded (a dataset name, an error code from ``schemas.errors``): never an
item id, a tenant or a run id, which would make a series per night. Outside Ray (a worker
called as a plain class in a test) nothing is recorded.
"""

from __future__ import annotations

import contextlib
from collections import Counter as Tally
from typing import Any

import pyarrow as pa

_MADE: dict[str, Any] = {}


def _metrics() -> dict[str, Any] | None:
    """The process's metrics, made once Ray runs here (a driver prices a killed run's rows
    before it starts Ray: not made then, and made at the next call)."""
    if not _MADE:
        made = _make()
        if made is None:
            return None
        _MADE.update(made)
    return _MADE


def _make() -> dict[str, Any] | None:
    try:
        import ray
        from ray.util.metrics import Counter

        if not ray.is_initialized():
            return None
    except ImportError:
        return None
    return {
        "items": Counter(
            "overnight_items",
            description="items committed, by dataset, status and error code",
            tag_keys=("dataset", "status", "error_code"),
        ),
        "audio": Counter(
            "overnight_audio_seconds",
            description="seconds of audio of the items committed ok",
            tag_keys=("dataset",),
        ),
        "tokens": Counter(
            "overnight_tokens",
            description="LLM tokens of the items committed, in and out",
            tag_keys=("dataset", "direction"),
        ),
        "cost": Counter(
            "overnight_cost_usd",
            description="USD the ledger priced as rows were published, by stage",
            tag_keys=("dataset", "stage"),
        ),
    }


def _column(table: pa.Table, name: str) -> list[Any]:
    return table.column(name).to_pylist() if name in table.column_names else [None] * len(table)


def record_committed(dataset: str, rows: pa.Table) -> None:
    """Count a committed batch. A metrics failure never fails the commit."""
    with contextlib.suppress(Exception):
        metrics = _metrics()
        if metrics is None or rows.num_rows == 0:
            return
        status, codes = _column(rows, "status"), _column(rows, "error_code")
        for (s, code), n in Tally(zip(status, codes, strict=True)).items():
            tags = {"dataset": dataset, "status": s or "ok", "error_code": code or ""}
            metrics["items"].inc(n, tags=tags)
        ok = [s == "ok" for s in status]
        audio = sum(
            d or 0.0 for d, good in zip(_column(rows, "duration_s"), ok, strict=True) if good
        )
        if audio:
            metrics["audio"].inc(audio, tags={"dataset": dataset})
        for direction in ("input", "output"):
            tokens = sum(t or 0 for t in _column(rows, f"{direction}_tokens"))
            if tokens:
                metrics["tokens"].inc(tokens, tags={"dataset": dataset, "direction": direction})


def record_priced(dataset: str, ledger: pa.Table) -> None:
    """Count what the ledger priced, by stage."""
    with contextlib.suppress(Exception):
        metrics = _metrics()
        if metrics is None or ledger.num_rows == 0:
            return
        by_stage: dict[str, float] = {}
        for stage, usd in zip(_column(ledger, "stage"), _column(ledger, "cost_usd"), strict=True):
            by_stage[stage] = by_stage.get(stage, 0.0) + (usd or 0.0)
        for stage, usd in by_stage.items():
            if usd:
                metrics["cost"].inc(usd, tags={"dataset": dataset, "stage": stage})
