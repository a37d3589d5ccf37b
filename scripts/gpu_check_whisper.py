#!/usr/bin/env python3
"""The Whisper half of the device check (``scripts/gpu_check.sh`` runs both halves).

    python3 scripts/gpu_check_whisper.py prepare [--dir .gpu-check]   # here: vocabulary files
    python3 scripts/gpu_check_whisper.py run [--dir .gpu-check] [--cpu] [--out DIR]

``prepare`` copies the bundled tiny.en's tokenizer and CTranslate2 config (2.5 MB) into
``DIR/whisper``. ``run`` builds a Whisper with random weights from them where it runs (the
GPU machines are air-gapped): large-v3-turbo's shape on a GPU (32 encoder layers of 1280, 4
decoder layers, 128 mel bins), tiny.en's with ``--cpu``. The vocabulary is tiny.en's (51,864
tokens, English-only; large-v3's has 51,866), so only the output projection differs, by two
rows. Then, through overnight's own ``WhisperWorker`` as a transcription actor runs it:

1. **load**: the worker's warm-up forward sits inside the model load's ``try``, so a CUDA build
   that cannot open its libraries fails at load with the message a job prints (exit 5), not
   as error rows. On a CUDA 13 image CTranslate2's CUDA 12 build finds no ``libcublas.so.12``:
   that failure is this step's reading there.
2. **workers**: one against two model workers on the same device (on CPU: one two-thread
   worker against two one-thread workers, the CPU sizing rule), taking turns, ``--passes``
   each after a warm-up: audio seconds per second and rows per status. Random weights never
   say end-of-text, so every chunk decodes exactly ``--new-tokens`` tokens (96: about a 30 s
   chunk of speech).

When step 1 fails for ``libcublas.so.12`` and the machine has cuBLAS 13 (the CUDA 13 image's
PyTorch carries it), step 2 runs in a child whose ``LD_LIBRARY_PATH`` names it as
``libcublas.so.12``: a stand-in for the production image's CUDA 12 (``infra/``), on the check
machine only, and the report says so. Missing ctranslate2, torch or transformers is a SKIP
(exit 0). Output: ``whisper_check.json`` (and ``whisper-dmon.txt`` on a GPU) under ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

VOCAB_FILES = ("config.json", "tokenizer.json", "vocabulary.txt")
TURBO = {"d_model": 1280, "encoder_layers": 32, "encoder_attention_heads": 20}
TURBO.update(decoder_layers=4, decoder_attention_heads=20, num_mel_bins=128)
TURBO.update(encoder_ffn_dim=5120, decoder_ffn_dim=5120)
LARGE_V3 = {**TURBO, "decoder_layers": 32}
TINY = {"d_model": 384, "encoder_layers": 4, "encoder_attention_heads": 6}
TINY.update(decoder_layers=4, decoder_attention_heads=6, num_mel_bins=80)
TINY.update(encoder_ffn_dim=1536, decoder_ffn_dim=1536)
SHAPES = {"large-v3-turbo": TURBO, "large-v3": LARGE_V3, "tiny.en": TINY}
LOAD_FAILED = 5  # the job's exit code for a model that cannot load


def prepare(folder: Path) -> None:
    from overnight.workers.whisper_models import bundled_model_path

    target = folder / "whisper"
    target.mkdir(parents=True, exist_ok=True)
    for name in VOCAB_FILES:
        shutil.copy(Path(bundled_model_path()) / name, target / name)
    print(f"gpu_check: wrote {target} (tiny.en's tokenizer and CTranslate2 config)")


def build(vocab: Path, target: Path, cuda: bool, name: str) -> dict[str, Any]:
    """A CTranslate2 Whisper folder with random weights, through the public converter."""
    import ctranslate2
    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    shape = SHAPES[name]
    started = time.perf_counter()
    config = WhisperConfig(vocab_size=51864, max_source_positions=1500, **shape)
    torch.manual_seed(0)
    with torch.device("cuda" if cuda else "cpu"):
        model = WhisperForConditionalGeneration(config)
    if cuda:
        model = model.half()
    hf = target.with_name(target.name + "-hf")
    model.save_pretrained(hf)
    del model
    converter = ctranslate2.converters.TransformersConverter(str(hf), load_as_float16=cuda)
    converter.convert(str(target), quantization="float16" if cuda else None, force=True)
    shutil.rmtree(hf)
    # tiny.en's config (suppressed tokens, alignment heads within 4 decoder layers of 6+
    # heads) and vocabulary replace the converter's placeholders.
    (target / "vocabulary.json").unlink(missing_ok=True)
    for file in VOCAB_FILES:
        shutil.copy(vocab / file, target / file)
    prep = {"feature_size": shape["num_mel_bins"]}
    (target / "preprocessor_config.json").write_text(json.dumps(prep))
    return {
        "shape": name,
        **shape,
        "build_s": round(time.perf_counter() - started, 1),
    }


def _find_cublas13() -> Path | None:
    """cuBLAS 13 (or later) on this machine: the NVIDIA wheels' folders on sys.path, CUDA's."""
    roots = [Path(p) for p in sys.path if p] + [Path("/usr/local/cuda/lib64")]
    patterns = ("nvidia/*/lib/libcublas.so.*", "nvidia/*/*/lib/libcublas.so.*", "libcublas.so.*")
    for root in roots:
        for pattern in patterns:
            for lib in sorted(root.glob(pattern)):
                major = lib.name.removeprefix("libcublas.so.").split(".")[0]
                if major.isdigit() and int(major) >= 13:
                    return lib
    return None


def cublas12_env(work: Path) -> tuple[dict[str, str], str] | None:
    """An environment whose ``LD_LIBRARY_PATH`` names this machine's cuBLAS 13 as
    ``libcublas.so.12`` (a symlink under ``work``), and a note saying so; None without one."""
    cublas = _find_cublas13()
    if cublas is None:
        return None
    shim = work / "cublas12"
    shim.mkdir(exist_ok=True)
    link = shim / "libcublas.so.12"
    if not link.exists():
        link.symlink_to(cublas)
    path = [str(shim), str(cublas.parent), os.environ.get("LD_LIBRARY_PATH", "")]
    env = {**os.environ, "LD_LIBRARY_PATH": os.pathsep.join(path)}
    return env, f"libcublas.so.12 -> {cublas} (check machine only)"


def _rows(chunks: int, n_mels: int) -> Any:
    """Decoded recordings of 1-6 chunks of 30 s, as the decode stage hands them on."""
    import numpy as np
    import pyarrow as pa

    from overnight.schemas.stages import DECODED
    from overnight.workers.audio import FRAMES_PER_SECOND, Chunk, DecodedAudio

    rng = np.random.default_rng(0)
    rows, made, item = [], 0, 0
    while made < chunks:
        n = min(int(rng.integers(1, 7)), chunks - made)
        parts = [
            Chunk(
                0,
                [(30.0 * k, 30.0 * k + 30)],
                rng.standard_normal((n_mels, 30 * FRAMES_PER_SECOND), np.float32),
            )
            for k in range(n)
        ]
        decoded = DecodedAudio(duration_s=30.0 * n, speech_s=30.0 * n, num_channels=1, chunks=parts)
        rows.append(decoded.record(f"rec{item}", f"mem://rec{item}.wav", size=1, etag="e"))
        made, item = made + n, item + 1
    return pa.Table.from_pylist(rows, schema=DECODED)


def measure(
    model: str, cpu: bool, chunks: int, new_tokens: int, passes: int, batch_sizes: list[int]
) -> dict[str, Any]:
    """Steps 1 and 2 in this process (see the module docstring)."""
    try:
        import av  # noqa: F401
    except ImportError:
        # PyAV decodes files, which this check never does (it hands the worker decoded
        # chunks); faster-whisper and overnight import it at module level. Its wheel (36 MB)
        # does not fit beside CTranslate2's in one 64 MiB carry.
        sys.modules["av"] = types.ModuleType("av")
    from overnight.workers.devices import detect_gpu_kind
    from overnight.workers.whisper import ModelLoadError, WhisperWorker, WhisperWorkerConfig
    from overnight.workers.whisper_options import WhisperOptions

    cores = os.cpu_count() or 2
    report: dict[str, Any] = {}
    workers: dict[tuple[int, int], Any] = {}  # (model workers, batch size) -> worker
    started = time.perf_counter()
    for batch in batch_sizes:
        for n in (1, 2):
            threads = max(1, min(cores, 2) // n) if cpu else 0
            options = WhisperOptions(
                model=model,
                device="cpu" if cpu else "cuda",
                cpu_threads=threads,
                model_workers=n,
                batch_size=batch,
            )
            try:
                workers[n, batch] = WhisperWorker(WhisperWorkerConfig(whisper=options))
            except ModelLoadError as exc:
                report["load"] = {"status": "error", "message": str(exc)}
                return report
    w1 = next(iter(workers.values()))
    report["load"] = {
        "status": "ok",
        "s": round(time.perf_counter() - started, 1),
        "device": w1.device,
        "compute_type": w1.compute_type,
        # What the job would price it as (the runner labels rows so; the worker no longer).
        "resource": detect_gpu_kind() if w1.device == "cuda" else "cpu",
    }
    table = _rows(chunks, w1.model.model.n_mels)
    audio_s = chunks * 30.0
    for worker in workers.values():
        plain = worker._transcription_options

        def capped(tokenizer: Any, prompt: Any = (None, None), plain: Any = plain) -> Any:
            return dataclasses.replace(plain(tokenizer, prompt), max_new_tokens=new_tokens)

        worker._transcription_options = capped
        worker(table.slice(0, 2))  # warm-up: CUDA kernels, allocator, thread pools
    runs: dict[tuple[int, int], list[float]] = {key: [] for key in workers}
    statuses: dict[str, int] = {}
    for _ in range(passes):
        for key, worker in workers.items():  # the variants take turns
            started = time.perf_counter()
            out = worker(table)
            runs[key].append(time.perf_counter() - started)
            assert out.num_rows == table.num_rows, (out.num_rows, table.num_rows)
            for row in out.select(["status", "error_code"]).to_pylist():
                key = row["status"] if row["status"] == "ok" else f"error:{row['error_code']}"
                statuses[key] = statuses.get(key, 0) + 1
    report["workers"] = {
        "recordings": table.num_rows,
        "chunks": chunks,
        "audio_s": audio_s,
        "new_tokens_per_chunk": new_tokens,
        "beam_size": w1.config.whisper.beam_size,
        "passes": passes,
        "row_statuses": statuses,
        "variants": {
            f"model_workers_{n}_batch_{b}": {
                "s": [round(s, 2) for s in runs[n, b]],
                "audio_s_per_s": [round(audio_s / s, 1) for s in runs[n, b]],
            }
            for n, b in runs
        },
        # Per batch size, per pass: two model workers' speed over one's.
        "two_over_one": {
            str(b): [round(x / y, 3) for x, y in zip(runs[1, b], runs[2, b], strict=True)]
            for b in batch_sizes
        },
    }
    return report


def _child(args: argparse.Namespace, model: Path, out: Path, env: dict[str, str]) -> dict:
    result = out / "whisper_measure.json"
    result.unlink(missing_ok=True)
    cmd = [sys.executable, __file__, "measure", "--model", str(model), "--out", str(result)]
    cmd += ["--chunks", str(args.chunks), "--new-tokens", str(args.new_tokens)]
    cmd += ["--passes", str(args.passes), "--batch-sizes", args.batch_sizes]
    cmd += ["--cpu"] if args.cpu else []
    done = subprocess.run(cmd, env=env, timeout=args.child_timeout)
    if not result.is_file():
        # Not a load failure the job would report: the process died without a word.
        return {"load": {"status": "crash", "message": f"the child exited {done.returncode}"}}
    report = json.loads(result.read_text())
    result.unlink()
    return report


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"mode": "cpu" if args.cpu else "gpu"}
    started = time.time()
    vocab = Path(args.dir) / "whisper"
    needed = ("ctranslate2", "torch", "transformers", "faster_whisper", "pydantic")
    missing = [m for m in needed if not _importable(m)]
    if missing or not (vocab / "tokenizer.json").is_file():
        why = f"{', '.join(missing)} not installed" if missing else f"no {vocab}/tokenizer.json"
        report["status"] = f"skip: {why}"
        print(f"gpu_check: whisper SKIP: {why}")
        (out / "whisper_check.json").write_text(json.dumps(report, indent=2))
        return 0
    dmon = None
    if shutil.which("nvidia-smi") and not args.cpu:
        dmon = subprocess.Popen(
            ["nvidia-smi", "dmon", "-s", "pucm", "-d", "1"],
            stdout=(out / "whisper-dmon.txt").open("w"),
            stderr=subprocess.STDOUT,
        )
    work = Path(tempfile.mkdtemp(prefix="gpu-check-whisper-"))
    try:
        model = work / "model"
        report["model"] = build(vocab, model, cuda=not args.cpu, name=args.shape)
        first = _child(args, model, out, dict(os.environ))
        report.update(first)
        message = first["load"].get("message", "")
        shimmed = cublas12_env(work) if "libcublas.so.12" in message else None
        if shimmed is not None:
            env, report["cublas_shim"] = shimmed
            second = _child(args, model, out, env)
            report["load_with_shim"] = second.pop("load")
            report.update(second)
        # Either the model ran, or it failed at load with its reason (the job's exit 5).
        if "workers" in report:
            report["status"] = "pass"
        elif report["load"]["status"] == "error":
            report["status"] = "pass: the load failed cleanly, with its reason; nothing else ran"
        else:
            report["status"] = "fail"
    except Exception as exc:
        report["status"] = f"fail: {type(exc).__name__}: {exc}"
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if dmon is not None:
            dmon.terminate()
        report["wall_s"] = round(time.time() - started, 1)
        (out / "whisper_check.json").write_text(json.dumps(report, indent=2))
        print(json.dumps(report, indent=2))
    return 0 if report["status"].startswith("pass") else 1


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("step", choices=("prepare", "run", "measure"))
    ap.add_argument("--dir", default=".gpu-check", help="where prepare writes whisper/")
    ap.add_argument("--out", default=os.environ.get("OUT") or "gpu-check-out")
    ap.add_argument("--cpu", action="store_true", help="tiny.en's shape on the CPU")
    ap.add_argument("--model", help="measure: the model folder that run built")
    ap.add_argument("--chunks", type=int, default=None, help="30 s chunks per pass")
    ap.add_argument("--new-tokens", type=int, default=None, help="tokens decoded per chunk")
    ap.add_argument("--passes", type=int, default=None, help="timed passes per variant")
    ap.add_argument("--batch-sizes", default="16", help="comma-separated; 16: the job's default")
    ap.add_argument("--shape", choices=sorted(SHAPES), default=None)
    ap.add_argument("--child-timeout", type=int, default=600)
    args = ap.parse_args()
    if args.chunks is None:
        args.chunks = 8 if args.cpu else 256
    if args.new_tokens is None:
        args.new_tokens = 16 if args.cpu else 96
    if args.shape is None:
        args.shape = "tiny.en" if args.cpu else "large-v3-turbo"
    if args.passes is None:
        args.passes = 1 if args.cpu else 2
    if args.step == "prepare":
        prepare(Path(args.dir))
        return 0
    if args.step == "measure":
        sizes = [int(b) for b in args.batch_sizes.split(",")]
        report = measure(args.model, args.cpu, args.chunks, args.new_tokens, args.passes, sizes)
        Path(args.out).write_text(json.dumps(report))
        return 0 if report["load"]["status"] == "ok" else LOAD_FAILED
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
