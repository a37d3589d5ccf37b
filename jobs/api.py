"""The Python API: what the command line runs, for schedulers (Airflow, Dagster, Prefect) and
notebooks. ``overnight.transcribe``, ``overnight.process`` and ``overnight.run`` are these.

Options are the job spec's fields (``overnight config`` lists them), given as keyword
arguments: a field of ``[job]`` (``run_id``, ``max_items``, ``include`` ...) goes there, any
other to the kind's section (``[transcribe]`` or ``[process]``); ``prices`` to ``[prices]``.
An unknown name is a ``ConfigError`` that suggests the closest field. Failures raise the
``jobs.errors.OvernightError`` subclasses whose ``exit_code`` the command line exits with; a run
that finishes returns its summary, also when some items failed (see ``RunSummary.failed``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from overnight.jobs.errors import ConfigError, ErrorRateExceeded

# The webhook of runs whose spec names none (``[job] notify`` and ``--notify`` win).
NOTIFY_ENV = "OVERNIGHT_NOTIFY_URL"

if TYPE_CHECKING:
    from overnight.jobs.spec import JobSpec, ProcessOptions, TranscribeOptions


@dataclass(frozen=True)
class RunSummary:
    """A finished run: the figures schedulers branch on, and the whole summary in ``raw``
    (the same object the run writes to ``OUTPUT/runs/<run_id>.json``)."""

    run_id: str
    kind: str
    items: int
    succeeded: int
    failed: int
    items_already_done: int
    cost_usd: float | None
    wall_seconds: float | None
    errors_by_code: dict[str, int] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict, repr=False)
    # A chained or multi-task job's stages, each its own summary (the counts above add
    # them up: a recording transcribed and summarized is 2 items); empty for a single-stage
    # job.
    stages: tuple[RunSummary, ...] = ()

    @property
    def error_rate(self) -> float:
        """Failed items over the items this run processed (0.0 when it processed none); for a
        chained or multi-task job, its worst stage's, as ``max_error_rate`` judges it: pooled,
        a task failing on 30 of 100 documents read 15% beside a clean transcription stage."""
        if self.stages:
            return max(s.error_rate for s in self.stages)
        return self.failed / self.items if self.items else 0.0

    def to_dict(self) -> dict[str, Any]:
        """The whole summary, as written to ``OUTPUT/runs/<run_id>.json`` (JSON-ready)."""
        return dict(self.raw)

    @classmethod
    def from_dict(cls, summary: Mapping[str, Any]) -> RunSummary:
        stages = summary.get("stages")
        if stages:  # a chained or multi-task job: the stages' figures added up
            parts = [cls.from_dict(s) for s in stages]
            costs = [p.cost_usd for p in parts if p.cost_usd is not None]
            errors: dict[str, int] = {}
            for p in parts:
                for code, n in p.errors_by_code.items():
                    errors[code] = errors.get(code, 0) + n
            return cls(
                run_id=parts[0].run_id,
                kind=str(summary.get("kind") or "chain"),
                items=sum(p.items for p in parts),
                succeeded=sum(p.succeeded for p in parts),
                failed=sum(p.failed for p in parts),
                items_already_done=sum(p.items_already_done for p in parts),
                cost_usd=sum(costs) if costs else None,
                wall_seconds=sum(p.wall_seconds or 0.0 for p in parts),
                errors_by_code=errors,
                raw=dict(summary),
                stages=tuple(parts),
            )
        return cls(
            run_id=str(summary.get("run_id")),
            kind=str(summary.get("kind")),
            items=int(summary.get("items") or 0),
            succeeded=int(summary.get("succeeded") or 0),
            failed=int(summary.get("failed") or 0),
            items_already_done=int(summary.get("items_already_done") or 0),
            cost_usd=summary.get("cost_usd"),
            wall_seconds=summary.get("wall_seconds"),
            errors_by_code=dict(summary.get("errors_by_code") or {}),
            raw=dict(summary),
        )


def execute(spec: JobSpec) -> dict[str, Any]:
    """Run a validated spec; its summary as a dict (the command line prints this one)."""
    if spec.job.kind == "transcribe":
        from overnight.jobs.transcribe import run_transcribe

        return run_transcribe(spec)
    if spec.job.kind == "probe":
        from overnight.jobs.probe import run_probe  # type: ignore[import-not-found,unused-ignore]

        return run_probe(spec)
    from overnight.jobs.process import run_chain, run_process

    return run_process(spec) if spec.job.kind == "process" else run_chain(spec)


def finish(spec: JobSpec, show: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Run a spec to its end, as the command line and the API both do: execute it, ``show``
    the summary (the command line prints it), check ``max_error_rate``, and tell
    ``[job] notify`` how it ended: its summary, over the error rate, or the error that stopped
    it (also an interrupt). The notification never changes the outcome."""
    try:
        summary = execute(spec)
    except BaseException as exc:
        _notify(spec, error=exc)
        raise
    if show is not None:
        show(summary)
    try:
        check_error_rate(spec, summary)
    except ErrorRateExceeded as exc:
        _notify(spec, error=exc)
        raise
    _notify(spec, summary=summary)
    return summary


