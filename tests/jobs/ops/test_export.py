"""Specifications for `overnight export`: one file a recording, read back by maintained parsers."""

from __future__ import annotations

import hashlib
import itertools
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import srt
import webvtt

from overnight.jobs.errors import ConfigError, InputNotFound
from overnight.jobs.ops.export import export
from overnight.schemas.tables import TRANSCRIPTS

T0 = datetime(2026, 12, 1, tzinfo=UTC)
SEGMENTS = [
    {
        "start": 0.0,
        "end": 2.5,
        "text": " Thank you for calling, how can I help?",
        "channel": 0,
        "speaker": "agent",
    },
    {
        "start": 2.8,
        "end": 5.25,
        "text": " I'd like to check my order status please.",
        "channel": 1,
        "speaker": "customer",
    },
    {"start": 3605.5, "end": 3607.0, "text": " Of course.", "channel": 0, "speaker": "agent"},
]


def _row(item: str, uri: str, status: str = "ok", when: int = 0, **kw) -> dict:
    return {
        "item_id": item,
        "source_uri": uri,
        "status": status,
        "run_id": f"r{when}",
        "processed_at": T0 + timedelta(minutes=when),
        "text": " ".join(s["text"].strip() for s in SEGMENTS) if status == "ok" else None,
        "segments": SEGMENTS if status == "ok" else None,
        "duration_s": 3607.0,
        "channel_labels": ["agent", "customer"],
        "error_code": None if status == "ok" else "decode_failed",
        **kw,
    }


