"""What diarization adds to a transcription run: the same mono calls through ``overnight
transcribe`` with and without ``--diarize``, on this machine, turns alternating.

The calls are ``scripts/bench_diarize.py``'s 2-speaker mixes of real voices (telephone band;
espeak-ng voices without ../shared/data), written as WAV files. Each turn runs the real job
(local Ray, bundled tiny.en, CPU) into a fresh output and reads its summary: wall time, and
the ledger's seconds by stage. The target (issue #37): at most 15% more time on 2 cores.

    OPENBLAS_NUM_THREADS=1 .venv/bin/python scripts/bench_diarize_job.py --calls 8 --turns 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_diarize  # noqa: E402

from overnight.jobs.ops.demo import write_wav  # noqa: E402
from overnight.workers.audio import SAMPLE_RATE  # noqa: E402


def write_calls(folder: Path, calls: int, seed: int) -> float:
    """The calls as 16 kHz mono WAV files; their seconds of audio."""
    folder.mkdir(parents=True, exist_ok=True)
    kind = "real" if bench_diarize.DATA.is_dir() else "espeak"
    total = 0.0
    for call in bench_diarize.build_set(kind, 2, calls, seed, bench_diarize.DATA):
        audio = bench_diarize.telephone_copy(call.audio)
        write_wav(folder / f"{call.name}.wav", audio)
        total += len(audio) / SAMPLE_RATE
    return total


# What each variant adds to ``overnight transcribe CALLS OUT --device cpu``: diarization turns
# word timestamps on (words are what it assigns to speakers), so ``words`` separates the cost
# of the timestamps from that of finding the speakers.
VARIANTS = {"plain": [], "words": ["--config", "{words}"], "diarize": ["--diarize"]}


def run(calls: Path, out: Path, variant: str, words_config: Path, base_config: Path) -> dict:
    cmd = [sys.executable, "-m", "overnight.jobs.cli", "transcribe", str(calls), str(out)]
    extra = [a.format(words=words_config) for a in VARIANTS[variant]]
    if "--config" not in extra:
        extra += ["--config", str(base_config)]
    cmd += ["--device", "cpu", "--json", "--quiet", *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the job failed ({done.returncode}): {done.stderr[-2000:]}")
    summary = json.loads(done.stdout)
    ledger = {}
    import pyarrow.dataset as pads

    for row in pads.dataset(str(out / "costs"), format="parquet").to_table().to_pylist():
        ledger[row["stage"]] = ledger.get(row["stage"], 0.0) + row["seconds"]
    return {"wall_s": summary["wall_seconds"], "stages_s": ledger, "items": summary["items"]}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=8)
    p.add_argument("--turns", type=int, default=2)
    p.add_argument("--seed", type=int, default=3)
    p.add_argument(
        "--items-per-call",
        type=int,
        help="the job spec's items_per_call for every variant (default: the job's, 8): "
        "a short job's first Whisper call waits for that many decoded calls",
    )
    p.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help="which of plain, words, diarize run (comma list; plain and diarize at least)",
    )
    args = p.parse_args(argv)
    names = [n for n in args.variants.split(",") if n]
    if not {"plain", "diarize"} <= set(names) <= set(VARIANTS):
        p.error(f"--variants {args.variants!r}: plain and diarize, and words if wanted")
    work = Path(tempfile.mkdtemp(prefix="bench-diarize-job-"))
    audio_s = write_calls(work / "calls", args.calls, args.seed)
    words_config = work / "words.toml"
    shared = f"items_per_call = {args.items_per_call}\n" if args.items_per_call else ""
    words_config.write_text(f"[transcribe]\nword_timestamps = true\n{shared}")
    base_config = work / "base.toml"
    base_config.write_text(f"[transcribe]\n{shared}")
    results: dict[str, list[dict]] = {name: [] for name in names}
    for turn in range(args.turns):
        # Each turn in another order: the machine drifts, so no variant always runs first.
        for name in names[turn % len(names) :] + names[: turn % len(names)]:
            r = run(work / "calls", work / f"out-{name}-{turn}", name, words_config, base_config)
            results[name].append(r)
            print(
                f"turn {turn} {name:8s} wall {r['wall_s']:.1f} s  stages {json.dumps({k: round(v, 1) for k, v in r['stages_s'].items()})}"
            )
    wall = {name: statistics.median(r["wall_s"] for r in rs) for name, rs in results.items()}
    diarize_s = statistics.median(r["stages_s"].get("diarize", 0.0) for r in results["diarize"])
    # The same turn's runs are minutes apart, runs of other turns up to an hour: the ratio
    # within each turn is less exposed to the machine's drift than a ratio of medians.
    paired = [
        d["wall_s"] / p["wall_s"] - 1
        for d, p in zip(results["diarize"], results["plain"], strict=True)
    ]
    report = {
        "calls": args.calls,
        "items_per_call": args.items_per_call or "default",
        "audio_s": round(audio_s, 1),
        **{f"{name}_wall_s": [round(r["wall_s"], 1) for r in rs] for name, rs in results.items()},
        "diarize_over_plain": round(wall["diarize"] / wall["plain"] - 1, 3),
        "diarize_over_plain_per_turn": [round(x, 3) for x in paired],
        "diarize_over_plain_per_turn_median": round(statistics.median(paired), 3),
        "diarize_s_per_audio_s": round(diarize_s / audio_s, 4),
    }
    if "words" in wall:
        report["diarize_over_words"] = round(wall["diarize"] / wall["words"] - 1, 3)
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
