#!/usr/bin/env python
"""Side-by-side transcription benchmark, one process run, same files, model and options.

(a) plain faster-whisper, one file at a time (WhisperModel.transcribe)
(b) faster-whisper's BatchedInferencePipeline, one file at a time
(c) overnight's pipeline (Ray Data, cross-file batching) with the job's defaults, among them
    its encoder window (``window_step_s`` 10: each chunk padded to the next 10 s)
(c') overnight with other ``window_step_s`` values (``--window-step``, default 30: every chunk
    padded to Whisper's 30 s, as (a) and (b) do), each reported with its WER

Prints audio-seconds per second, ratios, word error rates and peak memory (PSS of the whole
process tree, Ray's workers included). ``--scale 10`` also runs (c) on ten times the files to
show time grows linearly and peak memory stays flat.

    python scripts/bench_transcribe.py --files 60 --scale 10 --scale-baselines plain --json bench.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import contextlib
from collections.abc import Callable

from jobs.demo import silence, speak, write_wav
from jobs.tune import edit_distance
from tests.conftest import normalize

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
    """n recordings of 5-30 s of synthesized speech with pauses and light noise."""
    refs_path = folder / "references-v2.json"
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
        length = len(parts[0]) / 16000
        while length < target:
            sentence = rng.choice(SENTENCES)
            clip = cache.setdefault((sentence, voice), speak(sentence, voice=voice))
            pause = silence(rng.uniform(0.3, 1.2))
            if length + (len(clip) + len(pause)) / 16000 > 30:
                break  # recordings stay within 5-30 s
            parts += [clip, pause]
            said.append(sentence)
            length += (len(clip) + len(pause)) / 16000
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


def errors_and_words(ref: str, hyp: str) -> tuple[int, int]:
    r, h = normalize(ref), normalize(hyp)
    return edit_distance(r, h), len(r)


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
        children: dict[int, list[int]] = {}
        for d in os.listdir("/proc"):
            if d.isdigit():
                with contextlib.suppress(OSError, IndexError, ValueError):
                    with open(f"/proc/{d}/stat") as f:
                        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                    children.setdefault(ppid, []).append(int(d))
        total, todo = 0, [self.pid]
        while todo:
            pid = todo.pop()
            with contextlib.suppress(OSError, ValueError):  # a process may end meanwhile
                total += self._pss(pid)
            todo.extend(children.get(pid, []))
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


def run_plain(files: list[Path], threads: int) -> dict[str, str]:
    from faster_whisper import WhisperModel

    from workers.whisper import bundled_model_path

    model = WhisperModel(
        bundled_model_path(), device="cpu", compute_type="int8", cpu_threads=threads
    )
    out = {}
    for f in files:
        segments, _ = model.transcribe(
            str(f),
            beam_size=BEAM,
            vad_filter=VAD,
            temperature=0.0,
            condition_on_previous_text=False,
            without_timestamps=True,
            language="en",
        )
        out[f.name] = " ".join(s.text.strip() for s in segments)
    return out


def run_batched(files: list[Path], threads: int) -> dict[str, str]:
    from faster_whisper import BatchedInferencePipeline, WhisperModel

    from workers.whisper import bundled_model_path

    model = WhisperModel(
        bundled_model_path(), device="cpu", compute_type="int8", cpu_threads=threads
    )
    pipe = BatchedInferencePipeline(model)
    out = {}
    for f in files:
        segments, _ = pipe.transcribe(
            str(f), beam_size=BEAM, vad_filter=VAD, batch_size=BATCH, language="en"
        )
        out[f.name] = " ".join(s.text.strip() for s in segments)
    return out


# The file-by-file baselines, by their --skip / --scale-baselines key.
BASELINES: dict[str, tuple[str, str, Callable[[list[Path], int], dict[str, str]]]] = {
    "plain": ("(a)", "(a) faster-whisper, file by file", run_plain),
    "batched": ("(b)", "(b) BatchedInferencePipeline", run_batched),
}


def run_overnight(
    folder: Path, output: Path, args, window_step: int | None = None
) -> dict[str, str]:
    """``window_step`` None: the job's default."""
    import pyarrow.dataset as pads

    from jobs.spec import build_spec
    from jobs.transcribe import run_transcribe

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
            },
        }
    )
    summary = run_transcribe(spec)
    rows = pads.dataset(str(output / "transcripts"), format="parquet").to_table(
        columns=["source_uri", "text"]
    )
    run_overnight.last_summary = summary  # type: ignore[attr-defined]
    return {Path(r["source_uri"]).name: r["text"] or "" for r in rows.to_pylist()}