def _notify(
    spec: JobSpec, summary: dict[str, Any] | None = None, error: BaseException | None = None
) -> None:
    # A webhook URL holds its token: in a job file or a command line it sits in a ConfigMap, a
    # RayJob's entrypoint and the dashboard; the environment can take it from a Secret.
    url = spec.job.notify or os.environ.get(NOTIFY_ENV, "").strip()
    if not url:
        return
    from overnight.jobs.ops import notify

    body = notify.payload(summary=summary, error=error, spec_kind=spec.job.kind, run_id=spec.run_id)
    notify.post(url, body)


def check_error_rate(spec: JobSpec, summary: Mapping[str, Any]) -> None:
    """``ErrorRateExceeded`` (exit 12) when the failed share of any stage of the run is over
    ``max_error_rate``; the command line and the API both end a run here.

    A chained or multi-task job's summary is ``{"stages": [...]}``, one summary per stage.
    The limit holds for each stage, not for the items of all stages pooled: each stage writes
    a dataset of its own (the transcripts, each task's rows) that the scheduler's next step
    reads, and pooling would let one broken stage pass (a task failing on 30% of the
    documents in a job of three tasks is 10% of the pooled rows), while a recording whose
    transcription failed would count once more in every task that inherits its failure.
    """
    limit = spec.job.max_error_rate
    if limit is None:
        return
    stages = summary.get("stages") or [summary]
    over = [s for s in stages if _failed_share(s) > limit]
    if not over:
        return
    several = len(stages) > 1
    output = next((s["output"] for s in stages if s.get("output")), "OUTPUT")
    counts = "; ".join(
        f"{s.get('failed')} of {s.get('items')} items failed"
        + (f" in the {s.get('task') or s.get('kind')} stage" if several else "")
        + f" ({_failed_share(s):.1%}"
        + "".join(f", {c} {n}" for c, n in (s.get("errors_by_code") or {}).items())
        + ")"
        for s in over
    )
    raise ErrorRateExceeded(
        f"{counts}: more than the {limit:.1%} that max_error_rate allows. The rows and the run "
        f"summary are written; see `overnight show {output} --status error`, fix the cause"
        " and rerun with --retry-errors (`retry_errors` in [job]) to redo "
        "the failed items; finished items are not redone.",
        dict(summary),
    )


def _failed_share(stage: Mapping[str, Any]) -> float:
    """Failed items over the items the stage processed (0.0 when it processed none)."""
    items = int(stage.get("items") or 0)
    return int(stage.get("failed") or 0) / items if items else 0.0


def _spec(
    kind: str, input: Any, output: Any, config: str | Path | None, options: Mapping[str, Any]
) -> JobSpec:
    from overnight.jobs.spec import build_spec, overrides, read_job_file

    for name, value in (("input", input), ("output", output)):
        # ``str(None)`` was looked for as a file named "None".
        if not isinstance(value, (str, Path)) or not str(value).strip():
            raise ConfigError(
                f"overnight.{kind}(): {name} must be a path or URL (a str or Path), got {value!r}"
            )
    input, output = str(input), str(output)

    file_data = read_job_file(config) if config is not None else None
    over = overrides(kind, options, input=input, output=output, who=f"overnight.{kind}()")
    return build_spec(file_data, overrides=over)


