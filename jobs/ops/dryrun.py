"""``--dry-run``: what a run would do, without starting Ray or writing anything.

It prepares the job as the run would (the input listed and filtered, the model and the
output checked by ``jobs.preflight``, the model as on a cluster: in the cache or on the hub,
never downloaded), counts the items pending against those already
committed in OUTPUT, and prices the pending work at the cost per unit that OUTPUT's own past
runs measured (``OUTPUT/runs/*.json``): per audio minute for transcription, per document for
LLM tasks. Audio minutes of pending recordings are read from the container headers of a
sample of them (``workers.probe``, a few kilobytes each) and scaled by bytes.
"""

from __future__ import annotations

import random
from typing import Any

from overnight.jobs.dataset import commits, storage
from overnight.jobs.run import runner
from overnight.jobs.spec import JobSpec

# Recordings whose headers are read to turn pending bytes into audio minutes.
SAMPLE = 8


def _prepared(spec: JobSpec) -> list[tuple[runner.Job[Any], runner.Prepared]]:
    """The job's runs, each prepared as the run would prepare it, but dry."""
    kind = spec.job.kind
    jobs: list[runner.Job[Any]] = []
    if kind in ("transcribe", "chain"):
        from overnight.jobs.transcribe import TranscribeJob

        jobs.append(TranscribeJob(spec))
    elif kind == "probe":
        from overnight.jobs.probe import ProbeJob

        jobs.append(ProbeJob(spec))
    if kind in ("process", "chain"):
        from overnight.jobs.process import check_process, process_jobs

        if kind == "chain":  # its documents are the transcripts the first stage would write
            check_process(spec, dry=True)
        else:
            jobs.extend(process_jobs(spec, spec.job.input))
    return [(job, job.prepare(dry=True)) for job in jobs]


def _audio_seconds(
    pending: list[dict[str, Any]], within: list[str] | None
) -> tuple[float | None, int]:
    """Audio seconds of ``pending`` estimated from a sample's headers; (None, 0) when no
    sampled header states a duration."""
    from overnight.workers.probe import ProbeError, read_header

    sample = random.Random(0).sample(pending, min(SAMPLE, len(pending)))
    seconds = size = 0.0
    read = 0
    for row in sample:
        try:
            with storage.open_object(row["uri"], within=within) as f:
                header = read_header(f)
        except (ProbeError, storage.Unreadable, OSError):
            continue
        if header.duration_s and row.get("size"):
            seconds += header.duration_s
            size += row["size"]
            read += 1
    if not read:
        return None, 0
    total_bytes = sum(r.get("size") or 0 for r in pending)
    return seconds / size * total_bytes, read


def _past_unit_cost(output: storage.Location, kind: str) -> tuple[float | None, int]:
    """Cost per audio second (transcribe) or per document (process) over OUTPUT's past runs
    of that kind; (None, 0) when there are none."""
    from overnight.jobs.ops.plan import read_summaries, run_problem

    runs: list[dict[str, Any]] = []
    for s in read_summaries(output):
        runs.extend(s.get("stages") or [s])
    # A run whose figures are out of range (a NaN cost) would make the estimate "$nan".
    runs = [
        r
        for r in runs
        if r.get("kind") == kind and run_problem(r) is None and (r.get("cost_usd") or 0) > 0
    ]
    if not runs:
        return None, 0
    cost = sum(r["cost_usd"] for r in runs)
    work = sum(
        (r.get("audio_seconds") or 0.0) if kind == "transcribe" else r["items"] for r in runs
    )
    return (cost / work if work else None), len(runs)


def dry_run(spec: JobSpec) -> dict[str, Any]:
    """The dry run's report (``jobs.cli`` prints it)."""
    output = storage.resolve(spec.job.output)
    stages = []
    for job, prepared in _prepared(spec):
        todo, found = runner.left_to_do(
            job, prepared, commits.CommittedDataset(output.join(job.dataset))
        )
        redo = {i for rows in found.values() for i in rows}
        limit = spec.job.max_items
        pending = todo[:limit] if limit is not None else todo
        stage: dict[str, Any] = {
            "kind": job.kind,
            "dataset": job.dataset,
            "items_listed": len(prepared.records),
            "items_already_done": len(prepared.records) - len(todo),
            "items_pending": len(pending),
            "errors_to_redo": len(redo),
            "pending_bytes": sum(r.get("size") or 0 for r in pending),
            # Files of the listing that are not items (reason -> how many), as the run's
            # summary says them.
            "skipped": prepared.skipped,
            "skipped_examples": prepared.skipped_examples,
        }
        unit_cost, runs = _past_unit_cost(output, job.kind)
        if job.kind == "transcribe" and pending:
            seconds, sampled = _audio_seconds(pending, spec.job.allowed_input_prefixes)
            stage["pending_audio_hours_estimate"] = (
                None if seconds is None else round(seconds / 3600.0, 4)
            )
            stage["pending_audio_seconds_estimate"] = None if seconds is None else round(seconds, 1)
            stage["audio_estimate_basis"] = f"headers of {sampled} sampled recording(s)"
            work = seconds
        else:
            work = float(len(pending))
        stage["past_runs_priced"] = runs
        stage["cost_estimate_usd"] = (
            round(unit_cost * work, 6) if unit_cost is not None and work is not None else None
        )
        stages.append(stage)
    return {
        "dry_run": True,
        "kind": spec.job.kind,
        "output": storage.scrub_secrets(spec.job.output),
        "stages": stages,
    }


def render(report: dict[str, Any]) -> str:
    from overnight.jobs.ops.plan import fmt_duration

    lines = [
        f"dry run of a {report['kind']} job into {report['output']}: nothing was started or written"
    ]
    for s in report["stages"]:
        lines.append(
            f"  {s['kind']:<10} {s['items_listed']} listed, {s['items_already_done']} already "
            f"done, {s['items_pending']} to do ({s['pending_bytes'] / 1e6:.1f} MB)"
            + (
                f", {s['errors_to_redo']} of them error rows to redo"
                if s.get("errors_to_redo")
                else ""
            )
        )
        if s.get("skipped"):
            from overnight.jobs.dataset.manifest import skipped_lines
            from overnight.jobs.run.console import printable

            # printable: a name may hold a newline that would forge a line of its own.
            lines += [
                "             " + printable(line.replace("skipped      ", "skipped ", 1))
                for line in skipped_lines(s["skipped"], s.get("skipped_examples") or [])
            ]
        if s.get("pending_audio_seconds_estimate") is not None:
            # In a unit that suits it: in hours alone, 16 s of audio read "about 0.00 h".
            lines.append(
                f"             about {fmt_duration(s['pending_audio_seconds_estimate'])} of audio "
                f"({s['audio_estimate_basis']})"
            )
        if s["cost_estimate_usd"] is not None and s["items_pending"]:
            lines.append(
                f"             about ${s['cost_estimate_usd']:.4f}, at the cost per unit of "
                f"{s['past_runs_priced']} past run(s) in this output"
            )
        elif s["items_pending"]:
            lines.append(
                "             no cost estimate: this output has no past run of this kind to price "
                "from (`overnight plan` sizes a backlog from a `tune` profile)"
            )
    return "\n".join(lines)
