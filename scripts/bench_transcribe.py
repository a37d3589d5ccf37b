#!/usr/bin/env python
"""Side-by-side transcription benchmark: the same files, model and decoding options, and what a
user who types the command gets.

(a) plain faster-whisper, one file at a time (WhisperModel.transcribe), all cores
(b) faster-whisper's BatchedInferencePipeline, one file at a time (opt-in: ``--skip ''``)
(c) overnight in-process (``jobs.transcribe.run_transcribe``, Ray Data, cross-file batching),
    tuned for 2 cores: one actor holding 1.5 CPUs, decode tasks of 0.25 CPU (``--cpus-per-actor``,
    ``--decode-cpus``, ...). Ray is started before the timer and shut down after each run, so
    (c) measures the pipeline on a warm Ray, and nothing of it is left when (d) runs
(c') (c) with other encoder window steps (``--window-step 30,...``; default 0: not run)
(d) overnight CLI, defaults: ``python -m overnight.jobs.cli transcribe CORPUS OUT`` as a subprocess, with
    no option but what a user types, timed as a whole process (interpreter, imports, Ray start,
    model load, listing, ledger, summary, Ray shutdown). Its transcripts are read from
    OUT/transcripts and its run summary from OUT/runs/*.json; it also reports the start-up to
    the first result (the run summary's ``startup`` timeline), and the options the job chose

Every variant uses tiny.en int8 on CPU, beam 5, VAD on, batch 32 (the job's defaults).

Corpora (``--corpus-kind real|synth|both``; default real when the shared audio exists):

* real: real speech cut from the recordings with references in ``--real-audio`` (default
  ``<repo>/../shared/data/audio``: the three LibriSpeech utterances and jfk.flac; never copied
  into the repository). They last 5-17 s, so each clip is cut from a "tape" of the utterances
  concatenated twice in random order with 0.2-1 s pauses (seeded), as a 5-30 s window at a
  random offset. Cuts fall only in pauses between utterances or in quiet gaps between words:
  plain faster-whisper (``word_timestamps=True``) runs once per utterance, its words are aligned
  to the human reference (edit distance) to time each reference word, and a clip's reference is
  the reference words whose middle lies inside the window. A cut between words must be quiet
  for 40 ms, lie between two words recognised exactly, and pass a check by ear (the
  recogniser, run on either side, ends and begins on the right words). The four recordings
  hold about 40 s of distinct speech, so clips repeat the same words: right for throughput;
  the WER is that of these few sentences. ``--real-clips N`` (default 60)
  makes N/2 windows (rounded up), each written twice: wideband 16 kHz and a telephone variant
  (band-limited to 300-3400 Hz, 8 kHz WAV). WER is reported for both together and per band.
  The corpus is cached in a temporary folder keyed by its parameters.
  Without the shared audio the benchmark runs on the synthesized corpus and says so.
* synth: ``--files`` recordings of 5-30 s of espeak-synthesized call-centre sentences.

The variants take turns, pass after pass (``--repeat``, default 2): each is reported with all
its walls, their spread and its fastest pass, and by its throughput against (a) at the WERs
side by side. Peak memory is the PSS of the whole process tree (Ray's processes and the CLI
subprocess included).

    python scripts/bench_transcribe.py                     # the README headline: (a), (c), (d)
    python scripts/bench_transcribe.py --skip '' --json bench.json              # (b) too
    python scripts/bench_transcribe.py --corpus-kind synth --files 60 --scale 10 \\
        --scale-baselines plain --json bench.json          # (c) on 10x the files, linearity
    python scripts/bench_transcribe.py --real-clips 6 --files 4 --repeat 1 --corpus-kind both
                                                           # a smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import wave
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))  # number_speech, beside this file

from number_speech import write_wav  # noqa: E402

from overnight.jobs.ops.wer import word_errors, words  # noqa: E402

DEFAULT_REAL_AUDIO = Path(__file__).resolve().parents[2] / "shared" / "data" / "audio"
SAMPLE_RATE = 16_000
TELEPHONE_RATE = 8_000

# ---------------------------------------------------------------------------------------------
# Word error rate
# ---------------------------------------------------------------------------------------------

# jobs.ops.wer: Whisper's English normaliser (British spellings, numbers and currency written as
# digits either way) and jiwer's word edits, the same metric as the tests' and `overnight tune`'s.


def errors_and_words(ref: str, hyp: str) -> tuple[int, int]:
    return word_errors([ref], [hyp])


# ---------------------------------------------------------------------------------------------
# Synthesized corpus
# ---------------------------------------------------------------------------------------------

SENTENCES = [
    "Thank you for calling customer support, how can I help you today",
    "I would like to check the balance on my account please",
    "My last payment was charged twice this month",
    "Could you tell me when the technician will arrive",
    "I need to update the billing address on my file",
    "The internet connection keeps dropping every evening",
    "I can promise to pay two hundred dollars next Friday",
    "Please cancel the premium plan at the end of this cycle",
    "Let me transfer you to the billing department",
    "Your reference number is seven four two nine",
    "I have been waiting for the refund for three weeks",
    "Can you send me a copy of the invoice by email",
    "The package was delivered to the wrong address",
    "I would like to speak with a supervisor about this complaint",
    "We will call you back tomorrow morning between nine and eleven",
    "Is there a discount for customers who pay the whole year in advance",
    "My card expired and I need to add a new one",
    "The mobile application shows an error when I sign in",
    "I am calling about the letter I received yesterday",
    "Please confirm your date of birth and postal code",
    "The new router arrived but the lights are blinking red",
    "I want to move my appointment to next Tuesday afternoon",
    "Thank you for your patience while I look into this",
    "Is there anything else I can help you with today",
]
VOICES = ["en-us", "en-gb", "en-us+f3", "en-gb+m3"]


def make_corpus(folder: Path, n: int, seed: int = 0) -> dict[str, str]:
    """n recordings of 5-30 s of synthesized speech with pauses and light noise.

    The references are kept in ``_references.json``: names starting with ``_`` are not
    listed as input by the job, so the folder can be given to the CLI as it is.
    """
    from overnight.jobs.ops.demo import silence, speak, write_wav

    refs_path = folder / "_references.json"
    if refs_path.exists():
        refs = json.loads(refs_path.read_text())
        if len(refs) == n:
            return refs
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    rng = random.Random(seed)
    cache: dict[tuple[str, str], np.ndarray] = {}
    refs = {}
    for i in range(n):
        voice = VOICES[i % len(VOICES)]
        target = rng.uniform(5, 28)
        parts, said = [silence(rng.uniform(0.2, 1.0))], []
        length = len(parts[0]) / SAMPLE_RATE
        while length < target:
            sentence = rng.choice(SENTENCES)
            clip = cache.setdefault((sentence, voice), speak(sentence, voice=voice))
            pause = silence(rng.uniform(0.3, 1.2))
            if length + (len(clip) + len(pause)) / SAMPLE_RATE > 30:
                break  # recordings stay within 5-30 s
            parts += [clip, pause]
            said.append(sentence)
            length += (len(clip) + len(pause)) / SAMPLE_RATE
        if length < 5:  # too short: pad with silence (still within 5-30 s)
            parts.append(silence(5.0 - length))
        audio = np.concatenate(parts)
        audio = (
            audio + np.random.default_rng(i).standard_normal(audio.size).astype(np.float32) * 0.003
        )
        name = f"call_{i:05d}.wav"
        write_wav(folder / name, audio)
        refs[name] = ". ".join(said) + "."
    refs_path.write_text(json.dumps(refs))
    return refs


# ---------------------------------------------------------------------------------------------
# Real-speech corpus
# ---------------------------------------------------------------------------------------------

REAL_CORPUS_VERSION = 2
JFK_REFERENCE = (
    "And so my fellow Americans, ask not what your country can do for you, "
    "ask what you can do for your country."
)
# A gap between two words is a cut point when its quietest 40 ms lie this far below the
# utterance's loud frames (95th percentile): measured on the four recordings, gaps between
# words lie at -25 to -40 dB, the middle of voiced sounds at -4 to -20 dB.
QUIET_DB = -25.0
FADE_S = 0.01


def real_sources(audio_dir: Path) -> dict[str, tuple[Path, str]]:
    """The recordings with a human reference: id -> (path, reference)."""
    sources: dict[str, tuple[Path, str]] = {}
    trans = audio_dir / "librispeech_trans.txt"
    if trans.is_file():
        for line in trans.read_text().splitlines():
            if "\t" in line or " " in line:
                uid, text = re.split(r"\s", line.strip(), maxsplit=1)
                path = audio_dir / f"{uid}.wav"
                if path.is_file():
                    sources[uid] = (path, text.strip())
    if (audio_dir / "jfk.flac").is_file():
        sources["jfk"] = (audio_dir / "jfk.flac", JFK_REFERENCE)
    return sources


def _key(word: str) -> str:
    return "".join(words(word))


def align(ref: list[str], hyp: list[str]) -> list[int | None]:
    """For each reference word, the hypothesis word it is aligned to (match or substitution),
    or None (deleted), by the edit distance's backtrace."""
    n, m = len(ref), len(hyp)
    d = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n + 1):
        d[i][0] = i
    for j in range(m + 1):
        d[0][j] = j
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            d[i][j] = min(
                d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (ref[i - 1] != hyp[j - 1])
            )
    out: list[int | None] = [None] * n
    i, j = n, m
    while i > 0 and j > 0:
        if d[i][j] == d[i - 1][j - 1] + (ref[i - 1] != hyp[j - 1]):
            out[i - 1] = j - 1
            i, j = i - 1, j - 1
        elif d[i][j] == d[i - 1][j] + 1:
            i -= 1
        else:
            j -= 1
    return out


