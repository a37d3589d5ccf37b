"""Capacity planning: how many workers finish a backlog by a deadline, at what cost.

Pure arithmetic over *measured* throughput profiles; nothing here runs a model. A profile
says, for one configuration on one kind of hardware, how much work one worker does per
second while busy. Profiles come from ``overnight tune`` (``profile.json``) or from past runs'
summaries (``OUTPUT/runs/*.json``).

For each configuration (one "option"), with ``B`` the backlog (audio seconds or documents),
``T`` the per-worker busy throughput, ``u`` the expected utilization (busy share of the
reserved time: batches waiting for decode, stragglers at the end), ``D`` the deadline, ``h``
the headroom kept for retries and surprises, and ``s`` the start-up time of a worker::

    window   = D * (1 - h) - s                      seconds each worker can work
    workers  = ceil(B / (T * u * window))          the fewest that finish inside the window
    finish   = s + B / (workers * T * u)           when the last worker is done
    compute  = workers * units * price * finish / 3600
    total    = compute + B * other                 other: measured CPU (fetch, decode) cost per unit
    headroom = 1 - finish / D                      what is left of the deadline

Workers are released when the backlog is done, so they are paid for ``finish``, not for the
whole deadline. An option *meets the deadline* when ``window > 0`` and, if a worker limit is
given, ``workers <= max_workers``. The cheapest option that meets it is the answer; ties go
to the one that finishes first. A configuration ``tune`` measured but found not accurate
enough for its SLA (``accuracy.acceptable`` false in the profile) is sized and shown, never
chosen.

A profile file (JSON)::

    {"profile_version": 1, "kind": "transcribe", "unit": "audio_s",
     "configurations": [{"name": "...", "resource": "cpu", "units_per_worker": 1.0,
                         "throughput": 14.2, "price_per_unit_hour_usd": 0.0425,
                         "utilization": null, "other_cost_per_unit_usd": 1.2e-06,
                         "hardware": "...", "source": "...", "options": {...},
                         "accuracy": {...}}]}

A past run's summary is checked as a profile file is (``run_problem``): a figure that is not a
finite number in its range skips that run with a warning line naming it, and a plan with no
profile left from such outputs exits 4 (``InputNotFound``).

``throughput`` is in units of work (``unit``: ``audio_s`` or ``documents``) per busy second
of one worker; ``units_per_worker`` GPUs or CPU cores are priced at
``price_per_unit_hour_usd`` each. ``utilization`` is null when it was not measured on a
long enough run (a tuning sample); the plan then assumes ``DEFAULT_UTILIZATION``.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from overnight.jobs.accounting.ledger import price as price_of
from overnight.jobs.choices import DEFAULT_HEADROOM, DEFAULT_UTILIZATION
from overnight.jobs.dataset import storage
from overnight.jobs.errors import ConfigError, InputNotFound
from overnight.jobs.spec import DEFAULT_PRICES

PROFILE_VERSION = 1
UNITS = ("audio_s", "documents")
# Utilization measured over less reserved time than this carries a run's start-up (actor
# start, model load, the first decode) at a weight a night does not: the plan says so under
# the figure it uses.
SHORT_MEASUREMENT_S = 600.0
# A ratio like 30.000000000004 from float division must not become 31 workers.
_CEIL_SLACK = 1e-9
# Above this many workers without --max-workers, the plan says the count is unlikely to be had.
MANY_WORKERS = 1000

_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(d|h|m|s)", re.IGNORECASE)
_SECONDS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}


def parse_duration(text: str, what: str = "duration") -> float:
    """Seconds in ``"6h"``, ``"90m"``, ``"1h30m"``, ``"45s"``, ``"2d"`` (a unit is required)."""
    cleaned = str(text).strip().replace(" ", "")
    pos, total = 0, 0.0
    for match in _DURATION.finditer(cleaned):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _SECONDS[match.group(2).lower()]
        pos = match.end()
    if not cleaned or pos != len(cleaned):
        raise ConfigError(
            f"{what} {text!r} is not a duration: write e.g. 6h, 90m, 1h30m, 45s or 2d"
        )
    if total <= 0:
        raise ConfigError(f"{what} {text!r} must be longer than zero")
    if not math.isfinite(total):  # hundreds of digits: a float holds no such number
        raise ConfigError(f"{what} {text!r} is too long a duration to compute with")
    return total


def check_number(
    value: Any,
    what: str,
    *,
    low: float = 0.0,
    low_open: bool = False,
    high: float | None = None,
    high_open: bool = False,
) -> float:
    """``value`` as a float, unless it is not a finite number in the range (``low``, ``high``;
    ``*_open``: the bound itself is outside): then a ConfigError naming ``what`` (a flag, an
    SLA key, a profile's field). NaN and infinity are no throughput, price or share of time:
    the plan's arithmetic would print them as results (``$nan``, ``finish 0 s``)."""
    ok = (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and (value > low if low_open else value >= low)
        and (high is None or (value < high if high_open else value <= high))
    )
    if not ok:
        if high is None:
            rule = f"larger than {low:g}" if low_open else f"at least {low:g}"
        else:
            rule = f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        raise ConfigError(f"{what} must be a finite number {rule} (got {value!r})")
    return float(value)


def span_back(text: str, what: str, now: datetime | None = None) -> datetime:
    """The time ``text`` (a duration, as ``parse_duration`` reads it) before ``now`` (UTC)."""
    now = now or datetime.now(UTC)
    try:
        return now - timedelta(seconds=parse_duration(text, what))
    except OverflowError:  # before the year 1: no date can hold it
        days = (now - datetime.min.replace(tzinfo=UTC)).days
        raise ConfigError(
            f"{what} {text!r} reaches back before the year 1; give at most {days}d"
        ) from None


def fmt_duration(seconds: float) -> str:
    """Seconds under a minute, minutes under an hour, else hours; the unit is picked after
    rounding, so that 59.97 s reads "1.0 min", not "60.0 s"."""
    if round(seconds / 60, 1) >= 60:
        return f"{seconds / 3600:.2f} h"
    if round(seconds, 1) >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.1f} s"


