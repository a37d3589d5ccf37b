"""Diarization of mono calls, scored: DER, speaker-count accuracy, word attribution, roles, speed.

Evaluation calls are built, so the reference comes from construction:

- ``real``: phrases of real voices from ``../shared/data/audio`` (the LibriSpeech speakers
  1089 and 1221, JFK, each channel of ``stereo_diarization.wav``, the English first half of
  ``multilingual.mp3``: six speakers), cut at their pauses by Silero VAD.
- ``espeak``: espeak-ng voices (accent + variant + rate + pitch as a speaker) reading
  contact-center lines, for bulk.
- A call is 8-14 turns; speaker 0 (the agent) speaks first, the others in random order. Gaps
  between turns are 0.2-1.2 s, one in ten a 2-3 s pause, one in seven turns starts 0.3-0.8 s
  before the previous one ends (overlap), and one in five turns is interrupted by a listener's
  backchannel (a short word cut from that speaker's real speech, or "yes"/"okay"/"mm-hmm" in
  its espeak voice) in a pause inside the turn.
- Each call in conditions: ``wideband`` (16 kHz), ``telephone`` (300-3400 Hz, 8 kHz G.711
  mu-law, decoded back to 16 kHz by the job's decoder) and ``telephone-noise`` (line noise at
  10-25 dB SNR first).
- ``--speakers 1``: one voice in both parts (does a lone voice stay one speaker?).
- Plus ``stereo_diarization.wav`` mixed down to mono (reference: each channel's energy).

The pipeline is the job's: speech regions as the job finds them for diarization
(``--regions voice``: WebRTC's VAD, ``workers.diarize.regions``; ``job``, ``fine``, ``fine3``
and ``oracle`` compare others), ``Diarizer`` on the 16 kHz audio, Whisper tiny.en (bundled,
int8, word timestamps) on the same audio, ``assign_speakers``. Scores: ``pyannote.metrics``
DER with a 0.25 s collar (overlap scored), the share of calls with the right speaker count,
the share of Whisper's words that land on the right speaker (the reference speaker is the
one whose constructed speech overlaps the word most; words outside every reference span are
not scored; hypothesis speakers mapped to reference ones by DER's optimal mapping), and the
share of calls whose first-speaker role is right. ``diarize_s`` per audio second on this
machine, and beside it Whisper's ``asr_s`` per audio second on the same calls.

    # tune (seeds 1 and 2 only)
    OPENBLAS_NUM_THREADS=1 .venv/bin/python scripts/bench_diarize.py --seed 1 --calls 12 \
        --sets real --speakers 1,2,3 --conditions telephone,wideband,telephone-noise --no-words
    # report (seeds 3-5, nothing tuned on them)
    OPENBLAS_NUM_THREADS=1 .venv/bin/python scripts/bench_diarize.py --seed 4 --calls 12 \
        --sets real --speakers 2 --conditions telephone

One BLAS thread, as in a Ray task (Ray sets OMP_NUM_THREADS to the task's CPUs): with the
default threads the per-frame products of the LSTM spin on a shared 2-core machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pickle
import random
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
DATA = REPO.parent / "shared" / "data" / "audio"
SR = 16_000

LINES = [
    "Thank you for calling, my name is Sam, how can I help you today?",
    "I would like to check the status of my order please.",
    "Can I have your account number and the name on the account?",
    "Sure, it is the one ending in four seven two.",
    "Let me pull that up for you, one moment.",
    "I see the package left our warehouse on Tuesday.",
    "That is strange, the tracking page still says it is pending.",
    "I understand, I will open a ticket with the carrier right now.",
    "How long will that take to resolve?",
    "Usually two to three business days, and we will email you.",
    "Is there anything else I can help you with?",
    "No, that was everything, thank you for your help.",
    "I was charged twice for the same subscription last month.",
    "I am sorry about that, I can refund the second charge today.",
    "Could you confirm the email address on file?",
    "My internet keeps dropping every evening around seven.",
    "Have you tried restarting the router and the modem?",
    "Yes, several times, and it did not make any difference.",
]
BACKCHANNELS = ["yes", "okay", "mm-hmm", "right", "sure"]
ESPEAK_VOICES = ["en-us", "en-gb", "en-gb-scotland", "en-029", "en-us-nyc", "en-gb-x-rp"]
ESPEAK_VARIANTS = ["+m3", "+f2", "+f4", "+m5", "+m1", "+f3"]


@dataclass
class Speaker:
    name: str
    phrases: list[np.ndarray]
    backchannels: list[np.ndarray]


@dataclass
class Call:
    name: str
    audio: np.ndarray
    reference: list[tuple[str, float, float]]  # (speaker, start, end) of real speech
    speakers: int
    copies: dict[str, np.ndarray] = field(default_factory=dict)  # by condition, made once
    words: dict[str, tuple[list[dict], float]] = field(default_factory=dict)  # by condition


@dataclass
class Scores:
    calls: int = 0
    count_right: int = 0
    role_right: int = 0
    words: int = 0
    words_right: int = 0
    audio_s: float = 0.0
    diarize_s: float = 0.0
    asr_s: float = 0.0
    der: object = None
    found: list[int] = field(default_factory=list)
    parts: dict[str, float] = field(default_factory=dict)


def _energy_spans(audio: np.ndarray, floor_db: float = -35.0) -> list[tuple[float, float]]:
    """Speech spans of a clean clip: 10 ms frames within ``floor_db`` of its loudest, joined
    across gaps under 0.3 s."""
    hop = SR // 100
    n = len(audio) // hop
    if n == 0:
        return []
    rms = np.sqrt(np.mean(audio[: n * hop].reshape(n, hop) ** 2, axis=1))
    on = rms > max(rms.max() * 10 ** (floor_db / 20), 1e-4)
    spans: list[list[float]] = []
    for i in np.flatnonzero(on):
        t = i / 100
        if spans and t - spans[-1][1] < 0.3:
            spans[-1][1] = t + 0.01
        else:
            spans.append([t, t + 0.01])
    return [(a, b) for a, b in spans]


def _phrases(audio: np.ndarray, rng: random.Random) -> list[np.ndarray]:
    """A recording cut at its pauses (Silero VAD, 150 ms), long phrases into 1.5-4 s pieces."""
    from faster_whisper.vad import VadOptions, get_speech_timestamps

    vad = VadOptions(min_silence_duration_ms=150, speech_pad_ms=30)
    out = []
    for c in get_speech_timestamps(audio, vad):
        piece = audio[c["start"] : c["end"]]
        while len(piece) > 5 * SR:
            cut = int(rng.uniform(1.5, 4.0) * SR)
            out.append(piece[:cut])
            piece = piece[cut:]
        if len(piece) > 0.6 * SR:
            out.append(piece)
    return out


def real_speakers(data: Path, rng: random.Random) -> list[Speaker]:
    from faster_whisper.audio import decode_audio

    def load(name: str, **kw) -> np.ndarray:
        return decode_audio(str(data / name), sampling_rate=SR, **kw)

    sources = {
        "ls1089": [load("1089-134686-0001.wav")],
        "ls1221": [load("1221-135766-0001.wav"), load("1221-135766-0002.wav")],
        "jfk": [load("jfk.flac")],
        "multi": [load("multilingual.mp3")[: 28 * SR]],
    }
    left, right = load("stereo_diarization.wav", split_stereo=True)
    sources["stereoL"], sources["stereoR"] = [left], [right]
    out = []
    for name, clips in sources.items():
        phrases = [p for clip in clips for p in _phrases(clip, rng)]
        # A backchannel: the first 0.3-0.6 s of a phrase (a word or two of this voice).
        backs = [p[: int(rng.uniform(0.3, 0.6) * SR)] for p in phrases]
        out.append(Speaker(name, phrases, backs))
    return out


def espeak_speakers(n: int, rng: random.Random) -> list[Speaker]:
    from overnight.jobs.ops.demo import speak

    out = []
    combos = [(v, var) for v in ESPEAK_VOICES for var in ESPEAK_VARIANTS]
    rng.shuffle(combos)
    for k, (v, var) in enumerate(combos[:n]):
        rate = rng.choice([135, 150, 165, 180])
        voice = v + var
        lines = rng.sample(LINES, 6)
        phrases = [speak(line, voice=voice, speed=rate) for line in lines]
        backs = [speak(b, voice=voice, speed=rate) for b in rng.sample(BACKCHANNELS, 3)]
        trim = [p[slice(*_trim(p))] for p in phrases]
        out.append(Speaker(f"es{k}:{voice}@{rate}", trim, [b[slice(*_trim(b))] for b in backs]))
    return out


def _trim(audio: np.ndarray) -> tuple[int, int]:
    spans = _energy_spans(audio)
    if not spans:
        return 0, len(audio)
    return int(spans[0][0] * SR), int(spans[-1][1] * SR)


def _crop(phrase: np.ndarray, rng: random.Random) -> np.ndarray:
    """A random part (at least 1.2 s, or all) of a phrase: material is scarce (the stereo
    file's left channel is one 4.6 s sentence), and the same phrase placed whole again and
    again gives identical windows, which cluster by position in the phrase, not by voice."""
    n = len(phrase)
    length = int(rng.uniform(min(1.2 * SR, n), n))
    start = rng.randint(0, n - length)
    return phrase[start : start + length]


def build_call(name: str, speakers: list[Speaker], rng: random.Random) -> Call:
    """Turns of ``speakers`` (speaker 0 first) with pauses, overlaps and backchannels."""
    n = len(speakers)
    order = [0]
    for _ in range(rng.randint(8, 14) - 1):
        order.append(rng.choice([s for s in range(n) if s != order[-1]]))
    for s in range(n):  # everyone speaks at least twice
        if order.count(s) < 2:
            order += [s] if order[-1] != s else [(s + 1) % n, s]
    placed: list[tuple[int, float, np.ndarray]] = []
    t = 0.3
    for i, s in enumerate(order):
        sp = speakers[s]
        if i > 0:
            r = rng.random()
            if r < 1 / 7:
                t -= rng.uniform(0.3, 0.8)
            elif r < 1 / 7 + 0.1:
                t += rng.uniform(2.0, 3.0)
            else:
                t += rng.uniform(0.2, 1.2)
        pieces = [_crop(rng.choice(sp.phrases), rng) for _ in range(rng.choice([1, 1, 2]))]
        for k, piece in enumerate(pieces):
            if k:
                t += rng.uniform(0.15, 0.4)
            placed.append((s, t, piece))
            t += len(piece) / SR
            if k == 0 and rng.random() < 0.2:  # the listener's backchannel in a pause
                other = rng.choice([o for o in range(n) if o != s])
                t += rng.uniform(0.2, 0.4)
                back = rng.choice(speakers[other].backchannels)
                placed.append((other, t, back))
                t += len(back) / SR + rng.uniform(0.2, 0.4)
                extra = _crop(rng.choice(sp.phrases), rng)
                placed.append((s, t, extra))
                t += len(extra) / SR
    total = t + 0.5
    audio = np.zeros(int(total * SR) + 1, np.float32)
    reference = []
    for s, start, piece in placed:
        a = int(start * SR)
        gain = 0.7 / max(float(np.abs(piece).max()), 1e-3) * rng.uniform(0.6, 1.0)
        audio[a : a + len(piece)] += piece * gain
        for x, y in _energy_spans(piece):
            reference.append((speakers[s].name, round(start + x, 3), round(start + y, 3)))
    peak = float(np.abs(audio).max())
    if peak > 0.98:
        audio *= 0.98 / peak
    return Call(name, audio, reference, n)


def stereo_call(data: Path) -> Call:
    from faster_whisper.audio import decode_audio

    left, right = decode_audio(str(data / "stereo_diarization.wav"), split_stereo=True)
    reference = [("L", a, b) for a, b in _energy_spans(left)]
    reference += [("R", a, b) for a, b in _energy_spans(right)]
    return Call("stereo_mix", (left + right) / 2, reference, 2)


def telephone_copy(audio: np.ndarray, noise_seed: int | None = None) -> np.ndarray:
    """300-3400 Hz, 8 kHz, mu-law, then back to 16 kHz through the job's decoder (PyAV);
    with ``noise_seed``, line noise at 10-25 dB SNR first."""
    from faster_whisper.audio import decode_audio
    from number_speech import add_noise, telephone, write_wav

    if noise_seed is not None:
        rng = np.random.default_rng(noise_seed)
        audio = add_noise(audio, float(rng.uniform(10, 25)), rng)
    with tempfile.TemporaryDirectory() as tmp:
        path = write_wav(Path(tmp) / "t.wav", telephone(audio), 8000)
        return decode_audio(str(path), sampling_rate=SR)


def build_set(kind: str, n_speakers: int, calls: int, seed: int, data: Path) -> list[Call]:
    rng = random.Random(seed * 1_000 + n_speakers * 10 + (kind == "espeak"))
    pool = real_speakers(data, rng) if kind == "real" else espeak_speakers(12, rng)
    out = []
    for i in range(calls):
        # One speaker: one voice in both parts, so that its reference is one speaker.
        chosen = [rng.choice(pool)] * 2 if n_speakers == 1 else rng.sample(pool, n_speakers)
        call = build_call(f"{kind}{n_speakers}-{i}", chosen, rng)
        call.speakers = n_speakers
        out.append(call)
    return out


def _annotation(spans, uri: str):
    from pyannote.core import Annotation, Segment

    ann = Annotation(uri=uri)
    for i, (who, a, b) in enumerate(spans):
        if b > a:
            ann[Segment(a, b), f"t{i}"] = who
    return ann


class Whisper:
    def __init__(self) -> None:
        from faster_whisper import WhisperModel

        from overnight.workers.whisper_models import bundled_model_path

        self.model = WhisperModel(bundled_model_path(), device="cpu", compute_type="int8")

    def words(self, audio: np.ndarray) -> tuple[list[dict], float]:
        """The words Whisper hears in the speech the job's VAD passes (its noise floor
        included: faster-whisper's own VAD passes a fraction of telephone-band speech)."""
        from overnight.workers.audio import AudioOptions, speech_clips

        started = time.perf_counter()
        clips = speech_clips(audio, AudioOptions())
        if not clips:
            return [], time.perf_counter() - started
        segs, _ = self.model.transcribe(
            audio,
            language="en",
            beam_size=1,
            word_timestamps=True,
            vad_filter=False,
            clip_timestamps=[t / SR for clip in clips for t in clip],
        )
        out = []
        for s in segs:
            out.append(
                {
                    "start": s.start,
                    "end": s.end,
                    "text": s.text.strip(),
                    "channel": 0,
                    "speaker": None,
                    "words": [
                        {"word": w.word.strip(), "start": w.start, "end": w.end, "probability": 1}
                        for w in s.words or []
                    ],
                }
            )
        return out, time.perf_counter() - started


def crop_call(call: Call, seconds: float, min_talk_s: float = 1.0) -> Call | None:
    """The first ``seconds`` of ``call`` (a short recording: a voicemail, a brief call), its
    reference cut there; None when a speaker the call needs talks under ``min_talk_s`` in it
    (a 2-speaker call whose second party has not spoken yet is not a 2-speaker recording)."""
    reference = [(s, a, min(b, seconds)) for s, a, b in call.reference if a < seconds]
    talk: dict[str, float] = {}
    for s, a, b in reference:
        talk[s] = talk.get(s, 0.0) + b - a
    if sum(t >= min_talk_s for t in talk.values()) < call.speakers:
        return None
    name = f"{call.name}@{seconds:.0f}s"
    return Call(name, call.audio[: int(seconds * SR)].copy(), reference, call.speakers)


def crop_set(calls: list[Call], low: float, high: float, seed: int) -> list[Call]:
    """Each call cut to a length drawn from [low, high] seconds (``crop_call``)."""
    rng = random.Random(seed)
    cut = (crop_call(c, rng.uniform(low, high)) for c in calls)
    return [c for c in cut if c is not None]


def speech_regions(audio: np.ndarray, call: Call, how: str) -> list[tuple[float, float]]:
    """``voice``: the diarization's own regions in the job (WebRTC's VAD, mode 2, 160 ms
    pauses); ``job``: the transcription's mono Silero regions (2 s silence, 400 ms pad);
    ``fine``: Silero cut at 160 ms pauses (the split-channel setting); ``fine3``: that at
    threshold 0.3 (the diarization's regions before WebRTC's); ``oracle``: the constructed
    speech (DER then measures speakers alone)."""
    from overnight.workers.audio import AudioOptions, speech_clips
    from overnight.workers.diarize.regions import voice_regions

    if how == "voice":
        return voice_regions(audio)
    if how == "oracle":
        spans = sorted((a, b) for _, a, b in call.reference)
        merged: list[list[float]] = []
        for a, b in spans:
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        return [(a, b) for a, b in merged]
    options = AudioOptions(vad_threshold=0.3) if how == "fine3" else AudioOptions()
    return [(a / SR, b / SR) for a, b in speech_clips(audio, options, split=how != "job")]


def evaluate(
    calls: list[Call],
    options,
    condition: str,
    whisper: Whisper | None,
    encoder,
    regions_from: str = "job",
) -> Scores:
    from pyannote.metrics.diarization import DiarizationErrorRate

    from overnight.workers.diarize import Diarizer, assign_speakers, first_speaker_roles
    from overnight.workers.diarize.assign import speaker_at
    from overnight.workers.diarize.diarize import Turn

    diarizer = Diarizer(options, encoder)
    metric = DiarizationErrorRate(collar=0.25, skip_overlap=False)
    sc = Scores(der=metric)
    for call in calls:
        audio = call.audio
        if condition != "wideband":
            if condition not in call.copies:
                noisy = condition == "telephone-noise"
                seed = zlib.crc32(call.name.encode()) if noisy else None
                call.copies[condition] = telephone_copy(call.audio, seed)
            audio = call.copies[condition]
        regions = speech_regions(audio, call, regions_from)
        result = diarizer(audio, regions)
        ref = _annotation(call.reference, call.name)
        hyp = _annotation([(t.speaker, t.start, t.end) for t in result.turns], call.name)
        detail = metric(ref, hyp, detailed=True)
        for part in ("confusion", "missed detection", "false alarm", "total"):
            sc.parts[part] = sc.parts.get(part, 0.0) + detail[part]
        mapping = metric.optimal_mapping(ref, hyp)
        sc.calls += 1
        sc.found.append(result.num_speakers)
        sc.count_right += result.num_speakers == call.speakers
        sc.audio_s += len(audio) / SR
        sc.diarize_s += result.diarize_s
        ref_turns = sorted((Turn(w, a, b) for w, a, b in call.reference), key=lambda t: t.start)
        long_refs = [t for t in ref_turns if t.end - t.start >= 0.5] or ref_turns
        roles = first_speaker_roles(result.turns)
        agent = next((h for h, r in roles.items() if r == "agent"), None)
        sc.role_right += agent is not None and mapping.get(agent) == long_refs[0].speaker
        if whisper is None:
            continue
        if condition not in call.words:
            call.words[condition] = whisper.words(audio)
        segments, asr_s = call.words[condition]
        sc.asr_s += asr_s
        for seg in assign_speakers(segments, result.turns):
            for w in seg["words"] or []:
                truth = None
                overlapping = [t for t in ref_turns if t.start < w["end"] and t.end > w["start"]]
                if overlapping:
                    truth = speaker_at(overlapping, w["start"], w["end"])
                if truth is None:
                    continue
                sc.words += 1
                sc.words_right += mapping.get(seg["speaker"]) == truth
    return sc


def row(label: str, sc: Scores) -> dict:
    der = abs(sc.der) if sc.calls else float("nan")  # type: ignore[arg-type]
    return {
        "set": label,
        "calls": sc.calls,
        "DER": round(100 * der, 1),
        "conf/miss/fa": "/".join(
            f"{100 * sc.parts.get(k, 0) / max(sc.parts.get('total', 0), 1e-9):.1f}"
            for k in ("confusion", "missed detection", "false alarm")
        ),
        "count_ok": round(100 * sc.count_right / max(sc.calls, 1), 1),
        "words_ok": round(100 * sc.words_right / sc.words, 1) if sc.words else None,
        # The words scored: a pooled figure over seeds weighs each seed by them.
        "words": sc.words,
        "role_ok": round(100 * sc.role_right / max(sc.calls, 1), 1),
        "found": dict(sorted({k: sc.found.count(k) for k in set(sc.found)}.items())),
        "audio_s": round(sc.audio_s, 1),
        "diarize_ms_per_s": round(1000 * sc.diarize_s / max(sc.audio_s, 1e-9), 2),
        "asr_ms_per_s": round(1000 * sc.asr_s / sc.audio_s, 1) if sc.asr_s else None,
    }


def _kept(sets) -> dict:
    """What ``--words-cache`` keeps: each call's telephone copies and words, by set."""
    return {
        f"{kind}{n}/{call.name}": (call.copies, call.words)
        for kind, n, calls in sets
        for call in calls
    }


def _restore(sets, kept: dict) -> None:
    for kind, n, calls in sets:
        for call in calls:
            copies, words = kept.get(f"{kind}{n}/{call.name}", ({}, {}))
            call.copies.update(copies)
            call.words.update(words)


def long_recordings(
    calls: list[Call], minutes: list[float], turns: int, options, encoder
) -> list[dict]:
    """The calls' telephone copies joined and repeated to each length: the diarizer's time
    by part (speech regions, mel frames, embeddings, clustering), with the clustering's graph
    decompositions shared between its passes (``cluster.Eigs``, as the job runs) and, taking
    turns with it, each pass decomposing its own (the code before). Such a recording holds
    the calls' voices many times over: it times the path, not its accuracy."""
    from overnight.workers.diarize import cluster
    from overnight.workers.diarize.diarize import Diarizer, region_mels
    from overnight.workers.diarize.regions import voice_regions

    joined = np.concatenate([telephone_copy(c.audio) for c in calls])
    real_eigs = cluster._laplacian_eigs

    def unshared(affinity, p, cache=None):
        return real_eigs(affinity, p)

    out = []
    for length in minutes:
        n = int(length * 60 * SR)
        audio = np.resize(joined, n)
        times: dict[str, list[float]] = {}
        for turn in range(turns):
            for variant in ("shared", "unshared"):
                cluster._laplacian_eigs = real_eigs if variant == "shared" else unshared
                diarizer = Diarizer(options, encoder)
                parts: dict[str, float] = {}
                for name in ("_embed", "_cluster"):
                    method = getattr(diarizer, name)

                    def timed(*a, _m=method, _name=name, _parts=parts):
                        t0 = time.perf_counter()
                        result = _m(*a)
                        _parts[_name] = time.perf_counter() - t0
                        return result

                    setattr(diarizer, name, timed)
                t0 = time.perf_counter()
                regions = voice_regions(audio)
                t1 = time.perf_counter()
                mels = region_mels(audio, regions)
                t2 = time.perf_counter()
                found = diarizer.from_mels(mels, regions)
                t3 = time.perf_counter()
                cluster._laplacian_eigs = real_eigs
                r = {
                    "minutes": length,
                    "variant": variant,
                    "turn": turn,
                    "windows": found.windows,
                    "speakers": found.num_speakers,
                    "regions_s": round(t1 - t0, 2),
                    "mels_s": round(t2 - t1, 2),
                    "embed_s": round(parts["_embed"], 2),
                    "cluster_s": round(parts["_cluster"], 2),
                    "total_s": round(t3 - t0, 2),
                }
                times.setdefault(variant, []).append(r["cluster_s"])
                print(json.dumps(r), flush=True)
                out.append(r)
        ratio = [
            u / max(s_, 1e-9) for s_, u in zip(times["shared"], times["unshared"], strict=True)
        ]
        print(
            json.dumps(
                {
                    "minutes": length,
                    "cluster_s shared": times["shared"],
                    "cluster_s unshared": times["unshared"],
                    "unshared/shared per turn": [round(x, 2) for x in ratio],
                }
            ),
            flush=True,
        )
    return out


def main(argv: list[str] | None = None) -> list[dict]:
    from overnight.workers.diarize import DiarizeOptions
    from overnight.workers.diarize.encoder import SpeakerEncoder

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=2)
    p.add_argument("--calls", type=int, default=20, help="calls per set")
    p.add_argument("--speakers", default="2,3,4")
    p.add_argument("--sets", default="real,espeak")
    p.add_argument(
        "--conditions", default="telephone,wideband", help="also telephone-noise (10-25 dB SNR)"
    )
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--no-words", action="store_true", help="skip Whisper (no word scores)")
    p.add_argument("--sweep", action="store_true", help="compare methods and windows")
    p.add_argument(
        "--regions", default="voice", help="voice, job, fine, fine3 or oracle (comma list)"
    )
    p.add_argument("--json", type=Path, help="write the rows here")
    p.add_argument(
        "--words-cache",
        help="a pickle path with {seed}: each set's telephone copies and Whisper words are "
        "read from it when there, written to it when not, so that two runs (other options, "
        "or the code before a change) score the same words; tiny.en's word timestamps "
        "change from run to run",
    )
    p.add_argument(
        "--engines",
        default="onnxruntime",
        help="speaker encoder engines (onnxruntime, numpy; comma list): with more than one, "
        "they take turns on each set and the ratio of their times is printed",
    )
    for f in dataclasses.fields(DiarizeOptions):
        if (f.type in ("float", "int") or f.name == "method") and f.name != "seed":
            p.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=None)
    p.add_argument(
        "--crop",
        metavar="LOW,HIGH",
        help="short recordings: each call cut to its first LOW-HIGH seconds (drawn per call); "
        "a 2-speaker call whose second party has not spoken 1 s by then is left out",
    )
    p.add_argument(
        "--long",
        metavar="MINUTES",
        help="time long recordings instead of scoring: the first set's telephone copies "
        "joined and repeated to each length (comma list), clustering with and without shared "
        "graph decompositions, taking --turns turns",
    )
    p.add_argument("--turns", type=int, default=2, help="with --long: turns per variant")
    p.add_argument("--speakers-exact", type=int, default=None)
    p.add_argument("--hint", type=int, default=None, help="hint_speakers (0: none)")
    args = p.parse_args(argv)
    overrides = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(DiarizeOptions)
        if getattr(args, f.name, None) is not None and f.name not in ("speakers", "seed")
    }
    if args.hint is not None:
        overrides["hint_speakers"] = args.hint or None
    base = DiarizeOptions(**overrides, speakers=args.speakers_exact)
    if not args.data.is_dir() and "real" in args.sets:
        print(f"no real voices at {args.data}: espeak-ng voices only", file=sys.stderr)
        args.sets = "espeak"
    engines = args.engines.split(",")
    encoders = {engine: SpeakerEncoder.load(engine=engine) for engine in engines}
    whisper = None if args.no_words or args.sweep else Whisper()
    variants = [("", base)]
    if args.sweep:
        variants = [
            (f"{m} w{w} s{s}", dataclasses.replace(base, method=m, window_s=w, step_s=s))
            for m in ("spectral", "agglomerative")
            for w, s in ((1.0, 0.5), (1.5, 0.75), (2.0, 1.0), (1.5, 1.5))
        ]
    rows = []
    sets = [
        (kind, n, build_set(kind, n, args.calls, args.seed, args.data))
        for kind in args.sets.split(",")
        for n in (int(x) for x in args.speakers.split(","))
    ]
    if args.crop:
        low, high = (float(x) for x in args.crop.split(","))
        sets = [(k, n, crop_set(calls, low, high, args.seed)) for k, n, calls in sets]
    elif args.data.is_dir():
        sets.append(("stereo", 2, [stereo_call(args.data)]))
    if args.long:
        calls = sets[0][2]  # the first set's (--sets, --speakers)
        minutes = [float(x) for x in args.long.split(",")]
        return long_recordings(calls, minutes, args.turns, base, encoders[engines[0]])
    cache = Path(args.words_cache.format(seed=args.seed)) if args.words_cache else None
    kept: dict = {}
    if cache is not None and cache.exists():
        kept = pickle.loads(cache.read_bytes())
        _restore(sets, kept)
    for tag, options in variants:
        for kind, n, calls in sets:
            for condition in args.conditions.split(","):
                for how in args.regions.split(","):
                    for engine, encoder in encoders.items():
                        sc = evaluate(calls, options, condition, whisper, encoder, how)
                        label = f"{tag} {kind}{n} {condition} vad={how}"
                        if len(encoders) > 1:
                            label += f" engine={engine}"
                        r = row(label.strip(), sc)
                        rows.append(r)
                        print(json.dumps(r), flush=True)
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        # Merged into what was there: a run of other sets (--crop, --speakers) keeps the rest.
        cache.write_bytes(pickle.dumps({**kept, **_kept(sets)}))
    if len(encoders) > 1:
        # The engines ran in turn on the same sets: their summed time per second of audio.
        per = {
            e: sum(r["diarize_ms_per_s"] * r["audio_s"] for r in rows if r["set"].endswith(e))
            / max(sum(r["audio_s"] for r in rows if r["set"].endswith(e)), 1e-9)
            for e in encoders
        }
        first = engines[0]
        print(
            json.dumps(
                {
                    "diarize_ms_per_s": {e: round(v, 2) for e, v in per.items()},
                    f"time vs {first}": {e: round(v / per[first], 2) for e, v in per.items()},
                }
            ),
            flush=True,
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
