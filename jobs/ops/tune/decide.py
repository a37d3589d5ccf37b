"""The decision: size every measured configuration for the SLA and pick the cheapest that meets it."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from overnight.jobs.accounting.money import money
from overnight.jobs.ops.plan import Option, size_option
from overnight.jobs.ops.tune.measure import Measurement
from overnight.jobs.ops.tune.sla import SLA


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
            sla.sizing,
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
            f"but more expensive: {money(mine)} {unit} at this SLA vs {money(theirs)} (+{extra:.0%}); "
            "the chosen one already meets the deadline"
        )
    return f"slower and more expensive: {money(mine)} {unit} vs {money(theirs)} (+{extra:.0%})"