@dataclass(frozen=True)
class WorkerProfile:
    """One measured configuration: what one worker of it does per busy second, and its price."""

    name: str
    kind: str  # transcribe | process
    unit: str  # audio_s | documents
    resource: str  # a price-table key: cpu, h100, ...
    units_per_worker: float  # GPUs or CPU cores one worker holds
    throughput: float  # units of work per busy second of one worker
    price_per_unit_hour_usd: float
    utilization: float | None = None  # measured busy / reserved; None: not measured
    # The reserved seconds that utilization was measured over (past runs, pooled).
    measured_reserved_s: float | None = None
    other_cost_per_unit_usd: float = 0.0  # CPU stages (fetch, decode, extract) per unit of work
    # The CPU price per core-hour that ``other_cost_per_unit_usd`` is priced at, so that
    # ``--cpu-price`` prices it again; None: not known (a profile file of an older version).
    other_cpu_price_per_hour_usd: float | None = None
    hardware: str = ""
    source: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    accuracy: dict[str, Any] = field(default_factory=dict)

    @property
    def worker_price_per_hour_usd(self) -> float:
        return self.units_per_worker * self.price_per_unit_hour_usd


@dataclass(frozen=True)
class Sizing:
    """What a backlog is sized for: the deadline and what is assumed and allowed around it.

    ``utilization`` None: each profile's measured one, else ``DEFAULT_UTILIZATION``;
    ``max_workers`` None: any number of workers can be had.
    """

    deadline_s: float
    headroom: float = DEFAULT_HEADROOM
    utilization: float | None = None
    startup_s: float = 0.0
    max_workers: int | None = None

    def check(self, name: Callable[[str], str] = str) -> Sizing:
        """This sizing, unless a value is out of its range: then a ConfigError naming the
        field as ``name`` spells it (``--headroom`` for plan, ``--sla headroom`` for tune).
        Checked before any work: tune measures for minutes before it sizes anything."""
        check_number(self.deadline_s, name("deadline"), low_open=True)
        check_number(self.headroom, name("headroom"), high=1.0, high_open=True)
        if self.utilization is not None:
            check_number(self.utilization, name("utilization"), low_open=True, high=1.0)
        check_number(self.startup_s, name("startup"))
        if self.max_workers is not None and (
            isinstance(self.max_workers, bool)
            or not isinstance(self.max_workers, int)
            or self.max_workers < 1
        ):
            raise ConfigError(
                f"{name('max_workers')} must be a whole number at least 1 (got {self.max_workers!r})"
            )
        return self