def reference_word_times(
    ref_words: list[str], hyp: list[tuple[str, float, float]], duration: float
) -> tuple[list[tuple[float, float]], list[bool]]:
    """A (start, end) for each reference word from the recognised words' times: an aligned
    word takes its hypothesis word's times, an inserted hypothesis word widens its aligned
    neighbour, deleted words share the time between their neighbours. Also, for each word,
    whether it was recognised exactly (its times are the most trustworthy)."""
    if not hyp:
        step = duration / max(1, len(ref_words))
        return [(i * step, (i + 1) * step) for i in range(len(ref_words))], [False] * len(ref_words)
    keys = [_key(w) for w in ref_words]
    to_hyp = align(keys, [k for k, _, _ in hyp])
    exact = [j is not None and hyp[j][0] == keys[i] for i, j in enumerate(to_hyp)]
    spans: list[list[float] | None] = [
        None if j is None else [hyp[j][1], hyp[j][2]] for j in to_hyp
    ]
    owner = {j: i for i, j in enumerate(to_hyp) if j is not None}
    for j, (_, start, end) in enumerate(hyp):
        if j in owner:
            continue
        before = [i for jj, i in owner.items() if jj < j]
        after = [i for jj, i in owner.items() if jj > j]
        if before:
            span = spans[max(before)]
            assert span is not None
            span[1] = max(span[1], end)
        elif after:
            span = spans[min(after)]
            assert span is not None
            span[0] = min(span[0], start)
    i = 0
    while i < len(spans):
        if spans[i] is not None:
            i += 1
            continue
        k = i
        while k < len(spans) and spans[k] is None:
            k += 1
        prev, nxt = spans[i - 1] if i else None, spans[k] if k < len(spans) else None
        lo = prev[1] if prev else 0.0
        hi = nxt[0] if nxt else duration
        hi = max(hi, lo)
        step = (hi - lo) / (k - i)
        for t in range(i, k):
            spans[t] = [lo + (t - i) * step, lo + (t - i + 1) * step]
        i = k
    return [(s[0], s[1]) for s in spans if s is not None], exact


def _frame_rms(audio: np.ndarray, frame: int = 320, hop: int = 160) -> np.ndarray:
    if len(audio) < frame:
        return np.array([float(np.sqrt(np.mean(audio**2)))]) if len(audio) else np.zeros(1)
    frames = np.lib.stride_tricks.sliding_window_view(audio, frame)[::hop]
    return np.sqrt((frames.astype(np.float64) ** 2).mean(axis=1))


