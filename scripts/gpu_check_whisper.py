#!/usr/bin/env python3
"""The Whisper half of the device check (``scripts/gpu_check.sh`` runs both halves).

    python3 scripts/gpu_check_whisper.py prepare [--dir .gpu-check]   # here: vocabulary files
    python3 scripts/gpu_check_whisper.py run [--dir .gpu-check] [--cpu] [--out DIR]
    python3 scripts/gpu_check_whisper.py engines [--dir .gpu-check] [--cpu] [--out DIR]

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
   chunk of speech). They also repeat tokens, which the loop guard flags: the sampled
   fallback decode is left out and the flagged chunks counted (``degenerate_not_redone``),
   so the figures are the batched decode's, as on real speech.

When step 1 fails for ``libcublas.so.12`` and the machine has cuBLAS 13 (the CUDA 13 image's
PyTorch carries it), step 2 runs in a child whose ``LD_LIBRARY_PATH`` names it as
``libcublas.so.12``: a stand-in for the production image's CUDA 12 (``infra/``), on the check
machine only, and the report says so. Missing ctranslate2, torch or transformers is a SKIP
(exit 0). Output: ``whisper_check.json`` (and ``whisper-dmon.txt`` on a GPU) under ``--out``.

``engines`` (issue #39) times the two engines themselves, encoder plus decoder on random 30 s
windows, without the worker: the torch engine (``workers.whisper_torch``, built from the
shape alone with random weights, bfloat16 on a GPU) and CTranslate2 (float16, the same shape
through the converter, in a child process with the cuBLAS shim when needed; a SKIP when it
is not installed), greedy and beam 5, at each of ``--batch-sizes`` (32-256 on a GPU), every
window decoding exactly ``--new-tokens`` tokens (96; end-of-text suppressed). Per variant:
audio-s/s, windows/s and the share of dense BF16 peak (989 TFLOP/s on an H100 or H200) that
the FLOPs of ``window_flops`` (about 2.27 TFLOP for turbo's encoder per window, 0.07 more for
96 greedy tokens) make of the wall time; the torch engine also without CUDA graphs at the
first size. Then the log-mel front end on the GPU (``LogMel``, ``torch.stft``) against
faster-whisper's on one CPU core, and their largest difference; and the front end as the
worker runs it (``chunk_features``: host samples in, host features out). Needs torch and ``prepare``'s
vocabulary files; under 5 minutes on one GPU. Output: ``whisper_engines.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Iterator
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
# Dense BF16 tensor-core peak, TFLOP/s (no sparsity): H100 SXM and H200 alike.
PEAK_BF16_TFLOPS = {"h100": 989.0, "h200": 989.0}
WINDOW_S = 30.0


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
    # The warm-up (CUDA kernels, allocator, thread pools) is the first two recordings; the CPU
    # mode, which proves the path and whose timings are no figure, has only two, so there it
    # warms up on the smallest (the suite's run of this check: 30-40 s less).
    warm = table.slice(0, 2)
    if cpu:
        import pyarrow.compute as pc

        sizes = pc.list_value_length(table.column("chunks")).to_pylist()
        warm = table.slice(sizes.index(min(sizes)), 1)
    from overnight.workers.whisper import _degenerate

    not_redone = [0]

    def no_fallback(batch: Any, outputs: Any, forward: Any) -> None:
        # Random weights repeat tokens, so the guard finds most chunks degenerate and the
        # worker would decode them again, sampled, at rising temperatures: in CPU mode that
        # was 2 more decodes of every chunk, most of each variant's time. Real speech seldom
        # takes that path, so it is counted here, not timed.
        not_redone[0] += sum(
            bool(_degenerate(c, out)) for c, out in zip(batch, outputs, strict=True)
        )

    for worker in workers.values():
        plain = worker._transcription_options

        def capped(tokenizer: Any, prompt: Any = (None, None), plain: Any = plain) -> Any:
            return dataclasses.replace(plain(tokenizer, prompt), max_new_tokens=new_tokens)

        worker._transcription_options = capped
        worker._fall_back = no_fallback
        worker(warm)
    not_redone[0] = 0
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
        # Timed chunks the guard found degenerate, which the job would decode again
        # (``WhisperWorker._fall_back``) and this check does not.
        "degenerate_not_redone": not_redone[0],
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
    extra = ["--chunks", str(args.chunks), "--new-tokens", str(args.new_tokens)]
    extra += ["--passes", str(args.passes), "--batch-sizes", args.batch_sizes]
    return _run_child("measure", args, model, out / "whisper_measure.json", env, extra)


def _run_child(
    step: str,
    args: argparse.Namespace,
    model: Path,
    result: Path,
    env: dict[str, str],
    extra: list[str],
) -> dict:
    """``step`` of this script in a child process (a CUDA fault kills it, not the check);
    its report, or a crash record when it died without writing one."""
    result.unlink(missing_ok=True)
    cmd = [sys.executable, __file__, step, "--model", str(model), "--out", str(result), *extra]
    cmd += ["--cpu"] if args.cpu else []
    done = subprocess.run(cmd, env=env, timeout=args.child_timeout)
    if not result.is_file():
        # Not a load failure the job would report: the process died without a word.
        return {"load": {"status": "crash", "message": f"the child exited {done.returncode}"}}
    report = json.loads(result.read_text())
    result.unlink()
    return report


def run(args: argparse.Namespace) -> int:
    started = time.time()
    needed = ("ctranslate2", "torch", "transformers", "faster_whisper", "pydantic")
    out, report, vocab, why = _begin(args, needed, "tokenizer.json")
    path = out / "whisper_check.json"
    if why:
        return _skip(report, path, "whisper", why)
    dmon_log = out / "whisper-dmon.txt"
    with _running(report, path, dmon_log, "gpu-check-whisper-", args, started) as work:
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
    return 0 if report["status"].startswith("pass") else 1


def window_flops(shape: dict[str, int], new_tokens: int, hyps: int, vocab: int = 51864) -> dict:
    """FLOPs of one 30 s window (multiply-add = 2): the encoder (convolutions, projections,
    attention over 1500 positions), and the decoder for ``new_tokens`` steps of ``hyps``
    hypotheses (self and cross attention, the output projection, the cross keys and values
    once per window). Turbo: about 2.27 TFLOP encoder, 0.07 greedy decoder at 96 tokens."""
    d, frames, ctx = shape["d_model"], 1500, 3000
    enc_layer = 4 * d * d + 2 * d * shape["encoder_ffn_dim"]
    encoder = 2 * frames * shape["encoder_layers"] * enc_layer
    encoder += 4 * shape["encoder_layers"] * frames * frames * d  # QK^T and AV
    encoder += 2 * ctx * shape["num_mel_bins"] * d * 3 + 2 * frames * d * d * 3  # convolutions
    dec_layer = 4 * d * d + 2 * d * d + 2 * d * shape["decoder_ffn_dim"]  # self, cross q/out, ffn
    per_token = 2 * (shape["decoder_layers"] * dec_layer + vocab * d)
    per_token += 4 * shape["decoder_layers"] * (frames + new_tokens // 2) * d  # attention reads
    decoder = hyps * new_tokens * per_token + 2 * frames * 2 * d * d * shape["decoder_layers"]
    return {"encoder": float(encoder), "decoder": float(decoder)}


def _sync(cuda: bool) -> None:
    if cuda:
        import torch

        torch.cuda.synchronize()


def _rates(batch: int, walls: list[float], flops: dict, peak: float | None) -> dict[str, Any]:
    best = min(walls)
    total = batch * (flops["encoder"] + flops["decoder"])
    out: dict[str, Any] = {
        "s": [round(w, 3) for w in walls],
        "audio_s_per_s": round(batch * WINDOW_S / best, 1),
        "windows_per_s": round(batch / best, 2),
        "tflops": round(total / best / 1e12, 1),
    }
    if peak:
        out["pct_bf16_peak"] = round(100 * total / best / 1e12 / peak, 1)
    return out


def torch_half(args: argparse.Namespace, vocab: Path, peak: float | None) -> dict[str, Any]:
    """The torch engine: greedy and beam at each batch size, encoder and decoder timed apart."""
    import numpy as np
    import torch

    from overnight.workers.whisper_torch import TorchWhisper
    from overnight.workers.whisper_weights import WhisperDims, read_vocabulary

    cuda = not args.cpu
    shape = SHAPES[args.shape]
    dims = WhisperDims(
        n_mels=shape["num_mel_bins"],
        n_audio_ctx=1500,
        n_state=shape["d_model"],
        n_encoder_layers=shape["encoder_layers"],
        n_encoder_heads=shape["encoder_attention_heads"],
        n_decoder_layers=shape["decoder_layers"],
        n_decoder_heads=shape["decoder_attention_heads"],
        n_vocab=51864,
        n_encoder_ffn=shape["encoder_ffn_dim"],
        n_decoder_ffn=shape["decoder_ffn_dim"],
    )
    started = time.perf_counter()
    config = json.loads((vocab / "config.json").read_text())
    engine = TorchWhisper.random(
        dims, config, read_vocabulary(vocab), device="cuda" if cuda else "cpu"
    )
    _sync(cuda)
    report: dict[str, Any] = {
        "shape": args.shape,
        "dtype": engine.compute_type,
        "build_s": round(time.perf_counter() - started, 1),
        "new_tokens_per_window": args.new_tokens,
    }
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    beams = [int(b) for b in args.beams.split(",")]
    rng = np.random.default_rng(0)
    features = rng.standard_normal((max(sizes), dims.n_mels, 3000), np.float32)
    prompt = [engine.sot_id, engine.no_timestamps_id]
    # CTranslate2's cap: min(max_length // 2, max_length - 1) steps after [sot, notimestamps].
    kwargs = {"max_length": 2 * args.new_tokens, "suppress_tokens": [-1, engine.eot_id]}

    def once(batch: int, beam: int) -> tuple[float, float]:
        _sync(cuda)
        t0 = time.perf_counter()
        encoded = engine.encode(features[:batch])
        _sync(cuda)
        t1 = time.perf_counter()
        result = engine.generate(encoded, [prompt] * batch, beam_size=beam, **kwargs)
        _sync(cuda)
        t2 = time.perf_counter()
        got = len(result[0].sequences_ids[0])
        if got != args.new_tokens:
            raise RuntimeError(f"decoded {got} tokens, not {args.new_tokens}")
        return t1 - t0, t2 - t1

    variants: dict[str, Any] = {}
    for batch in sizes:
        for beam in beams:
            name = f"{'greedy' if beam == 1 else f'beam{beam}'}_batch_{batch}"
            first = sum(once(batch, beam))  # warm-up: kernels, allocator, graph capture
            runs = [once(batch, beam) for _ in range(args.passes)]
            flops = window_flops(shape, args.new_tokens, beam)
            variants[name] = {
                **_rates(batch, [e + d for e, d in runs], flops, peak),
                "first_s": round(first, 2),
                "encoder_s": [round(e, 3) for e, _ in runs],
                "decoder_s": [round(d, 3) for _, d in runs],
            }
            print(f"gpu_check: torch {name}: {variants[name]['audio_s_per_s']} audio-s/s")
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    if engine.cuda_graphs:  # the same decode without graphs, at the first size
        engine.cuda_graphs = False
        batch = sizes[0]
        once(batch, 1)
        runs = [once(batch, 1) for _ in range(args.passes)]
        flops = window_flops(shape, args.new_tokens, 1)
        variants[f"greedy_eager_batch_{batch}"] = {
            **_rates(batch, [e + d for e, d in runs], flops, peak),
            "decoder_s": [round(d, 3) for _, d in runs],
        }
        engine.cuda_graphs = True
    report["variants"] = variants
    report["graph_failures"] = engine.graph_failures
    if cuda:
        report["max_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)
    return report


def front_end(args: argparse.Namespace) -> dict[str, Any]:
    """Log-mel of 30 s windows: ``LogMel`` on the device (a batch, audio copied from the host)
    against faster-whisper's ``FeatureExtractor`` on one CPU core, window by window."""
    import numpy as np
    import torch

    from overnight.workers.whisper_torch import LogMel

    n_mels = SHAPES[args.shape]["num_mel_bins"]
    windows = 4 if args.cpu else 64
    audio = (np.random.default_rng(1).standard_normal((windows, 480000)) * 0.1).astype(np.float32)
    device = "cpu" if args.cpu else "cuda"
    mel = LogMel(n_mels, device)
    mel(audio[:2])  # warm-up
    _sync(not args.cpu)
    walls = []
    for _ in range(3):
        t0 = time.perf_counter()
        out = mel(audio)
        _sync(not args.cpu)
        walls.append(time.perf_counter() - t0)
    report: dict[str, Any] = {
        "windows": windows,
        "device_audio_s_per_s": round(windows * WINDOW_S / min(walls), 1),
        **_worker_front_end(audio, n_mels, device),
    }
    try:
        from faster_whisper.feature_extractor import FeatureExtractor
    except Exception as exc:  # faster-whisper imports CTranslate2
        report["cpu"] = f"SKIP: faster-whisper not importable ({type(exc).__name__})"
        return report
    threads = torch.get_num_threads()
    extractor = FeatureExtractor(feature_size=n_mels)
    count = min(windows, 8)
    t0 = time.perf_counter()
    cpu = [extractor(a) for a in audio[:count]]
    cpu_s = time.perf_counter() - t0
    torch.set_num_threads(threads)
    report["cpu_audio_s_per_s"] = round(count * WINDOW_S / cpu_s, 1)
    report["device_over_cpu"] = round(
        report["device_audio_s_per_s"] / report["cpu_audio_s_per_s"], 1
    )
    ours = out[:count].float().cpu().numpy()
    report["max_abs_diff"] = float(np.abs(ours - np.stack(cpu)).max())
    return report