@dataclass(frozen=True)
class Option:
    """One configuration sized for one backlog and deadline, with its arithmetic."""

    profile: WorkerProfile
    backlog: float
    sizing: Sizing  # as asked; ``utilization`` below is the one used
    utilization: float
    utilization_assumed: bool
    window_s: float
    workers: int | None  # None: no number of workers can meet the deadline (window <= 0)
    finish_s: float | None
    compute_cost_usd: float | None
    other_cost_usd: float
    cost_usd: float | None
    meets_deadline: bool
    reason: str  # why it does not meet the deadline ("" when it does)
    arithmetic: tuple[str, ...]

    @property
    def accuracy_rejected(self) -> str:
        """Why the tuner found this configuration not accurate enough ("" when it did not)."""
        acc = self.profile.accuracy or {}
        if acc.get("acceptable") is False:
            return f"accuracy: WER {acc.get('wer', float('nan')):.3f} above the {acc.get('allowed_wer', float('nan')):.3f} tune allowed"
        return ""

    @property
    def eligible(self) -> bool:
        return self.meets_deadline and self.cost_usd is not None and not self.accuracy_rejected

    @property
    def headroom(self) -> float | None:
        return None if self.finish_s is None else 1.0 - self.finish_s / self.sizing.deadline_s

    @property
    def cost_per_unit_usd(self) -> float | None:
        return None if self.cost_usd is None else self.cost_usd / self.backlog

    @property
    def cost_per_audio_minute_usd(self) -> float | None:
        if self.cost_usd is None or self.profile.unit != "audio_s":
            return None
        return self.cost_usd / (self.backlog / 60.0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.profile.name,
            "resource": self.profile.resource,
            "units_per_worker": self.profile.units_per_worker,
            "throughput": self.profile.throughput,
            "price_per_unit_hour_usd": self.profile.price_per_unit_hour_usd,
            "utilization": self.utilization,
            "utilization_assumed": self.utilization_assumed,
            "workers": self.workers,
            "finish_s": self.finish_s,
            "headroom": self.headroom,
            "compute_cost_usd": self.compute_cost_usd,
            "other_cost_usd": self.other_cost_usd,
            "cost_usd": self.cost_usd,
            "cost_per_unit_usd": self.cost_per_unit_usd,
            "cost_per_audio_minute_usd": self.cost_per_audio_minute_usd,
            "meets_deadline": self.meets_deadline,
            "reason": self.reason,
            "accuracy_rejected": self.accuracy_rejected,
            "arithmetic": list(self.arithmetic),
        }


def _n(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:,.6g}"


def _work(backlog: float, unit: str) -> str:
    if unit == "audio_s":
        return f"{backlog / 3600:,.6g} audio hours = {backlog:,.0f} audio s"
    return f"{_n(backlog)} documents"


def _short_measurement(p: WorkerProfile) -> bool:
    return (
        p.utilization is not None
        and p.measured_reserved_s is not None
        and p.measured_reserved_s < SHORT_MEASUREMENT_S
    )


def size_option(profile: WorkerProfile, backlog: float, sizing: Sizing) -> Option:
    """Size one configuration for a backlog (see the module docstring for the formulas)."""
    sizing.check()
    deadline_s, headroom, startup_s = sizing.deadline_s, sizing.headroom, sizing.startup_s
    utilization, max_workers = sizing.utilization, sizing.max_workers
    check_number(backlog, "the backlog", low_open=True)
    check_number(profile.throughput, f"profile {profile.name!r}: throughput", low_open=True)
    assumed = utilization is None and profile.utilization is None
    u = utilization if utilization is not None else (profile.utilization or DEFAULT_UTILIZATION)
    check_number(u, f"profile {profile.name!r}: utilization", low_open=True, high=1.0)
    p = profile
    per = "audio s" if p.unit == "audio_s" else "documents"
    lines = [
        f"backlog   {_work(backlog, p.unit)}",
        f"worker    {p.units_per_worker:g} x {p.resource} at ${p.price_per_unit_hour_usd:g}/h = "
        f"${p.worker_price_per_hour_usd:.6g}/h; {p.throughput:,.6g} {per} per busy second"
        + (" (real-time factor)" if p.unit == "audio_s" else ""),
        f"          x utilization {u:g}"
        + (" (assumed: not measured on a long run)" if assumed else "")
        + f" = {p.throughput * u:,.6g} {per}/s per worker",
        *(
            [
                f"          (measured over {p.measured_reserved_s or 0:,.0f} s of reserved "
                "time: a short run, in which start-up weighs more than in a full night; state "
                "a night's utilization with --utilization)"
            ]
            if utilization is None and _short_measurement(p)
            else []
        ),
        f"window    {deadline_s:,.0f} s deadline x (1 - {headroom:g} headroom) - {startup_s:,.0f} s start-up"
        f" = {deadline_s * (1 - headroom) - startup_s:,.0f} s",
    ]
    window = deadline_s * (1 - headroom) - startup_s
    other = backlog * p.other_cost_per_unit_usd

    def sized(
        workers: int | None,
        finish: float | None,
        compute: float | None,
        total: float | None,
        reason: str,
    ) -> Option:
        """The Option: these inputs, the outcome, and the arithmetic's lines so far."""
        return Option(
            p,
            backlog,
            sizing,
            u,
            assumed,
            window,
            workers,
            finish,
            compute,
            other,
            total,
            not reason,
            reason,
            tuple(lines),
        )

    if window <= 0:
        lines.append("workers   none: start-up alone takes the whole window")
        return sized(None, None, None, None, "start-up exceeds the deadline window")
    per_worker = p.throughput * u * window
    workers = max(1, math.ceil(backlog / per_worker - _CEIL_SLACK))
    finish = startup_s + backlog / (workers * p.throughput * u)
    compute = workers * p.units_per_worker * p.price_per_unit_hour_usd * finish / 3600.0
    total = compute + other
    if not all(math.isfinite(x) for x in (finish, compute, total)):
        raise ConfigError(
            f"profile {p.name!r}: the backlog, throughput and prices give numbers too large to "
            f"compute with (cost {total!r}); check their units"
        )
    lines += [
        f"workers   ceil({_n(backlog)} / ({p.throughput * u:,.6g} x {window:,.0f})) = "
        f"ceil({backlog / per_worker:,.4f}) = {workers}",
        f"finish    {startup_s:,.0f} s + {_n(backlog)} / ({workers} x {p.throughput * u:,.6g}) = "
        f"{finish:,.0f} s ({fmt_duration(finish)}); headroom 1 - {finish:,.0f} / {deadline_s:,.0f} = "
        f"{1 - finish / deadline_s:.1%}",
        f"compute   {workers} x ${p.worker_price_per_hour_usd:.6g}/h x {finish / 3600:.4f} h = ${compute:,.4f}",
    ]
    if p.other_cost_per_unit_usd:
        lines.append(
            f"other     {_n(backlog)} x ${p.other_cost_per_unit_usd:.4g} (CPU fetch/decode per unit) = ${other:,.4f}"
        )
    lines.append(
        f"total     ${total:,.4f}"
        + (
            f" = ${total / (backlog / 60):.6f} per audio minute"
            if p.unit == "audio_s"
            else f" = ${total / backlog:.6f} per document"
        )
    )
    reason = ""
    if max_workers is not None and workers > max_workers:
        best = startup_s + backlog / (max_workers * p.throughput * u)
        reason = (
            f"needs {workers} workers, more than the {max_workers} available; "
            f"{max_workers} would finish in {fmt_duration(best)}"
        )
        lines.append(f"limit     {reason}")
    return sized(workers, finish, compute, total, reason)