@pytest.fixture
def output(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    (out / "transcripts").mkdir(parents=True)
    rows = [
        _row("a1", "s3://calls/2026/call-1.wav"),
        _row("b2", "s3://calls/2026/call-2.wav", status="error"),  # never succeeded
        _row("c3", "s3://calls/other/call-3.flac", status="error"),
        _row("c3", "s3://calls/other/call-3.flac", when=5),  # a rerun's newer ok row
    ]
    for n, row in enumerate(rows):  # one commit file a row, as actor calls write them
        pq.write_table(
            pa.Table.from_pylist([row], schema=TRANSCRIPTS),
            out / "transcripts" / f"part-{n}.parquet",
        )
    return out


def test_srt_reads_back_with_the_same_cues_and_speaker_labels(output: Path, tmp_path: Path):
    summary = export(str(output), str(tmp_path / "srt"), "srt")
    assert summary["files"] == 2 and summary["items_without_transcript"] == 1
    subs = list(srt.parse((tmp_path / "srt" / "call-1.srt").read_text()))
    assert [(s.start.total_seconds(), s.end.total_seconds()) for s in subs] == [
        (seg["start"], seg["end"]) for seg in SEGMENTS
    ]
    assert [s.content.replace("\n", " ") for s in subs] == [
        f"{seg['speaker']}: {seg['text'].strip()}" for seg in SEGMENTS
    ]


def test_vtt_reads_back_with_the_same_cues_and_voice_labels(output: Path, tmp_path: Path):
    export(str(output), str(tmp_path / "vtt"), "vtt")
    captions = webvtt.read(str(tmp_path / "vtt" / "call-3.vtt"))
    assert [(c.start, c.end) for c in captions] == [
        ("00:00:00.000", "00:00:02.500"),
        ("00:00:02.800", "00:00:05.250"),
        ("01:00:05.500", "01:00:07.000"),
    ]
    assert [c.raw_text.replace("\n", " ") for c in captions] == [
        f"<v {seg['speaker']}>{seg['text'].strip()}</v>" for seg in SEGMENTS
    ]
    assert [c.voice for c in captions] == [seg["speaker"] for seg in SEGMENTS]


def test_txt_and_json_carry_the_dialogue(output: Path, tmp_path: Path):
    export(str(output), str(tmp_path / "txt"), "txt")
    lines = (tmp_path / "txt" / "call-1.txt").read_text().splitlines()
    assert lines[0] == "[00:00:00] agent: Thank you for calling, how can I help?"
    assert lines[2].startswith("[01:00:05] agent: Of course.")
    export(str(output), str(tmp_path / "json"), "json")
    doc = json.loads((tmp_path / "json" / "call-3.json").read_text())
    assert [s["speaker"] for s in doc["segments"]] == ["agent", "customer", "agent"]
    assert doc["run_id"] == "r5"  # the newest ok row


def test_json_carries_word_timings_entities_and_nulls_for_what_the_job_did_not_fill(
    tmp_path: Path,
):
    out = tmp_path / "out"
    (out / "transcripts").mkdir(parents=True)
    words = [
        {"word": " Card", "start": 0.1, "end": 0.4, "probability": 0.9},
        {"word": " [CARD_NUMBER]", "start": 0.5, "end": 2.0, "probability": 0.75},
    ]
    redacted = [{**SEGMENTS[0], "text": " Card [CARD_NUMBER]", "words": words}]
    entity = {"type": "CARD_NUMBER", "start_char": 6, "end_char": 25, "start_s": 0.5}
    rows = [
        _row(
            "a1", "s3://calls/redacted.wav", segments=redacted, entities=[entity | {"end_s": 2.0}]
        ),
        _row("b2", "s3://calls/plain.wav"),
    ]
    pq.write_table(
        pa.Table.from_pylist(rows, schema=TRANSCRIPTS), out / "transcripts" / "p.parquet"
    )
    export(str(out), str(tmp_path / "json"), "json")
    doc = json.loads((tmp_path / "json" / "redacted.json").read_text())
    [seg] = doc["segments"]
    assert seg["words"] == [w | {"probability": round(w["probability"], 4)} for w in words]
    assert seg["channel"] == 0 and seg["speaker"] == "agent"
    assert doc["entities"] == [entity | {"end_s": 2.0, "score": None}]
    plain = json.loads((tmp_path / "json" / "plain.json").read_text())
    # No word timestamps, no redaction, no analytics: null, not an empty list that reads as
    # "none found".
    assert plain["entities"] is None and plain["analytics"] is None
    assert {s["words"] for s in plain["segments"]} == {None}


def test_a_rerun_overwrites_instead_of_adding_files(output: Path, tmp_path: Path):
    export(str(output), str(tmp_path / "e"), "srt")
    export(str(output), str(tmp_path / "e"), "srt")
    assert sorted(p.name for p in (tmp_path / "e").iterdir()) == ["call-1.srt", "call-3.srt"]


def test_a_large_export_runs_as_ray_tasks_with_the_same_files(output: Path, tmp_path: Path):
    summary = export(str(output), str(tmp_path / "ray"), "srt", ray_threshold=1)
    assert summary["written_by"] == "ray" and summary["files"] == 2
    export(str(output), str(tmp_path / "local"), "srt")
    for name in ("call-1.srt", "call-3.srt"):
        assert (tmp_path / "ray" / name).read_text() == (tmp_path / "local" / name).read_text()


def test_bad_format_and_missing_transcripts_are_clear_errors(output: Path, tmp_path: Path):
    with pytest.raises(ConfigError, match="srt, vtt, txt, json"):
        export(str(output), str(tmp_path / "x"), "docx")
    with pytest.raises(InputNotFound, match="no transcripts/"):
        export(str(tmp_path / "empty"), str(tmp_path / "x"), "srt")


def test_the_export_command_writes_the_files_and_says_what_it_left_out(output: Path, tmp_path):
    import subprocess
    import sys

    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "overnight.jobs.cli",
            "export",
            str(output),
            str(tmp_path / "d"),
            "--format",
            "vtt",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert (
        "wrote 2 vtt file(s)" in done.stdout
        and "1 recording(s) have only error rows" in done.stdout
    )
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["call-1.vtt", "call-3.vtt"]
    missing = subprocess.run(
        [
            sys.executable,
            "-m",
            "overnight.jobs.cli",
            "export",
            str(tmp_path / "nothing"),
            str(tmp_path / "e"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert missing.returncode == 4 and "Traceback" not in missing.stderr
    assert "no transcripts/ dataset" in missing.stderr


def _tag(uri: str) -> str:
    """The tag a colliding or cut name carries: from the source URI, so that it stays the same
    when the recording is transcribed again under a new item id."""
    return "-" + hashlib.sha256(uri.encode()).hexdigest()[:12]


def _output_of(tmp_path: Path, rows: list[dict]) -> Path:
    out = tmp_path / "named"
    (out / "transcripts").mkdir(parents=True)
    pq.write_table(
        pa.Table.from_pylist(rows, schema=TRANSCRIPTS), out / "transcripts" / "part-0.parquet"
    )
    return out


def test_export_to_an_existing_file_is_exit_11_in_one_line_without_a_traceback(
    output: Path, tmp_path: Path, capsys
):
    from overnight.jobs.cli import main

    (tmp_path / "taken").write_text("a file where the folder would go")
    assert main(["export", str(output), str(tmp_path / "taken")]) == 11
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "it is a file, not a folder" in err
    assert (tmp_path / "taken").read_text() == "a file where the folder would go"


@pytest.mark.parametrize(
    "inside", ["transcripts", "transcripts/run_date=2026-12-01", "costs", "runs", "_claims"]
)
def test_export_into_the_outputs_own_datasets_is_exit_2_and_writes_nothing(
    output: Path, inside: str, capsys
):
    from overnight.jobs.cli import main

    before = sorted(output.rglob("*"))
    assert main(["export", str(output), str(output / inside), "--format", "json"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert sorted(output.rglob("*")) == before
    pq.read_table(output / "transcripts")  # the dataset still reads as one table


def test_export_beside_the_datasets_inside_output_is_allowed(output: Path):
    assert export(str(output), str(output / "subtitles"), "srt")["files"] == 2


def test_export_of_251_character_names_writes_names_that_fit_and_stay_apart(tmp_path: Path):
    long = "x" * 200 + "é" * 25 + "y"  # 251 characters, 276 bytes of UTF-8
    rows = [
        _row("a" * 16, f"s3://calls/{long}a.wav"),
        _row("b" * 16, f"s3://calls/{long}b.wav"),
        _row("c" * 16, f"/calls/{'z' * 251}.wav"),
    ]
    out = _output_of(tmp_path, rows)
    for fmt in ("srt", "json"):
        assert export(str(out), str(tmp_path / fmt), fmt)["files"] == 3
        names = sorted(p.name for p in (tmp_path / fmt).iterdir())
        assert len(names) == 3 and all(len(n.encode()) <= 255 for n in names), names
        # Cut names carry their source's tag: the two that share 250 characters stay apart.
        assert any(n.endswith(f"{_tag(rows[0]['source_uri'])}.{fmt}") for n in names)
        assert any(n.endswith(f"{_tag(rows[1]['source_uri'])}.{fmt}") for n in names)
        assert not list((tmp_path / fmt).glob(".*"))  # no temporary file left


# What the words may hold: markup characters, the cue arrow, an entity written out, and a
# turn of 300 characters (wrapped over lines, one word with a hyphen, one long word).
HARD_TEXT = [
    "I pay AT&T <5 dollars",
    "the arrow --> inside a turn, x > y & y < z, <b>not bold</b> and &amp; as typed",
    "-->",
    (
        "so the well-known plan https://example.com/plans/a-very-long-path-that-does-not-wrap "
        + "and then I said the same thing again " * 6
    ).strip()[:300],
]


def _hard_output(tmp_path: Path) -> Path:
    assert len(HARD_TEXT[-1]) == 300
    segments = [
        {"start": float(n), "end": n + 0.5, "text": f" {t}", "channel": n % 2, "speaker": None}
        for n, t in enumerate(HARD_TEXT)
    ]
    row = _row("h1", "s3://calls/hard.wav", segments=segments, text=" ".join(HARD_TEXT))
    row["channel_labels"] = ["agent", "A&B <team>"]  # a label that needs escaping too
    return _output_of(tmp_path, [row])


def test_srt_text_with_markup_and_arrows_reads_back_identically(tmp_path: Path):
    out = _hard_output(tmp_path)
    export(str(out), str(tmp_path / "srt"), "srt")
    subs = list(srt.parse((tmp_path / "srt" / "hard.srt").read_text()))
    labels = ["agent", "A&B <team>"]
    # A turn longer than a cue holds is several cues of its speaker (subtitle size); the
    # speakers alternate here, so each run of one speaker's cues reads back as its turn.
    turns: list[list[str]] = []
    for s in subs:
        who, said = s.content.replace("\n", " ").split(": ", 1)
        if turns and turns[-1][0] == who:
            turns[-1][1] += " " + said
        else:
            turns.append([who, said])
    assert turns == [[labels[n % 2], t] for n, t in enumerate(HARD_TEXT)]
    assert len(subs) > len(HARD_TEXT)
    assert [s.start.total_seconds() for s in subs][:1] == [0.0]
    # Every line fits 42 characters but the long word (a URL), which is never broken.
    lines = [line for s in subs for line in s.content.splitlines()]
    assert all(len(line) <= 42 or "https://" in line for line in lines)


def test_vtt_text_with_markup_and_arrows_reads_back_identically(tmp_path: Path):
    import html

    out = _hard_output(tmp_path)
    export(str(out), str(tmp_path / "vtt"), "vtt")
    body = (tmp_path / "vtt" / "hard.vtt").read_text()
    captions = webvtt.from_string(body)
    # webvtt-py strips the cue tags and keeps character references as written; decoding
    # them is the last step of the WebVTT cue text parsing rules (what a player does).
    turns: list[list[str]] = []
    for c in captions:
        who, said = html.unescape(c.voice), html.unescape(c.text).replace("\n", " ")
        if turns and turns[-1][0] == who:
            turns[-1][1] += " " + said
        else:
            turns.append([who, said])
    assert turns == [[["agent", "A&B <team>"][n % 2], t] for n, t in enumerate(HARD_TEXT)]
    # the only arrows are the cue timings', one per cue
    assert body.count("-->") == len(captions)


# A diarized one-speaker stretch: Whisper's segment runs 28 s, far past what a subtitle shows.
LONG_SAID = (
    "Okay so I called last week about the bill, and the lady said it would be fixed by "
    "Friday. It was not fixed, I still see the late fee on my statement and the amount is "
    "wrong again, so I want to know what happened and who I can talk to about getting the "
    "credit back on my account before the next payment comes out of my checking account."
)


def _long_segment(with_words: bool) -> dict:
    tokens = LONG_SAID.split()
    step = 28.0 / len(tokens)
    words = [
        {
            "word": f" {t}",
            "start": 1.0 + n * step,
            "end": 1.0 + (n + 0.8) * step,
            "probability": 0.9,
        }
        for n, t in enumerate(tokens)
    ]
    return {
        "start": 1.0,
        "end": 29.0,
        "text": f" {LONG_SAID}",
        "channel": 0,
        "speaker": "SPEAKER_00",
        "words": words if with_words else None,
    }


@pytest.mark.parametrize("with_words", [True, False], ids=["word timings", "no word timings"])
def test_a_long_segment_becomes_subtitle_sized_cues_of_two_lines_and_seven_seconds(
    tmp_path: Path, with_words: bool
):
    seg = _long_segment(with_words)
    out = _output_of(tmp_path, [_row("l1", "s3://calls/long.wav", segments=[seg])])
    export(str(out), str(tmp_path / "srt"), "srt")
    subs = list(srt.parse((tmp_path / "srt" / "long.srt").read_text()))
    assert len(subs) >= 4
    for s in subs:
        lines = s.content.splitlines()
        assert len(lines) <= 2 and all(len(line) <= 42 for line in lines), lines
        assert 0 < (s.end - s.start).total_seconds() <= 7.0
        assert lines[0].startswith("SPEAKER_00: ")
    said = [s.content.replace("\n", " ").removeprefix("SPEAKER_00: ") for s in subs]
    assert " ".join(said) == LONG_SAID  # nothing lost, nothing repeated
    times = [(s.start.total_seconds(), s.end.total_seconds()) for s in subs]
    assert times[0][0] == 1.0 and times[-1][1] == 29.0
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(times))
    if with_words:
        # Each cue is timed by its own words: it ends where its last word ends.
        ends = {round(w["end"], 3) for w in seg["words"]}
        assert all(round(end, 3) in ends for _, end in times[:-1])
    export(str(out), str(tmp_path / "vtt"), "vtt")
    captions = webvtt.read(str(tmp_path / "vtt" / "long.vtt"))
    assert [c.text.replace("\n", " ") for c in captions] == said
    assert {c.voice for c in captions} == {"SPEAKER_00"}


def test_a_cue_cut_early_ends_at_its_last_clause_rather_than_mid_clause(tmp_path: Path):
    seg = _long_segment(with_words=True)
    out = _output_of(tmp_path, [_row("l1", "s3://calls/long.wav", segments=[seg])])
    export(str(out), str(tmp_path / "srt"), "srt")
    subs = list(srt.parse((tmp_path / "srt" / "long.srt").read_text()))
    first = subs[0].content.replace("\n", " ")
    assert first == "SPEAKER_00: Okay so I called last week about the bill,"


def test_a_redacted_segment_splits_with_its_tags_whole_and_timed_by_its_words(tmp_path: Path):
    said = (
        "My card number is [CARD_NUMBER] and the expiry is [DATE], and my social is [SSN] "
        "if you need it for the account"
    )
    tokens = said.split()
    words = [
        {"word": f" {t}", "start": 2.0 + n, "end": 2.5 + n, "probability": 0.9}
        for n, t in enumerate(tokens)
    ]
    seg = {"start": 2.0, "end": 2.0 + len(tokens), "text": f" {said}", "channel": 1}
    seg |= {"speaker": "customer", "words": words}
    out = _output_of(tmp_path, [_row("r1", "s3://calls/red.wav", segments=[seg])])
    export(str(out), str(tmp_path / "srt"), "srt")
    subs = list(srt.parse((tmp_path / "srt" / "red.srt").read_text()))
    assert len(subs) > 1
    assert " ".join(s.content.replace("\n", " ").removeprefix("customer: ") for s in subs) == said
    assert all((s.end - s.start).total_seconds() <= 7.0 for s in subs)
    starts = {w["start"] for w in words}
    assert all(s.start.total_seconds() in starts for s in subs)
