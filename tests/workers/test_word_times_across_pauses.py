"""A word's time never stretches across a pause the VAD cut out.

The VAD concatenates speech clips that lie seconds apart into one chunk, and Whisper places
words on that concatenation. A word that crosses the seam of two clips by a frame or two
had its start and its end mapped back apart, and so spanned the whole pause: "brothels."
ran 5.68 -> 26.71 s in a 103 s recording with 20 s pauses, "early" 330.45 -> 352.60 s, and
with them went segment times, speaker turns and interruptions. Each word now maps through
the one clip its midpoint falls in, and stays inside it.
"""

from __future__ import annotations

import io
import itertools
import random
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest

from overnight.workers.audio import clip_index, span_to_original_time, to_original_time
from overnight.workers.whisper import WhisperOptions, WhisperWorker, WhisperWorkerConfig
from tests.conftest import SHARED_DATA

# The clips of the tester's recording (one utterance, 20 s of zeros, another, ...), as the
# VAD found them, in seconds of the recording; their seams in the chunk are at 6.59, 11.78
# and 18.34 s.
CLIPS = [(0.02, 6.61), (26.7, 31.89), (51.47, 58.03), (78.16, 83.34)]


def _inside_one_clip(clips, start, end) -> bool:
    return any(a - 1e-9 <= start <= end <= b + 1e-9 for a, b in clips)


def test_a_word_crossing_a_seam_by_a_few_milliseconds_stays_in_its_clip():
    # "brothels." 5.66 -> 6.60 in the chunk, 8 ms past the seam at 6.59: it ran to 26.71 s.
    start, end = span_to_original_time(CLIPS, 5.66, 6.60)
    assert (round(start, 3), round(end, 3)) == (5.68, 6.61)  # the end held at its clip's end
    assert to_original_time(CLIPS, 6.60) == pytest.approx(26.71)  # what it was mapped to


def test_a_word_mostly_after_a_seam_maps_into_the_later_clip_from_its_start():
    # 0.1 s before the seam at 11.78, 0.4 s after: spoken in the clip at 51.47 s.
    start, end = span_to_original_time(CLIPS, 11.68, 12.18)
    assert (round(start, 3), round(end, 3)) == (51.47, 51.87)
    assert to_original_time(CLIPS, 11.68) == pytest.approx(31.79)  # where it began before


def test_a_zero_length_word_on_a_seam_starts_the_later_clip():
    # A word Whisper gave no frames, on the seam: the old mapping put it at the end of the
    # earlier clip, 20 s before the speech it belongs to, as a segment of its own.
    seam = CLIPS[0][1] - CLIPS[0][0]
    assert clip_index(CLIPS, seam) == 1 and clip_index(CLIPS, seam, is_end=True) == 0
    assert span_to_original_time(CLIPS, seam, seam) == (26.7, 26.7)


def test_words_stay_inside_one_clip_keep_their_order_and_never_grow():
    rng = random.Random(7)
    for _ in range(200):
        edges = sorted(rng.uniform(0, 300) for _ in range(2 * rng.randint(1, 6)))
        clips = [(edges[i], edges[i + 1]) for i in range(0, len(edges), 2)]
        total = sum(b - a for a, b in clips)
        cuts = sorted(rng.uniform(0, total) for _ in range(20))
        words = list(itertools.pairwise(cuts))
        mapped = [span_to_original_time(clips, a, b) for a, b in words]
        for (a, b), (start, end) in zip(words, mapped, strict=True):
            assert _inside_one_clip(clips, start, end)
            # Never longer, and never nothing: the midpoint's clip holds part of the word.
            assert 0 < end - start <= b - a + 1e-9
        for (_, end), (start, _) in itertools.pairwise(mapped):
            assert end <= start + 1e-9


def test_a_segment_without_words_may_span_clips_but_its_edges_stay_in_speech():
    start, end = span_to_original_time(CLIPS, 5.0, 12.0, whole=True)
    assert (round(start, 3), round(end, 3)) == (5.02, 51.69)
    # Ends on a seam: the end of the earlier clip, not the start of the next.
    seam = CLIPS[0][1] - CLIPS[0][0]
    assert span_to_original_time(CLIPS, 5.0, seam, whole=True) == (5.02, 6.61)
    # A segment of no length on a seam stays a point, not a span backwards.
    start, end = span_to_original_time(CLIPS, seam, seam, whole=True)
    assert start == end == 26.7


def _segments(output: list[dict], clips, word_timestamps: bool = True) -> list[dict]:
    """The worker's chunk -> recording step alone, without a model."""
    opts = WhisperOptions(word_timestamps=word_timestamps)
    worker = SimpleNamespace(config=SimpleNamespace(whisper=opts))
    total = sum(b - a for a, b in clips)
    chunk = SimpleNamespace(channel=0, clips=clips, features=np.zeros((80, int(total * 100))))
    return WhisperWorker._segments(worker, chunk, output, {})  # type: ignore[arg-type]


