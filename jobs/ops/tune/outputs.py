"""What a tuning leaves: chosen.toml, profile.json, measurements.json, and the printed table."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from overnight.jobs.accounting.money import money
from overnight.jobs.dataset import storage
from overnight.jobs.ops.plan import fmt_duration, profile_document
from overnight.jobs.ops.tune.measure import Measurement

if TYPE_CHECKING:  # the orchestration imports this module
    from overnight.jobs.ops.tune.orchestrate import TuneResult


def _throughput(m: Measurement) -> str:
    if m.unit == "audio_s":
        return f"{m.throughput:,.1f}x real time"
    return f"{m.throughput:,.3g} documents/s"


def _toml_value(value: Any) -> str:
    import tomli_w

    return tomli_w.dumps({"v": value}).split("=", 1)[1].strip()


def chosen_toml(result: TuneResult, sample: str, base: dict[str, Any], kind: str) -> str:
    """The chosen configuration as a job spec (the job file's sections, the chosen options on top)."""
    d = result.decision
    assert d.chosen is not None and d.chosen.option is not None  # only called with a choice
    m, o = d.chosen.measurement, d.chosen.option
    section = {**(base.get(kind) or {}), **m.options, **m.effective}
    # A plan's worker is one model worker; an actor runs model_workers of them at once.
    per_actor = int(section.get("model_workers") or 1)
    actors = max(1, -(-(o.workers or 1) // per_actor))
    per_unit = (
        f"{money(o.cost_per_audio_minute_usd)} per audio minute"
        if m.unit == "audio_s"
        else f"{money(o.cost_per_unit_usd)} per document"
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
        f"# Run the backlog: overnight {kind} INPUT OUTPUT --config chosen.toml --actors {actors}",
        f"# ({o.workers} workers: actors of {per_actor} model worker(s) each, on a cluster that "
        "has them; see `overnight plan`)",
        "",
        "[job]",
        f'kind = "{kind}"',
        f"input = {_toml_value(storage.scrub_secrets(sample))}  # replace with the backlog",
        'output = "overnight-output"  # replace with the output',
    ]
    for name, values in (("transcribe", base.get("transcribe")), ("process", base.get("process"))):
        values = section if name == kind else values
        if values:
            lines += ["", f"[{name}]"] + [
                f"{k} = {_toml_value(v)}" for k, v in values.items() if v is not None
            ]
    prices = base.get("prices")
    if prices:
        lines += ["", "[prices]"] + [f"{k} = {_toml_value(v)}" for k, v in prices.items()]
    return "\n".join(lines) + "\n"


def write_outputs(
    result: TuneResult, out: storage.Location, sample: str, base: dict[str, Any], kind: str
) -> dict[str, str]:
    d = result.decision
    files = {}
    # chosen.toml goes first and comes back last: never a choice that profile.json and
    # measurements.json do not make (an earlier tuning's, when this one chose nothing).
    storage.delete(out.join("chosen.toml"))
    source = f"overnight tune on {storage.scrub_secrets(sample)} ({result.sample_items} items)"
    profiles = []
    for r in d.rows:
        if r.option is None:
            continue
        p = r.measurement.profile(kind, result.hardware, source)
        accuracy = {**p.accuracy, "allowed_wer": d.allowed_wer, "acceptable": r.meets_accuracy}
        profiles.append(replace(p, accuracy=accuracy))
    doc = profile_document(
        profiles,
        kind,
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
        storage.write_bytes_atomic(loc, chosen_toml(result, sample, base, kind).encode())
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
            f"{money(m.sample_cost_per_unit):>12} {o.workers if o.workers is not None else '-':>7} "
            f"{fmt_duration(o.finish_s) if o.finish_s is not None else '-':>9} {money(r.cost_per_unit):>11} "
            f"{money(o.cost_usd):>10}  {verdict}{' *' if r.frontier else ''}"
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