def word_gap_cuts(
    audio: np.ndarray, times: list[tuple[float, float]], exact: list[bool]
) -> tuple[list[tuple[float, float]], list[tuple[float, int]]]:
    """The words' times trimmed to their speech, and the cut points inside the utterance:
    (time, words before it).

    Whisper's word times are rough: a word often takes in the pause before it ("Americans,
    [1 s pause] ask" gave "ask" 2.26-3.88 s), so each word's span is first trimmed to its
    frames louder than QUIET_DB. A cut lies at the quietest 40 ms near the boundary of two
    neighbouring words (within 80 ms of it, and at least 30 ms from either word's middle, so
    two boundaries never share a cut), only where that is quiet enough to be a gap, and only
    between two words recognised exactly
    (around a misrecognised or merged word, "FOR EVER" heard as "forever", the times are
    guesses). Cut times rise with the words before them."""
    rms = _frame_rms(audio)
    loud = float(np.percentile(rms, 95)) or 1e-9
    # Three 20 ms frames 10 ms apart: one quiet frame is often a stop consonant's closure
    # inside a word, 40 ms of quiet a gap.
    level = 20 * np.log10(np.convolve(rms, np.ones(3) / 3, mode="same") / loud + 1e-12)
    hop_s = 160 / SAMPLE_RATE
    trimmed = []
    for start, end in times:
        lo, hi = int(start / hop_s), min(int(end / hop_s) + 1, len(level))
        voiced = np.nonzero(level[lo:hi] > QUIET_DB)[0]
        if len(voiced):
            start, end = (lo + voiced[0]) * hop_s, (lo + voiced[-1]) * hop_s + 0.02
        trimmed.append((float(start), float(end)))
    cuts: list[tuple[float, int]] = []
    for i in range(len(trimmed) - 1):
        if not (exact[i] and exact[i + 1]):
            continue
        # Near the boundary Whisper saw (80 ms either side), never nearer a word's middle
        # than 30 ms.
        a = max((trimmed[i][0] + trimmed[i][1]) / 2 + 0.03, trimmed[i][1] - 0.08)
        b = min((trimmed[i + 1][0] + trimmed[i + 1][1]) / 2 - 0.03, trimmed[i + 1][0] + 0.08)
        lo, hi = int(a / hop_s), min(int(b / hop_s), len(level))
        if hi <= lo:
            continue
        k = lo + int(level[lo:hi].argmin())
        t = k * hop_s + 0.01  # the frame's middle
        if level[k] <= QUIET_DB and (not cuts or t > cuts[-1][0]):
            cuts.append((t, i + 1))
    return trimmed, cuts


def _heard_edges(model, audio: np.ndarray, at: int) -> tuple[str, str]:
    """The last word recognised before sample ``at`` and the first after it."""

    def heard(part: np.ndarray) -> list[str]:
        segments, _ = model.transcribe(
            part, beam_size=1, language="en", condition_on_previous_text=False, vad_filter=False
        )
        return words(" ".join(s.text for s in segments))

    # 4 s either side, greedy: the words at the cut are what counts, and this runs twice
    # per candidate cut.
    context = 4 * SAMPLE_RATE
    left, right = heard(audio[max(0, at - context) : at]), heard(audio[at : at + context])
    return (left[-1] if left else "", right[0] if right else "")


def analyse_sources(audio_dir: Path, threads: int) -> list[dict[str, Any]]:
    """Each source: its audio (16 kHz), reference words, their times and the candidate cut
    points between words (checked by ear when a window uses one: cut_heard_right)."""
    from faster_whisper import WhisperModel
    from faster_whisper.audio import decode_audio

    from overnight.workers.whisper_models import bundled_model_path

    model = WhisperModel(
        bundled_model_path(), device="cpu", compute_type="int8", cpu_threads=threads
    )
    out = []
    for uid, (path, reference) in sorted(real_sources(audio_dir).items()):
        audio = decode_audio(str(path), sampling_rate=SAMPLE_RATE)
        segments, _ = model.transcribe(
            audio,
            beam_size=5,
            language="en",
            word_timestamps=True,
            condition_on_previous_text=False,
            vad_filter=False,
        )
        hyp = [(_key(w.word), w.start, w.end) for s in segments for w in (s.words or [])]
        hyp = [h for h in hyp if h[0]]
        words = reference.split()
        times, exact = reference_word_times(words, hyp, len(audio) / SAMPLE_RATE)
        times, cuts = word_gap_cuts(audio, times, exact)
        out.append(
            {
                "id": uid,
                "audio": audio,
                "words": words,
                "times": times,
                "cuts": cuts,
                "heard": {},  # words before a cut -> whether the check by ear passed
                "model": model,
            }
        )
    return out


def cut_heard_right(src: dict[str, Any], t: float, k: int) -> bool:
    """The last check of a cut between words, by ear: the recogniser must end the left side on
    the word before it and begin the right side on the word after it. Whisper's times for
    short function words are often off ("so my" cut as "and so am I" | "fellow"), and such a
    cut would move a word into the wrong clip's reference. Run on the cuts a window uses
    (twice a recognition each), once per cut."""
    if k not in src["heard"]:
        heard = _heard_edges(src["model"], src["audio"], int(t * SAMPLE_RATE))
        src["heard"][k] = heard == (_key(src["words"][k - 1]), _key(src["words"][k]))
    return src["heard"][k]


def telephone(audio: np.ndarray) -> np.ndarray:
    """16 kHz -> 8 kHz telephone band: 300-3400 Hz (100 Hz ramps, nothing above 3.5 kHz, so
    keeping every second sample does not alias), at the wideband clip's loudness."""
    spectrum = np.fft.rfft(audio.astype(np.float64))
    f = np.fft.rfftfreq(len(audio), 1 / SAMPLE_RATE)
    gain = np.clip((f - 200) / 100, 0, 1) * np.clip((3500 - f) / 100, 0, 1)
    narrow = np.fft.irfft(spectrum * gain, n=len(audio))[::2]
    rms_in, rms_out = float(np.sqrt(np.mean(audio**2))), float(np.sqrt(np.mean(narrow**2)))
    if rms_out > 0:
        narrow *= rms_in / rms_out
    return np.clip(narrow, -1, 1).astype(np.float32)


