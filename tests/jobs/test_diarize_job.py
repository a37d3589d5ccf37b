"""Diarization of mono calls through the real job: bundled tiny.en, the speaker encoder
prepared at install, local Ray. A mono mix of two real voices (LibriSpeech speakers where
../shared/data exists, two espeak-ng voices otherwise) comes out as two speakers with their
words, as dialogue in ``show``, with call analytics and its own ledger stage."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pyarrow.dataset as pads
import pytest

from overnight.jobs.cli import main
from overnight.jobs.ops.demo import write_wav
from tests.jobs.test_transcribe import rows, transcribe
from tests.workers.test_diarize import SR, _call


def _model_prepared() -> None:
    from overnight.workers.diarize.prepare import DiarizerModelMissing, load_weights

    try:
        load_weights()
    except DiarizerModelMissing:
        pytest.skip("the speaker encoder is not prepared (scripts/install.sh prepares it)")


def _mono_call_folder(tmp_path_factory, name: str):
    """ROOT/calls/mono_call.wav, the two-voice mono mix; (root, calls, audio, reference)."""
    _model_prepared()
    root = tmp_path_factory.mktemp(name)
    calls = root / "calls"
    calls.mkdir()
    audio, reference = _call()
    write_wav(calls / "mono_call.wav", audio)
    return root, calls, audio, reference


@pytest.fixture(scope="module")
def diarized(tmp_path_factory):
    root, calls, _, reference = _mono_call_folder(tmp_path_factory, "diarize")
    out = root / "out"
    summary = transcribe(
        str(calls), str(out), device="cpu", diarize=True, speaker_roles=["agent", "customer"]
    )
    return out, reference, summary


def test_a_two_speaker_mono_call_comes_out_as_two_speakers_with_their_words(diarized):
    out, reference, summary = diarized
    [row] = rows(out)
    assert row["status"] == "ok" and summary["succeeded"] == 1
    segments = row["segments"]
    assert {s["speaker"] for s in segments} == {"agent", "customer"}
    # Each word's speaker against who was speaking at its middle (the mix's construction;
    # A speaks first, so A is the agent).
    role = {"A": "agent", "B": "customer"}
    words = [w | {"speaker": s["speaker"]} for s in segments for w in s["words"]]
    assert len(words) >= 20
    right = 0
    for w in words:
        middle = (w["start"] + w["end"]) / 2
        who = min(reference, key=lambda r: max(r[1] - middle, middle - r[2], 0.0))[0]
        right += w["speaker"] == role[who]
    assert right / len(words) >= 0.9, (right, len(words))
    # The text is the dialogue, one line a turn, as a split-channel call's.
    lines = row["text"].splitlines()
    assert len(lines) >= 3 and lines[0].startswith("agent: ")
    assert any(line.startswith("customer: ") for line in lines)


def test_a_diarized_call_has_analytics_and_its_own_ledger_stage(diarized):
    out, _, _ = diarized
    [row] = rows(out)
    analytics = row["analytics"]
    assert {s["speaker"] for s in analytics["speakers"]} == {"agent", "customer"}
    assert all(s["talk_s"] > 0 for s in analytics["speakers"])
    assert analytics["overtalk_s"] is None  # one speaker per instant: not measured on mono
    assert row["diarize_s"] > 0
    costs = pads.dataset(str(out / "costs"), format="parquet").to_table().to_pylist()
    diarize = [c for c in costs if c["stage"] == "diarize"]
    assert len(diarize) == 1 and diarize[0]["resource"] == "cpu" and not diarize[0]["model_stage"]
    assert diarize[0]["work"] == "audio"


def test_show_prints_a_diarized_call_as_dialogue(diarized, capsys):
    out, _, _ = diarized
    capsys.readouterr()
    assert main(["show", str(out)]) == 0
    printed = capsys.readouterr().out
    # One line a turn: its time, its speaker, what was said; the speakers take turns.
    spoken = re.findall(r"^\s+\d\d:\d\d\s+(agent|customer)\s+\S", printed, re.M)
    assert spoken[:4] == ["agent", "customer", "agent", "customer"], printed


def test_a_json_export_carries_the_words_their_speakers_and_the_analytics(
    diarized, tmp_path, capsys
):
    # The JSON export gave segments' text and speaker only: a consumer wanting who said which
    # word when, or the talk times, had to read the Parquet file.
    out, _, _ = diarized
    [row] = rows(out)
    assert main(["export", str(out), str(tmp_path / "json"), "--format", "json"]) == 0
    doc = json.loads((tmp_path / "json" / "mono_call.json").read_text())
    assert doc["analytics"] == row["analytics"]
    exported = [(w["word"], w["start"], s["speaker"]) for s in doc["segments"] for w in s["words"]]
    stored = [(w["word"], w["start"], s["speaker"]) for s in row["segments"] for w in s["words"]]
    assert exported == stored and len(exported) >= 20
    assert doc["entities"] is None  # the job did not redact


def test_a_rerun_with_other_options_says_the_done_calls_keep_their_rows(diarized, tmp_path, capsys):
    # Done items are never redone: a rerun with other roles (or --diarize after a plain run)
    # wrote nothing and said nothing of it.
    out, _, _ = diarized
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    calls = str(out.parent / "calls")
    flags = ["--diarize", "--quiet", "--speaker-roles"]
    capsys.readouterr()
    assert main(["transcribe", calls, str(copy), *flags, "customer,agent"]) == 0
    printed = capsys.readouterr().out
    assert "the 1 done item(s) keep the rows the last run wrote with other options" in printed
    assert 'speaker_roles ["agent", "customer"] -> ["customer", "agent"]' in printed, printed
    [row] = rows(copy)
    assert row["text"].startswith("agent: ")  # the row as it was
    # The options the rows were written with (the pool's and the device aside): no notice.
    assert (
        main(["transcribe", calls, str(copy), *flags, "agent,customer", "--batch-size", "4"]) == 0
    )
    assert "other options" not in capsys.readouterr().out


@pytest.fixture(scope="module")
def mixed_queue(tmp_path_factory):
    """A job that splits channels (a queue of stereo calls) and diarizes, over the mono mix
    and a stereo call (each channel one half of the mix)."""
    root, calls, audio, _ = _mono_call_folder(tmp_path_factory, "mixed")
    half = len(audio) // 2
    write_wav(calls / "stereo_call.wav", np.stack([audio[:half], audio[half : 2 * half]]))
    out = root / "out"
    transcribe(str(calls), str(out), device="cpu", diarize=True, split_channels=True)
    return out


def test_a_mono_call_in_a_job_that_splits_channels_is_diarized_and_a_stereo_one_split(
    mixed_queue,
):
    # A mixed queue: --split-channels for its stereo calls, --diarize for its mono ones. The
    # mono call came out as one speaker, "ch0", with no diarization.
    out = mixed_queue
    found = {Path(r["source_uri"]).name: r for r in rows(out)}
    mono, stereo = found["mono_call.wav"], found["stereo_call.wav"]
    assert mono["status"] == stereo["status"] == "ok"
    assert {s["speaker"] for s in mono["segments"]} == {"SPEAKER_00", "SPEAKER_01"}
    assert mono["diarize_s"] > 0 and len(mono["analytics"]["speakers"]) == 2
    assert {s["speaker"] for s in stereo["segments"]} == {"ch0", "ch1"}
    assert stereo["diarize_s"] is None  # a channel is a speaker: nothing to find


def test_a_missing_speaker_model_stops_the_job_before_work_with_exit_5(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("OVERNIGHT_CACHE", str(tmp_path / "empty-cache"))
    (tmp_path / "in").mkdir()
    write_wav(tmp_path / "in" / "a.wav", np.zeros(SR, np.float32))
    code = main(["transcribe", str(tmp_path / "in"), str(tmp_path / "out"), "--diarize"])
    err = capsys.readouterr().err
    assert code == 5, err
    assert "speaker model for diarization is missing" in err
    assert "python -m overnight.workers.diarize.prepare" in err
    assert not (tmp_path / "out" / "transcripts").exists()


def test_diarize_with_word_timestamps_false_in_a_job_file_is_exit_2_naming_both_before_work(
    tmp_path, capsys
):
    # Speakers are given word by word: the job ran, and a two-speaker call came out as one
    # turn of SPEAKER_01.
    (tmp_path / "in").mkdir()
    write_wav(tmp_path / "in" / "a.wav", np.zeros(SR, np.float32))
    job = tmp_path / "job.toml"
    job.write_text(
        f'[job]\ninput = "{tmp_path / "in"}"\noutput = "{tmp_path / "out"}"\n'
        "[transcribe]\ndiarize = true\nspeakers = 2\nword_timestamps = false\n"
    )
    code = main(["run", str(job)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "diarize" in err and "word_timestamps" in err
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_a_recording_whose_diarization_raises_is_its_own_error_row_and_the_others_go_on(
    tmp_path, monkeypatch
):
    # A diarizer error in the decode task failed the whole Ray Data job: no row for any item.
    import pyarrow as pa

    from overnight.jobs import transcribe as job
    from overnight.jobs.dataset import storage
    from overnight.workers.audio import AudioOptions
    from overnight.workers.diarize import DiarizeOptions

    audio, _ = _call()
    for name in ("a.wav", "b.wav"):
        write_wav(tmp_path / name, audio[: 3 * SR])

    def diarize(row, decoded, options):
        if row["uri"].endswith("a.wav"):
            raise IndexError("index 3 is out of bounds for axis 0 with size 3")
        row["_speaker_turns"], row["diarize_s"] = [], 0.0

    monkeypatch.setattr(job, "_diarize", diarize)
    from overnight.schemas import MANIFEST

    batch = pa.Table.from_pylist(
        [
            {"item_id": n, "uri": str(tmp_path / n), "size": (tmp_path / n).stat().st_size}
            for n in ("a.wav", "b.wav")
        ],
        schema=MANIFEST,
    )
    out = job.fetch_and_decode(
        batch,
        options=AudioOptions(),
        max_bytes=10**9,
        storage_config=storage.StorageConfig.from_env(),
        diarize=DiarizeOptions(),
    ).to_pylist()
    a, b = out
    assert a["status"] == "error" and a["error_code"] == "diarization_failed"
    assert "IndexError" in a["error_message"] and a["chunks"] == []
    assert b["status"] == "ok" and b["chunks"]