def transcribe(
    input: str | Path,
    output: str | Path,
    *,
    config: str | Path | None = None,
    settings: TranscribeOptions | None = None,
    **options: Any,
) -> RunSummary:
    """Transcribe INPUT (folder, file, URL prefix or manifest) into OUTPUT.

    ``overnight.transcribe("s3://calls/2026-12-01/", "s3://out/nightly", run_id="nightly-1201",
    batch_size=32)`` is ``overnight transcribe ... --run-id nightly-1201 --batch-size 32``.
    ``settings``: the ``[transcribe]`` section as its typed model
    (``settings=TranscribeOptions(batch_size=32, diarize=True)``, checked by a type checker
    and validated where it is built); the fields it sets, then ``options``, override the job file.
    """
    return run(_spec("transcribe", input, output, config, _typed(settings, options)))


def process(
    input: str | Path,
    output: str | Path,
    *,
    task: str = "summarize",
    config: str | Path | None = None,
    settings: ProcessOptions | None = None,
    **options: Any,
) -> RunSummary:
    """Run an LLM task over documents, or over a transcripts dataset (a chained job reads
    OUTPUT/transcripts as its input). ``settings``: the ``[process]`` section as its typed
    model, as ``transcribe``'s."""
    chosen = {"task": task, **_typed(settings, options)}
    return run(_spec("process", input, output, config, chosen))


def _typed(settings: Any, options: Mapping[str, Any]) -> dict[str, Any]:
    """The fields a typed section model sets (not its defaults), under the keyword options.
    A plain mapping is taken as those fields (it was an AttributeError)."""
    if settings is None:
        given: dict[str, Any] = {}
    elif isinstance(settings, Mapping):
        given = dict(settings)
    elif hasattr(settings, "model_dump"):
        given = settings.model_dump(exclude_unset=True)
    else:
        raise ConfigError(
            "settings must be the section's options model (TranscribeOptions or "
            f"ProcessOptions) or a mapping of its fields, got {type(settings).__name__}"
        )
    return {**given, **options}


def run(spec: JobSpec | str | Path | Mapping[str, Any]) -> RunSummary:
    """Run a job spec: a ``JobSpec``, a spec file's path (TOML or YAML), or its sections as a
    mapping (``{"job": {...}, "transcribe": {...}}``)."""
    from overnight.jobs.spec import JobSpec, build_spec, read_job_file

    if isinstance(spec, (str, Path)):
        spec = build_spec(read_job_file(spec))
    elif isinstance(spec, Mapping):
        spec = build_spec(overrides=dict(spec))
    elif not isinstance(spec, JobSpec):
        raise ConfigError(
            "overnight.run() takes a JobSpec, a job file's path or its sections as a mapping "
            f"({{'job': {{...}}, 'transcribe': {{...}}}}), got {type(spec).__name__}"
        )
    return RunSummary.from_dict(finish(spec))


# -- a job on a Ray cluster, through the Ray Jobs API (``overnight submit``/``status``/``logs``)
#
# For an orchestrator: the run happens on the cluster, not in the Airflow or Dagster worker
# that calls these. ``address``: the head's dashboard URL (http://HEAD:8265); default
# ``$RAY_API_SERVER_ADDRESS`` or ``$RAY_ADDRESS``. ``overnight.submit`` is
# ``jobs.ops.remote.submit`` itself (a ``JobSpec``, a spec file or its sections as a mapping).


def status(job_id: str, address: str | None = None) -> dict[str, Any]:
    """The cluster job's state: ``status`` (PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED),
    ``message``, start and end times, the driver's exit code and the run id."""
    from overnight.jobs.ops import remote

    return remote.status(address, job_id)


def wait(job_id: str, address: str | None = None, timeout: float | None = None) -> str:
    """Block until the cluster job ends or ``timeout`` seconds pass; its status then."""
    from overnight.jobs.ops import remote

    return remote.wait(address, job_id, timeout_s=timeout)


def logs(job_id: str, address: str | None = None) -> str:
    """The cluster job's driver output so far (credentials scrubbed)."""
    from overnight.jobs.ops import remote

    return remote.logs(address, job_id)