def _worker_front_end(audio: Any, n_mels: int, device: str) -> dict[str, Any]:
    """The front end as the Whisper worker runs it on chunks sent as samples
    (``chunk_features``, ``AudioOptions.features_on_model``): host samples in, host features
    out, chunks of one length together. Half the chunks are 30 s, the others 5-30 s each of
    its own length (VAD-packed chunks), so those go through one by one."""
    import numpy as np

    from overnight.workers.whisper_torch import chunk_features

    rng = np.random.default_rng(2)
    cut = [len(a) if i % 2 == 0 else int(rng.integers(80000, len(a))) for i, a in enumerate(audio)]
    chunks = [a[:n] for a, n in zip(audio, cut, strict=True)]
    chunk_features(chunks[:2], n_mels, device)  # warm-up
    walls = []
    for _ in range(3):
        t0 = time.perf_counter()
        chunk_features(chunks, n_mels, device)  # back on the host: synchronized
        walls.append(time.perf_counter() - t0)
    return {"worker_audio_s_per_s": round(sum(cut) / 16000 / min(walls), 1)}


def ct2_measure(args: argparse.Namespace) -> dict[str, Any]:
    """CTranslate2 on the model ``run`` would build (``--model``): the torch half's
    variants, in this (child) process."""
    import ctranslate2
    import numpy as np

    cuda = not args.cpu
    try:
        model = ctranslate2.models.Whisper(
            args.model,
            device="cuda" if cuda else "cpu",
            compute_type="float16" if cuda else "default",
        )
        warm = ctranslate2.StorageView.from_array(np.zeros((1, model.n_mels, 3000), np.float32))
        model.encode(warm)
    except Exception as exc:
        return {"load": {"status": "error", "message": str(exc)}}
    shape = SHAPES[args.shape]
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    rng = np.random.default_rng(0)
    features = rng.standard_normal((max(sizes), model.n_mels, 3000), np.float32)
    from overnight.workers.whisper_weights import read_vocabulary

    ids = {tok: i for i, tok in enumerate(read_vocabulary(Path(args.model)))}
    eot = ids["<|endoftext|>"]
    prompt = [ids["<|startoftranscript|>"], ids["<|notimestamps|>"]]
    peak = _peak(cuda)
    variants: dict[str, Any] = {}
    for batch in sizes:
        for beam in (int(b) for b in args.beams.split(",")):
            walls = []
            for k in range(args.ct2_passes + 1):
                t0 = time.perf_counter()
                sv = ctranslate2.StorageView.from_array(features[:batch])
                encoded = model.encode(sv)
                result = model.generate(
                    encoded, [prompt] * batch, beam_size=beam,
                    max_length=2 * args.new_tokens, suppress_tokens=[-1, eot],
                )  # fmt: skip
                if k:
                    walls.append(time.perf_counter() - t0)
            got = len(result[0].sequences_ids[0])
            name = f"{'greedy' if beam == 1 else f'beam{beam}'}_batch_{batch}"
            flops = window_flops(shape, args.new_tokens, beam)
            variants[name] = {**_rates(batch, walls, flops, peak), "tokens": got}
            print(f"gpu_check: ctranslate2 {name}: {variants[name]['audio_s_per_s']} audio-s/s")
    return {"load": {"status": "ok"}, "compute_type": model.compute_type, "variants": variants}