@dataclass(frozen=True)
class Plan:
    options: tuple[Option, ...]
    cheapest: Option | None  # the cheapest option that meets the deadline
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "options": [o.to_dict() for o in self.options],
            "cheapest": None if self.cheapest is None else self.cheapest.profile.name,
            "notes": list(self.notes),
        }


def cheapest(options: list[Option] | tuple[Option, ...]) -> Option | None:
    """The cheapest option that meets the deadline (and that tune did not reject for accuracy)."""
    ok = [o for o in options if o.eligible]
    return min(ok, key=lambda o: (o.cost_usd, o.finish_s, o.profile.name)) if ok else None


def make_plan(
    profiles: list[WorkerProfile],
    backlog: float,
    unit: str,
    sizing: Sizing,
    notes: tuple[str, ...] | list[str] = (),
) -> Plan:
    usable = [p for p in profiles if p.unit == unit]
    if not usable:
        have = sorted({p.unit for p in profiles}) or ["nothing"]
        raise ConfigError(
            f"no profile measures {unit} (the profiles measure {', '.join(have)}): tune on a sample "
            "of this workload first (overnight tune) or point --profile at past runs of it"
        )
    options = tuple(size_option(p, backlog, sizing) for p in usable)
    best = cheapest(options)
    notes = list(notes)
    if best is not None and sizing.max_workers is None and (best.workers or 0) > MANY_WORKERS:
        # The arithmetic holds for any count, but a plan of 166,666,667 GPUs (a deadline of
        # a fraction of a second) was printed as if it could be had.
        notes.append(
            f"note: {best.workers:,} workers is more than a cluster is usually granted; plan "
            "within the quota you have with --max-workers N, or extend the deadline"
        )
    return Plan(options, best, tuple(notes))


# -- profiles -------------------------------------------------------------------------------


def profile_document(
    profiles: list[WorkerProfile], kind: str, unit: str, **extra: Any
) -> dict[str, Any]:
    """The JSON document ``load_profiles`` reads back."""
    return {
        "profile_version": PROFILE_VERSION,
        "kind": kind,
        "unit": unit,
        **extra,
        "configurations": [asdict(p) for p in profiles],
    }


# A profile's numbers, each with its range (check_number's keywords); None allowed where the
# field's default is None. A plan computes with every one of them: a string, a null or a
# NaN there was a TypeError, or a result of NaN.
_PROFILE_NUMBERS: dict[str, dict[str, Any]] = {
    "throughput": {"low_open": True},
    "units_per_worker": {"low_open": True},
    "price_per_unit_hour_usd": {},
    "utilization": {"high": 1.0},  # 0: not measured, as null
    "measured_reserved_s": {},
    "other_cost_per_unit_usd": {},
    "other_cpu_price_per_hour_usd": {},
}
_PROFILE_TEXTS = ("name", "kind", "unit", "resource", "hardware", "source")


