"""The transcription job end to end, on the real tiny.en model and real Ray."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import wave
from pathlib import Path

import numpy as np
import pyarrow.dataset as pads
import pytest

from overnight.jobs.dataset import commits, storage
from overnight.jobs.ops.demo import noise, silence, speak, stereo_dialogue, write_wav
from overnight.jobs.run import runner, sizing
from overnight.jobs.spec import build_spec
from overnight.jobs.transcribe import TranscribeJob, run_transcribe
from overnight.workers.whisper import repeats_itself
from overnight.workers.whisper_guard import looks_degenerate
from tests.conftest import REPO, LoopbackProxy, secrets_in, upload_folder, wer

pytestmark = pytest.mark.usefixtures("ray_local")


def transcribe(input_: str, output: str, **transcribe_opts):
    spec = build_spec(
        overrides={
            "job": {"input": input_, "output": output, "progress": False},
            "transcribe": transcribe_opts,
        }
    )
    return run_transcribe(spec)


def rows(output: str | Path, name: str = "transcripts") -> list[dict]:
    return pads.dataset(str(output) + f"/{name}", format="parquet").to_table().to_pylist()


def by_name(table_rows: list[dict]) -> dict[str, dict]:
    return {Path(r["source_uri"]).name: r for r in table_rows}


def test_shared_recordings_keep_plain_faster_whisper_word_error_rate(shared_audio, tmp_path):
    refs = {
        line.split("\t")[0] + ".wav": line.split("\t")[1].strip()
        for line in (shared_audio / "librispeech_trans.txt").read_text().splitlines()
        if line.strip()
    }
    jfk = "And so my fellow Americans, ask not what your country can do for you, ask what you can do for your country."
    refs.update({"jfk.flac": jfk, "jfk.mp3": jfk})
    # The floor measured with plain faster-whisper on the same model (../shared/data/README.md).
    floor = {
        "1089-134686-0001.wav": 0.0,
        "1221-135766-0001.wav": 0.062,
        "1221-135766-0002.wav": 0.273,
        "jfk.flac": 0.0,
        "jfk.mp3": 0.0,
    }
    manifest = tmp_path / "m.csv"
    manifest.write_text("uri\n" + "\n".join(str(shared_audio / n) for n in refs) + "\n")
    summary = transcribe(str(manifest), str(tmp_path / "out"))
    got = by_name(rows(tmp_path / "out"))
    assert summary["succeeded"] == len(refs) == len(got)
    for name, ref in refs.items():
        assert wer(ref, got[name]["text"]) <= floor[name] + 1e-3, (name, got[name]["text"])


@pytest.fixture(scope="module")
def synth_run(synth_calls, tmp_path_factory, ray_local):
    """One run over the synthesized calls, shared by the tests that only read its output."""
    folder, refs = synth_calls
    out = tmp_path_factory.mktemp("synth") / "out"
    return refs, out, transcribe(str(folder), str(out))


def test_synthesized_calls_are_transcribed_accurately_without_shared_data(synth_run):
    refs, out, summary = synth_run
    got = by_name(rows(out))
    assert set(got) == set(refs)
    for name in ("call_billing.wav", "call_address.wav", "call_cancel.wav", "call_refund.wav"):
        assert got[name]["status"] == "ok"
        assert wer(refs[name], got[name]["text"]) <= 0.1, got[name]["text"]
        # 0.5 s of silence first, less VAD's 0.4 s of padding: times are the recording's own.
        assert 0.05 < got[name]["segments"][0]["start"] < 0.5
    assert summary["items"] == len(refs)
    # What the first result waited for, step by step, and the pool auto chose, as run.
    startup = summary["startup"]
    assert list(startup)[:3] == ["list_s", "ray_s", "manifest_s"]
    assert startup["model_load_s"] > 0 and startup["actor_start_s"] >= 0
    assert startup["first_result_s"] >= startup["model_load_s"]
    assert (
        summary["options"]["cpus_per_actor"] >= 1.5
        and "cpus_per_actor" in summary["options"]["auto"]
    )
    # No call's transcript says a run of words twice where its script says it once.
    for name, row in got.items():
        if row["status"] == "ok":
            assert repeats_itself(row["text"]) == repeats_itself(refs[name]), (name, row["text"])


def _unsupported_codec_wav() -> bytes:
    """A well-formed WAV whose format tag names no codec FFmpeg knows."""
    pcm = np.zeros(1600, dtype=np.int16).tobytes()
    fmt = (
        b"fmt "
        + (16).to_bytes(4, "little")
        + (0x7A7A).to_bytes(2, "little")
        + (1).to_bytes(2, "little")
        + (16000).to_bytes(4, "little")
        + (32000).to_bytes(4, "little")
        + (2).to_bytes(2, "little")
        + (16).to_bytes(2, "little")
    )
    body = b"WAVE" + fmt + b"data" + len(pcm).to_bytes(4, "little") + pcm
    return b"RIFF" + len(body).to_bytes(4, "little") + body


def _video_only_mkv() -> bytes:
    import io

    import av

    buf = io.BytesIO()
    with av.open(buf, "w", format="matroska") as out:
        stream = out.add_stream("mpeg4", rate=5)
        stream.width, stream.height, stream.pix_fmt = 32, 32, "yuv420p"
        for _ in range(5):
            frame = av.VideoFrame.from_ndarray(
                np.zeros((32, 32, 3), dtype=np.uint8), format="rgb24"
            )
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


def _low_rate_wav(path: Path, seconds: float) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(1)
        w.setframerate(8000)
        w.writeframes(
            (np.random.default_rng(1).integers(120, 136, int(seconds * 8000)))
            .astype(np.uint8)
            .tobytes()
        )


SSN_CALL = "My social security number is 219 09 9999 and I live at 42 Elm Street, Springfield."


def test_a_number_heavy_call_the_batched_decode_loops_on_comes_out_as_numbers_not_a_loop(
    synth_calls, tmp_path
):
    # Issue #34: the job wrote "My social security number is $200,000, $10,000, $10,000, ..."
    # (40 times) here, alone and among other calls; plain faster-whisper wrote numbers.
    folder, _ = synth_calls
    among = tmp_path / "among"
    among.mkdir()
    for wav in sorted(folder.glob("call_*.wav")):
        (among / wav.name).write_bytes(wav.read_bytes())
    write_wav(among / "ssn.wav", speak(SSN_CALL, voice="en-us", speed=150))
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "ssn.wav").write_bytes((among / "ssn.wav").read_bytes())
    for name, calls in (("alone", alone), ("among", among)):
        summary = transcribe(str(calls), str(tmp_path / f"out-{name}"))
        row = by_name(rows(tmp_path / f"out-{name}"))["ssn.wav"]
        said = row["text"].lower()
        assert not looks_degenerate(said, row["speech_s"]), (name, said)
        number = said.split("security number", 1)[-1]
        assert re.search(r"\d|zero|one|two|three|four|five|six|seven|eight|nine", number), said
        assert summary["degenerate"] == sum(
            bool(r["degenerate"]) for r in rows(tmp_path / f"out-{name}")
        )


@pytest.mark.skipif(not __import__("shutil").which("espeak-ng"), reason="espeak-ng not installed")
def test_bad_input_corpus_becomes_error_rows_while_good_files_succeed(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    write_wav(
        src / "good.wav",
        np.concatenate([silence(0.3), speak("Please call me back tomorrow morning.")]),
    )
    write_wav(src / "noise_only.wav", noise(5.0))
    (src / "corrupt.flac").write_bytes(b"fLaC" + os.urandom(3000))
    (src / "notes.txt").write_text("this is not audio at all\n" * 20)
    (src / "empty.wav").write_bytes(b"")
    (src / "weird_codec.wav").write_bytes(_unsupported_codec_wav())
    (src / "video_only.mkv").write_bytes(_video_only_mkv())
    _low_rate_wav(src / "too_long.wav", 25.0)  # 200 KB, 25 s
    write_wav(src / "too_large.wav", silence(40.0))  # 1.28 MB
    manifest = tmp_path / "m.jsonl"
    lines = [{"uri": str(p)} for p in sorted(src.iterdir())] + [{"uri": str(src / "vanished.wav")}]
    manifest.write_text("\n".join(json.dumps(x) for x in lines) + "\n")

    summary = transcribe(str(manifest), str(tmp_path / "out"), max_duration_s=20, max_file_mb=1.0)
    got = by_name(rows(tmp_path / "out"))
    expected = {
        "corrupt.flac": "corrupt_audio",
        "notes.txt": "not_audio",
        "empty.wav": "empty_file",
        "weird_codec.wav": "unsupported_codec",
        "video_only.mkv": "no_audio_stream",
        "too_long.wav": "too_long",
        "too_large.wav": "too_large",
        "vanished.wav": "fetch_failed",
    }
    assert len(got) == len(lines)  # exactly one row per input
    for name, code in expected.items():
        assert (got[name]["status"], got[name]["error_code"]) == ("error", code), got[name]
        assert got[name]["error_message"]
    assert got["good.wav"]["status"] == "ok" and "call me back" in got["good.wav"]["text"].lower()
    # Noise is not speech: no hallucinated text, and not an error either.
    assert got["noise_only.wav"]["status"] == "ok"
    assert got["noise_only.wav"]["text"] == "" and got["noise_only.wav"]["speech_s"] == 0
    assert summary["items"] == len(lines) and summary["failed"] == len(expected)
    assert summary["succeeded"] == 2 and summary["no_speech"] == 1
    assert summary["errors_by_code"] == {code: 1 for code in expected.values()}
    costs = rows(tmp_path / "out", "costs")
    assert {r["item_id"] for r in costs} == {r["item_id"] for r in got.values()}


def test_rerun_on_same_output_processes_nothing_and_writes_no_second_row(synth_calls, synth_run):
    folder, _ = synth_calls
    refs, out, first = synth_run
    before_rows, before_costs = rows(out), rows(out, "costs")
    second = transcribe(str(folder), str(out))
    assert first["items"] == len(refs)
    assert second["items"] == 0 and second["items_already_done"] == len(refs)
    assert len(rows(out)) == len(before_rows) == len(refs)
    assert len(rows(out, "costs")) == len(before_costs)


def test_a_changed_object_is_new_work_and_an_unchanged_one_is_not(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    write_wav(src / "a.wav", noise(1.0, seed=1))
    write_wav(src / "b.wav", noise(1.0, seed=2))
    transcribe(str(src), str(tmp_path / "out"))
    time.sleep(0.01)
    write_wav(src / "b.wav", noise(1.5, seed=3))  # replaced: new size and mtime
    again = transcribe(str(src), str(tmp_path / "out"))
    assert again["items"] == 1 and again["items_already_done"] == 1


@pytest.mark.skipif(not __import__("shutil").which("espeak-ng"), reason="espeak-ng not installed")
def test_killed_run_restarted_ends_with_exactly_one_row_per_item(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    base = speak("This recording belongs to a long overnight backlog of calls.")
    for i in range(16):
        write_wav(src / f"call_{i:02d}.wav", np.concatenate([silence(0.1 * (i % 3)), base]))
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [
        sys.executable,
        "-m",
        "overnight.jobs.cli",
        "transcribe",
        str(src),
        str(out),
        "--batch-size",
        "2",
        "--quiet",
        "--config",
        str(tmp_path / "job.toml"),
    ]
    (tmp_path / "job.toml").write_text("[transcribe]\nitems_per_call = 2\n")
    proc = subprocess.Popen(
        cmd, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline:
            # Actors commit into the run's staging folder; readers see rows once published.
            committed = list((out / "_staging" / "transcripts").glob("*/*/part-*.parquet"))
            if committed or proc.poll() is not None:
                break
            time.sleep(0.2)
        assert proc.poll() is None, "the run finished before it could be killed"
        assert committed, "nothing was committed before the deadline"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # driver and its local Ray: the whole job dies
        proc.wait()
    partial = commits.CommittedDataset(storage.resolve(str(out / "transcripts"))).committed_ids()
    assert 0 < len(partial) < 16

    summary = transcribe(str(src), str(out))
    final = rows(out)
    ids = [r["item_id"] for r in final]
    assert len(ids) == len(set(ids)) == 16
    # The killed run's actors outlive its driver by a few seconds (Ray workers run in their
    # own process groups) and may commit one more batch: at least what was seen is done.
    assert summary["items"] + summary["items_already_done"] == 16
    assert summary["items_already_done"] >= len(partial)
    # The resumed run also prices what the killed run committed: one ledger set per item.
    costs = rows(out, "costs")
    per_item = {}
    for r in costs:
        per_item.setdefault(r["item_id"], []).append(r["stage"])
    assert set(per_item) == set(ids)
    assert all(sorted(stages) == ["decode", "fetch", "transcribe"] for stages in per_item.values())


def test_job_reads_and_writes_an_s3_endpoint_with_the_model_in_object_storage(
    s3, synth_calls, tmp_path
):
    from overnight.workers.whisper_models import bundled_model_path

    folder, refs = synth_calls
    upload_folder(s3, "calls-in", folder, "2026-12-01")
    upload_folder(s3, "models", Path(bundled_model_path()), "whisper/tiny.en")
    s3.create_bucket(Bucket="calls-out")
    summary = transcribe(
        "s3://calls-in/2026-12-01/", "s3://calls-out/nightly", model="s3://models/whisper/tiny.en"
    )
    assert summary["items"] == len(refs) and summary["failed"] == 1  # the corrupt one

    import s3fs

    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": os.environ["AWS_ENDPOINT_URL"]})
    got = (
        pads.dataset("calls-out/nightly/transcripts", filesystem=fs, format="parquet")
        .to_table()
        .to_pylist()
    )
    assert len(got) == len(refs)
    texts = {Path(r["source_uri"]).name: r["text"] for r in got}
    assert wer(refs["call_refund.wav"], texts["call_refund.wav"]) <= 0.1
    assert all(r["source_uri"].startswith("s3://calls-in/2026-12-01/") for r in got)
    assert {r["model"] for r in got} == {"s3://models/whisper/tiny.en"}
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="calls-out")["Contents"]]
    assert any(k.startswith("nightly/costs/") for k in keys)
    summary_key = next(k for k in keys if k.startswith("nightly/runs/"))
    body = s3.get_object(Bucket="calls-out", Key=summary_key)["Body"].read().decode()
    assert json.loads(body)["run_id"] == summary["run_id"]
    # Credentials never reach outputs.
    everything = body + json.dumps(got, default=str)
    assert secrets_in(everything) == []


def test_stereo_call_comes_out_as_two_speaker_dialogue(shared_audio, tmp_path):
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(
        json.dumps(
            {
                "uri": str(shared_audio / "stereo_diarization.wav"),
                "channel_labels": "agent,customer",
                "tenant": "acme",
            }
        )
        + "\n"
    )
    transcribe(str(manifest), str(tmp_path / "out"))
    (row,) = rows(tmp_path / "out")
    left = "He began a confused complaint against the wizard, who had vanished behind the curtain on the left."
    right = "The horizon seems extremely distant."
    said = {
        label: " ".join(s["text"] for s in row["segments"] if s["speaker"] == label)
        for label in ("agent", "customer")
    }
    assert wer(left, said["agent"]) <= 0.25, said
    assert wer(right, said["customer"]) <= 0.2, said
    assert {s["channel"] for s in row["segments"] if s["speaker"] == "agent"} == {0}
    assert {s["channel"] for s in row["segments"] if s["speaker"] == "customer"} == {1}
    assert {line.split(": ", 1)[0] for line in row["text"].splitlines()} == {"agent", "customer"}
    assert row["tenant"] == "acme" and row["channel_labels"] == ["agent", "customer"]


@pytest.mark.skipif(not __import__("shutil").which("espeak-ng"), reason="espeak-ng not installed")
def test_a_mono_call_in_a_job_with_channel_labels_names_no_speaker_and_a_stereo_one_its_labels(
    tmp_path,
):
    # A one-channel recording has no second party to tell apart: it came out wholly as
    # "agent", and `report` counted the customer's talk as the agent's.
    src = tmp_path / "in"
    src.mkdir()
    write_wav(
        src / "mono.wav",
        np.concatenate([silence(0.3), speak("I was charged twice."), silence(0.3)]),
    )
    write_wav(src / "stereo.wav", stereo_dialogue()[0])
    transcribe(str(src), str(tmp_path / "out"), channel_labels=["agent", "customer"])
    got = by_name(rows(tmp_path / "out"))
    mono, stereo = got["mono.wav"], got["stereo.wav"]
    assert mono["status"] == stereo["status"] == "ok"
    assert mono["segments"] and {s["speaker"] for s in mono["segments"]} == {None}
    assert mono["analytics"] is None and not mono["text"].startswith("agent:")
    assert {s["speaker"] for s in stereo["segments"]} == {"agent", "customer"}
    assert stereo["analytics"] is not None


@pytest.mark.skipif(not __import__("shutil").which("espeak-ng"), reason="espeak-ng not installed")
def test_split_channels_flag_puts_dialogue_turns_in_time_order(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    audio, said = stereo_dialogue()
    write_wav(src / "dialogue.wav", audio)
    transcribe(str(src), str(tmp_path / "out"), split_channels=True)
    (row,) = rows(tmp_path / "out")
    speakers = [line.split(":", 1)[0] for line in row["text"].splitlines()]
    assert speakers == ["ch0", "ch1", "ch0"]
    assert (
        wer(said["customer"], " ".join(s["text"] for s in row["segments"] if s["channel"] == 1))
        <= 0.15
    )
    starts = [s["start"] for s in row["segments"]]
    assert starts == sorted(starts)


def test_outputs_read_back_with_pyarrow_pandas_polars_and_duckdb(synth_run):
    import duckdb
    import pandas as pd
    import polars as pl
    import pyarrow.parquet as pq

    refs, out, _ = synth_run
    path = str(out / "transcripts")
    from overnight.schemas import SCHEMA_VERSION, TRANSCRIPTS

    table = pq.read_table(path)  # the run_date partition comes from the folder names
    assert (
        table.drop_columns(["run_date"])
        .schema.remove_metadata()
        .equals(TRANSCRIPTS.remove_metadata())
    )
    assert table.schema.metadata[b"overnight.schema_version"] == SCHEMA_VERSION.encode()
    assert len(pd.read_parquet(path)) == len(refs)
    assert pl.read_parquet(path + "/*/*.parquet").height == len(refs)
    con = duckdb.connect()
    n, ok = con.execute(
        f"select count(*), count(*) filter (where status = 'ok') from read_parquet('{path}/*/*.parquet')"
    ).fetchone()
    assert n == len(refs) and ok == len(refs) - 1
    costs = con.execute(
        f"select sum(cost_usd), count(distinct item_id) from read_parquet('{out}/costs/*/*.parquet')"
    ).fetchone()
    assert costs[0] > 0 and costs[1] == len(refs)


@pytest.mark.skipif(not __import__("shutil").which("espeak-ng"), reason="espeak-ng not installed")
def test_speech_on_one_channel_of_a_multichannel_call_is_transcribed(tmp_path):
    said = "Please call me back tomorrow morning."
    speech = np.concatenate([silence(0.5), speak(said), silence(0.5)])

    def only_on(channel: int, channels: int) -> np.ndarray:
        audio = np.zeros((channels, speech.size), dtype=np.float32)
        audio[channel] = speech
        return audio

    src = tmp_path / "in"
    src.mkdir()
    write_wav(src / "six.wav", only_on(3, 6))  # 5.1's LFE: FFmpeg's downmix dropped it
    write_wav(src / "three.wav", only_on(2, 3))
    write_wav(src / "sixteen.wav", only_on(12, 16))
    manifest = tmp_path / "m.jsonl"
    lines = [
        {"uri": str(src / "six.wav")},  # mixed down to mono
        {"uri": str(src / "three.wav"), "channel_labels": "agent,customer,supervisor"},
        {"uri": str(src / "sixteen.wav"), "channel_labels": ",".join(f"p{i}" for i in range(16))},
    ]
    manifest.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    transcribe(str(manifest), str(tmp_path / "out"), max_channels=4)
    got = by_name(rows(tmp_path / "out"))
    assert got["six.wav"]["status"] == "ok" and wer(said, got["six.wav"]["text"]) <= 0.2
    three = got["three.wav"]
    assert three["status"] == "ok" and {s["speaker"] for s in three["segments"]} == {"supervisor"}
    assert wer(said, " ".join(s["text"] for s in three["segments"])) <= 0.2
    assert got["sixteen.wav"]["error_code"] == "too_many_channels"


def test_symlinks_in_an_input_folder_are_followed_and_broken_ones_become_error_rows(tmp_path):
    src, elsewhere = tmp_path / "calls", tmp_path / "elsewhere"
    src.mkdir()
    elsewhere.mkdir()
    write_wav(src / "a.wav", noise(2.0))
    write_wav(elsewhere / "b.wav", noise(3.0))
    (src / "b.wav").symlink_to(elsewhere / "b.wav")  # absolute, outside the folder
    (src / "c.wav").symlink_to("../elsewhere/b.wav")  # relative
    (src / "dangling.wav").symlink_to(elsewhere / "gone.wav")
    (src / "loop1.wav").symlink_to("loop2.wav")
    (src / "loop2.wav").symlink_to("loop1.wav")
    summary = transcribe(str(src), str(tmp_path / "out"))
    got = by_name(rows(tmp_path / "out"))
    assert sorted(got) == ["a.wav", "b.wav", "c.wav", "dangling.wav", "loop1.wav", "loop2.wav"]
    for name in ("a.wav", "b.wav", "c.wav"):
        assert got[name]["status"] == "ok", got[name]
    assert got["b.wav"]["duration_s"] == 3.0
    assert got["dangling.wav"]["error_code"] == "fetch_failed"
    assert "does not exist" in got["dangling.wav"]["error_message"]
    for name in ("loop1.wav", "loop2.wav"):
        assert got[name]["error_code"] == "fetch_failed"
        assert "loops" in got[name]["error_message"]
    assert summary["items"] == 6 and summary["failed"] == 3


@pytest.mark.timeout(240)  # a FIFO once hung the job forever
def test_fifo_device_socket_and_folder_in_a_manifest_are_error_rows_before_any_read(tmp_path):
    import socket

    write_wav(tmp_path / "good.wav", noise(2.0))
    os.mkfifo(tmp_path / "pipe.wav")
    (tmp_path / "folder.wav").mkdir()
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "s.wav"))
    manifest = tmp_path / "m.csv"
    uris = ["good.wav", "pipe.wav", "folder.wav", "s.wav", "/dev/zero"]
    manifest.write_text("uri\n" + "\n".join(uris) + "\n")
    try:
        transcribe(str(manifest), str(tmp_path / "out"), max_file_mb=1.0)
    finally:
        sock.close()
    got = by_name(rows(tmp_path / "out"))
    assert got["good.wav"]["status"] == "ok"
    kinds = {"pipe.wav": "FIFO", "folder.wav": "folder", "s.wav": "socket", "zero": "device"}
    for name, kind in kinds.items():
        assert got[name]["error_code"] == "not_a_file", got[name]
        assert kind in got[name]["error_message"]


def _cli(*args: str, env: dict[str, str] | None = None, timeout: float = 300):
    return subprocess.run(
        [sys.executable, "-m", "overnight.jobs.cli", *args, "--quiet"],
        env={**(env or os.environ), "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_a_superseded_run_exits_8_through_the_cli(tmp_path):
    src, out = tmp_path / "in", tmp_path / "out"
    src.mkdir()
    for i in range(4):
        write_wav(src / f"call_{i}.wav", noise(2.0, seed=i))
    cmd = [sys.executable, "-m", "overnight.jobs.cli", "transcribe", str(src), str(out), "--quiet"]
    proc = subprocess.Popen(
        cmd,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    claim = out / "_claims" / "transcripts.json"
    try:
        deadline = time.monotonic() + 120
        while not claim.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert claim.exists(), "the run never claimed its output"
        # What a second run on the same OUTPUT does first: the first run's commits must stop.
        commits.CommittedDataset(storage.resolve(str(out / "transcripts"))).claim("a-later-run")
        _, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 8, err[-3000:]
    assert "a later run (a-later-run) took over" in err and "Traceback" not in err
    # Our message alone: not Ray Data's retry advice, which it appends to the error's args.
    assert "Failed to apply UDF transform" not in err


class _StorageDownForReads(LoopbackProxy):
    """An S3 endpoint in front of moto that goes down at the first object read: it answers
    the listing, drops that read and refuses every connection after it (storage that fails
    between the listing and the fetch)."""

    def __init__(self, upstream: str):
        self.reads_dropped = 0
        super().__init__(upstream)

    def accepted(self, conn) -> None:
        import threading

        threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn) -> None:
        import socket
        import threading

        head = b""
        while b"\r\n\r\n" not in head:
            chunk = conn.recv(65536)
            if not chunk:
                conn.close()
                return
            head += chunk
        method, target = head.split(b" ", 2)[:2]
        path, _, query = target.decode().partition("?")
        if method == b"GET" and "list-type" not in query and "/" in path.strip("/"):
            self.reads_dropped += 1
            conn.close()
            self.server.close()
            return
        lines = [x for x in head.split(b"\r\n") if not x.lower().startswith(b"connection:")]
        head = b"\r\n".join(lines).replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n", 1)
        up = socket.create_connection(self.upstream)
        up.sendall(head)

        def pump(a, b) -> None:
            with contextlib.suppress(OSError):
                while data := a.recv(65536):
                    b.sendall(data)
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

        threading.Thread(target=pump, args=(conn, up), daemon=True).start()
        pump(up, conn)


def test_a_storage_outage_during_fetch_exits_3_through_the_cli(s3, s3_server, tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    write_wav(src / "a.wav", noise(2.0))
    upload_folder(s3, "calls-down", src, "2026-12-01")
    proxy = _StorageDownForReads(s3_server)
    try:
        result = _cli(
            "transcribe",
            "s3://calls-down/2026-12-01/",
            str(tmp_path / "out"),
            env={**os.environ, "AWS_ENDPOINT_URL": proxy.url},
        )
    finally:
        proxy.close()
    assert proxy.reads_dropped > 0  # the listing went through; the fetch met the outage
    assert result.returncode == 3, result.stderr[-3000:]
    assert "storage unreachable" in result.stderr and "Traceback" not in result.stderr
    assert secrets_in(result.stderr + result.stdout) == []


@pytest.mark.parametrize(("model_workers", "units"), [(1, 2.0), (2, 1.0)])
def test_each_model_worker_prices_its_batches_at_its_share_of_the_actor(
    tmp_path, model_workers, units
):
    """Two model batches at once on an actor of two cores: each ran on one of them."""
    write_wav(tmp_path / "a.wav", silence(1.0))
    spec = build_spec(overrides={"job": {"input": str(tmp_path), "output": str(tmp_path / "out")}})
    pool = sizing.Pool(1, 2.0, 0.0, 1.0, model_workers, 1)
    job = TranscribeJob(spec)
    stages = job.stages(runner.Resolved("cpu", pool, 1), job.prepare(dry=True)).stages
    costs = {s.name: s.cost for s in stages if s.cost is not None}
    assert (costs["whisper"].resource, costs["whisper"].units) == ("cpu", units)
    assert (costs["decode"].resource, costs["decode"].units) == ("cpu", 1.0)


@pytest.mark.parametrize(
    ("engine", "device", "on_model"),
    [
        ("torch", "cuda", True),
        ("torch", "cpu", False),
        ("auto", "cuda", False),
        ("ctranslate2", "cuda", False),
        ("auto", "cpu", False),
    ],
)
def test_the_features_are_the_models_only_for_the_torch_engine_on_cuda(
    tmp_path, engine, device, on_model
):
    """The torch engine on a GPU computes the log-mel front end itself from the chunks'
    samples (``AudioOptions.features_on_model``); every other run keeps the decode stage's
    features, CPU runs included. The rows' options say which."""
    write_wav(tmp_path / "a.wav", silence(1.0))
    spec = build_spec(
        overrides={
            "job": {"input": str(tmp_path), "output": str(tmp_path / "out")},
            "transcribe": {"engine": engine},
        }
    )
    pool = sizing.Pool(1, 2.0, 1.0 if device == "cuda" else 0.0, 1.0, 1, 1)
    job = TranscribeJob(spec)
    stages = {
        s.name: s
        for s in job.stages(runner.Resolved(device, pool, 1), job.prepare(dry=True)).stages
    }
    assert stages["decode"].kwargs["options"].features_on_model is on_model
    extra = dict(stages["whisper"].kwargs["config"].extra_options)
    assert extra["audio.features_on_model"] is on_model
