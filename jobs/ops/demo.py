"""Synthesized calls for the quick start and the tests (no third-party media needed).

espeak-ng (Debian package ``espeak-ng``) speaks known text; numpy mixes it into mono or
agent/customer stereo WAVs. The texts are the references a word error rate is computed on.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import textwrap
import wave
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from overnight.jobs.errors import ConfigError

if TYPE_CHECKING:
    from overnight.jobs.ops.show import Turn

SAMPLE_RATE = 16_000

CALLS: tuple[tuple[str, str], ...] = (
    (
        "call_billing",
        "Thank you for calling. I would like to pay my bill of fifty dollars on Friday.",
    ),
    ("call_address", "Hello, I need to change the address on my account to the new apartment."),
    (
        "call_cancel",
        "I want to cancel my subscription because the service stopped working last week.",
    ),
    (
        "call_refund",
        "Could you please send the refund to my credit card before the end of the month?",
    ),
)
DIALOGUE: tuple[tuple[str, str], ...] = (
    ("agent", "Good morning, this is the billing department, how can I help you today?"),
    ("customer", "I was charged twice for my internet service this month."),
    ("agent", "I am sorry about that, I will refund the second payment right away."),
)


class SynthesisUnavailable(ConfigError, exit_code=ConfigError.exit_code):
    """espeak-ng, which the demo speaks its calls with, is missing or fails: exit 2 saying
    what to install (it was a traceback)."""


_INSTALL_ESPEAK = (
    "install it (apt-get install espeak-ng, dnf install espeak-ng or brew install espeak-ng) "
    "and run the demo again, or transcribe recordings of your own with overnight transcribe"
)


def espeak_available() -> bool:
    return shutil.which("espeak-ng") is not None


def speak(text: str, *, voice: str = "en-us", speed: int = 150) -> np.ndarray:
    """Mono float32 speech at 16 kHz."""
    exe = shutil.which("espeak-ng")
    if exe is None:
        raise SynthesisUnavailable(
            f"espeak-ng is not installed, and it speaks the demo's calls: {_INSTALL_ESPEAK}"
        )
    try:
        wav = subprocess.run(
            [exe, "-v", voice, "-s", str(speed), "--stdout", text],
            capture_output=True,
            check=True,
            timeout=120,
        ).stdout
        with wave.open(io.BytesIO(wav)) as w:
            rate = w.getframerate()
            frames = w.readframes(w.getnframes())
    except (OSError, subprocess.SubprocessError, wave.Error, EOFError) as exc:
        # A broken install (voice data missing, a wrapper that prints no WAV): its own words.
        said = getattr(exc, "stderr", None) or b""
        detail = said.decode("utf-8", "replace").strip().splitlines()[-1:] or [str(exc)]
        raise SynthesisUnavailable(
            f"espeak-ng could not speak the demo's calls ({type(exc).__name__}: "
            f"{detail[0][:200]}): {_INSTALL_ESPEAK}"
        ) from None
    pcm = np.frombuffer(frames, dtype=np.int16).astype(np.float32) / 32768
    # espeak-ng speaks at 22.05 kHz: resample linearly, plenty for speech recognition.
    n_out = int(len(pcm) * SAMPLE_RATE / rate)
    return np.interp(np.linspace(0, len(pcm) - 1, n_out), np.arange(len(pcm)), pcm).astype(
        np.float32
    )


def write_wav(path: Path | BinaryIO, audio: np.ndarray) -> Path | BinaryIO:
    """16-bit WAV; audio: (samples,) mono or (channels, samples)."""
    audio = np.atleast_2d(audio)
    pcm = (np.clip(audio, -1, 1) * 32767).astype(np.int16).T.copy()
    dest: str | BinaryIO = str(path) if isinstance(path, Path) else path
    with wave.open(dest, "wb") as w:
        w.setnchannels(audio.shape[0])
        w.setsampwidth(2)
        w.setframerate(SAMPLE_RATE)
        w.writeframes(pcm.tobytes())
    return path


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * SAMPLE_RATE), dtype=np.float32)


def noise(seconds: float, level: float = 0.05, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(int(seconds * SAMPLE_RATE)) * level).astype(
        np.float32
    )


def stereo_dialogue(turns=DIALOGUE, gap_s: float = 0.6) -> tuple[np.ndarray, dict[str, str]]:
    """Agent on the left channel, customer on the right, taking turns."""
    labels = sorted({speaker for speaker, _ in turns}, key=[s for s, _ in turns].index)
    channels: dict[str, list[np.ndarray]] = {label: [] for label in labels}
    said: dict[str, list[str]] = {label: [] for label in labels}
    for speaker, text in turns:
        clip = np.concatenate(
            [speak(text, voice="en-us" if speaker == "agent" else "en-gb"), silence(gap_s)]
        )
        for label in labels:
            channels[label].append(clip if label == speaker else np.zeros_like(clip))
        said[speaker].append(text)
    audio = np.stack([np.concatenate(channels[label]) for label in labels])
    return audio, {label: " ".join(texts) for label, texts in said.items()}


def make_demo_calls(folder: Path) -> dict[str, str]:
    """Write a few synthesized calls plus one bad file; returns file name → reference text.

    A file that already holds the same bytes is left alone: it keeps its mtime, hence its
    item id, and a second demo into the same output finds its calls already done.
    """
    folder.mkdir(parents=True, exist_ok=True)
    refs: dict[str, str] = {}
    for name, text in CALLS:
        _keep(
            folder / f"{name}.wav",
            _wav(np.concatenate([silence(0.5), speak(text), silence(0.5)])),
        )
        refs[f"{name}.wav"] = text
    audio, said = stereo_dialogue()
    _keep(folder / "call_stereo.wav", _wav(audio))
    refs["call_stereo.wav"] = " ".join(said.values())
    _keep(folder / "call_silent.wav", _wav(noise(4.0)))
    refs["call_silent.wav"] = ""
    _keep(folder / "call_corrupt.wav", b"RIFF\x00\x00\x00\x00WAVEfmt garbage")
    refs["call_corrupt.wav"] = ""
    return refs


def _wav(audio: np.ndarray) -> bytes:
    buf = io.BytesIO()
    write_wav(buf, audio)
    return buf.getvalue()


def _keep(path: Path, data: bytes) -> None:
    if not (path.is_file() and path.read_bytes() == data):
        path.write_bytes(data)


def demo_scripts() -> dict[str, list[tuple[str | None, str]]]:
    """What each demo call says, turn by turn (speaker None: a one-voice call)."""
    scripts: dict[str, list[tuple[str | None, str]]] = {
        f"{name}.wav": [(None, text)] for name, text in CALLS
    }
    scripts["call_stereo.wav"] = list(DIALOGUE)
    scripts["call_silent.wav"] = []
    scripts["call_corrupt.wav"] = []
    return scripts


# What the two calls without speech are for, in the quick start's table.
PURPOSE = {
    "call_silent.wav": "noise only, on purpose: no speech, no text",
    "call_corrupt.wav": "a broken file, on purpose: it becomes an error row",
}


def comparison_table(
    rows: list[dict[str, Any]], scripts: dict[str, list[tuple[str | None, str]]], cols: int
) -> str:
    """Each demo call's script beside its transcript, turn by turn, wrapped at word
    boundaries, with the word error rate per call and over all of them (jobs.ops.tune's WER:
    word edits over reference words, case and punctuation ignored)."""
    from overnight.jobs.ops.show import Turn, spoken_text, turns
    from overnight.jobs.ops.wer import corpus_wer

    latest: dict[str, dict[str, Any]] = {}
    for row in sorted(rows, key=lambda r: str(r.get("processed_at"))):
        latest[str(row["source_uri"]).rsplit("/", 1)[-1]] = row
    half = max(30, (cols - 4) // 2)
    blocks, references, hypotheses = [], {}, {}
    order = list(scripts)  # the scripts' order: the spoken calls first
    for name in sorted(latest, key=lambda n: (order.index(n) if n in order else len(order), n)):
        row = latest[name]
        script = [Turn(speaker, None, text) for speaker, text in scripts.get(name, [])]
        heard = turns(row) if row["status"] == "ok" else []
        head = f"{name}  {row['status']}"
        if row["status"] != "ok":
            head += f"  {row['error_code']}"
        reference = " ".join(t.text for t in script)
        if reference and row["status"] == "ok":
            references[name], hypotheses[name] = reference, spoken_text(row)
            wer, _ = corpus_wer({name: reference}, {name: hypotheses[name]})
            head += f"  WER {wer:.2f}"
        elif row["status"] == "ok" and not heard:
            head += "  no speech"
        if name in PURPOSE:
            head += f"  ({PURPOSE[name]})"
        lines = [head]
        if script or heard:
            lines.append(f"  {'script':<{half}}  transcript")
            for i in range(max(len(script), len(heard))):
                left = _cell(script[i] if i < len(script) else None, half)
                right = _cell(heard[i] if i < len(heard) else None, half)
                for j in range(max(len(left), len(right))):
                    a = left[j] if j < len(left) else ""
                    b = right[j] if j < len(right) else ""
                    lines.append(f"  {a:<{half}}  {b}".rstrip())
        blocks.append("\n".join(lines))
    total, scored = corpus_wer(references, hypotheses)
    if total is not None:
        blocks.append(f"word error rate over the {scored} spoken calls: {total:.3f}")
    return "\n\n".join(blocks)


def _cell(turn: Turn | None, width: int) -> list[str]:
    if turn is None:
        return []
    text = f"{turn.speaker}: {turn.text}" if turn.speaker else turn.text
    return textwrap.wrap(text, width, subsequent_indent="  " if turn.speaker else "") or [""]