def _from_document(doc: Any, where: str) -> list[WorkerProfile]:
    if (
        not isinstance(doc, dict)
        or doc.get("profile_version") != PROFILE_VERSION
        or not isinstance(doc.get("configurations"), list)
    ):
        raise ConfigError(
            f"{where} is not an overnight profile (a JSON object: profile_version "
            f"{PROFILE_VERSION}, a 'configurations' list)"
        )
    fields = WorkerProfile.__dataclass_fields__
    out = []
    for i, conf in enumerate(doc["configurations"]):
        if not isinstance(conf, dict):
            raise ConfigError(
                f"{where}: configuration {i} is not a JSON object (got {type(conf).__name__})"
            )
        data = {
            "kind": doc.get("kind", doc.get("task", "transcribe")),
            "unit": doc.get("unit", "audio_s"),
            **conf,
        }
        data = {k: v for k, v in data.items() if k in fields}
        for key, bounds in _PROFILE_NUMBERS.items():
            if key in data and not (data[key] is None and fields[key].default is None):
                check_number(data[key], f"{where}: configuration {i}: {key}", **bounds)
        for key in _PROFILE_TEXTS:
            if key in data and not isinstance(data[key], str):
                raise ConfigError(
                    f"{where}: configuration {i}: {key} must be text (got {data[key]!r})"
                )
        if data.get("unit") not in UNITS:
            raise ConfigError(
                f"{where}: configuration {i}: unit must be one of {', '.join(UNITS)} "
                f"(got {data.get('unit')!r})"
            )
        for key in ("options", "accuracy"):
            if key in data and not isinstance(data[key], dict | None):
                raise ConfigError(
                    f"{where}: configuration {i}: {key} must be a JSON object (got {data[key]!r})"
                )
            if key in data and data[key] is None:
                data[key] = {}
        try:
            out.append(WorkerProfile(**data))
        except TypeError as exc:
            raise ConfigError(f"{where}: configuration {i} is incomplete: {exc}") from None
    return out


def _read_text(loc: storage.Location) -> str:
    return storage.with_retries(f"read {loc.url()}", lambda: loc.fs.cat_file(loc.path)).decode()


def read_summaries(output: storage.Location) -> list[dict[str, Any]]:
    """Every run summary under OUTPUT/runs/ (``*.json``). A file there that is not one (not
    JSON, or not an object with a text ``run_id`` and ``kind``: a note or a stray copy) is
    skipped with a warning line, not read as a run."""
    from overnight.jobs.run import console

    files = storage.list_files(output.join("runs"), ".json")

    def read(path: str) -> dict[str, Any] | None:
        try:
            doc = json.loads(_read_text(storage.Location(output.fs, path, output.scheme)))
        except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
            why = f"it is not JSON ({exc})"
        else:
            if isinstance(doc, dict) and all(
                isinstance(doc.get(k), str) and doc.get(k) for k in ("run_id", "kind")
            ):
                return doc
            why = "it is not a run summary (a JSON object with run_id and kind)"
        shown = storage.scrub_secrets(path)
        console.event(
            "skipped_file",
            f"warning: skipped {shown}: {why}; it is not read as a run (move it out of runs/ "
            "to silence this)",
            level="warning",
            path=shown,
        )
        return None

    return [s for s in storage.map_threads(read, files) if s is not None]


# Options that add work to each audio second, so that runs with and without them are two
# profiles: word timestamps (an alignment pass, about 15% of Whisper's time on CPU),
# diarization (CPU tasks beside the model, priced as other cost) and redaction. Pooled, a
# plan for a diarizing backlog took in plain runs' throughput, which it does not run at (on
# 2 cores a job with --diarize took 8-36% longer, docs/how-to/diarization.md).
_ADDED_WORK = ("word_timestamps", "diarize", "redact")


def _option_key(summary: dict[str, Any]) -> tuple:
    opts = summary.get("options") or {}
    return (
        summary.get("kind"),
        summary.get("model") or opts.get("model"),
        summary.get("accelerator"),
        summary.get("device"),
        opts.get("engine") or "ctranslate2",  # runs before engines were an option: ctranslate2
        opts.get("compute_type"),
        opts.get("batch_size"),
        opts.get("beam_size"),
        _units(summary),
        tuple(name for name in _ADDED_WORK if opts.get(name)),
    )


def _units(summary: dict[str, Any]) -> float:
    opts = summary.get("options") or {}
    if summary.get("device") == "cuda":
        return float(opts.get("gpus_per_actor") or 1.0)
    return float(opts.get("cpus_per_actor") or 1.0)


# A run summary's figures that a profile is computed from, each with its range (check_number's
# keywords), as a profile file's are (``_PROFILE_NUMBERS``); a missing one is not measured.
# Pooled unchecked, one run's NaN made every figure of its configuration NaN, and a negative
# one a smaller throughput or a negative utilization: plans of nonsense, or exit 2 naming a
# profile the user never wrote.
_RUN_NUMBERS: dict[str, dict[str, Any]] = {
    "accelerator_seconds": {},
    "accelerator_reserved_seconds": {},
    "audio_seconds": {},
    "items": {},
    "cost_usd": {},
}


def _unit_of_work(kind: str | None) -> str:
    return "audio_s" if kind in ("transcribe", "chain", None) else "documents"


