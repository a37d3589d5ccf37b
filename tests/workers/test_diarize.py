"""Diarization of mono calls: speaker turns, words onto speakers, segments split, analytics and
roles. On real voices where ../shared/data exists, on espeak-ng voices otherwise."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from overnight.workers.audio import AudioOptions, speech_clips
from overnight.workers.diarize import (
    OVERTALK_UNMEASURED,
    DiarizeOptions,
    Diarizer,
    Turn,
    assign_speakers,
    dialogue_text,
    first_speaker_roles,
    mono_call_analytics,
    region_mels,
    relabel,
)
from overnight.workers.diarize.encoder import SpeakerEncoder
from overnight.workers.diarize.regions import voice_regions
from tests.conftest import SHARED_DATA
from tests.workers.test_diarize_encoder import diarizer_model_dir  # noqa: F401 (fixture)

SR = 16_000


@pytest.fixture(scope="module")
def encoder(diarizer_model_dir) -> SpeakerEncoder:  # noqa: F811
    return SpeakerEncoder.load(diarizer_model_dir)


def _voices() -> tuple[list[np.ndarray], list[np.ndarray], str]:
    """Phrases of two speakers: LibriSpeech 1089 and 1221 when the shared data is here, else
    two espeak-ng voices that GE2E tells apart (cosine about 0.7; en-us+m3 and en-gb+f4 are 0.85)."""
    audio = SHARED_DATA / "audio"
    if audio.is_dir():
        from faster_whisper.audio import decode_audio

        a = decode_audio(str(audio / "1089-134686-0001.wav"), sampling_rate=SR)
        b = decode_audio(str(audio / "1221-135766-0001.wav"), sampling_rate=SR)
        return [a[: 3 * SR], a[3 * SR :]], [b[: 4 * SR], b[4 * SR : 8 * SR]], "real"
    from overnight.jobs.ops.demo import speak

    a = [
        speak(t, voice="en-us+m3", speed=150)
        for t in (
            "Thank you for calling the help desk, my name is Sam.",
            "I can see the order on my screen, it left the warehouse on Tuesday.",
        )
    ]
    b = [
        speak(t, voice="en-gb-scotland+f2", speed=165)
        for t in (
            "Hello, my order never came and the tracking page says pending.",
            "It was supposed to arrive on Monday, and I paid for express delivery.",
        )
    ]
    return a, b, "espeak"


def _call() -> tuple[np.ndarray, list[tuple[str, float, float]]]:
    a, b, _ = _voices()
    gap = np.zeros(int(0.6 * SR), np.float32)
    parts, reference, t = [], [], 0.0
    for who, piece in (("A", a[0]), ("B", b[0]), ("A", a[1]), ("B", b[1])):
        parts += [piece, gap]
        reference.append((who, t, t + len(piece) / SR))
        t += (len(piece) + len(gap)) / SR
    return np.concatenate(parts), reference


def test_two_speaker_mono_mix_comes_out_as_two_speakers_with_their_words(encoder):
    from faster_whisper import WhisperModel

    from overnight.workers.whisper_models import bundled_model_path

    audio, reference = _call()
    # The job's regions: WebRTC's inside the transcription's clips (``diarize_chunks``); here
    # one clip holds the whole call. Silero's clip alone spans the silent gaps, and windows
    # over a gap and speech made a third speaker of the espeak-ng voices.
    assert len(speech_clips(audio, AudioOptions())) == 1
    result = Diarizer(DiarizeOptions(), encoder)(audio, voice_regions(audio))
    assert result.num_speakers == 2
    # SPEAKER_00 is who spoke first; each turn lands on its constructed speaker.
    truth = {"A": "SPEAKER_00", "B": "SPEAKER_01"}
    for who, start, end in reference:
        inside = [t for t in result.turns if t.start < end - 0.3 and t.end > start + 0.3]
        covered = sum(
            min(t.end, end) - max(t.start, start) for t in inside if t.speaker == truth[who]
        )
        assert covered >= 0.8 * (end - start), (who, start, end, result.turns)

    model = WhisperModel(bundled_model_path(), device="cpu", compute_type="int8")
    segs, _ = model.transcribe(audio, language="en", beam_size=1, word_timestamps=True)
    segments = [
        {
            "start": s.start,
            "end": s.end,
            "text": s.text.strip(),
            "channel": 0,
            "speaker": None,
            "words": [{"word": w.word.strip(), "start": w.start, "end": w.end} for w in s.words],
        }
        for s in segs
    ]
    diarized = assign_speakers(segments, result.turns)
    words = [(w, seg["speaker"]) for seg in diarized for w in seg["words"]]
    right = 0
    for w, speaker in words:
        middle = (w["start"] + w["end"]) / 2
        who = min(reference, key=lambda r: max(r[1] - middle, middle - r[2], 0.0))[0]
        right += speaker == truth[who]
    assert right >= 0.9 * len(words) and len(words) >= 10
    assert {seg["speaker"] for seg in diarized} == {"SPEAKER_00", "SPEAKER_01"}
    assert dialogue_text(diarized).count("\n") >= 3  # four turns as dialogue lines


def test_one_voice_comes_out_as_one_speaker(encoder):
    a, _, _ = _voices()
    audio = np.concatenate([a[0], np.zeros(SR // 2, np.float32), a[1]])
    result = Diarizer(DiarizeOptions(), encoder)(audio)
    assert result.num_speakers == 1
    assert {t.speaker for t in result.turns} == {"SPEAKER_00"}


def test_a_calls_mel_frames_and_speakers_are_the_same_bits_whatever_blas_threads_it_has(
    encoder,
):
    # A Ray decode task diarizes with one BLAS thread; an in-process run or a test has the
    # machine's cores. OpenBLAS rounds the mel product (and the clustering's products and
    # eigen decompositions) differently per thread count: every mel frame of 24 real-voice
    # calls differed in its last bits between one and two threads.
    from threadpoolctl import threadpool_limits

    audio, _ = _call()
    regions = voice_regions(audio)
    diarizer = Diarizer(DiarizeOptions(), encoder)
    got = []
    for threads in (1, 2, 4):
        with threadpool_limits(limits=threads, user_api="blas"):
            got.append((region_mels(audio, regions), diarizer(audio, regions).turns))
    mels, turns = got[0]
    assert sum(len(m) for m in mels) > 500 and len(turns) >= 4
    for other_mels, other_turns in got[1:]:
        assert all(np.array_equal(a, b) for a, b in zip(mels, other_mels, strict=True))
        assert other_turns == turns


def test_clustering_decomposes_each_pruned_graph_once_and_finds_the_same_speakers(
    monkeypatch,
):
    # The estimate, its silhouette and the split into ``overcluster`` clusters ask for the
    # same graphs of the same windows: 17 eigen decompositions where 8 differ, most of the
    # clustering time of a long call (the cost grows as the cube of its windows).
    from overnight.workers.diarize import cluster

    rng = np.random.default_rng(7)
    centres = rng.standard_normal((2, 256))
    emb = np.concatenate([c + 0.9 * rng.standard_normal((150, 256)) for c in centres])
    emb = (emb / np.linalg.norm(emb, axis=1, keepdims=True)).astype(np.float32)
    diarizer = Diarizer(DiarizeOptions(), encoder=object())  # type: ignore[arg-type]
    real_eigh, calls = np.linalg.eigh, []

    def counted(a):
        calls.append(a.shape)
        return real_eigh(a)

    monkeypatch.setattr(np.linalg, "eigh", counted)
    labels = diarizer._cluster(emb)
    assert len(calls) == 8  # one per pruning value of NME-SC
    assert len(np.unique(labels)) == 2 and np.array_equal(labels[:150], labels[:1].repeat(150))
    # Without the shared decompositions (each call its own), the same labels.
    opts, hint = diarizer.options, diarizer.options.hint_speakers
    alone = cluster.spectral(emb, opts, hint)
    alone = cluster.spectral(emb, opts, hint, k=max(len(np.unique(alone)), opts.overcluster))
    shared: cluster.Eigs = {}
    first = cluster.spectral(emb, opts, hint, eigs=shared)
    again = cluster.spectral(
        emb, opts, hint, k=max(len(np.unique(first)), opts.overcluster), eigs=shared
    )
    assert np.array_equal(alone, again) and len(calls) > 8


def test_exact_speaker_count_is_obeyed(encoder):
    audio, _ = _call()
    result = Diarizer(DiarizeOptions(speakers=3), encoder)(audio)
    assert result.num_speakers == 3


def _change_found(weights) -> float:
    """Where ``_turns`` puts the change of a 6 s region whose speaker changes at 3.0 s, from
    1.2 s windows every 0.4 s whose embeddings mix the two voices by their share of it."""
    from overnight.workers.diarize import diarize

    a, b = np.eye(256, dtype=np.float32)[:2]
    spans = [(0, s, 120) for s in range(0, 481, 40)]
    emb = []
    for _, s, w in spans:
        share = np.clip(300 - s, 0, w) / w
        v = share * a + (1 - share) * b
        emb.append(v / np.linalg.norm(v))
    labels = np.array([int(e[1] > e[0]) for e in emb])
    original = diarize.centre_weights
    diarize.centre_weights = weights
    try:
        turns = diarize._turns([np.zeros((600, 40))], [(0.0, 6.0)], spans, np.stack(emb), labels)
    finally:
        diarize.centre_weights = original
    assert [t.speaker for t in turns] == ["SPEAKER_00", "SPEAKER_01"]
    return turns[0].end


def test_a_change_inside_a_region_is_placed_where_the_windows_centred_on_it_agree():
    """Each window speaks most for its centre: a window straddling the change must not pull
    the frames past it to its majority speaker. With equal weights the change lands half a
    step (0.2 s) late."""
    from overnight.workers.diarize.diarize import centre_weights

    assert abs(_change_found(centre_weights) - 3.0) <= 0.05
    assert abs(_change_found(lambda n: np.ones(n)) - 3.0) >= 0.15
    w = centre_weights(120)
    assert w.argmax() in (59, 60) and w.min() > 0


def test_options_refuse_impossible_counts():
    with pytest.raises(ValueError, match="min_speakers"):
        DiarizeOptions(min_speakers=3, max_speakers=2)
    with pytest.raises(ValueError, match="speakers=0"):
        DiarizeOptions(speakers=0)


def _word(word, start, end):
    return {"word": word, "start": start, "end": end, "probability": 0.9}


SEGMENT = {
    "start": 0.0,
    "end": 3.0,
    "text": "Hello, how can I help? My order.",
    "channel": 0,
    "speaker": None,
    "avg_logprob": -0.2,
    "no_speech_prob": 0.01,
    "degenerate": False,
    "words": [
        _word("Hello,", 0.0, 0.4),
        _word("how", 0.5, 0.7),
        _word("can", 0.7, 0.9),
        _word("I", 0.9, 1.0),
        _word("help?", 1.0, 1.4),
        _word("My", 1.9, 2.1),
        _word("order.", 2.1, 3.0),
    ],
}
TURNS = [Turn("SPEAKER_00", 0.0, 1.6), Turn("SPEAKER_01", 1.6, 3.2)]


def test_words_go_to_the_speaker_they_overlap_and_segments_split_at_speaker_changes():
    out = assign_speakers([SEGMENT], TURNS)
    assert [(s["speaker"], s["text"], s["start"], s["end"]) for s in out] == [
        ("SPEAKER_00", "Hello, how can I help?", 0.0, 1.4),
        ("SPEAKER_01", "My order.", 1.9, 3.0),
    ]
    assert all(s["avg_logprob"] == -0.2 and s["channel"] == 0 for s in out)
    assert SEGMENT["speaker"] is None  # the input is not changed
    # A word across a boundary goes where most of it is; turns as plain dicts work too.
    dict_turns = [{"speaker": t.speaker, "start": t.start, "end": t.end} for t in TURNS]
    straddle = {**SEGMENT, "words": [_word("yes", 1.5, 1.9)]}
    assert assign_speakers([straddle], dict_turns)[0]["speaker"] == "SPEAKER_01"


def test_segment_without_words_goes_whole_to_the_speaker_it_overlaps_most():
    seg = {**SEGMENT, "words": None, "start": 1.2, "end": 3.0}
    (out,) = assign_speakers([seg], TURNS)
    assert out["speaker"] == "SPEAKER_01" and out["text"] == SEGMENT["text"]


def test_word_outside_every_turn_goes_to_the_nearest_turn():
    seg = {**SEGMENT, "words": [_word("bye", 5.0, 5.3)]}
    assert assign_speakers([seg], TURNS)[0]["speaker"] == "SPEAKER_01"


def test_mono_analytics_give_talk_turns_silence_and_interruptions_with_overtalk_null():
    segments = assign_speakers(
        [
            {**SEGMENT, "words": [_word("Hello", 0.0, 1.0), _word("there", 1.1, 2.0)]},
            {**SEGMENT, "words": [_word("hi", 2.05, 2.5)]},  # no pause: cut in
            {**SEGMENT, "words": [_word("so", 5.0, 6.0)]},  # after a 2.5 s silence
        ],
        [Turn("SPEAKER_00", 0.0, 2.02), Turn("SPEAKER_01", 2.02, 3.0), Turn("SPEAKER_00", 4.8, 6)],
    )
    a = mono_call_analytics(segments, duration_s=7.0)
    assert a["overtalk_s"] is None and "one speaker per instant" in OVERTALK_UNMEASURED
    assert a["interruptions"] == [{"by": "SPEAKER_01", "of": "SPEAKER_00", "count": 1}]
    by = {s["speaker"]: s for s in a["speakers"]}
    assert by["SPEAKER_00"]["talk_s"] == pytest.approx(3.0)
    assert by["SPEAKER_01"]["talk_s"] == pytest.approx(0.45)
    assert by["SPEAKER_00"]["turns"] == 2 and by["SPEAKER_01"]["turns"] == 1
    assert by["SPEAKER_01"]["interruptions_made"] == 1 and by["SPEAKER_00"]["interrupted"] == 1
    assert a["longest_silence_s"] == pytest.approx(2.5)
    assert a["non_talk_s"] == pytest.approx(7.0 - 3.45)


def test_first_speaker_is_the_agent_and_a_short_blip_does_not_decide():
    turns = [
        Turn("SPEAKER_00", 0.0, 0.2),  # a cough
        Turn("SPEAKER_01", 0.5, 3.0),
        Turn("SPEAKER_00", 3.2, 5.0),
        Turn("SPEAKER_02", 5.2, 6.0),
    ]
    roles = first_speaker_roles(turns)
    assert roles == {"SPEAKER_01": "agent", "SPEAKER_00": "customer", "SPEAKER_02": "SPEAKER_02"}
    (seg,) = relabel([{"speaker": "SPEAKER_01", "text": "hi"}], roles)
    assert seg["speaker"] == "agent"


def test_a_speaker_past_the_roles_never_takes_a_name_a_role_took():
    turns = [Turn(f"SPEAKER_0{i}", i, i + 1.0) for i in range(3)]
    roles = first_speaker_roles(turns, ("agent", "SPEAKER_02"))
    assert roles == {"SPEAKER_00": "agent", "SPEAKER_01": "SPEAKER_02", "SPEAKER_02": "SPEAKER_00"}
    assert len(set(roles.values())) == 3


def test_speech_regions_of_a_quiet_call_are_those_of_the_call_at_normal_level():
    # WebRTC's detector weighs energy: the same call peaking at -40 dBFS had 10.8 s of speech
    # regions against 14.3 s at -20 dBFS, and at -60 dBFS none.
    audio, _ = _call()
    audio = (audio / np.abs(audio).max()).astype(np.float32)
    normal = voice_regions(audio * np.float32(0.1))
    assert sum(b - a for a, b in normal) > 5.0
    for db in (-30.0, -40.0, -60.0):
        quiet = voice_regions(audio * np.float32(10 ** (db / 20)))
        assert len(quiet) == len(normal), db
        assert np.allclose(quiet, normal, atol=0.02), db
    assert voice_regions(np.zeros(SR, np.float32)) == []


def test_speech_regions_join_short_pauses_drop_clicks_and_pad():
    from overnight.workers.diarize.regions import join_runs

    flags = np.zeros(300, bool)
    flags[10:50] = flags[60:100] = True  # 0.1 s pause: one region
    flags[150:153] = True  # a 30 ms click: dropped
    flags[200:260] = True
    assert join_runs(flags, 0.01, 3.0, 0.16, 0.1, 0.05) == [(0.05, 1.05), (1.95, 2.65)]


def test_speech_regions_cover_each_turn_and_stop_at_the_pauses_between_them():
    audio, reference = _call()
    regions = voice_regions(audio)
    for _, start, end in reference:
        covered = sum(max(0.0, min(b, end) - max(a, start)) for a, b in regions)
        assert covered >= 0.8 * (end - start), (start, end, regions)  # phrases start quiet
    # The 0.6 s pauses between turns are not speech: no region spans two turns.
    for (_, _, end), (_, start, _) in itertools.pairwise(reference):
        assert not any(a < end - 0.1 and b > start + 0.1 for a, b in regions), regions


def test_more_speakers_asked_than_a_short_clip_has_windows_is_each_window_its_own_speaker():
    # ``--speakers 4`` on a 2.5 s clip: 3 windows, so 3 eigenvalues, and the gap after the
    # 4th was read past them (IndexError), which stopped the whole job.
    from overnight.workers.diarize import cluster

    rng = np.random.default_rng(3)
    for n in (3, 4, 5):
        emb = rng.standard_normal((n, 256))
        emb /= np.linalg.norm(emb, axis=1, keepdims=True)
        for k in range(1, n + 3):
            labels = cluster.spectral(emb, DiarizeOptions(), 2, k=k)
            assert len(labels) == n and len(np.unique(labels)) == min(k, n), (n, k)


@pytest.mark.parametrize("speakers", [3, 4, 16])
def test_a_short_clip_with_more_speakers_asked_than_it_can_hold_is_diarized(encoder, speakers):
    audio, _ = _call()
    clip = audio[: int(2.5 * SR)]
    result = Diarizer(DiarizeOptions(speakers=speakers), encoder)(clip)
    assert 1 <= result.num_speakers <= speakers
