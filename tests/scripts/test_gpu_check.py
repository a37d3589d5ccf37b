"""scripts/gpu_check.sh in CPU mode: the device check runs here on every CI run, so it
cannot rot between the rare sessions that have a GPU."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO, load_script, require_vllm

require_vllm()


@pytest.mark.slow
def test_gpu_check_passes_in_cpu_mode_from_configs_and_dummy_weights(tmp_path):
    configs, out = tmp_path / "configs", tmp_path / "out"
    prepare = [sys.executable, "scripts/gpu_check.py", "prepare", "--dir", str(configs)]
    subprocess.run(prepare, cwd=REPO, check=True, timeout=300)
    assert {p.name for p in configs.iterdir()} == {"tiny", "llama8b", "whisper"}
    assert not list(configs.glob("*/*.safetensors"))  # configs and tokenizer only
    assert not list(configs.glob("*/model.bin"))
    env = {**os.environ, "OUT": str(out), "GPU_CHECK_DIR": str(configs), "PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--cpu", "--docs", "16"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr + (out / "gpu_check.log").read_text()
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["status"] == "pass", report
    assert set(report["structural"]) == {"generate", "extract", "classify", "summarize"}
    ct2 = report["ctranslate2_structural"]  # the other engine, the same checks
    assert ct2["device"] == "cpu" and {"generate", "extract", "classify", "summarize"} <= set(ct2)
    assert report["throughput"]["documents"] == 16 and report["throughput"]["ratio"] > 0
    # The Whisper half: a random-weight tiny.en-shaped model through overnight's worker, one
    # against two model workers, every recording one row.
    whisper = json.loads((out / "whisper_check.json").read_text())
    assert whisper["status"] == "pass", whisper
    assert whisper["load"]["status"] == "ok" and whisper["load"]["device"] == "cpu"
    runs = whisper["workers"]
    assert sum(runs["row_statuses"].values()) == runs["recordings"] * runs["passes"] * 2
    assert len(runs["two_over_one"]["16"]) == runs["passes"]
    # Random weights loop; their chunks are counted, not decoded again (the sampled fallback).
    assert 0 <= runs["degenerate_not_redone"] <= runs["chunks"] * runs["passes"] * 2
    assert all(r > 0 for r in runs["two_over_one"]["16"])


def _gpu_check_module():
    return load_script("gpu_check")


def test_a_failing_ctranslate2_half_is_recorded_and_the_run_goes_on_to_fail_clearly(
    tmp_path, monkeypatch
):
    """A device call is minutes of a session's few: one half's failure must not lose the
    other half's results, and the report and exit status must say it failed."""
    gpu_check = _gpu_check_module()

    def boom(folder, cpu):
        raise RuntimeError("boom on the device")

    monkeypatch.setattr(gpu_check, "ct2_half", boom)
    monkeypatch.setitem(sys.modules, "vllm", None)  # the vLLM half: absent, so a SKIP
    out = tmp_path / "out"
    assert gpu_check.run(tmp_path / "configs", out, cpu=True, docs=1) == 1
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["status"] == "fail: the CTranslate2 checks", report
    assert "boom on the device" in report["ctranslate2_structural"]["status"]
    assert report["vllm"].startswith("SKIP")
    # A shimmed child that died is a failure too; a clean load error is what the check wants.
    shim_died = {"load": "error at load: libcublas", "with_shim": {"status": "fail: exited 1"}}
    assert gpu_check._failed(shim_died)
    assert not gpu_check._failed({"load": "error at load: libcublas.so.12 is not found"})
    assert not gpu_check._failed({"device": "cuda", "generate": {"prompts": 4}})


def test_whisper_engines_check_times_both_engines_and_the_front_ends_in_cpu_mode(tmp_path):
    """``gpu_check_whisper.py engines`` (issue #39) in its tiny CPU mode: the torch engine
    built from a shape with random weights, CTranslate2 beside it, greedy and beam, each
    window decoding exactly the tokens asked for, and the torch log-mel against faster-whisper's."""
    import pytest

    pytest.importorskip("torch")
    configs, out = tmp_path / "configs", tmp_path / "out"
    script = [sys.executable, "scripts/gpu_check_whisper.py"]
    subprocess.run([*script, "prepare", "--dir", str(configs)], cwd=REPO, check=True, timeout=120)
    args = ["--cpu", "--dir", str(configs), "--out", str(out), "--batch-sizes", "1"]
    args += ["--beams", "1,2", "--new-tokens", "4"]
    done = subprocess.run(
        [*script, "engines", *args], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((out / "whisper_engines.json").read_text())
    assert report["status"] == "pass", report
    variants = report["torch"]["variants"]
    assert set(variants) == {"greedy_batch_1", "beam2_batch_1"}
    assert all(v["audio_s_per_s"] > 0 and v["windows_per_s"] > 0 for v in variants.values())
    assert report["front_end"]["max_abs_diff"] < 1e-4
    assert report["front_end"]["worker_audio_s_per_s"] > 0
    if importlib.util.find_spec("ctranslate2") is not None:
        ct2 = report["ctranslate2"]
        assert ct2["load"]["status"] == "ok", ct2
        assert {v["tokens"] for v in ct2["variants"].values()} == {4}
        assert set(report["torch_over_ctranslate2"]) == set(variants)


def test_window_flops_give_the_issues_turbo_figures():
    module = load_script("gpu_check_whisper")
    flops = module.window_flops(module.SHAPES["large-v3-turbo"], 96, 1)
    assert abs(flops["encoder"] / 1e12 - 2.27) < 0.02
    assert abs(flops["decoder"] / 1e12 - 0.07) < 0.01