def _fade(audio: np.ndarray) -> np.ndarray:
    n = min(int(FADE_S * SAMPLE_RATE), len(audio) // 2)
    out = audio.astype(np.float32).copy()
    if n:
        ramp = np.linspace(0, 1, n, dtype=np.float32)
        out[:n] *= ramp
        out[-n:] *= ramp[::-1]
    return out


def _segments(words: list[tuple[str, int]]) -> list[dict[str, Any]]:
    """Runs of consecutive words of one source: [{source, start, stop}] (a slice of its
    reference words)."""
    runs: list[dict[str, Any]] = []
    for uid, i in words:
        if runs and runs[-1]["source"] == uid and runs[-1]["stop"] == i:
            runs[-1]["stop"] = i + 1
        else:
            runs.append({"source": uid, "start": i, "stop": i + 1})
    return runs


def cut_window(sources: list[dict[str, Any]], rng: random.Random) -> dict[str, Any]:
    """One 5-30 s window of a fresh tape: the sources twice, shuffled, with pauses. It starts
    and ends in a pause between utterances or at a cut between words that passes the check by
    ear (another is drawn when one fails)."""
    first, second = rng.sample(sources, len(sources)), rng.sample(sources, len(sources))
    if len(second) > 1 and second[0] is first[-1]:  # no utterance twice in a row
        second = second[1:] + second[:1]
    order = first + second
    noise = np.random.default_rng(rng.randrange(2**32))
    parts: list[np.ndarray] = []
    # (time on the tape, tape words before, the cut inside a source: (source, time, k) or None)
    cuts: list[tuple[float, int, tuple[dict[str, Any], float, int] | None]] = []
    words: list[tuple[str, int]] = []  # (source id, index of the word in its reference)
    t = 0.0

    def pause() -> None:
        nonlocal t
        p = rng.uniform(0.2, 1.0)
        parts.append((noise.standard_normal(int(p * SAMPLE_RATE)) * 1e-3).astype(np.float32))
        cuts.append((t + p / 2, len(words), None))
        t += len(parts[-1]) / SAMPLE_RATE

    pause()
    for src in order:
        cuts.extend((t + ct, len(words) + k, (src, ct, k)) for ct, k in src["cuts"])
        words.extend((src["id"], i) for i in range(len(src["words"])))
        parts.append(_fade(src["audio"]))
        t += len(src["audio"]) / SAMPLE_RATE
        pause()
    tape = np.concatenate(parts)
    target = rng.uniform(5, 30)
    rejected: set[int] = set()
    while True:
        pairs: dict[int, list[int]] = {}
        for a, (ta, ka, _) in enumerate(cuts):
            for b, (tb, kb, _) in enumerate(cuts):
                n = round(tb * SAMPLE_RATE) - round(ta * SAMPLE_RATE)
                if (
                    a not in rejected
                    and b not in rejected
                    and kb > ka
                    and 5 * SAMPLE_RATE <= n <= 30 * SAMPLE_RATE
                ):
                    pairs.setdefault(a, []).append(b)
        a = rng.choice(sorted(pairs))
        b = min(pairs[a], key=lambda b: abs(cuts[b][0] - cuts[a][0] - target))
        for i in (a, b):
            inner = cuts[i][2]
            if inner is not None and not cut_heard_right(*inner):
                rejected.add(i)
        if a not in rejected and b not in rejected:
            break
    (ta, ka, _), (tb, kb, _) = cuts[a], cuts[b]
    clip = _fade(tape[round(ta * SAMPLE_RATE) : round(tb * SAMPLE_RATE)])
    by_id = {s["id"]: s for s in sources}
    return {
        "audio": clip,
        "reference": " ".join(by_id[uid]["words"][i] for uid, i in words[ka:kb]),
        "segments": _segments(words[ka:kb]),
        "tape_offset_s": round(ta, 3),
        "tape_s": round(t, 3),
    }


def real_corpus_folder(root: Path, audio_dir: Path, n: int, seed: int) -> Path:
    """The cache folder for these parameters and these source files."""
    stamp: list[Any] = [REAL_CORPUS_VERSION, QUIET_DB, n, seed]
    for uid, (path, ref) in sorted(real_sources(audio_dir).items()):
        stamp += [uid, path.stat().st_size, ref]
    digest = hashlib.sha256(json.dumps(stamp).encode()).hexdigest()[:10]
    return root / f"real-n{n}-s{seed}-{digest}"


def make_real_corpus(
    folder: Path, audio_dir: Path, n: int, seed: int = 0, threads: int = 0
) -> dict[str, Any]:
    """ceil(n/2) windows of real speech, each as ``real_NNN_16k.wav`` and its telephone variant
    ``real_NNN_8k.wav`` (8 kHz); returns (and caches in ``_corpus.json``) the metadata:
    ``clips``: name -> reference, duration_s, sample_rate, band, segments (the source reference
    word slices it holds, in order), tape_offset_s; ``sources``: id -> reference."""
    meta_path = folder / "_corpus.json"
    if meta_path.exists():
        with contextlib.suppress(ValueError):
            meta = json.loads(meta_path.read_text())
            if meta.get("version") == REAL_CORPUS_VERSION and meta.get("n") == n:
                return meta
    sources = analyse_sources(audio_dir, threads or os.cpu_count() or 2)
    if not sources:
        raise FileNotFoundError(f"no recording with a reference in {audio_dir}")
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    rng = random.Random(seed)
    clips: dict[str, dict[str, Any]] = {}
    for w in range(math.ceil(n / 2)):
        window = cut_window(sources, rng)
        common = {
            "reference": window["reference"],
            "segments": window["segments"],
            "tape_offset_s": window["tape_offset_s"],
            "duration_s": round(len(window["audio"]) / SAMPLE_RATE, 3),
        }
        wide, narrow = f"real_{w:03d}_16k.wav", f"real_{w:03d}_8k.wav"
        write_wav(folder / wide, window["audio"], SAMPLE_RATE)
        write_wav(folder / narrow, telephone(window["audio"]), TELEPHONE_RATE)
        clips[wide] = {**common, "sample_rate": SAMPLE_RATE, "band": "16k"}
        clips[narrow] = {**common, "sample_rate": TELEPHONE_RATE, "band": "8k"}
    meta = {
        "version": REAL_CORPUS_VERSION,
        "n": n,
        "seed": seed,
        "sources": {s["id"]: " ".join(s["words"]) for s in sources},
        "word_times": {
            s["id"]: [[round(float(a), 2), round(float(b), 2)] for a, b in s["times"]]
            for s in sources
        },
        # The cuts between words that windows drew, and whether they passed the check by ear.
        "cuts_checked": {
            s["id"]: {
                f"{s['words'][k - 1]}|{s['words'][k]}": ok for k, ok in sorted(s["heard"].items())
            }
            for s in sources
        },
        "clips": clips,
    }
    meta_path.write_text(json.dumps(meta, indent=1))
    return meta


# ---------------------------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------------------------


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(d))
    out, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


