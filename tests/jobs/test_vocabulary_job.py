"""A transcription job with vocabulary, channel labels and language hints per item, end to end
on Ray, the bundled tiny.en and espeak-ng calls: what the rows, the summary and stderr say."""

from __future__ import annotations

import json

import numpy as np
import pytest

from overnight.jobs.ops.demo import espeak_available, silence, speak, stereo_dialogue, write_wav
from tests.jobs.test_transcribe import by_name, rows, transcribe

pytestmark = [
    pytest.mark.skipif(not espeak_available(), reason="espeak-ng not installed"),
    pytest.mark.usefixtures("ray_local"),
]


def test_a_job_applies_prompts_channel_labels_and_language_hints_per_item(tmp_path, capfd):
    calls = tmp_path / "calls"
    calls.mkdir()
    for name, text in {
        "plumber.wav": "The technician from Kwiatkowski Plumbing never arrived.",
        "german.wav": "I want to cancel my subscription today.",
    }.items():
        write_wav(calls / name, np.concatenate([silence(0.3), speak(text), silence(0.3)]))
    write_wav(calls / "stereo.wav", stereo_dialogue()[0])
    manifest = calls / "m.jsonl"
    manifest.write_text(
        "\n".join(
            json.dumps(r)
            for r in [
                {"uri": "plumber.wav", "initial_prompt": "Kwiatkowski Plumbing"},
                {"uri": "german.wav", "language": "de"},
                {"uri": "stereo.wav", "external_id": "job-labels"},
                {"uri": "stereo.wav", "external_id": "own", "channel_labels": "rep,caller"},
            ]
        )
    )
    out = tmp_path / "out"
    summary = transcribe(str(manifest), str(out), channel_labels=["agent", "customer"])
    got = by_name(rows(out))
    assert summary["succeeded"] == 4

    plumber = got["plumber.wav"]
    assert "kwiatkowski" in plumber["text"].lower(), plumber["text"]
    assert json.loads(plumber["options"])["initial_prompt"] == "Kwiatkowski Plumbing"
    assert summary["items_with_own_prompt"] == 1

    # The German hint on an English-only model: marked, counted, and warned about once.
    assert got["german.wav"]["language_mismatch"] is True
    assert plumber["language_mismatch"] is False
    assert summary["language_mismatch"] == 1
    err = capfd.readouterr().err
    assert err.count("ask for a language other than English") == 1, err
    assert "1 of 4 items" in err

    # The job's labels name the speakers of the row that has none; a row's own labels win.
    stereo = {r["external_id"]: r for r in rows(out) if r["external_id"]}
    speakers = {k: {s["speaker"] for s in r["segments"]} for k, r in stereo.items()}
    assert speakers == {"job-labels": {"agent", "customer"}, "own": {"rep", "caller"}}
    assert stereo["job-labels"]["channel_labels"] == ["agent", "customer"]
    assert summary["options"]["channel_labels"] == ["agent", "customer"]
    assert summary["options"]["split_channels"] is True
