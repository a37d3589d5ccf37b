"""Prometheus metrics of a running job: a real transcription on the session's local Ray, read
back from the node's metrics port as Prometheus scrapes it."""

from __future__ import annotations

import re
import shutil
import time
import urllib.request

import pytest

from tests.jobs.test_transcribe import transcribe


def _scrape(ray) -> dict[str, float]:
    """Sum of each ``ray_overnight_*`` series over its workers, keyed by name and our labels."""
    port = ray.nodes()[0]["MetricsExportPort"]
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r"(ray_overnight_\w+)\{(.*)\} (\S+)$", line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        ours = ",".join(
            f"{k}={labels[k]}"
            for k in ("dataset", "status", "error_code", "direction", "stage")
            if k in labels
        )
        key = f"{m.group(1)}{{{ours}}}"
        out[key] = out.get(key, 0.0) + float(m.group(3))
    return out


def _settled(ray) -> dict[str, float]:
    """The series once an earlier test's job has finished reaching the port: two scrapes a
    Ray export interval (10 s) apart that agree. A run prices its ledger as it publishes, its
    last step, so its cost can reach the port a scrape after its items."""
    deadline = time.monotonic() + 90
    last = _scrape(ray)
    while True:
        time.sleep(11)
        now = _scrape(ray)
        if now == last or time.monotonic() > deadline:
            return now
        last = now


@pytest.mark.usefixtures("ray_local")
def test_committed_items_audio_and_cost_reach_prometheus_by_outcome(
    ray_local, synth_calls, tmp_path
):
    folder, refs = synth_calls
    calls = tmp_path / "in"
    calls.mkdir()
    for name in sorted(refs)[:2]:
        shutil.copy(folder / name, calls / name)
    (calls / "broken.wav").write_bytes(b"RIFF....WAVEfmt not really audio")
    before = _settled(ray_local)
    summary = transcribe(str(calls), str(tmp_path / "out"), device="cpu")
    assert summary["succeeded"] == 2 and summary["failed"] == 1
    ok = "ray_overnight_items_total{dataset=transcripts,status=ok,error_code=}"
    audio = "ray_overnight_audio_seconds_total{dataset=transcripts}"
    deadline = time.monotonic() + 60  # Ray exports every 10 s or so
    while True:
        now = _scrape(ray_local)
        delta = {k: v - before.get(k, 0.0) for k, v in now.items()}
        failed = {k: v for k, v in delta.items() if "status=error" in k and v}
        cost = {k: v for k, v in delta.items() if k.startswith("ray_overnight_cost_usd") and v}
        if delta.get(ok) == 2 and failed and delta.get(audio) and cost:
            break
        assert time.monotonic() < deadline, delta
        time.sleep(2)
    assert sum(failed.values()) == 1
    assert delta[audio] == pytest.approx(summary["audio_seconds"], abs=1e-3)  # rounded there
    # What the ledger priced, by stage, as it published: the run's busy cost.
    assert "ray_overnight_cost_usd_total{dataset=transcripts,stage=transcribe}" in cost
    assert sum(cost.values()) == pytest.approx(summary["cost_usd"], rel=1e-3, abs=1e-9)
