"""Redaction in the transcription job, end to end on Ray, the bundled tiny.en and espeak-ng
calls, through the command line: what the rows, the ledger, the summary and every file under
OUTPUT say, and that no card digits are anywhere but in transcripts_unredacted/ when asked."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from overnight.jobs.cli import main
from overnight.jobs.dataset import storage
from overnight.jobs.dataset.commits import CommittedDataset
from overnight.jobs.documents import transcript_records
from overnight.jobs.errors import ConfigError
from overnight.jobs.ops.demo import espeak_available, stereo_dialogue, write_wav
from overnight.jobs.process import task_spec
from overnight.jobs.spec import build_spec
from overnight.schemas import TRANSCRIPTS
from overnight.schemas.stages import DECODED, DOC_INPUT
from overnight.workers.llm.engine_options import EngineOptions
from overnight.workers.llm.worker import LLMWorker, LLMWorkerConfig
from tests.jobs.test_transcribe import rows

pytestmark = [
    pytest.mark.skipif(not espeak_available(), reason="espeak-ng not installed"),
    pytest.mark.usefixtures("ray_local"),
]

CARD = "4539 1488 0343 6467"  # Luhn-valid
SPOKEN = "four five three nine, one four eight eight, oh three four three, six four six seven"
TURNS = (
    ("agent", "Thank you for calling, what is the card number?"),
    ("customer", f"The card number is {SPOKEN}."),
    ("agent", "And my social security number is needed too?"),
    ("customer", "No, thank you, that is all."),
)


def leaks(text: str, heard: str) -> list[str]:
    """The card in ``text``: the true number or the digits Whisper heard (``heard``), with or
    without spaces, or any 8 consecutive digits of either in the text's digits (separators
    ignored)."""
    found = [form for form in (CARD, CARD.replace(" ", ""), heard) if form and form in text]
    stream = re.sub(r"[\s,.\-]", "", text)
    for digits in (CARD.replace(" ", ""), heard):
        found += [digits[i : i + 8] for i in range(len(digits) - 7) if digits[i : i + 8] in stream]
    return found


def every_file(root: Path) -> dict[str, str]:
    """Each file under ``root`` as text (Parquet files as their rows)."""
    out = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        if path.suffix == ".parquet":
            out[str(path)] = json.dumps(pq.read_table(path).to_pylist(), default=str)
        else:
            out[str(path)] = path.read_bytes().decode("utf-8", "replace")
    return out


class RecordingBackend:
    """The real engine, with every conversation it is asked to complete kept."""

    def __init__(self, inner):
        self.inner, self.prompts = inner, []

    def generate(self, conversations, params):
        self.prompts.extend(conversations)
        return self.inner.generate(conversations, params)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def chain_job(path: Path, input_: str, output: str) -> Path:
    path.write_text(
        "[job]\n"
        'kind = "chain"\n'
        f'input = "{input_}"\n'
        f'output = "{output}"\n'
        'run_id = "redacted"\n'
        "[transcribe]\n"
        'channel_labels = ["agent", "customer"]\n'
        'redact = ["pci", "ssn"]\n'
        "keep_unredacted = true\n"
        "[process]\n"
        'task = "call_summary"\n'
        'backend = "ctranslate2"\n'
        "max_new_tokens = 40\n"
        "summary_words = 25\n"
    )
    return path


def test_redacted_chain_writes_tags_entities_a_ledger_stage_and_no_card_digits_anywhere(
    tmp_path, capfd
):
    calls = tmp_path / "calls"
    calls.mkdir()
    write_wav(calls / "card.wav", stereo_dialogue(TURNS, gap_s=0.4)[0])
    out = tmp_path / "out"
    code = main(["run", str(chain_job(tmp_path / "job.toml", str(calls), str(out)))])
    captured = capfd.readouterr()
    assert code == 0, captured.err
    (row,) = rows(out)
    assert row["status"] == "ok"
    assert "[CARD_NUMBER]" in row["text"], row["text"]
    assert any(w["word"] == "[CARD_NUMBER]" for s in row["segments"] for w in s["words"])
    (card,) = [e for e in row["entities"] if e["type"] == "card_number"]
    assert 0 < card["start_s"] < card["end_s"] <= row["duration_s"]
    assert json.loads(row["options"])["word_timestamps"] is True
    assert row["redact_s"] > 0

    # The original is in transcripts_unredacted/ only, and the recognizer saw the number.
    (original,) = rows(out, "transcripts_unredacted")
    assert original["item_id"] == row["item_id"]
    span = original["text"][card["start_char"] : card["end_char"]]
    heard = re.sub(r"\D", "", span)
    assert len(heard) >= 8, span

    costs = rows(out, "costs")
    assert {"fetch", "decode", "transcribe", "redact", "generate"} <= {c["stage"] for c in costs}
    summary = json.loads((out / "runs" / "redacted.json").read_text())
    assert summary["redacted_entities"]["card_number"] == 1
    assert summary["options"]["redact"] == ["card_number", "cvv", "expiry", "ssn", "bank_account"]
    assert "redacting card_number, cvv, expiry, ssn, bank_account" in captured.err
    (result,) = rows(out, "results")
    assert result["status"] == "ok" and result["output_text"].strip()

    # No card digits in any file under OUTPUT but the opt-in originals, nor on the terminal.
    files = every_file(out)
    unredacted = [f for f in files if "/transcripts_unredacted/" in f]
    assert unredacted and any(leaks(files[f], heard) for f in unredacted)
    leaked = {f: leaks(t, heard) for f, t in files.items() if f not in unredacted}
    assert {f: found for f, found in leaked.items() if found} == {}
    assert leaks(captured.out + captured.err, heard) == []

    # What the chain's LLM is asked: the documents its process stage reads from this output,
    # through the real worker and engine, every prompt kept. Tags, never the number.
    records = transcript_records(storage.resolve(str(out / "transcripts")), "call_summary")
    spec = build_spec(
        overrides={
            "job": {"input": "x", "output": "y"},
            "process": {"task": "call_summary", "backend": "ctranslate2", "max_new_tokens": 8},
        }
    )
    worker = LLMWorker(
        LLMWorkerConfig(
            task=task_spec("call_summary", spec.process),
            engine=EngineOptions(backend="ctranslate2"),
        )
    )
    worker.backend = RecordingBackend(worker.backend)
    worker(pa.Table.from_pylist(records, schema=DOC_INPUT))
    prompts = json.dumps(worker.backend.prompts)
    assert "[CARD_NUMBER]" in prompts
    assert leaks(prompts, heard) == []

    # Retention reaches the originals: vacuuming the run's night removes its unredacted rows.
    from datetime import UTC, datetime, timedelta

    from overnight.jobs.ops.vacuum import vacuum

    tomorrow = datetime.now(UTC).date() + timedelta(days=1)
    assert unredacted[0] in vacuum(str(out), tomorrow).files
    assert not [f for f in every_file(out) if "/transcripts_unredacted/" in f]


def test_export_redacted_only_refuses_an_output_with_unredacted_transcripts(tmp_path, capsys):
    out = tmp_path / "out"
    base = {
        "source_uri": "calls/a.wav",
        "status": "ok",
        "segments": [],
        "run_id": "r",
    }
    CommittedDataset(storage.resolve(str(out / "transcripts"))).write_table(
        pa.Table.from_pylist(
            [
                {**base, "item_id": "a", "text": "my card is [CARD_NUMBER]", "entities": []},
                {**base, "item_id": "b", "source_uri": "calls/b.wav", "text": "plain"},
            ],
            schema=TRANSCRIPTS,
        ),
    )
    assert (
        main(["export", str(out), str(tmp_path / "txt"), "--format", "txt", "--redacted-only"]) == 2
    )
    assert "1 of 2 transcripts" in capsys.readouterr().err
    assert not (tmp_path / "txt").exists()
    assert main(["export", str(out), str(tmp_path / "txt"), "--format", "txt"]) == 0


def test_redact_names_unknown_types_and_needs_redact_for_its_options():
    with pytest.raises(ConfigError, match=r"unknown redaction type 'passport'.*card_number"):
        build_spec(
            overrides={"job": {"input": "a", "output": "b"}, "transcribe": {"redact": ["passport"]}}
        )
    with pytest.raises(ConfigError, match="need `redact`"):
        build_spec(
            overrides={
                "job": {"input": "a", "output": "b"},
                "transcribe": {"keep_unredacted": True},
            }
        )
    spec = build_spec(
        overrides={"job": {"input": "a", "output": "b"}, "transcribe": {"redact": "pci"}}
    )
    assert spec.transcribe.redact == ["card_number", "cvv", "expiry", "bank_account"]
    assert spec.transcribe.word_timestamps is True
    off = build_spec(
        overrides={
            "job": {"input": "a", "output": "b"},
            "transcribe": {"redact": ["ssn"], "word_timestamps": False},
        }
    )
    assert off.transcribe.word_timestamps is False
    plain = build_spec(overrides={"job": {"input": "a", "output": "b"}})
    assert plain.transcribe.word_timestamps is False and plain.transcribe.redact == []


SPELLED = {
    w: str(i)
    for i, w in enumerate(
        ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    )
} | {"oh": "0"}


def said_digits(text: str) -> str:
    """Every digit the text says, written or spelled out, in order."""
    words = re.findall(r"[a-z]+|\d", text.lower())
    return "".join(SPELLED.get(w, w if w.isdigit() else "") for w in words)


def test_redacted_audio_is_flac_of_the_same_shape_and_says_none_of_the_card(tmp_path):
    from overnight.workers.audio import AudioChunker, AudioOptions
    from overnight.workers.redact.audio import decode_pcm
    from overnight.workers.whisper import WhisperOptions, WhisperWorker, WhisperWorkerConfig

    calls = tmp_path / "calls"
    calls.mkdir()
    write_wav(calls / "card.wav", stereo_dialogue(TURNS, gap_s=0.4)[0])
    out = tmp_path / "out"
    code = main(
        [
            "transcribe",
            str(calls),
            str(out),
            "--channel-labels",
            "agent,customer",
            "--redact",
            "pci",
            "--redact-audio",
            "--quiet",
        ]
    )
    assert code == 0
    (row,) = rows(out)
    assert [e["type"] for e in row["entities"]].count("card_number") == 1
    (flac,) = list((out / "redacted_audio").iterdir())
    assert flac.name.startswith("card-") and flac.suffix == ".flac"
    original, rate = decode_pcm((calls / "card.wav").read_bytes())
    redacted, redacted_rate = decode_pcm(flac.read_bytes())
    assert redacted_rate == rate and redacted.shape == original.shape

    # The redacted recording through tiny.en again, the channels apart as in the job.
    decoded = AudioChunker(AudioOptions())(flac.read_bytes(), split_channels=True)
    record = decoded.record(
        "again", "mem://again", split=True, channel_labels=["agent", "customer"]
    )
    worker = WhisperWorker(WhisperWorkerConfig(whisper=WhisperOptions(cpu_threads=2)))
    (again,) = worker(pa.Table.from_pylist([record], schema=DECODED)).to_pylist()
    heard = said_digits(again["text"])
    card = CARD.replace(" ", "")
    assert not [card[i : i + 4] for i in range(len(card) - 3) if card[i : i + 4] in heard], again[
        "text"
    ]
    assert "thank you for calling" in again["text"].lower()  # the rest is still there
