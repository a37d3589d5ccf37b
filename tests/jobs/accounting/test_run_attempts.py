"""Specifications for a run id run again into the same output: every attempt's figures stay.

A fixed run id (a scheduled run's, rerun with --retry-errors; a cluster job's retry; a user
reusing one) replaced the earlier summary, and with it the earlier attempt's reserved time
and cost left every report: 25% utilization read as 42%."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from overnight.jobs.accounting.ledger import with_attempts, write_summary
from overnight.jobs.dataset import storage
from overnight.jobs.ops.demo import silence, speak, write_wav
from overnight.jobs.ops.plan import profiles_from_runs, read_summaries
from overnight.jobs.ops.report import build_report, load
from overnight.jobs.spec import build_spec
from overnight.jobs.transcribe import run_transcribe


def _summary(reserved: float, **figures) -> dict:
    return {
        "run_id": "nightly-2026-12-01",
        "kind": "transcribe",
        "finished_at": "2026-12-01T06:00:00+00:00",
        "accelerator_reserved_seconds": reserved,
        "reserved_cost_usd": reserved / 3600,
        "pipeline_seconds": reserved / 2,
        **figures,
    }


def test_a_summary_written_again_for_its_run_id_keeps_the_earlier_attempts(tmp_path: Path):
    out = storage.resolve(str(tmp_path))
    for reserved in (10.0, 20.0, 40.0):
        write_summary(out, _summary(reserved, items=int(reserved)))
    summary = json.loads((tmp_path / "runs" / "nightly-2026-12-01.json").read_text())
    assert summary["accelerator_reserved_seconds"] == 40.0
    assert [a["accelerator_reserved_seconds"] for a in summary["earlier_attempts"]] == [10, 20]
    assert all("earlier_attempts" not in a for a in summary["earlier_attempts"])
    counted = with_attempts(summary)
    assert counted["accelerator_reserved_seconds"] == 70.0
    assert counted["reserved_cost_usd"] == pytest.approx(70 / 3600)
    assert counted["pipeline_seconds"] == 35.0 and counted["items"] == 40  # its own


def test_an_attempt_with_a_damaged_figure_makes_the_runs_sum_one_the_report_refuses():
    damaged = _summary(10.0) | {"earlier_attempts": [_summary(math.nan)]}
    assert math.isnan(with_attempts(damaged)["accelerator_reserved_seconds"])
    text = _summary(10.0) | {"earlier_attempts": [_summary(10.0) | {"reserved_cost_usd": "x"}]}
    assert with_attempts(text)["reserved_cost_usd"] == "x"


@pytest.fixture(scope="module")
def attempted(tmp_path_factory, ray_local):
    """Two attempts of one run id into one output, each over its own recording (on the
    session's Ray: one the job started would be stopped under a later test's own)."""
    from overnight.jobs.ops.demo import espeak_available

    if not espeak_available():
        pytest.skip("espeak-ng is not installed")
    root = tmp_path_factory.mktemp("attempts")
    summaries = []
    for n, text in enumerate(["Thank you for calling.", "I would like to pay my bill."]):
        calls = root / f"calls{n}"
        calls.mkdir()
        write_wav(calls / f"call{n}.wav", np.concatenate([speak(text), silence(0.3)]))
        spec = build_spec(
            overrides={
                "job": {
                    "input": str(calls),
                    "output": str(root / "out"),
                    "run_id": "nightly-2026-12-01",
                    "progress": False,
                }
            }
        )
        summaries.append(run_transcribe(spec))
    return root / "out", summaries


def test_a_report_counts_the_reserved_time_of_every_attempt_of_a_run(attempted):
    out, (first, second) = attempted
    [row] = [
        r
        for r in build_report(load([str(out)]), by="run").main.to_pylist()
        if r["run"] == "nightly-2026-12-01"
    ]
    reserved = first["accelerator_reserved_seconds"] + second["accelerator_reserved_seconds"]
    assert row["accelerator_reserved_hours"] == pytest.approx(reserved / 3600)
    assert row["items"] == 2


def test_a_plan_profile_pools_every_attempt_of_a_run(attempted):
    out, (first, second) = attempted
    [profile] = profiles_from_runs(read_summaries(storage.resolve(str(out))))
    busy = first["accelerator_seconds"] + second["accelerator_seconds"]
    audio = first["audio_seconds"] + second["audio_seconds"]
    assert profile.throughput == pytest.approx(audio / busy)