def _peak(cuda: bool) -> float | None:
    if not cuda:
        return None
    from overnight.workers.devices import detect_gpu_kind

    return PEAK_BF16_TFLOPS.get(detect_gpu_kind())


def _ct2_child(args: argparse.Namespace, model: Path, out: Path, env: dict[str, str]) -> dict:
    extra = ["--shape", args.shape, "--batch-sizes", args.batch_sizes, "--beams", args.beams]
    extra += ["--new-tokens", str(args.new_tokens), "--ct2-passes", str(args.ct2_passes)]
    return _run_child("engines-ct2", args, model, out / "whisper_engines_ct2.json", env, extra)


def ct2_half(args: argparse.Namespace, vocab: Path, work: Path, out: Path) -> dict[str, Any]:
    needed = ("ctranslate2", "transformers")
    missing = [m for m in needed if not _importable(m)]
    if missing:
        return {"status": f"SKIP: {', '.join(missing)} not installed"}
    model = work / "ct2-model"
    built = build(vocab, model, cuda=not args.cpu, name=args.shape)
    report: dict[str, Any] = {"build_s": built["build_s"]}
    first = _ct2_child(args, model, out, dict(os.environ))
    message = first["load"].get("message", "")
    shimmed = cublas12_env(work) if "libcublas.so.12" in message else None
    if shimmed is not None:
        env, report["cublas_shim"] = shimmed
        report["load_without_shim"] = first["load"]
        first = _ct2_child(args, model, out, env)
    report.update(first)
    return report


