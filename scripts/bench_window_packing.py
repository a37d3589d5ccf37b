#!/usr/bin/env python
"""Cross-recording window packing, measured (issue #14): can several short recordings share
one 30 s Whisper encoder window, and be split back by the timestamps the decoder writes?

Whisper's encoder always takes a 30 s window, so a 10 s clip pays for 30 s of encoder work.
Packing short chunks of different recordings into one window (first-fit decreasing, a gap of
``--gap-frames`` silent frames between them) cuts the windows by about half on the benchmark's
5-30 s clips. A chunk's text is then the segments whose middle falls in its part of the window.
Three variants, the same chunks (the job's own decode: Silero VAD, 30 s chunks), the same
model call (the job's ``WhisperWorker``: its model and decoding options, faster-whisper's batched
``forward``, tiny.en int8, beam 5, batch 16), taking turns:

(u) one chunk per window, no timestamps: what the job does
(t) one chunk per window, timestamps on: what packing needs to split, without packing
(p) packed windows, timestamps on, split back by segment times

It prints each variant's seconds, word error rate over the clips, and for (p) the segments
that straddle a boundary by more than 0.3 s.

    python scripts/bench_window_packing.py [--clips 60] [--repeat 2] [--gap-frames 100]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_transcribe as bench

from overnight.jobs.ops.wer import wer

WINDOW = 3000  # feature frames in Whisper's 30 s window


def pack(frames: list[int], gap: int) -> list[list[int]]:
    """First-fit decreasing: chunk indices per window, gaps included in the 30 s."""
    bins: list[list[int]] = []
    used: list[int] = []
    for k in sorted(range(len(frames)), key=lambda k: -frames[k]):
        for b, u in enumerate(used):
            if u + gap + frames[k] <= WINDOW:
                bins[b].append(k)
                used[b] += gap + frames[k]
                break
        else:
            bins.append([k])
            used.append(frames[k])
    return bins


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clips", type=int, default=60)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--gap-frames", type=int, default=100, help="10 ms frames of silence")
    parser.add_argument(
        "--real-audio",
        default=str(Path(__file__).resolve().parents[1] / ".." / "shared/data/audio"),
    )
    args = parser.parse_args()

    import dataclasses

    from faster_whisper.transcribe import BatchedInferencePipeline

    from overnight.workers.audio import AudioChunker, AudioOptions
    from overnight.workers.whisper import WhisperOptions, WhisperWorker, WhisperWorkerConfig

    audio_dir = Path(args.real_audio)
    root = Path(tempfile.gettempdir()) / "overnight-bench-corpus"
    folder = bench.real_corpus_folder(root, audio_dir, args.clips, 0)
    folder.mkdir(parents=True, exist_ok=True)
    meta = bench.make_real_corpus(folder, audio_dir, args.clips)["clips"]
    names = sorted(meta)
    chunker = AudioChunker(AudioOptions())
    chunks: list[tuple[str, np.ndarray]] = []
    for name in names:
        chunks += [(name, c.features) for c in chunker((folder / name).read_bytes()).chunks]
    # The job's own worker: its model, tokenizer and decoding options (beam 5, int8).
    worker = WhisperWorker(
        WhisperWorkerConfig(
            WhisperOptions(device="cpu", compute_type="int8", beam_size=5, cpu_threads=args.threads)
        )
    )
    tokenizer = worker._tokenizer("en")
    job_options = worker._transcription_options(tokenizer)

    def decode(windows: list[np.ndarray], timestamps: bool) -> list[list[dict]]:
        options = dataclasses.replace(job_options, without_timestamps=not timestamps)
        outputs: list[list[dict]] = []
        for i in range(0, len(windows), 16):
            part = windows[i : i + 16]
            feats = np.stack([np.pad(w, ((0, 0), (0, WINDOW - w.shape[1]))) for w in part])
            metas = [{"offset": 0.0, "duration": w.shape[1] / 100} for w in part]
            pipeline = BatchedInferencePipeline(worker.model)
            outputs += pipeline.forward(feats, tokenizer, metas, options)
        return outputs

    def unpacked(timestamps: bool) -> tuple[dict[str, str], int]:
        outputs = decode([f for _, f in chunks], timestamps)
        texts: dict[str, str] = {}
        for (name, _), out in zip(chunks, outputs, strict=True):
            texts[name] = texts.get(name, "") + " " + " ".join(s["text"] for s in out)
        return texts, len(chunks)

    def packed() -> tuple[dict[str, str], int, int]:
        bins = pack([f.shape[1] for _, f in chunks], args.gap_frames)
        windows, bounds = [], []
        for b in bins:
            parts, spans, pos = [], [], 0
            for k in b:
                f = chunks[k][1]
                if parts:  # silence at the quiet floor of the chunk before
                    parts.append(
                        np.full((f.shape[0], args.gap_frames), parts[-1].min(), np.float32)
                    )
                    pos += args.gap_frames
                spans.append((pos / 100, (pos + f.shape[1]) / 100))
                parts.append(f)
                pos += f.shape[1]
            windows.append(np.concatenate(parts, axis=1))
            bounds.append(spans)
        outputs = decode(windows, timestamps=True)
        texts: dict[str, str] = {}
        straddling = 0
        for b, spans, out in zip(bins, bounds, outputs, strict=True):
            for seg in out:
                mid = (seg["start"] + seg["end"]) / 2
                j = min(
                    range(len(spans)),
                    key=lambda q: (
                        0
                        if spans[q][0] <= mid <= spans[q][1]
                        else min(abs(mid - spans[q][0]), abs(mid - spans[q][1]))
                    ),
                )
                if seg["start"] < spans[j][0] - 0.3 or seg["end"] > spans[j][1] + 0.3:
                    straddling += 1
                name = chunks[b[j]][0]
                texts[name] = texts.get(name, "") + " " + seg["text"]
        return texts, len(bins), straddling

    reference = " ".join(meta[n]["reference"] for n in names)
    walls: dict[str, list[float]] = {"u": [], "t": [], "p": []}
    for rep in range(args.repeat):
        for variant in ("u", "t", "p"):
            t0 = time.perf_counter()
            if variant == "p":
                texts, windows, straddling = packed()
            else:
                texts, windows = unpacked(timestamps=variant == "t")
                straddling = 0
            wall = time.perf_counter() - t0
            walls[variant].append(wall)
            score = wer(reference, " ".join(texts.get(n, "") for n in names))
            extra = f", {straddling} segments straddle a boundary" if variant == "p" else ""
            print(
                f"pass {rep + 1} ({variant}) {windows} windows, {wall:.1f} s, WER {score:.2%}{extra}",
                flush=True,
            )
    base = statistics.median(walls["u"])
    for variant in ("t", "p"):
        ratios = [u / v for u, v in zip(walls["u"], walls[variant], strict=True)]
        print(
            f"({variant}) vs (u): {base / statistics.median(walls[variant]):.2f}x by medians, "
            f"per pass {', '.join(f'{r:.2f}x' for r in ratios)}"
        )


if __name__ == "__main__":
    main()