def measure(name: str, fn, refs: dict[str, str], audio_s: float) -> dict:
    t0 = time.perf_counter()
    with PeakRSS() as mem:
        texts = fn()
    wall = time.perf_counter() - t0
    errs = words = 0
    for fname, ref in refs.items():
        e, w = errors_and_words(ref, texts.get(fname, ""))
        errs, words = errs + e, words + w
    result = {
        "variant": name,
        "files": len(refs),
        "audio_s": round(audio_s, 1),
        "wall_s": round(wall, 2),
        "audio_s_per_s": round(audio_s / wall, 2),
        "wer": round(errs / words, 4),
        "peak_memory_mb": round(mem.peak / 2**20),
        "peak_by_quarter_mb": mem.peak_by_quarter(t0, wall),
    }
    print(
        f"  {name:<34} {result['wall_s']:>8.1f} s  {result['audio_s_per_s']:>7.2f} audio-s/s  "
        f"WER {result['wer']:.4f}  peak memory {result['peak_memory_mb']} MB "
        f"(peak so far at 25/50/75/100% of the run: "
        f"{'/'.join(str(m) for m in result['peak_by_quarter_mb'])} MB)",
        flush=True,
    )
    return result


def audio_seconds(files: list[Path]) -> float:
    import wave

    total = 0.0
    for f in files:
        with wave.open(str(f)) as w:
            total += w.getnframes() / w.getframerate()
    return total


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--files", type=int, default=60)
    ap.add_argument("--scale", type=int, default=0, help="also run (c) on files x scale")
    ap.add_argument(
        "--threads", type=int, default=os.cpu_count() or 2, help="CTranslate2 threads for (a)/(b)"
    )
    # The pool shape that fits 2 cores: one actor holding 1.5 CPUs runs two one-thread model
    # workers (model_workers 0 = one per core it holds), decode tasks share the other half.
    ap.add_argument("--actors", type=int, default=1)
    ap.add_argument("--cpus-per-actor", type=float, default=1.5)
    ap.add_argument("--actor-threads", type=int, default=0, help="0: the job's default")
    ap.add_argument("--model-workers", type=int, default=0, help="0: the job's default")
    ap.add_argument("--decode-cpus", type=float, default=0.25)
    ap.add_argument(
        "--window-step",
        default="30",
        help="(c'): encoder window step(s) in seconds, comma-separated (one run each; 30 = "
        "Whisper's full window); 0 skips (c')",
    )
    ap.add_argument(
        "--scale-baselines",
        default="",
        help="with --scale: also run these baselines on the ten-fold corpus (plain,batched)",
    )
    ap.add_argument("--items-per-call", type=int, default=0, help="0: the job's default")
    ap.add_argument("--calls-per-actor", type=int, default=0, help="0: the job's default")
    ap.add_argument(
        "--corpus", default=os.path.join(tempfile.gettempdir(), "overnight-bench-corpus")
    )
    ap.add_argument("--skip", default="", help="comma list of variants to skip: plain,batched")
    ap.add_argument(
        "--repeat", type=int, default=1, help="passes over the 60-file variants; fastest kept"
    )
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()

    import ray

    corpus = Path(args.corpus)
    refs = make_corpus(corpus / f"n{args.files}", args.files)
    folder = corpus / f"n{args.files}"
    files = sorted(folder / n for n in refs)
    audio_s = audio_seconds(files)
    print(
        f"corpus: {len(files)} recordings, {audio_s:.0f} s of audio "
        f"({min(audio_seconds([f]) for f in files):.1f}-{max(audio_seconds([f]) for f in files):.1f} s each); "
        f"model tiny.en int8 CPU, beam {BEAM}, VAD {VAD}, batch {BATCH}",
        flush=True,
    )
    ray.init(
        num_cpus=os.cpu_count(),
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )
    skip = set(filter(None, args.skip.split(",")))
    work = Path(tempfile.mkdtemp(prefix="overnight-bench-"))

    def baseline_run(
        runner: Callable[[list[Path], int], dict[str, str]],
    ) -> Callable[[int], dict[str, str]]:
        return lambda rep: runner(files, args.threads)

    variants: list[tuple[str, str, Callable[[int], dict[str, str]]]] = [
        (tag, name, baseline_run(runner))
        for key, (tag, name, runner) in BASELINES.items()
        if key not in skip
    ]
    ours_steps: list[tuple[str, str, int | None]] = [("(c)", "(c) overnight", None)]
    for w in (int(x) for x in str(args.window_step).split(",") if int(x)):
        ours_steps.append((f"(c') step {w}", f"(c') overnight, window step {w} s", w))

    def ours_run(k: int, step: int | None) -> Callable[[int], dict[str, str]]:
        # A fresh output per pass: the same one would resume and find nothing to do.
        return lambda rep: run_overnight(folder, work / f"out{k}-{rep}", args, step)

    for k, (tag, name, step) in enumerate(ours_steps):
        variants.append((tag, name, ours_run(k, step)))
    # Shared machines drift by tens of percent over minutes: with --repeat the variants take
    # turns, pass after pass, and each is reported by its fastest pass (all walls listed).
    runs: dict[str, list[dict]] = {tag: [] for tag, _, _ in variants}
    for rep in range(args.repeat):
        if args.repeat > 1:
            print(f"pass {rep + 1}/{args.repeat}", flush=True)
        for tag, name, fn in variants:
            r = measure(name, lambda fn=fn, rep=rep: fn(rep), refs, audio_s)
            r["tag"] = tag
            if tag.startswith("(c"):
                summary = run_overnight.last_summary  # type: ignore[attr-defined]
                r["model_busy_s"] = summary["accelerator_seconds"]
                r["pipeline_s"] = summary["pipeline_seconds"]
                print(
                    f"      model busy {summary['accelerator_seconds']:.1f} s of "
                    f"{summary['pipeline_seconds']:.1f} s pipeline wall; cost/audio-min "
                    f"${summary['cost_per_audio_minute_usd']:.6f} busy"
                )
            runs[tag].append(r)
    results = []
    for tag, _, _ in variants:
        best = min(runs[tag], key=lambda r: r["wall_s"])
        results.append(
            {
                **best,
                "walls_s": [r["wall_s"] for r in runs[tag]],
                "wers": [r["wer"] for r in runs[tag]],
            }
        )
    if args.repeat > 1:
        print(f"fastest of {args.repeat} passes:")
        for r in results:
            print(
                f"  {r['variant']:<34} {r['wall_s']:>8.1f} s  {r['audio_s_per_s']:>7.2f} audio-s/s  "
                f"WER {r['wer']:.4f}  (walls {', '.join(f'{w:.1f}' for w in r['walls_s'])})"
            )
    baselines = [r for r in results if not r["tag"].startswith("(c")]
    ours_all = [r for r in results if r["tag"].startswith("(c")]
    for ours in ours_all:
        for r in baselines:
            print(
                f"  ratio {ours['tag']}/{r['tag']}: "
                f"{ours['audio_s_per_s'] / r['audio_s_per_s']:.2f}x throughput, "
                f"WER {ours['wer']:.4f} vs {r['wer']:.4f}"
            )
    scaled = None
    if args.scale > 1:
        n = args.files * args.scale
        big_refs = make_corpus(corpus / f"n{n}", n, seed=1)
        big_files = sorted(corpus / f"n{n}" / f for f in big_refs)
        big_audio = audio_seconds(big_files)
        scaled = measure(
            f"(c) overnight x{args.scale} files",
            lambda: run_overnight(corpus / f"n{n}", work / "out-scaled", args),
            big_refs,
            big_audio,
        )
        ours = ours_all[0]
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
            scaled_baselines[tag] = measure(
                f"{tag} x{args.scale} files",
                lambda runner=runner: runner(big_files, args.threads),
                big_refs,
                big_audio,
            )
        scaled = {**scaled, "baselines": scaled_baselines}
        for r in baselines:
            tag = r["tag"]
            base, where = r, f"measured on the {args.files} files"
            if tag in scaled_baselines:
                base, where = scaled_baselines[tag], f"measured on the same {n} files"
            print(
                f"  ratio (c) x{args.scale}/{tag}: "
                f"{scaled['audio_s_per_s'] / base['audio_s_per_s']:.2f}x throughput, "
                f"WER {scaled['wer']:.4f} vs {base['wer']:.4f} ({tag} {where})"
            )
    shutil.rmtree(work, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(
            json.dumps({"results": results, "scaled": scaled, "args": vars(args)}, indent=2)
        )
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
