#!/usr/bin/env python
"""Redaction on the synthesized corpus (scripts/redaction_corpus.py): 40 calls with PII, 40
without, spoken by several espeak-ng voices and rates, wideband or over an 8 kHz telephone
band, with or without noise, numbers read in every way callers read them, transcribed by
the bundled tiny.en with word timestamps, redacted with every type on; prints recall (for a
number: none of its digits, 4 in a row, left anywhere in the row) and precision per type and
the share of clean calls with any redaction.

    python scripts/eval_redaction.py [--seed 17 [20 21 ...]] [--misses] [--cache 'DIR/s{seed}.json.gz']
        [--channels split|mono|diarized]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import redaction_corpus as corpus


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--seed", type=int, nargs="+", default=[17], help="one corpus per seed, scores pooled"
    )
    parser.add_argument("--misses", action="store_true", help="print every miss and false alarm")
    parser.add_argument(
        "--cache",
        help="the transcripts as gzipped JSON ({seed} in it: one per seed): read when it "
        "exists, else written",
    )
    parser.add_argument(
        "--channels",
        choices=corpus.CHANNEL_MODES,
        default="split",
        help="split: each side its own channel (default); mono: both voices on one line; "
        "diarized: that with the job's --diarize (keep a --cache path per mode)",
    )
    args = parser.parse_args()
    if args.cache and len(args.seed) > 1 and "{seed}" not in args.cache:
        parser.error("--cache needs {seed} in it when several seeds share it")
    pooled = corpus.Scores()
    for seed in args.seed:
        calls = corpus.build_corpus(seed)
        cache = Path(args.cache.format(seed=seed)) if args.cache else None
        t0 = time.perf_counter()
        if cache and cache.is_file():
            rows = corpus.load_rows(cache)
        else:
            rows = corpus.transcribe(calls, channels=args.channels)
            if cache:
                corpus.save_rows(rows, cache)
        t1 = time.perf_counter()
        scores = corpus.evaluate(calls, rows)
        t2 = time.perf_counter()
        if len(args.seed) > 1:
            print(f"\n## seed {seed}")
        print(scores.table())
        print(f"\ntranscription {t1 - t0:.1f} s, redaction {t2 - t1:.1f} s ({len(calls)} calls)")
        pooled.add(scores)
    if len(args.seed) > 1:
        print(f"\n## pooled over seeds {', '.join(map(str, args.seed))}")
        print(pooled.table())
    if args.misses:
        print("\nmisses:", *pooled.misses, sep="\n  ")
        print("\nfalse alarms:", *pooled.false_alarms, sep="\n  ")


if __name__ == "__main__":
    main()