class PeakRSS:
    """Peak memory of this process and all its descendants (Ray workers too), from /proc.

    Summed as PSS (proportional set size): Ray's object store is shared memory mapped into
    every worker, and summing RSS would count it once per process.
    """

    # Reading smaps_rollup walks a process's page tables: sampled every 0.1 s over Ray's
    # dozen processes it took most of a core from the runs it measured.
    def __init__(self, interval: float = 1.0):
        self.pid, self.interval, self.peak = os.getpid(), interval, 0
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()

    @staticmethod
    def _pss(pid: int) -> int:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
        return 0

    def _total(self) -> int:
        total = 0
        for pid in [self.pid, *descendants(self.pid)]:
            with contextlib.suppress(OSError, ValueError):  # a process may end meanwhile
                total += self._pss(pid)
        return total

    def _run(self):
        while not self._stop.is_set():
            total = self._total()
            self.samples.append((time.perf_counter(), total))
            self.peak = max(self.peak, total)
            time.sleep(self.interval)

    def peak_by_quarter(self, t0: float, wall: float) -> list[int]:
        """The peak so far at 25, 50, 75 and 100% of the run, in MB: flat memory reaches its
        peak early and stays there; memory that grows with the items done keeps rising."""
        return [
            round(max((m for t, m in self.samples if t - t0 <= q * wall), default=0) / 2**20)
            for q in (0.25, 0.5, 0.75, 1.0)
        ]

    def __enter__(self):
        self.peak = self._total()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


# Options every variant shares (the job's defaults, pinned).
BEAM, VAD, BATCH = 5, True, 32
# --word-timestamps: every variant also times each word (set once in main).
WORD_TIMESTAMPS = False

# A variant's run: the pass number -> (file name -> transcript, what else it reports).
Runner = Callable[[int], tuple[dict[str, str], dict[str, Any]]]


def _bundled_model(threads: int) -> Any:
    """The bundled Whisper model in faster-whisper itself, int8 on the CPU."""
    from faster_whisper import WhisperModel

    from overnight.workers.whisper_models import bundled_model_path

    return WhisperModel(
        bundled_model_path(), device="cpu", compute_type="int8", cpu_threads=threads
    )


def _file_by_file(
    transcribe: Callable[..., Any], files: list[Path], **options: Any
) -> dict[str, str]:
    """Each file through ``transcribe`` (faster-whisper's), English, the benchmark's beam, VAD
    and word timestamps plus ``options``; file name -> the segments' text joined."""
    out = {}
    for f in files:
        segments, _ = transcribe(
            str(f),
            beam_size=BEAM,
            vad_filter=VAD,
            language="en",
            word_timestamps=WORD_TIMESTAMPS,
            **options,
        )
        out[f.name] = " ".join(s.text.strip() for s in segments)
    return out


def run_plain(files: list[Path], threads: int) -> dict[str, str]:
    return _file_by_file(
        _bundled_model(threads).transcribe,
        files,
        temperature=0.0,
        condition_on_previous_text=False,
        without_timestamps=True,
    )


def run_batched(files: list[Path], threads: int) -> dict[str, str]:
    from faster_whisper import BatchedInferencePipeline

    pipe = BatchedInferencePipeline(_bundled_model(threads))
    return _file_by_file(pipe.transcribe, files, batch_size=BATCH)


# The file-by-file baselines, by their --skip / --scale-baselines key.
BASELINES: dict[str, tuple[str, str, Callable[[list[Path], int], dict[str, str]]]] = {
    "plain": ("(a)", "(a) faster-whisper, file by file", run_plain),
    "batched": ("(b)", "(b) BatchedInferencePipeline", run_batched),
}


def read_transcripts(output: Path) -> dict[str, str]:
    import pyarrow.dataset as pads

    rows = pads.dataset(str(output / "transcripts"), format="parquet").to_table(
        columns=["source_uri", "text"]
    )
    return {Path(r["source_uri"]).name: r["text"] or "" for r in rows.to_pylist()}


def chosen_options(summary: dict[str, Any]) -> dict[str, Any]:
    """The pool shape the job ran with: the summary's options hold what ``auto`` resolved
    (jobs/run/sizing.py), and which fields it chose."""
    opts = summary.get("options") or {}
    keys = ("actors", "cpus_per_actor", "decode_cpus", "model_workers", "cpu_threads", "auto")
    return {k: opts.get(k) for k in (*keys, "items_per_call", "calls_per_actor")}


def summary_report(summary: dict[str, Any]) -> dict[str, Any]:
    return {
        "model_busy_s": summary.get("accelerator_seconds"),
        "pipeline_s": summary.get("pipeline_seconds"),
        "job_wall_s": summary.get("wall_seconds"),
        # Job start to the first committed result (the run summary's start-up timeline).
        "first_batch_s": (summary.get("startup") or {}).get("first_result_s"),
        "startup": summary.get("startup"),
        "cost_per_audio_minute_usd": summary.get("cost_per_audio_minute_usd"),
        "failed": summary.get("failed"),
        "errors_by_code": summary.get("errors_by_code") or {},
        "options_chosen": chosen_options(summary),
    }


def ray_start() -> float:
    """Start a local Ray for an in-process run; returns the seconds it took."""
    import ray

    t0 = time.perf_counter()
    if not ray.is_initialized():
        ray.init(
            num_cpus=os.cpu_count(),
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
        )
    return time.perf_counter() - t0


def ray_stop(timeout_s: float = 30.0) -> None:
    """Shut Ray down and wait for its processes to end, so the next variant (the CLI's cold
    start above all) has the machine to itself."""
    import ray

    ray.shutdown()
    deadline = time.monotonic() + timeout_s
    while descendants(os.getpid()) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = descendants(os.getpid())
    if left:
        print(f"      note: {len(left)} child processes still alive after ray.shutdown()")


def run_overnight(
    folder: Path, output: Path, args, window_step: int | None = None
) -> tuple[dict[str, str], dict[str, Any]]:
    """(c): the job in this process, tuned. ``window_step`` None: the job's default."""
    from overnight.jobs.spec import build_spec
    from overnight.jobs.transcribe import run_transcribe

    spec = build_spec(
        overrides={
            "job": {"input": str(folder), "output": str(output), "progress": False},
            "transcribe": {
                "batch_size": BATCH,
                "beam_size": BEAM,
                "vad": VAD,
                "actors": args.actors,
                "cpus_per_actor": args.cpus_per_actor,
                "cpu_threads": args.actor_threads,
                "decode_cpus": args.decode_cpus,
                "items_per_call": args.items_per_call,
                "calls_per_actor": args.calls_per_actor,
                "model_workers": args.model_workers,
                "window_step_s": window_step,
                "word_timestamps": WORD_TIMESTAMPS,
            },
        }
    )
    summary = run_transcribe(spec)
    texts = read_transcripts(output)
    shutil.rmtree(output, ignore_errors=True)
    return texts, summary_report(summary)