def _segment(text, start, end, words) -> dict:
    return {
        "text": text,
        "start": start,
        "end": end,
        "avg_logprob": -0.2,
        "no_speech_prob": 0.01,
        "words": [{"word": w, "start": a, "end": b, "probability": 0.9} for w, a, b in words or []],
    }


def test_segments_are_their_words_in_recording_time_with_no_word_across_a_pause():
    seam = CLIPS[0][1] - CLIPS[0][0]
    output = [
        _segment("light up here brothels.", 5.0, 6.60, [("here", 5.0, 5.66), ("brothels.", 5.66, 6.60)]),
        _segment("After early nightfall", seam, 13.0, [
            ("After", seam, seam),
            ("early", seam, seam + 0.45),
            ("nightfall", seam + 0.45, 13.0),
        ]),
    ]  # fmt: skip
    segments = _segments(output, CLIPS)
    for s in segments:
        for w in s["words"]:
            assert _inside_one_clip(CLIPS, w["start"], w["end"]), w
        assert (s["start"], s["end"]) == (s["words"][0]["start"], s["words"][-1]["end"])
    first, second = segments
    assert (first["words"][-1]["start"], first["words"][-1]["end"]) == (5.68, 6.61)
    assert (first["start"], first["end"]) == (5.02, 6.61)
    # The utterance starts in the clip at 26.7 s, not at the end of the one before.
    assert second["start"] == 26.7 and second["words"][1]["end"] == 27.15


def test_segments_without_word_timestamps_keep_their_span():
    (segment,) = _segments([_segment("a long one", 5.0, 12.0, None)], CLIPS, False)
    assert (segment["start"], segment["end"], segment["words"]) == (5.02, 51.69, None)


# The real tiny.en model on the tester's recording: two LibriSpeech utterances, each
# followed by 20 s of zeros, twice (103 s).
SHARED = SHARED_DATA / "audio"


@pytest.fixture(scope="module")
def paused_recording() -> tuple[bytes, list[tuple[float, float]]]:
    sf = pytest.importorskip("soundfile")
    files = [SHARED / "1089-134686-0001.wav", SHARED / "1221-135766-0002.wav"]
    if not all(f.exists() for f in files):
        pytest.skip("the shared LibriSpeech recordings are not here")
    (a, rate), (b, _) = (sf.read(f) for f in files)
    pause = np.zeros(rate * 20)
    parts = [a, pause, b, pause, a, pause, b, pause]
    spoken, at = [], 0.0
    for p in parts:
        if p is not pause:
            spoken.append((at, at + len(p) / rate))
        at += len(p) / rate
    buf = io.BytesIO()
    sf.write(buf, np.concatenate(parts), rate, format="WAV")
    return buf.getvalue(), spoken


def test_words_of_a_recording_with_long_pauses_stay_in_the_utterance_they_were_said_in(
    paused_recording,
):
    from overnight.schemas.stages import DECODED
    from overnight.workers.audio import AudioChunker, AudioOptions

    data, spoken = paused_recording
    decoded = AudioChunker(AudioOptions())(data).record("paused", "mem://paused")
    worker = WhisperWorker(
        WhisperWorkerConfig(
            whisper=WhisperOptions(batch_size=8, beam_size=5, cpu_threads=2, word_timestamps=True)
        )
    )
    (row,) = worker(pa.Table.from_pylist([decoded], schema=DECODED)).to_pylist()
    assert row["status"] == "ok"
    # The VAD pads speech by 0.4 s; no word may reach further into a pause than that.
    padded = [(a - 0.45, b + 0.45) for a, b in spoken]
    words = [w for s in row["segments"] for w in s["words"]]
    assert len(words) >= 40
    for w in words:
        assert _inside_one_clip(padded, w["start"], w["end"]), w
    for s in [s for s in row["segments"] if s["words"]]:
        assert s["start"] < s["end"]
        assert (s["start"], s["end"]) == (s["words"][0]["start"], s["words"][-1]["end"])


def test_a_long_recordings_speaker_turn_starting_on_a_seam_starts_after_the_pause():
    # diarize_chunks (recordings too long to keep decoded) mapped a turn's two ends apart:
    # one starting on the seam of two clips began at the earlier clip's end, 20 s before
    # anyone spoke, and took that pause as talk time.
    import numpy as np

    from overnight.workers.audio import Chunk
    from overnight.workers.diarize.diarize import Diarization, Turn
    from overnight.workers.diarize.speech import diarize_chunks

    clips = [(0.0, 4.0), (24.0, 28.0)]  # 4 s of speech, 20 s of silence, 4 s of speech
    chunk = Chunk(0, clips, None, speech=np.zeros(8 * 16_000, np.float32))

    def diarizer(audio, regions):  # turns in the chunk's time, the second from the seam
        return Diarization([Turn("SPEAKER_00", 0.0, 4.0), Turn("SPEAKER_01", 4.0, 8.0)], 2)

    found = diarize_chunks(diarizer, [chunk])  # type: ignore[arg-type]
    assert [(t.speaker, t.start, t.end) for t in found.turns] == [
        ("SPEAKER_00", 0.0, 4.0),
        ("SPEAKER_01", 24.0, 28.0),
    ]