# Runs that read no audio and no document through a model: a probe reads container headers,
# and its items per second were taken for a documents profile (a plan for --documents from
# header-reading speed, named "None None batch None beam None on cpu").
_NO_THROUGHPUT = ("probe",)


def run_problem(summary: dict[str, Any]) -> str | None:
    """Why a past run's figures cannot go into a profile (a number that is not a finite one
    in its range, as ``check_number`` says it), or None when they can."""
    try:
        for key, bounds in _RUN_NUMBERS.items():
            if summary.get(key) is not None:
                check_number(summary[key], key, **bounds)
        options, prices = summary.get("options"), summary.get("prices")
        for key, value in (("options", options), ("prices", prices)):
            if value is not None and not isinstance(value, dict):
                raise ConfigError(f"{key} must be a JSON object (got {value!r})")
        per_actor = "gpus_per_actor" if summary.get("device") == "cuda" else "cpus_per_actor"
        units = (options or {}).get(per_actor)
        if units:  # absent or 0: one unit, as _units reads it
            check_number(units, f"options.{per_actor}", low_open=True)
        resource = summary.get("accelerator")
        if resource is not None and not isinstance(resource, str):
            raise ConfigError(f"accelerator must be text (got {resource!r})")
        if prices:
            check_number(price_of(prices, resource), f"the price of {resource} in prices")
        busy = summary.get("accelerator_seconds") or 0
        if busy > 0:
            work = "audio_seconds" if _unit_of_work(summary.get("kind")) == "audio_s" else "items"
            check_number(
                (summary.get(work) or 0) / busy,
                f"its throughput ({work} / accelerator_seconds)",
                low_open=True,
            )
    except ConfigError as exc:
        return str(exc)
    return None


def usable_runs(summaries: list[dict[str, Any]], source: str = "runs") -> list[dict[str, Any]]:
    """The summaries whose figures a profile can be computed from; each other one is skipped
    with a warning line naming it and why, as ``read_summaries`` skips a file that is not one."""
    from overnight.jobs.run import console

    out = []
    for s in summaries:
        why = run_problem(s)
        if why is None:
            out.append(s)
            continue
        console.event(
            "skipped_run",
            f"warning: skipped run {s.get('run_id')} of {source}: {why}; no profile is "
            "computed from it",
            level="warning",
            run_id=str(s.get("run_id")),
            source=source,
        )
    return out


def profiles_from_runs(
    summaries: list[dict[str, Any]], source: str = "runs"
) -> list[WorkerProfile]:
    """Throughput profiles from past runs, one per distinct configuration.

    Runs of the same configuration pool: throughput = sum of work / sum of busy seconds,
    utilization = sum of busy / sum of reserved seconds (both measured, so a plan from real
    nightly runs carries their real idle time). Runs that processed nothing are ignored; runs
    with figures out of range are skipped with a warning (``usable_runs``).
    """
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    # A run id run again keeps its earlier attempts in its summary: each was measured.
    attempts = [
        a
        for s in summaries
        for a in (*(x for x in s.get("earlier_attempts") or [] if isinstance(x, dict)), s)
    ]
    measured = [a for a in attempts if a.get("kind") not in _NO_THROUGHPUT]
    for s in usable_runs(measured, source):
        if (s.get("accelerator_seconds") or 0) > 0:
            groups[_option_key(s)].append(s)
    out = []
    for key, runs in sorted(groups.items(), key=lambda kv: str(kv[0])):
        kind, model, resource, device, engine, compute_type, batch, beam, units, added = key
        unit = _unit_of_work(kind)
        work = sum(
            (r.get("audio_seconds") or 0.0) if unit == "audio_s" else (r.get("items") or 0)
            for r in runs
        )
        busy = sum(r["accelerator_seconds"] for r in runs)
        reserved = sum(r.get("accelerator_reserved_seconds") or 0.0 for r in runs)
        if work <= 0:
            continue
        # The newest run's prices price the profile: the summaries come in file-name order,
        # and the last by name (a user's run id) gave a price two runs old.
        newest = max(runs, key=lambda r: (str(r.get("finished_at") or ""), str(r["run_id"])))
        prices = newest.get("prices") or {}
        hourly = price_of(prices, resource) if prices else 0.0
        cpu_hourly = price_of(prices, "cpu") if prices else 0.0
        # The CPU stages' cost (each run's cost beyond its busy model time) is taken back to
        # CPU-hours at the run's own CPU price and priced again at the newest one: subtracting
        # busy time at one price from costs ledgered at others gave "other" costs larger
        # than the compute. What a price of 0 leaves unknown stays in dollars.
        cpu_hours = dollars = 0.0
        for r in runs:
            own = r.get("prices") or {}
            model_cost = (
                r["accelerator_seconds"] * units * (price_of(own, resource) if own else 0.0)
            )
            spent = max(0.0, (r.get("cost_usd") or 0.0) - model_cost / 3600.0)
            own_cpu = price_of(own, "cpu") if own else 0.0
            if own_cpu > 0 and cpu_hourly > 0:
                cpu_hours += spent / own_cpu
            else:
                dollars += spent
        other = (cpu_hours * cpu_hourly + dollars) / work
        differ = len({json.dumps(r.get("prices") or {}, sort_keys=True) for r in runs}) > 1
        # The engine is named only where it is not the default one: older names stay.
        how = f"{engine} " if engine != "ctranslate2" else ""
        name = f"{model} {how}{compute_type} batch {batch} beam {beam} on {resource}"
        name += "".join(f" +{option}" for option in added)
        out.append(
            WorkerProfile(
                name=name,
                kind="transcribe" if unit == "audio_s" else "process",
                unit=unit,
                resource=str(resource or "cpu"),
                units_per_worker=units,
                throughput=work / busy,
                price_per_unit_hour_usd=hourly,
                utilization=min(1.0, busy / reserved) if reserved else None,
                measured_reserved_s=round(reserved, 3) if reserved else None,
                other_cost_per_unit_usd=other,
                other_cpu_price_per_hour_usd=cpu_hourly if other and not dollars else None,
                hardware=f"{resource} ({device})",
                source=f"{source}: {len(runs)} run(s), {', '.join(sorted(r['run_id'] for r in runs)[:5])}"
                + (f"; at the prices of the newest, {newest['run_id']}" if differ else ""),
                options=dict(newest.get("options") or {}),
            )
        )
    return out