def engines(args: argparse.Namespace) -> int:
    started = time.time()
    out, report, vocab, why = _begin(args, ("torch", "numpy"), "vocabulary.txt")
    path = out / "whisper_engines.json"
    if why:
        return _skip(report, path, "whisper engines", why)
    if not args.cpu:
        import torch

        if not torch.cuda.is_available():
            report["status"] = "fail: no CUDA device (use --cpu for the CPU mode)"
            path.write_text(json.dumps(report, indent=2))
            return 1
        report["device"] = torch.cuda.get_device_name(0)
    peak = _peak(not args.cpu)
    report["peak_bf16_tflops"] = peak
    shape = SHAPES[args.shape]
    report["flops_per_window"] = {
        "encoder_tflop": round(window_flops(shape, args.new_tokens, 1)["encoder"] / 1e12, 3),
        "greedy_decoder_tflop": round(window_flops(shape, args.new_tokens, 1)["decoder"] / 1e12, 3),
    }
    dmon_log = out / "whisper-engines-dmon.txt"
    with _running(report, path, dmon_log, "gpu-check-engines-", args, started) as work:
        report["torch"] = torch_half(args, vocab, peak)
        report["front_end"] = front_end(args)
        try:
            report["ctranslate2"] = ct2_half(args, vocab, work, out)
        except Exception as exc:  # the torch half's figures stand without it
            report["ctranslate2"] = {"status": f"fail: {type(exc).__name__}: {exc}"}
        theirs = report["ctranslate2"].get("variants", {})
        report["torch_over_ctranslate2"] = {
            name: round(v["audio_s_per_s"] / theirs[name]["audio_s_per_s"], 2)
            for name, v in report["torch"]["variants"].items()
            if name in theirs
        }
        report["status"] = "pass"
    return 0 if report["status"] == "pass" else 1


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _begin(
    args: argparse.Namespace, modules: tuple[str, ...], prepared: str
) -> tuple[Path, dict[str, Any], Path, str | None]:
    """A check's output folder (made), its report, the folder ``prepare`` wrote, and why the
    check cannot run here (a module not installed, the file ``prepared`` not there) or None."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    vocab = Path(args.dir) / "whisper"
    missing = [m for m in modules if not _importable(m)]
    why = None
    if missing:
        why = f"{', '.join(missing)} not installed"
    elif not (vocab / prepared).is_file():
        why = f"no {vocab}/{prepared}"
    return out, {"mode": "cpu" if args.cpu else "gpu"}, vocab, why


def _skip(report: dict[str, Any], path: Path, check: str, why: str) -> int:
    """A check that cannot run on this machine: its report, written to ``path``, says why; no
    failure (exit status 0)."""
    report["status"] = f"skip: {why}"
    print(f"gpu_check: {check} SKIP: {why}")
    path.write_text(json.dumps(report, indent=2))
    return 0


@contextlib.contextmanager
def _running(
    report: dict[str, Any],
    path: Path,
    dmon_log: Path,
    prefix: str,
    args: argparse.Namespace,
    started: float,
) -> Iterator[Path]:
    """A check's run, yielding a scratch folder (named ``prefix``...): on a GPU the GPU monitor
    (power, utilization, clocks, memory each second) logs to ``dmon_log``; an exception is the
    report's failure; whatever happened, the folder goes, the monitor stops, and the report
    (with its wall time since ``started``) is written to ``path`` and printed."""
    dmon = None
    if shutil.which("nvidia-smi") and not args.cpu:
        dmon = subprocess.Popen(
            ["nvidia-smi", "dmon", "-s", "pucm", "-d", "1"],
            stdout=dmon_log.open("w"),
            stderr=subprocess.STDOUT,
        )
    work = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield work
    except Exception as exc:
        report["status"] = f"fail: {type(exc).__name__}: {exc}"
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if dmon is not None:
            dmon.terminate()
        report["wall_s"] = round(time.time() - started, 1)
        path.write_text(json.dumps(report, indent=2))
        print(json.dumps(report, indent=2))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("step", choices=("prepare", "run", "measure", "engines", "engines-ct2"))
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
    ap.add_argument("--beams", default=None, help="engines: beam sizes (1: greedy)")
    ap.add_argument("--ct2-passes", type=int, default=1, help="engines: CTranslate2 passes")
    args = ap.parse_args()
    engine_step = args.step in ("engines", "engines-ct2")
    if engine_step and args.batch_sizes == "16":  # the engines step's own default
        args.batch_sizes = "2,4" if args.cpu else "32,64,128,256"
    if args.beams is None:
        args.beams = "1,2" if args.cpu else "1,5"
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
    if args.step == "engines":
        return engines(args)
    if args.step == "engines-ct2":
        report = ct2_measure(args)
        Path(args.out).write_text(json.dumps(report))
        return 0 if report["load"]["status"] == "ok" else LOAD_FAILED
    if args.step == "measure":
        sizes = [int(b) for b in args.batch_sizes.split(",")]
        report = measure(args.model, args.cpu, args.chunks, args.new_tokens, args.passes, sizes)
        Path(args.out).write_text(json.dumps(report))
        return 0 if report["load"]["status"] == "ok" else LOAD_FAILED
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
