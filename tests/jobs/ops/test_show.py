"""`overnight show`: transcripts as dialogue, document results, filters, JSON, errors, S3.

The outputs are written with the project's own writer and schemas (CommittedDataset.write_table,
schemas.TRANSCRIPTS / DOCUMENT_RESULTS), exactly as a run commits them; the quick start's
test (test_cli_experience) shows a real run's output too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest

from overnight.jobs.dataset import storage
from overnight.jobs.dataset.commits import CommittedDataset
from overnight.jobs.ops.show import turns as dialogue
from overnight.schemas import DOCUMENT_RESULTS, TRANSCRIPTS
from tests.conftest import REPO, upload_folder

NOW = datetime(2026, 12, 3, 20, 0, tzinfo=UTC)


def _segment(start, end, text, channel=0, speaker=None):
    return {
        "start": start,
        "end": end,
        "text": text,
        "channel": channel,
        "speaker": speaker,
        "avg_logprob": -0.2,
        "no_speech_prob": 0.01,
    }


STEREO = [
    _segment(0.6, 4.0, "Good morning, billing department.", 0, "agent"),
    _segment(4.1, 5.0, "How can I help you today?", 0, "agent"),
    _segment(5.6, 8.8, "I was charged twice for my internet service this month.", 1, "customer"),
    _segment(9.4, 13.0, "I am sorry about that, I will refund the second payment.", 0, "agent"),
]


def transcript_rows() -> list[dict]:
    base = {"run_id": "run-1", "processed_at": NOW, "tenant": "acme", "language": "en"}
    return [
        {
            **base,
            "item_id": "a" * 32,
            "source_uri": "/calls/call_stereo.wav",
            "external_id": "ticket-7",
            "channel_labels": ["agent", "customer"],
            "status": "ok",
            "text": "\n".join(f"{s['speaker']}: {s['text']}" for s in STEREO),
            "segments": STEREO,
            "duration_s": 13.5,
        },
        {
            **base,
            "item_id": "b" * 32,
            "source_uri": "/calls/call_billing.wav",
            "status": "ok",
            "text": "Thank you for calling. I would like to pay my bill of fifty dollars.",
            "segments": [_segment(0.5, 4.0, "Thank you for calling.")],
            "duration_s": 5.0,
        },
        {
            **base,
            "item_id": "c" * 32,
            "source_uri": "/calls/call_corrupt.wav",
            "status": "error",
            "error_code": "corrupt_audio",
            "error_message": "cannot open as audio: Invalid data found when processing input",
        },
    ]


def result_rows() -> list[dict]:
    base = {"run_id": "run-2", "processed_at": NOW, "status": "ok", "model": "ctranslate2:x"}
    return [
        {
            **base,
            "item_id": "d" * 32,
            "source_item_id": "a" * 32,
            "source_uri": "/docs/call.txt",
            "task": "summarize",
            "output_text": "The customer was charged twice; the agent refunds the second payment.",
        },
        {
            **base,
            "item_id": "e" * 32,
            "source_uri": "/docs/call.txt",
            "task": "classify",
            "label": "billing",
            "label_score": 0.93,
            "output_text": "billing",
        },
        {
            **base,
            "item_id": "f" * 32,
            "source_uri": "/docs/invoice.pdf",
            "task": "extract",
            "output_json": json.dumps({"amount": 50, "due": "Friday"}),
        },
        {
            **base,
            "item_id": "0" * 32,
            "source_uri": "/docs/locked.pdf",
            "task": "summarize",
            "status": "error",
            "error_code": "encrypted",
            "error_message": "the PDF is encrypted; set $OVERNIGHT_PDF_PASSWORD",
        },
    ]


def write_output(folder: Path, transcripts=True, results=False) -> Path:
    out = storage.resolve(str(folder))
    if transcripts:
        table = pa.Table.from_pylist(transcript_rows(), schema=TRANSCRIPTS)
        CommittedDataset(out.join("transcripts")).write_table(table)
    if results:
        table = pa.Table.from_pylist(result_rows(), schema=DOCUMENT_RESULTS)
        CommittedDataset(out.join("results")).write_table(table)
    return folder


def show(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "overnight.jobs.cli", "show", *args],
        env={**(env or os.environ), "PYTHONPATH": str(REPO), "COLUMNS": "100"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_show_prints_a_split_call_as_dialogue_with_one_speaker_label_per_turn(tmp_path):
    out = write_output(tmp_path / "out")
    done = show(str(out), "--source", "call_stereo")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "transcripts: 1 of 3 rows"
    assert "call_stereo.wav  ok  13.5 s  en" in done.stdout and "id ticket-7" in done.stdout
    turns = [line.split()[1] for line in lines if line.startswith("  00:")]
    # The agent's two segments are one turn; the turns alternate in time order.
    assert turns == ["agent", "customer", "agent"]
    assert "  00:00  agent     Good morning, billing department. How can I help you today?" in lines


def test_show_json_parses_and_carries_the_dialogue_turns(tmp_path):
    out = write_output(tmp_path / "out")
    done = show(str(out), "--json")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    by_name = {Path(r["source_uri"]).name: r for r in rows}
    assert set(by_name) == {"call_stereo.wav", "call_billing.wav", "call_corrupt.wav"}
    stereo = by_name["call_stereo.wav"]
    assert [t["speaker"] for t in stereo["turns"]] == ["agent", "customer", "agent"]
    assert stereo["dataset"] == "transcripts" and stereo["processed_at"].startswith("2026-12-03")
    assert by_name["call_corrupt.wav"]["error_code"] == "corrupt_audio"


def test_show_filters_by_status_item_and_source_glob_and_limits_the_rows(tmp_path):
    out = write_output(tmp_path / "out")
    errors = show(str(out), "--status", "error")
    assert errors.returncode == 0
    assert "call_corrupt.wav  error" in errors.stdout and "call_stereo" not in errors.stdout
    assert "error corrupt_audio: cannot open as audio" in errors.stdout
    item = show(str(out), "--item", "bbbbbb")
    assert "call_billing.wav" in item.stdout and "call_stereo" not in item.stdout
    # A mono call prints as wrapped text, without speaker labels.
    assert "  Thank you for calling. I would like to pay my bill of fifty dollars." in item.stdout
    glob = show(str(out), "--source", "call_*", "--limit", "1")
    assert "transcripts: 3 of 3 rows, the first 1 shown (--limit 0 shows all)" in glob.stdout


def test_show_prints_document_results_with_task_label_text_json_and_errors(tmp_path):
    out = write_output(tmp_path / "out", transcripts=False, results=True)
    done = show(str(out), "--limit", "0")
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "call.txt  classify  ok" in text and "  label: billing (0.93)" in text
    assert "call.txt  summarize  ok" in text and "the agent refunds the second payment" in text
    assert '  "amount": 50,' in text  # extract: the JSON, pretty-printed
    assert "locked.pdf  summarize  error" in text
    assert "error encrypted: the PDF is encrypted" in text
    only = show(str(out), "--task", "extract", "--json")
    assert [r["output_json"] for r in json.loads(only.stdout)] == [{"amount": 50, "due": "Friday"}]


def test_show_of_a_chained_output_prints_transcripts_then_results(tmp_path):
    out = write_output(tmp_path / "out", transcripts=True, results=True)
    done = show(str(out), "--item", "a" * 8)  # the call, and its result by source_item_id
    assert done.returncode == 0, done.stderr
    assert done.stdout.index("transcripts: 1 of 3") < done.stdout.index("results: 1 of 4")


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["{tmp}/nowhere"], "no transcripts or results under"),
        (["{tmp}/out", "--source", "no_such_call"], "nothing in"),
        (["{tmp}/out", "--status", "error", "--source", "call_stereo"], "matches --source"),
    ],
)
def test_show_errors_are_one_line_with_exit_status_4_and_no_traceback(tmp_path, args, words):
    write_output(tmp_path / "out")
    done = show(*[a.format(tmp=tmp_path) for a in args])
    assert done.returncode == 4
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("overnight: error: ")
    assert words in done.stderr


def test_show_reads_an_output_on_s3(s3, tmp_path):
    local = write_output(tmp_path / "out", transcripts=True, results=True)
    for name in ("transcripts", "results"):
        # A prefix of its own: the moto server lives for the session (test_report reads one).
        upload_folder(s3, "acme-out", local / name, f"show-test/nightly/{name}")
    done = show("s3://acme-out/show-test/nightly", "--source", "call_stereo", env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    assert "customer  I was charged twice" in done.stdout


FORGED = "\n[overnight] all 3 items ok, nothing failed"


def _named_output(folder: Path, uris: list[str], **extra) -> Path:
    rows = [
        {**transcript_rows()[1], "item_id": f"{n:032d}", "source_uri": uri, **extra}
        for n, uri in enumerate(uris)
    ]
    CommittedDataset(storage.resolve(str(folder)).join("transcripts")).write_table(
        pa.Table.from_pylist(rows, schema=TRANSCRIPTS),
    )
    return folder


def test_names_with_control_characters_print_escaped_and_forge_no_line(tmp_path, capsys):
    from overnight.jobs.cli import main

    out = _named_output(
        tmp_path / "out", [f"/calls/evil{FORGED}\x1b[2K.wav"], tenant=f"acme{FORGED}"
    )
    assert main(["show", str(out)]) == 0
    printed = capsys.readouterr().out
    assert not [line for line in printed.splitlines() if line.startswith("[overnight]")]
    assert "evil\\n[overnight] all 3 items ok, nothing failed\\x1b[2K.wav  ok" in printed
    assert "tenant acme\\n[overnight]" in printed and "\x1b" not in printed
    # The one-line error names the selection as given: escaped too.
    assert main(["show", str(out), "--source", f"nothing{FORGED}"]) == 4
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nothing\\n[overnight]" in err, err


def test_a_name_with_glob_characters_is_selected_by_its_own_name_or_uri(tmp_path, capsys):
    from overnight.jobs.cli import main

    out = _named_output(tmp_path / "out", ["/calls/glob[*]?.wav", "/calls/glob*x.wav"])
    for name in ("glob[*]?.wav", "glob[*]?", "/calls/glob[*]?.wav"):
        assert main(["show", str(out), "--source", name, "--json"]) == 0, name
        got = [r["source_uri"] for r in json.loads(capsys.readouterr().out)]
        assert got == ["/calls/glob[*]?.wav"], name
    # A pattern that is no source's name is still a glob.
    assert main(["show", str(out), "--source", "glob*", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 2


def test_a_transcript_the_model_looped_on_says_so_in_its_heading():
    from overnight.jobs.ops.show import render_transcript

    row = {
        "source_uri": "/calls/ssn.wav",
        "status": "ok",
        "duration_s": 8.0,
        "language": "en",
        "item_id": "0123456789abcdef",
        "run_id": "nightly",
        "text": "My social security number is $200,000, $10,000.",
        "segments": [
            {
                "start": 0.5,
                "end": 7.5,
                "text": "My social security number is $200,000, $10,000.",
                "speaker": None,
                "degenerate": True,
            }
        ],
        "degenerate": True,
    }
    assert "degenerate (the model looped" in render_transcript(row, 100)[0]
    row["degenerate"] = False
    assert "degenerate" not in render_transcript(row, 100)[0]


def test_one_number_tagged_in_two_segments_of_one_turn_reads_as_one_tag():
    # A diarized SSN whose last digits Whisper put in the next segment is one entity, tagged
    # in each segment; joined into the customer's turn it read "is [SSN]. [SSN],".
    row = {
        "segments": [
            {"speaker": "customer", "start": 26.0, "text": "My social security number is [SSN]."},
            {"speaker": "customer", "start": 29.5, "text": "[SSN], okay."},
            {"speaker": "agent", "start": 32.7, "text": "[SSN]. Great, the payment is done."},
            {"speaker": "agent", "start": 35.0, "text": "[CARD_NUMBER] was the card."},
        ]
    }
    assert [(t.speaker, t.text) for t in dialogue(row)] == [
        ("customer", "My social security number is [SSN], okay."),
        ("agent", "[SSN]. Great, the payment is done. [CARD_NUMBER] was the card."),
    ]