def load_profiles(paths: list[str]) -> list[WorkerProfile]:
    """Profiles from ``profile.json`` files and/or OUTPUT folders holding runs/*.json."""
    out: list[WorkerProfile] = []
    skipped = []  # outputs with runs skipped for their figures
    probed = []  # outputs with probe runs, which measure no throughput
    for path in paths:
        loc = storage.resolve(path)
        if path.endswith(".json"):
            try:
                doc = json.loads(_read_text(loc))
            except FileNotFoundError:
                raise InputNotFound(f"profile {path!r} does not exist") from None
            except json.JSONDecodeError as exc:
                raise ConfigError(f"profile {path!r} is not JSON: {exc}") from None
            out.extend(_from_document(doc, repr(path)))
            continue
        summaries = read_summaries(loc)
        if not summaries:
            raise InputNotFound(
                f"{path!r} is neither a profile .json nor an output folder with runs/*.json summaries"
            )
        shown = storage.scrub_secrets(path)
        out.extend(profiles_from_runs(summaries, source=shown))
        if any(run_problem(s) for s in summaries if s.get("kind") not in _NO_THROUGHPUT):
            skipped.append(shown)
        if any(s.get("kind") in _NO_THROUGHPUT for s in summaries):
            probed.append(shown)
    if not out and (skipped or probed):
        why = []
        if skipped:
            why.append("runs with a figure out of range were skipped, each with a warning")
        if probed:
            why.append("probe runs read headers and measure no throughput")
        why.append("any others processed nothing")
        raise InputNotFound(
            f"no past run in {', '.join(dict.fromkeys(skipped + probed))} has figures a plan "
            f"can use ({'; '.join(why)}): tune on a sample of this workload (overnight tune) or "
            "give a profile.json"
        )
    return out


# -- command line -----------------------------------------------------------------------------


def render(plan: Plan, unit: str) -> str:
    lines = []
    for o in plan.options:
        mark = "  <- cheapest meeting the deadline" if o is plan.cheapest else ""
        source = f"  [{o.profile.source}]" if o.profile.source else ""
        lines.append(f"{o.profile.name}{source}{mark}")
        lines.extend(f"  {line}" for line in o.arithmetic)
        lines.append("")
    per = "$/audio min" if unit == "audio_s" else "$/document"
    w = max([len("option"), *(len(o.profile.name) for o in plan.options)])
    header = f"{'option':<{w}} {'workers':>7} {'finish':>10} {'headroom':>8} {'cost':>11} {per:>12}  meets"
    lines += [header, "-" * len(header)]
    for o in sorted(plan.options, key=lambda o: (o.cost_usd is None, o.cost_usd or 0.0)):
        per_unit = o.cost_per_audio_minute_usd if unit == "audio_s" else o.cost_per_unit_usd
        lines.append(
            f"{o.profile.name:<{w}} {o.workers if o.workers is not None else '-':>7} "
            f"{fmt_duration(o.finish_s) if o.finish_s is not None else '-':>10} "
            f"{f'{o.headroom:.0%}' if o.headroom is not None else '-':>8} "
            f"{f'${o.cost_usd:,.2f}' if o.cost_usd is not None else '-':>11} "
            f"{f'${per_unit:.6f}' if per_unit is not None else '-':>12}  "
            f"{'yes' if o.eligible else 'no: ' + (o.reason or o.accuracy_rejected)}"
        )
    lines.append("")
    if plan.cheapest is None:
        lines.append(
            "no option meets the deadline: "
            + (
                "raise the worker limit, "
                if any(o.sizing.max_workers for o in plan.options)
                else ""
            )
            + (
                "lower the start-up, "
                if any(o.window_s <= 0 and o.sizing.startup_s for o in plan.options)
                else ""
            )
            + "extend the deadline or tune for more throughput"
        )
    else:
        c = plan.cheapest
        lines.append(
            f"cheapest meeting the deadline: {c.profile.name}: {c.workers} x {c.profile.units_per_worker:g} "
            f"{c.profile.resource}, done in {fmt_duration(c.finish_s or 0)} "
            f"({c.headroom:.0%} headroom), ${c.cost_usd:,.2f}"
        )
    lines.extend(plan.notes)
    return "\n".join(lines)


