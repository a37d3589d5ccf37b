#!/usr/bin/env python
"""Where Whisper's time goes: encoder and decoder seconds by batch size and encoder window.

Runs the bundled model (or ``--model``) directly, without Ray, on the chunks overnight's
decode stage makes of the benchmark corpus (``bench_transcribe.make_corpus``), and prints,
for each (batch size, window step) pair, the encoder and beam-search decoder seconds and the
word error rate. Batch 1 at the 30 s window is what a file-by-file loop pays for the model.

    python scripts/profile_whisper.py --files 60 --runs 1:0,16:0,32:0,16:10,16:5
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_transcribe import BEAM, errors_and_words, make_corpus


def main() -> int:
    import os
    import tempfile

    from faster_whisper import WhisperModel
    from faster_whisper.audio import pad_or_trim
    from faster_whisper.tokenizer import Tokenizer
    from faster_whisper.transcribe import get_suppressed_tokens

    from workers.audio import FRAMES_PER_SECOND, AudioChunker, AudioOptions
    from workers.whisper import bundled_model_path
    from workers.whisper import window_frames as window

    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--files", type=int, default=60)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--model", default=None, help="default: the bundled tiny.en")
    ap.add_argument(
        "--runs", default="1:0,16:0,32:0,16:10,16:5", help="batch:window_step pairs (0 = 30 s)"
    )
    ap.add_argument(
        "--corpus", default=os.path.join(tempfile.gettempdir(), "overnight-bench-corpus")
    )
    args = ap.parse_args()

    folder = Path(args.corpus) / f"n{args.files}"
    refs = make_corpus(folder, args.files, seed=0 if args.files == 60 else 1)
    chunker = AudioChunker(AudioOptions())
    t0 = time.perf_counter()
    chunks: list[tuple[str, np.ndarray]] = []
    for name in sorted(refs):
        decoded = chunker((folder / name).read_bytes(), split_channels=False)
        chunks += [(name, c.features) for c in decoded.chunks]
    decode_s = time.perf_counter() - t0
    speech = sum(f.shape[1] for _, f in chunks) / FRAMES_PER_SECOND
    print(
        f"{len(refs)} recordings -> {len(chunks)} chunks, {speech:.0f} s of speech; "
        f"decode + VAD + features {decode_s:.2f} s; {args.threads} threads, beam {BEAM}",
        flush=True,
    )

    model = WhisperModel(
        args.model or bundled_model_path(),
        device="cpu",
        compute_type="int8",
        cpu_threads=args.threads,
    )
    tokenizer = Tokenizer(
        model.hf_tokenizer, model.model.is_multilingual, task="transcribe", language="en"
    )
    prompt = model.get_prompt(tokenizer, [], without_timestamps=True)
    suppress = get_suppressed_tokens(tokenizer, [-1])
    baseline = None
    for run in args.runs.split(","):
        batch, step = (int(x) for x in run.split(":"))
        order = sorted(
            range(len(chunks)),
            key=lambda i: (window(chunks[i][1].shape[1], step), chunks[i][1].shape[1]),
        )
        encoder_s = decoder_s = 0.0
        texts: dict[str, str] = {}
        start = 0
        while start < len(order):
            frames = window(chunks[order[start]][1].shape[1], step)
            ids = [
                i
                for i in order[start : start + batch]
                if window(chunks[i][1].shape[1], step) == frames
            ]
            features = np.stack([pad_or_trim(chunks[i][1], frames) for i in ids])
            t = time.perf_counter()
            encoded = model.encode(features)
            encoder_s += time.perf_counter() - t
            t = time.perf_counter()
            results = model.model.generate(
                encoded,
                [prompt] * len(ids),
                beam_size=BEAM,
                max_length=model.max_length,
                suppress_blank=True,
                suppress_tokens=suppress,
            )
            decoder_s += time.perf_counter() - t
            for i, result in zip(ids, results, strict=True):
                name = chunks[i][0]
                texts[name] = texts.get(name, "") + " " + tokenizer.decode(result.sequences_ids[0])
            start += len(ids)
        errors = words = 0
        for name, ref in refs.items():
            e, w = errors_and_words(ref, texts.get(name, ""))
            errors, words = errors + e, words + w
        total = encoder_s + decoder_s
        baseline = baseline or total
        print(
            f"  batch {batch:>2}, window {'30 s' if step <= 0 else f'step {step} s':<9} "
            f"encoder {encoder_s:6.2f} s  decoder {decoder_s:6.2f} s  total {total:6.2f} s "
            f"({baseline / total:.2f}x the first)  WER {errors / words:.4f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
