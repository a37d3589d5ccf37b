"""The SLA a tuning must meet: deadline, backlog, accuracy bounds, worker limit."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from overnight.jobs.errors import ConfigError
from overnight.jobs.ops.plan import (
    DEFAULT_HEADROOM,
    Sizing,
    check_number,
    fmt_duration,
    parse_duration,
)

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
    def sizing(self) -> Sizing:
        """What each measured configuration is sized for."""
        return Sizing(
            self.deadline_s, self.headroom, self.utilization, self.startup_s, self.max_workers
        )

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


def parse_sla(text: str, kind: str = "transcribe") -> SLA:
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
    if kind == "transcribe":
        if "backlog_hours" not in values:
            raise ConfigError(
                "--sla needs backlog_hours=N for --kind transcribe (hours of audio per run)"
            )
        backlog_key = "backlog_hours"
        backlog, unit = number(backlog_key) * 3600.0, "audio_s"
    else:
        backlog_key = "backlog_documents" if "backlog_documents" in values else "documents"
        if backlog_key not in values:
            raise ConfigError("--sla needs backlog_documents=N for --kind process")
        backlog, unit = number(backlog_key), "documents"
    # Every value is checked here, before a configuration is measured: a bound out of range
    # used to fail only when the measurements were sized, minutes later.
    check_number(backlog, f"--sla {backlog_key}", low_open=True)
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
    for bound in ("max_wer_increase", "max_wer"):
        value = getattr(sla, bound)
        if value is not None:
            named = {"max_wer_increase": "max_error_increase", "max_wer": "max_error"}
            check_number(value, f"--sla {bound if kind == 'transcribe' else named[bound]}")
    sla.sizing.check(lambda field: f"--sla {workers_key if field == 'max_workers' else field}")
    return sla