def _gpu_kind(gpu: str, price: float | None) -> str:
    """``--gpu`` as the price table and the profiles spell a kind (lower case: ``L4`` was
    priced at the generic $2.69 and dropped the measured l4 profile). A name that is no kind
    we know needs its price stated: it would be priced as a generic GPU without a word."""
    from overnight.workers.devices import GPU_KINDS

    kind = gpu.strip().lower()
    known = sorted({*DEFAULT_PRICES, *GPU_KINDS})
    if kind not in known and price is None:
        hint = difflib.get_close_matches(kind, known, n=1)
        raise ConfigError(
            f"--gpu {gpu!r} is no GPU kind overnight knows"
            + (f" (did you mean {hint[0]!r}?)" if hint else "")
            + f"; known kinds: {', '.join(known)}. For another kind, state its price with --price"
        )
    return kind


def adjust_profiles(
    profiles: list[WorkerProfile],
    unit: str,
    *,
    gpu: str | None = None,
    price: float | None = None,
    cpu_price: float | None = None,
    throughput: float | None = None,
) -> tuple[list[WorkerProfile], list[str]]:
    """Apply stated prices, keep only the asked GPU kind, and add a GPU kind stated without
    a measurement; returns the profiles and notes for the plan."""
    # Checked here as well as by the command, which names its flags the same: a price or a
    # throughput of NaN or infinity printed "$nan" and "finish 0 s" as a plan.
    if price is not None:
        check_number(price, "--price")
    if cpu_price is not None:
        check_number(cpu_price, "--cpu-price")
    if throughput is not None:
        check_number(throughput, "--throughput", low_open=True)
    notes: list[str] = []
    if gpu is not None:
        gpu = _gpu_kind(gpu, price)
        if gpu not in DEFAULT_PRICES and price is None:
            notes.append(
                f"note: {gpu} has no price in the default table: priced as a generic GPU at "
                f"${DEFAULT_PRICES['gpu']:g}/h; state its price with --price"
            )
    out = []
    for p in profiles:
        if cpu_price is not None and p.resource == "cpu":
            p = replace(p, price_per_unit_hour_usd=cpu_price)
        if cpu_price is not None and p.other_cost_per_unit_usd:
            # The CPU stages (fetch, decode) run on CPU beside any model: --cpu-price prices
            # them too, where the profile says what price they were measured at.
            if p.other_cpu_price_per_hour_usd:
                p = replace(
                    p,
                    other_cost_per_unit_usd=p.other_cost_per_unit_usd
                    * cpu_price
                    / p.other_cpu_price_per_hour_usd,
                    other_cpu_price_per_hour_usd=cpu_price,
                )
            else:
                notes.append(
                    f"note: {p.name}: its CPU stages' cost stays as measured (the profile "
                    "does not say at which CPU price); --cpu-price prices its workers only"
                )
        if price is not None and p.resource != "cpu" and (gpu is None or p.resource == gpu):
            p = replace(p, price_per_unit_hour_usd=price)
        if gpu is not None and p.resource not in ("cpu", gpu):
            continue  # another GPU kind: not asked for
        out.append(p)
    if gpu is not None and not any(p.resource == gpu for p in out):
        if throughput is None:
            notes.append(
                f"note: no profile was measured on {gpu}; tune there, or state its throughput "
                f"with --throughput to include it"
            )
        else:
            hourly = price if price is not None else price_of(DEFAULT_PRICES, gpu)
            out.append(
                WorkerProfile(
                    name=f"{gpu} (stated {throughput:g}{'x' if unit == 'audio_s' else '/s'})",
                    kind="transcribe" if unit == "audio_s" else "process",
                    unit=unit,
                    resource=gpu,
                    units_per_worker=1.0,
                    throughput=throughput,
                    price_per_unit_hour_usd=hourly,
                    source="stated on the command line, not measured",
                )
            )
    elif throughput is not None:
        raise ConfigError(
            "--throughput states the throughput of a GPU kind no profile measured: give --gpu too"
        )
    return out, notes
