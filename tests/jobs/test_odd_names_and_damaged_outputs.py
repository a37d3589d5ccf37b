"""What a second hostile probe found (2026-12-07): a file whose name is not UTF-8 stopped the
whole job, and the commands that read an output (``show``, ``report``, ``export``, ``plan``,
``vacuum``) met damaged or foreign files in it with tracebacks or wrong figures. Each test
states what must hold."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from overnight.jobs.cli import main
from overnight.jobs.dataset import storage
from overnight.jobs.errors import ConfigError
from overnight.jobs.ops.demo import espeak_available, speak, write_wav
from tests.jobs.test_transcribe import rows, transcribe

pytestmark = pytest.mark.usefixtures("ray_local")

# A Latin-1 name, as an old PBX export writes it: "réunion_ÿ.wav" in bytes that are not UTF-8.
LATIN1 = os.fsdecode("r\xe9union_\xff.wav".encode("latin-1"))


def test_a_local_name_that_is_not_utf8_is_listed_as_text_and_read_from_disk(tmp_path):
    (tmp_path / LATIN1).write_bytes(b"RIFF....")
    (tmp_path / "plain.wav").write_bytes(b"RIFF")
    [odd, plain] = sorted(
        storage.list_objects(str(tmp_path)), key=lambda o: o.uri.endswith("plain.wav")
    )
    assert odd.uri.endswith("r\\xe9union_\\xff.wav") and odd.uri.encode("utf-8")
    assert odd.size == 8 and plain.uri == str(tmp_path / "plain.wav")
    assert storage.read_bytes(odd.uri) == b"RIFF...."
    # a missing name with an escape in it stays missing (fetch_failed), not another file
    with pytest.raises(FileNotFoundError):
        storage.read_bytes(str(tmp_path / "r\\xe9union_\\xfe.wav"))


def test_a_recording_whose_name_is_not_utf8_is_transcribed_beside_the_others(tmp_path, capsys):
    # It stopped the job before any work with a UnicodeEncodeError traceback from its item id,
    # so the other recordings of the folder were not transcribed either.
    if not espeak_available():
        pytest.skip("espeak-ng is not installed")
    calls = tmp_path / "calls"
    calls.mkdir()
    write_wav(calls / LATIN1, speak("I would like to check my balance please."))
    write_wav(calls / "plain.wav", speak("Thank you for calling, how can I help you today?"))
    out = tmp_path / "out"
    summary = transcribe(str(calls), str(out), device="cpu")
    assert summary["succeeded"] == 2
    found = {Path(r["source_uri"]).name: r for r in rows(out)}
    assert set(found) == {"r\\xe9union_\\xff.wav", "plain.wav"}
    assert "balance" in found["r\\xe9union_\\xff.wav"]["text"].lower()
    again = transcribe(str(calls), str(out), device="cpu")
    assert again["items_already_done"] == 2 and len(rows(out)) == 2  # a rerun adds nothing
    assert main(["export", str(out), str(tmp_path / "srt"), "--format", "srt"]) == 0
    assert sorted(p.name for p in (tmp_path / "srt").iterdir()) == [
        "plain.srt",
        "r\\xe9union_\\xff.srt",
    ]
    shutil.rmtree(tmp_path / "srt")


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """Two real runs into one output (CPU defaults: one actor running two model batches at
    once), the second over two recordings added after the first."""
    if not espeak_available():
        pytest.skip("espeak-ng is not installed")
    root = tmp_path_factory.mktemp("two_runs")
    calls, out = root / "calls", root / "out"
    calls.mkdir()
    lines = [
        "Thank you for calling, how can I help you today?",
        "I would like to check the balance of my account please.",
        "Your payment of forty dollars was received on Monday.",
        "Is there anything else I can help you with today?",
    ]
    summaries = []
    for batch in (lines[:2], lines[2:]):
        for text in batch:
            write_wav(calls / f"call_{lines.index(text)}.wav", speak(text))
        summaries.append(transcribe(str(calls), str(out), device="cpu"))
    return out, summaries


def _totals(out: Path) -> dict:
    from overnight.jobs.ops.report import build_report, load

    return build_report(load([str(out)]), by="run").tables["totals"].to_pylist()[0]


def test_report_utilization_and_busy_hours_are_the_run_summaries(two_runs):
    # With two model batches at once on an actor (model_workers, 2 on CPU), each batch's
    # ledger row holds its seconds at half the actor's units; summed whole, the report gave
    # twice the summaries' busy time: 71% utilization for a run at 36%, a resumed one 140%.
    out, summaries = two_runs
    assert all(s["options"]["model_workers"] == 2 for s in summaries)
    busy = sum(s["accelerator_seconds"] for s in summaries)
    reserved = sum(s["accelerator_reserved_seconds"] for s in summaries)
    totals = _totals(out)
    assert totals["accelerator_busy_hours"] * 3600 == pytest.approx(busy, abs=0.01)
    assert totals["utilization"] == pytest.approx(busy / reserved, abs=0.005)
    assert totals["utilization"] < 1


def test_reserved_cost_a_minute_is_over_the_audio_of_the_runs_that_have_a_summary(
    two_runs, tmp_path
):
    # A killed run leaves rows and ledger but no summary, so its reserved time is unknown:
    # its audio over the other runs' reserved cost gave less per minute than busy cost.
    out, summaries = two_runs
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    (copy / "runs" / f"{summaries[1]['run_id']}.json").unlink()
    totals = _totals(copy)
    first = summaries[0]
    assert totals["reserved_cost_per_audio_minute_usd"] == pytest.approx(
        first["reserved_cost_usd"] / (first["audio_seconds"] / 60), rel=1e-3
    )
    assert totals["reserved_cost_per_audio_minute_usd"] > totals["cost_per_audio_minute_usd"]


def test_a_probe_of_the_recordings_an_output_transcribed_adds_no_audio_to_its_report(
    two_runs, tmp_path
):
    # The probe's ledger rows carried each recording's duration: a report over an output
    # both probed and transcribed counted the audio twice, and halved the cost per minute.
    out, summaries = two_runs
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    before = _totals(copy)
    assert main(["probe", str(out.parent / "calls"), str(copy), "--quiet"]) == 0
    after = _totals(copy)
    assert after["audio_seconds"] == pytest.approx(before["audio_seconds"])
    assert after["audio_seconds"] == pytest.approx(
        sum(s["audio_seconds"] for s in summaries), abs=0.01
    )
    assert after["cost_usd"] > before["cost_usd"]  # probing is paid for, as audio work
    assert after["cost_per_audio_minute_usd"] > before["cost_per_audio_minute_usd"]


def test_an_actor_larger_than_this_machine_is_exit_2_not_a_wait_forever(tmp_path, capsys):
    # It printed "1 Whisper actor of 64 CPU" and waited for a node that a local Ray never gets.
    if not espeak_available():
        pytest.skip("espeak-ng is not installed")
    calls = tmp_path / "calls"
    calls.mkdir()
    write_wav(calls / "a.wav", speak("Thank you for calling."))
    out = tmp_path / "out"
    with pytest.raises(
        ConfigError, match=r"one model actor takes 64 CPU .* more than this machine"
    ):
        transcribe(str(calls), str(out), device="cpu", cpus_per_actor=64)


def test_more_actors_than_fit_run_and_are_priced_as_many_as_fit(two_runs, tmp_path):
    # 1,000 actors on 2 cores: 17,478 s reserved in a 26 s run, and plans sized from it; and
    # 2 actors of 1 CPU there left the decode tasks no core: the run waited forever. One
    # fits beside the decode tasks' reserve (1.5 of the 2 cores).
    out, _ = two_runs
    summary = transcribe(
        str(out.parent / "calls"), str(tmp_path / "out"), device="cpu", actors=20, cpus_per_actor=1
    )
    assert summary["options"]["actors"] == 1 and summary["succeeded"] == 4
    assert summary["accelerator_reserved_seconds"] <= summary["pipeline_seconds"] + 1e-6
