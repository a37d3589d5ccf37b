#!/usr/bin/env python
"""Redaction on the synthesized corpus (scripts/redaction_corpus.py): 40 calls with PII, 40
without, spoken by espeak-ng, transcribed by the bundled tiny.en with word timestamps,
redacted with every type on; prints recall and precision per type and the share of clean
calls with any redaction.

    python scripts/eval_redaction.py [--seed 17] [--misses]
"""

from __future__ import annotations

import argparse
import pickle
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import redaction_corpus as corpus


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--misses", action="store_true", help="print every miss and false alarm")
    parser.add_argument(
        "--cache", help="a pickle of the transcripts: read when it exists, else written"
    )
    args = parser.parse_args()
    calls = corpus.build_corpus(args.seed)
    t0 = time.perf_counter()
    if args.cache and Path(args.cache).is_file():
        rows = pickle.loads(Path(args.cache).read_bytes())
    else:
        rows = corpus.transcribe(calls)
        if args.cache:
            Path(args.cache).write_bytes(pickle.dumps(rows))
    t1 = time.perf_counter()
    scores = corpus.evaluate(calls, rows)
    t2 = time.perf_counter()
    print(scores.table())
    print(f"\ntranscription {t1 - t0:.1f} s, redaction {t2 - t1:.1f} s ({len(calls)} calls)")
    if args.misses:
        print("\nmisses:", *scores.misses, sep="\n  ")
        print("\nfalse alarms:", *scores.false_alarms, sep="\n  ")


if __name__ == "__main__":
    main()
