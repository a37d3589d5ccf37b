#!/usr/bin/env python3
"""WER and CPU speed of the Whisper engines on the shared recordings (issue #39).

    .venv/bin/python scripts/bench_whisper_engines.py [--audio ../shared/data/audio]
        [--beam 1] [--threads 2] [--passes 2] [--synth]

Runs overnight's ``WhisperWorker`` on the bundled tiny.en with each engine: CTranslate2 as the
CPU default runs it (int8), CTranslate2 in float32 (the torch engine's arithmetic), and the
torch engine (float32 on CPU). Prints per engine the corpus WER against the references
(``librispeech_trans.txt`` and jfk's known text; ``--synth`` adds espeak-ng calls), audio
seconds per wall second (best of ``--passes`` after a warm-up) and the speed ratio to
CTranslate2's default. CPU speed is informational: CTranslate2 stays the CPU default; the
torch engine is built for GPUs.
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

JFK = (
    "And so my fellow Americans, ask not what your country can do for you, ask what you can "
    "do for your country."
)
SYNTH = [
    "Please cancel my order from last week.",
    "The package arrived damaged and I want a refund.",
    "Can you call me back after five o'clock?",
    "My account number is on the letter you sent.",
    "I would like to upgrade my internet plan.",
]
VARIANTS = (("ctranslate2", "auto"), ("ctranslate2", "float32"), ("torch", "auto"))


def recordings(folder: Path, synth: bool) -> dict[str, tuple[bytes, str]]:
    out: dict[str, tuple[bytes, str]] = {}
    if (folder / "jfk.flac").is_file():
        out["jfk.flac"] = ((folder / "jfk.flac").read_bytes(), JFK)
    trans = folder / "librispeech_trans.txt"
    if trans.is_file():
        for line in trans.read_text().splitlines():
            item, text = line.split("\t")
            if (folder / f"{item}.wav").is_file():
                out[f"{item}.wav"] = ((folder / f"{item}.wav").read_bytes(), text)
    if synth:
        import numpy as np

        from overnight.jobs.ops.demo import silence, speak, write_wav

        for i, text in enumerate(SYNTH):
            buf = io.BytesIO()
            write_wav(buf, np.concatenate([silence(0.3 * i), speak(text), silence(0.5)]))
            out[f"synth{i}.wav"] = (buf.getvalue(), text)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    here = Path(__file__).resolve().parents[1]
    ap.add_argument("--audio", default=str(here.parent / "shared" / "data" / "audio"))
    ap.add_argument("--beam", type=int, default=1, help="beam size (1: greedy)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--synth", action="store_true", help="add espeak-ng calls")
    args = ap.parse_args()

    import pyarrow as pa
    import torch

    from overnight.jobs.ops.wer import corpus_wer
    from overnight.schemas.stages import DECODED
    from overnight.workers.audio import AudioChunker, AudioOptions
    from overnight.workers.whisper import WhisperOptions, WhisperWorker, WhisperWorkerConfig

    torch.set_num_threads(args.threads)
    items = recordings(Path(args.audio), args.synth)
    if not items:
        print(f"bench_whisper_engines: no recordings under {args.audio}")
        return 1
    chunker = AudioChunker(AudioOptions())
    rows = [
        chunker(data).record(name, f"mem://{name}", size=1, etag="e")
        for name, (data, _) in items.items()
    ]
    table = pa.Table.from_pylist(rows, schema=DECODED)
    audio_s = sum(r["duration_s"] for r in rows)
    refs = {name: text for name, (_, text) in items.items()}
    results = {}
    for engine, compute_type in VARIANTS:
        options = WhisperOptions(
            engine=engine,
            compute_type=compute_type,
            beam_size=args.beam,
            batch_size=8,
            cpu_threads=args.threads,
        )
        worker = WhisperWorker(WhisperWorkerConfig(whisper=options))
        worker(table.slice(0, 1))  # warm-up
        walls, out = [], None
        for _ in range(args.passes):
            started = time.perf_counter()
            out = worker(table)
            walls.append(time.perf_counter() - started)
        assert out is not None
        hyps = dict(zip(refs, out.column("text").to_pylist(), strict=True))
        wer, _ = corpus_wer(refs, hyps)
        results[engine, worker.compute_type] = (wer, audio_s / min(walls), hyps)
    base = results["ctranslate2", "int8"][1]
    print(
        f"{len(items)} recordings, {audio_s:.1f} audio-s, beam {args.beam}, {args.threads} threads"
    )
    print(f"{'engine':<12} {'compute':<8} {'WER':>7} {'audio-s/s':>10} {'speed vs ct2 int8':>18}")
    for (engine, compute_type), (wer, speed, _) in results.items():
        print(f"{engine:<12} {compute_type:<8} {wer:>7.4f} {speed:>10.1f} {speed / base:>17.2f}x")
    torch_wer = results["torch", "float32"][0]
    for key in (("ctranslate2", "float32"), ("ctranslate2", "int8")):
        same = sum(results[key][2][k] == results["torch", "float32"][2][k] for k in refs)
        gap = abs(torch_wer - results[key][0]) * 100
        print(f"torch vs {key[0]} {key[1]}: WER gap {gap:.2f} points, {same}/{len(refs)} identical")
    return 0


if __name__ == "__main__":
    sys.exit(main())