def _finished_epoch(summary: dict[str, Any]) -> float | None:
    with contextlib.suppress(KeyError, TypeError, ValueError):
        return datetime.fromisoformat(summary["finished_at"]).timestamp()
    return None


def _other_output(log: str) -> list[str]:
    """What the CLI printed besides its progress lines and run summary (warnings and the
    like), each distinct line once."""
    summary_keys = (
        "run ",
        "items ",
        "errors ",
        "repaired ",
        "audio ",
        "time ",
        "cost ",
        "tokens ",
        "per minute ",
        "transcripts ",
        "costs ",
        "summary_path ",
    )
    seen: list[str] = []
    for line in log.splitlines():
        text = line.strip()
        if text and not text.startswith(("[overnight]", *summary_keys)) and text not in seen:
            seen.append(text)
    return seen


def run_cli(folder: Path, output: Path) -> tuple[dict[str, str], dict[str, Any]]:
    """(d): ``python -m overnight.jobs.cli transcribe FOLDER OUTPUT`` as a user types it."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.pop("RAY_ADDRESS", None)  # a local, cold Ray of its own
    cmd = [sys.executable, "-m", "overnight.jobs.cli", "transcribe", str(folder), str(output)]
    started_epoch, t0 = time.time(), time.perf_counter()
    done = subprocess.run(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    process_wall = time.perf_counter() - t0
    report: dict[str, Any] = {
        "process_wall_s": round(process_wall, 2),
        "returncode": done.returncode,
        "cli_other_output": _other_output(done.stdout)[:20],
    }
    if done.returncode != 0:
        shutil.rmtree(output, ignore_errors=True)
        print(f"      the CLI exited {done.returncode}:\n" + done.stdout[-3000:], flush=True)
        return {}, report
    runs = sorted((output / "runs").glob("*.json"), key=lambda p: p.stat().st_mtime)
    summary = json.loads(runs[-1].read_text()) if runs else {}
    texts = read_transcripts(output)
    shutil.rmtree(output, ignore_errors=True)
    report.update(summary_report(summary))
    finished = _finished_epoch(summary)
    if finished is not None and summary.get("wall_seconds") is not None:
        # The job's own clock starts in run_transcribe: what lies before it (interpreter,
        # imports, argument parsing) is the process start to job start.
        job_start = finished - summary["wall_seconds"]
        report["before_job_s"] = round(job_start - started_epoch, 2)
        report["after_job_s"] = round(process_wall - (finished - started_epoch), 2)
        if report["first_batch_s"] is not None:
            report["startup_s"] = round(job_start - started_epoch + report["first_batch_s"], 2)
    return texts, report


@dataclass
class Variant:
    tag: str
    name: str
    run: Runner
    setup: Callable[[], dict[str, Any]] | None = None  # before the timer
    teardown: Callable[[], None] | None = None  # after the timer


def measure(
    variant: Variant, rep: int, refs: dict[str, str], bands: dict[str, str], audio_s: float
) -> dict:
    extra = variant.setup() if variant.setup else {}
    t0 = time.perf_counter()
    try:
        with PeakRSS() as mem:
            texts, more = variant.run(rep)
        wall = time.perf_counter() - t0
    finally:
        if variant.teardown:
            variant.teardown()
    errs: dict[str, list[int]] = {}
    per_file = {}
    for fname, ref in refs.items():
        e, w = errors_and_words(ref, texts.get(fname, ""))
        per_file[fname] = {"errors": e, "words": w, "text": texts.get(fname)}
        for key in {"all", bands.get(fname, "all")}:
            errs.setdefault(key, [0, 0])
            errs[key][0] += e
            errs[key][1] += w
    wers = {k: round(e / w, 4) if w else None for k, (e, w) in errs.items()}
    result = {
        "tag": variant.tag,
        "variant": variant.name,
        "pass": rep + 1,
        "files": len(refs),
        "transcribed": sum(1 for f in refs if f in texts),
        "audio_s": round(audio_s, 1),
        "wall_s": round(wall, 2),
        "audio_s_per_s": round(audio_s / wall, 2),
        "wer": wers["all"],
        "wer_by_band": {k: v for k, v in wers.items() if k != "all"},
        "peak_memory_mb": round(mem.peak / 2**20),
        "peak_by_quarter_mb": mem.peak_by_quarter(t0, wall),
        **extra,
        **more,
        "per_file": per_file,
    }
    bands_text = ", ".join(
        f"{k} {v:.4f}" for k, v in result["wer_by_band"].items() if v is not None
    )
    print(
        f"  {variant.name:<36} {result['wall_s']:>8.1f} s  {result['audio_s_per_s']:>7.2f} audio-s/s  "
        f"WER {result['wer']:.4f}{f' ({bands_text})' if len(result['wer_by_band']) > 1 else ''}  "
        f"peak memory {result['peak_memory_mb']} MB "
        f"(peak so far at 25/50/75/100% of the run: "
        f"{'/'.join(str(m) for m in result['peak_by_quarter_mb'])} MB)",
        flush=True,
    )
    if result["transcribed"] < len(refs):
        print(f"      only {result['transcribed']} of {len(refs)} files have a transcript")
    if "model_busy_s" in result:
        print(
            f"      model busy {result['model_busy_s']:.1f} s of {result['pipeline_s']:.1f} s "
            f"pipeline wall, {result['job_wall_s']:.1f} s job wall"
            + (
                f", first result {result['first_batch_s']:.1f} s after job start"
                if result.get("first_batch_s") is not None and "process_wall_s" not in result
                else ""
            )
            + (
                f", Ray started in {result['ray_start_s']:.1f} s before the timer"
                if "ray_start_s" in result
                else ""
            )
        )
    if "process_wall_s" in result:
        startup = (
            f"start-up to the first result {result['startup_s']:.1f} s "
            f"({result['first_batch_s']:.1f} s after job start; "
            + ", ".join(
                f"{k.removesuffix('_s')} {v:.1f} s"
                for k, v in (result.get("startup") or {}).items()
                if v is not None and k != "first_result_s"
            )
            + ")"
            if result.get("startup_s") is not None
            else "start-up to the first result: not in the run summary"
        )
        print(
            f"      whole process {result['process_wall_s']:.1f} s: "
            f"{result.get('before_job_s', float('nan')):.1f} s before the job's clock starts, "
            f"{result.get('after_job_s', float('nan')):.1f} s after it stops; {startup}"
        )
    if result.get("options_chosen"):
        print(
            "      options the job ran with: "
            + ", ".join(f"{k} {v}" for k, v in result["options_chosen"].items())
        )
    for line in result.get("cli_other_output", [])[:6]:
        print(f"      the CLI printed: {line[:200]}")
    if result.get("failed"):
        print(f"      {result['failed']} items failed: {result['errors_by_code']}")
    return result


def audio_seconds(files: list[Path]) -> float:
    total = 0.0
    for f in files:
        with wave.open(str(f)) as w:
            total += w.getnframes() / w.getframerate()
    return total


def best_of(runs: list[dict]) -> dict:
    best = min(runs, key=lambda r: r["wall_s"])
    walls = [r["wall_s"] for r in runs]
    return {
        **best,
        "walls_s": walls,
        "wall_min_s": min(walls),
        "wall_max_s": max(walls),
        "wers": [r["wer"] for r in runs],
        "peak_memory_mb_by_pass": [r["peak_memory_mb"] for r in runs],
    }


def print_table(results: list[dict], runs: dict[str, list[dict]], repeat: int) -> list[dict]:
    print(f"\nfastest of {repeat} pass{'es' if repeat > 1 else ''} (walls in pass order):")
    print(
        f"  {'variant':<36} {'walls s':<18} {'min-max s':<13} {'audio-s/s':>9}  {'WER':<24} peak MB"
    )
    for r in results:
        walls = ", ".join(f"{w:.1f}" for w in r["walls_s"])
        spread = f"{r['wall_min_s']:.1f}-{r['wall_max_s']:.1f}"
        bands = "/".join(f"{v:.3f}" for v in r["wer_by_band"].values() if v is not None)
        wer = f"{r['wer']:.4f}" + (f" ({bands})" if len(r["wer_by_band"]) > 1 else "")
        print(
            f"  {r['variant']:<36} {walls:<18} {spread:<13} {r['audio_s_per_s']:>9.2f}  "
            f"{wer:<24} {max(r['peak_memory_mb_by_pass'])}"
        )
    ratios: list[dict[str, Any]] = []
    base = next((r for r in results if r["tag"] == "(a)"), None)
    if base is None or len(results) < 2:
        return ratios
    print("  ratios against (a), the plain loop on all cores (throughput, fastest passes):")
    for r in results:
        if r is base:
            continue
        per_pass = [
            round(a["wall_s"] / x["wall_s"], 2)
            for a, x in zip(runs["(a)"], runs[r["tag"]], strict=False)
        ]
        ratio = round(base["wall_s"] / r["wall_s"], 2)
        ratios.append(
            {
                "of": r["tag"],
                "to": "(a)",
                "throughput": ratio,
                "per_pass": per_pass,
                "wer": r["wer"],
                "wer_a": base["wer"],
            }
        )
        print(
            f"    {r['tag']}/(a): {ratio:.2f}x (pass by pass {', '.join(f'{p:.2f}x' for p in per_pass)}), "
            f"WER {r['wer']:.4f} vs {base['wer']:.4f}"
        )
    return ratios


def bench_corpus(
    kind: str, folder: Path, refs: dict[str, str], bands: dict[str, str], args, work: Path
) -> dict[str, Any]:
    files = sorted(folder / n for n in refs)
    audio_s = audio_seconds(files)
    lengths = [audio_seconds([f]) for f in files]
    band_counts = {
        b: sum(1 for f in refs if bands.get(f) == b) for b in sorted(set(bands.values()))
    }
    print(
        f"\n{kind} corpus: {len(files)} recordings, {audio_s:.0f} s of audio "
        f"({min(lengths):.1f}-{max(lengths):.1f} s each"
        + (", " + ", ".join(f"{c} at {b}" for b, c in band_counts.items()) if band_counts else "")
        + f"); model tiny.en int8 CPU, beam {BEAM}, VAD {VAD}, batch {BATCH}",
        flush=True,
    )
    skip = set(filter(None, args.skip.split(",")))

    def baseline(runner: Callable[[list[Path], int], dict[str, str]]) -> Runner:
        return lambda rep: (runner(files, args.threads), {})

    variants = [
        Variant(tag, name, baseline(runner))
        for key, (tag, name, runner) in BASELINES.items()
        if key not in skip
    ]

    def ray_setup() -> dict[str, Any]:
        return {"ray_start_s": round(ray_start(), 2)}

    ours_steps: list[tuple[str, str, int | None]] = []
    if "tuned" not in skip:
        ours_steps.append(("(c)", "(c) overnight in-process, tuned", None))
    for w in (int(x) for x in str(args.window_step).split(",") if int(x)):
        ours_steps.append((f"(c') step {w}", f"(c') overnight tuned, window step {w} s", w))
    for k, (tag, name, step) in enumerate(ours_steps):
        # A fresh output per pass: the same one would resume and find nothing to do.
        def ours(rep: int, k: int = k, step: int | None = step):
            return run_overnight(folder, work / f"{kind}-out{k}-{rep}", args, step)

        variants.append(Variant(tag, name, ours, ray_setup, ray_stop))
    if "cli" not in skip:
        variants.append(
            Variant(
                "(d)",
                "(d) overnight CLI, defaults",
                lambda rep: run_cli(folder, work / f"{kind}-cli-{rep}"),
            )
        )
    # Shared machines drift by tens of percent over minutes: the variants take turns, pass
    # after pass, and each is reported by its fastest pass (all walls listed).
    runs: dict[str, list[dict]] = {v.tag: [] for v in variants}
    for rep in range(args.repeat):
        print(f"pass {rep + 1}/{args.repeat}", flush=True)
        for v in variants:
            runs[v.tag].append(measure(v, rep, refs, bands, audio_s))
    results = [best_of(runs[v.tag]) for v in variants]
    ratios = print_table(results, runs, args.repeat)
    scaled = scale_run(kind, results, args, work) if args.scale > 1 else None
    return {
        "corpus": {
            "kind": kind,
            "folder": str(folder),
            "files": len(files),
            "audio_s": round(audio_s, 1),
            "shortest_s": round(min(lengths), 2),
            "longest_s": round(max(lengths), 2),
            "bands": band_counts,
        },
        "results": results,
        "passes": runs,
        "ratios": ratios,
        "scaled": scaled,
    }


def load_corpus(kind: str, n: int, args, seed: int) -> tuple[Path, dict[str, str], dict[str, str]]:
    """(folder, file -> reference, file -> band)."""
    root = Path(args.corpus)
    if kind == "real":
        folder = real_corpus_folder(root, Path(args.real_audio), n, seed)
        meta = make_real_corpus(folder, Path(args.real_audio), n, seed, args.threads)
        clips = meta["clips"]
        return (
            folder,
            {k: c["reference"] for k, c in clips.items()},
            {k: c["band"] for k, c in clips.items()},
        )
    folder = root / f"n{n}" if seed == 0 else root / f"n{n}-s{seed}"
    refs = make_corpus(folder, n, seed=seed)
    return folder, refs, {}


def scale_run(kind: str, results: list[dict], args, work: Path) -> dict[str, Any]:
    """(c) on ``--scale`` times the files: time grows linearly, peak memory stays flat."""
    n = (args.real_clips if kind == "real" else args.files) * args.scale
    folder, refs, bands = load_corpus(kind, n, args, seed=args.seed + 1)
    files = sorted(folder / f for f in refs)
    audio = audio_seconds(files)
    ours = next(r for r in results if r["tag"] == "(c)")
    scaled = measure(
        Variant(
            "(c)",
            f"(c) overnight x{args.scale} files",
            lambda rep: run_overnight(folder, work / f"{kind}-out-scaled", args),
            lambda: {"ray_start_s": round(ray_start(), 2)},
            ray_stop,
        ),
        0,
        refs,
        bands,
        audio,
    )
    per_audio_1 = ours["wall_s"] / ours["audio_s"]
    per_audio_n = scaled["wall_s"] / scaled["audio_s"]
    print(
        f"  scaling x{args.scale}: wall per audio-second {per_audio_n / per_audio_1:.2f}x of the 1x run "
        f"(1.00 = linear, below 1: fixed start-up costs amortized), "
        f"peak memory {scaled['peak_memory_mb']} MB vs {ours['peak_memory_mb']} MB"
    )
    # (a) and (b) go file by file, so their throughput does not depend on the file count;
    # --scale-baselines measures that on the same ten-fold corpus instead of assuming it.
    scaled_baselines = {}
    for key in filter(None, args.scale_baselines.split(",")):
        tag, _, runner = BASELINES[key]

        def baseline(rep: int, runner=runner) -> tuple[dict[str, str], dict[str, Any]]:
            return runner(files, args.threads), {}

        scaled_baselines[tag] = measure(
            Variant(tag, f"{tag} x{args.scale} files", baseline),
            0,
            refs,
            bands,
            audio,
        )
    for r in results:
        tag = r["tag"]
        if tag.startswith(("(c", "(d")):
            continue
        base, where = r, "measured on the 1x corpus"
        if tag in scaled_baselines:
            base, where = scaled_baselines[tag], f"measured on the same {n} files"
        print(
            f"  ratio (c) x{args.scale}/{tag}: "
            f"{scaled['audio_s_per_s'] / base['audio_s_per_s']:.2f}x throughput, "
            f"WER {scaled['wer']:.4f} vs {base['wer']:.4f} ({tag} {where})"
        )
    return {**scaled, "baselines": scaled_baselines}


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--corpus-kind",
        choices=["real", "synth", "both"],
        default=None,
        help="default: real when the shared audio exists, else synth",
    )
    ap.add_argument(
        "--real-audio",
        default=str(DEFAULT_REAL_AUDIO),
        help="folder of the recordings with references (default <repo>/../shared/data/audio)",
    )
    ap.add_argument(
        "--real-clips",
        type=int,
        default=60,
        help="real-speech clips: half wideband 16 kHz, half their 8 kHz telephone variants",
    )
    ap.add_argument("--files", type=int, default=60, help="synthesized recordings")
    ap.add_argument("--seed", type=int, default=0, help="corpus seed")
    ap.add_argument("--scale", type=int, default=0, help="also run (c) on files x scale")
    ap.add_argument(
        "--threads", type=int, default=os.cpu_count() or 2, help="CTranslate2 threads for (a)/(b)"
    )
    # (c)'s pool shape, tuned for 2 cores: one actor holding 1.5 CPUs runs two one-thread model
    # workers (model_workers 0 = one per core it holds), decode tasks share the other half.
    ap.add_argument("--actors", type=int, default=1)
    ap.add_argument("--cpus-per-actor", type=float, default=1.5)
    ap.add_argument("--actor-threads", type=int, default=0, help="0: the job's default")
    ap.add_argument("--model-workers", type=int, default=0, help="0: the job's default")
    ap.add_argument("--decode-cpus", type=float, default=0.25)
    ap.add_argument(
        "--window-step",
        default="0",
        help="(c'): encoder window step(s) in seconds, comma-separated (one run each; 30 = "
        "Whisper's full window); 0 (the default) skips (c')",
    )
    ap.add_argument(
        "--scale-baselines",
        default="",
        help="with --scale: also run these baselines on the ten-fold corpus (plain,batched)",
    )
    ap.add_argument("--items-per-call", type=int, default=0, help="0: the job's default")
    ap.add_argument("--calls-per-actor", type=int, default=0, help="0: the job's default")
    ap.add_argument(
        "--corpus",
        default=os.path.join(tempfile.gettempdir(), "overnight-bench-corpus"),
        help="where the corpora are cached",
    )
    ap.add_argument(
        "--skip",
        default="batched",
        help="comma list of variants to skip: plain, batched, tuned, cli (default: batched; "
        "--skip '' runs them all)",
    )
    ap.add_argument(
        "--repeat", type=int, default=2, help="passes; the variants take turns, fastest kept"
    )
    ap.add_argument(
        "--word-timestamps",
        action="store_true",
        help="(a), (b), (c): word timestamps on (the CLI variant (d) runs as a user types it)",
    )
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    global WORD_TIMESTAMPS
    WORD_TIMESTAMPS = args.word_timestamps

    have_real = (
        bool(real_sources(Path(args.real_audio))) if Path(args.real_audio).is_dir() else False
    )
    kind = args.corpus_kind or ("real" if have_real else "synth")
    kinds = ["real", "synth"] if kind == "both" else [kind]
    if args.corpus_kind != "synth" and not have_real:
        print(
            f"note: no recordings with references in {args.real_audio} (the shared audio is "
            "absent): running on the synthesized corpus only",
            flush=True,
        )
        kinds = ["synth"]
    work = Path(tempfile.mkdtemp(prefix="overnight-bench-"))
    out: dict[str, Any] = {"corpora": {}, "args": vars(args)}
    try:
        for k in kinds:
            n = args.real_clips if k == "real" else args.files
            folder, refs, bands = load_corpus(k, n, args, args.seed)
            out["corpora"][k] = bench_corpus(k, folder, refs, bands, args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
