#!/usr/bin/env python
"""Loops on number-heavy speech: overnight against plain faster-whisper, on the same files.

The corpus (``scripts/number_speech.py``, ``--seed``, ``--n``): callers reading cards, SSNs,
account, routing and phone numbers, amounts, dates, times and addresses in every way people
read numbers, spoken by several espeak-ng voices at several rates, wideband or 8 kHz telephone
band, with or without noise; plus the real recordings of ``--audio`` (default
``<repo>/../shared/data/audio``) in the same conditions and spliced before a number.

(a) plain faster-whisper, one file at a time: ``WhisperModel.transcribe`` (int8, beam 5,
    ``vad_filter=True``: its temperature fallback on)
(b) faster-whisper's ``BatchedInferencePipeline`` (batch 8), one file at a time: the decode
    the job batches across files, which has no fallback (``--skip-batched`` leaves it out)
(c) ``overnight transcribe DIR OUT`` as a user types it (a subprocess, defaults)

A transcript loops when ``workers.whisper_guard.looks_degenerate`` says so (compression ratio
over 2.4, a run of words repeated back to back more than speech does, or more tokens than its
speech seconds can hold), the same check for every variant. (c) also reports its rows
flagged ``degenerate``: chunks that looped on every attempt, stored with the repetition cut.
WER (``jobs.ops.wer``: Whisper's English normaliser, jiwer) is reported over every item and over
the items on which no variant loops.

    python scripts/bench_loops.py --seed 1 --n 300          # the README figures
    python scripts/bench_loops.py --seed 2 --n 40 --skip-batched   # a quick look
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import number_speech

REPO = Path(__file__).resolve().parent.parent


def plain(paths: list[Path], batched: bool) -> dict[str, tuple[str, float]]:
    """(text, speech seconds after its VAD) per file name, from faster-whisper itself."""
    from faster_whisper import BatchedInferencePipeline, WhisperModel

    from overnight.workers.whisper_models import bundled_model_path

    model = WhisperModel(bundled_model_path(), device="cpu", compute_type="int8", cpu_threads=2)
    pipeline = BatchedInferencePipeline(model)
    out = {}
    for path in paths:
        if batched:
            segments, info = pipeline.transcribe(str(path), batch_size=8, language="en")
        else:
            segments, info = model.transcribe(
                str(path), beam_size=5, vad_filter=True, language="en"
            )
        text = " ".join(s.text.strip() for s in segments)
        out[path.stem] = (text, float(info.duration_after_vad))
    return out


def job(folder: Path, out: Path) -> dict[str, tuple[str, float, bool]]:
    """(text, speech seconds, flagged degenerate) per file name, from ``overnight transcribe``."""
    import pyarrow.parquet as pq

    cmd = [sys.executable, "-m", "overnight.jobs.cli", "transcribe", str(folder), str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"overnight transcribe failed ({done.returncode}):\n{done.stderr}")
    rows = pq.read_table(out / "transcripts").to_pylist()
    return {
        Path(r["source_uri"]).stem: (r["text"] or "", r["speech_s"] or 0.0, bool(r["degenerate"]))
        for r in rows
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--n", type=int, default=300, help="synthesized utterances")
    parser.add_argument("--audio", type=Path, default=REPO.parent / "shared" / "data" / "audio")
    parser.add_argument("--skip-batched", action="store_true")
    parser.add_argument("--keep", type=Path, help="write the corpus and outputs here")
    parser.add_argument("--json", type=Path, help="write every item's transcripts here")
    parser.add_argument("--examples", type=int, default=8)
    args = parser.parse_args()

    from overnight.jobs.ops.wer import corpus_wer
    from overnight.workers.whisper_guard import looks_degenerate

    root = args.keep or Path(tempfile.mkdtemp(prefix="bench-loops-"))
    folder = root / "calls"
    t0 = time.perf_counter()
    recordings = list(number_speech.corpus(folder, args.seed, args.n, args.audio))
    real = sum(r.real for r in recordings)
    print(
        f"corpus: {len(recordings)} recordings ({real} with real speech) in {folder}, "
        f"made in {time.perf_counter() - t0:.0f} s; conditions "
        f"{dict(Counter(r.condition for r in recordings))}"
    )
    refs = {r.name: r.reference for r in recordings}
    paths = [r.path for r in recordings]

    variants: dict[str, dict[str, str]] = {}
    loops: dict[str, set[str]] = {}
    walls: dict[str, float] = {}
    flagged: set[str] = set()
    runs = [("a plain", False)] + ([] if args.skip_batched else [("b batched", True)])
    for label, batched in runs:
        t0 = time.perf_counter()
        got = plain(paths, batched)
        walls[label] = time.perf_counter() - t0
        variants[label] = {k: v[0] for k, v in got.items()}
        loops[label] = {k for k, (text, speech) in got.items() if looks_degenerate(text, speech)}
    t0 = time.perf_counter()
    out = root / "out"
    if out.exists():
        import shutil

        shutil.rmtree(out)
    got_job = job(folder, out)
    walls["c overnight"] = time.perf_counter() - t0
    variants["c overnight"] = {k: v[0] for k, v in got_job.items()}
    loops["c overnight"] = {k for k, (t, s, _) in got_job.items() if looks_degenerate(t, s)}
    flagged = {k for k, v in got_job.items() if v[2]}

    any_loop = set().union(*loops.values()) | flagged
    steady = [k for k in refs if k not in any_loop]
    print(
        f"\n| variant | loops | of {len(refs)} | WER all | WER on the {len(steady)} items "
        "no variant loops on | wall |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for label, texts in variants.items():
        wer_all, _ = corpus_wer(refs, texts)
        wer_steady, _ = corpus_wer({k: refs[k] for k in steady}, texts)
        print(
            f"| {label} | {len(loops[label])} | {len(loops[label]) / len(refs):.1%} | "
            f"{(wer_all or 0):.2%} | {(wer_steady or 0):.2%} | {walls[label]:.0f} s |"
        )
    a, c = loops["a plain"], loops["c overnight"]
    print(
        f"\n(c) loops where (a) does not: {len(c - a)}; (a) loops where (c) does not: "
        f"{len(a - c)}; both: {len(a & c)}"
    )
    print(
        f"(c) rows flagged degenerate (looped on every attempt, stored cut): {len(flagged)}; "
        f"of them where (a) does not loop: {len(flagged - a)}"
    )
    if "b batched" in loops:
        b = loops["b batched"]
        print(f"(b) loops where (a) does not: {len(b - a)} (the batched decode, no fallback)")
    by = {r.name: r for r in recordings}
    for label, looped in loops.items():
        print(f"\n{label} loops by condition: {dict(Counter(by[k].condition for k in looped))}")
        print(f"{label} loops by kind: {dict(Counter(by[k].kind for k in looped))}")
    shown = sorted(any_loop)[: args.examples]
    for k in shown:
        print(f"\n{k} ({by[k].condition}, {by[k].voice} at {by[k].rate}, {by[k].style}):")
        print(f"  said: {refs[k]}")
        for label, texts in variants.items():
            mark = " [LOOP]" if k in loops[label] else ""
            mark += " [flagged]" if label.startswith("c") and k in flagged else ""
            print(f"  {label}{mark}: {texts.get(k, '')[:200]}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    k: {
                        "reference": refs[k],
                        "condition": by[k].condition,
                        "kind": by[k].kind,
                        **{label: texts.get(k) for label, texts in variants.items()},
                        "loops": [label for label in loops if k in loops[label]],
                        "flagged": k in flagged,
                    }
                    for k in refs
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
