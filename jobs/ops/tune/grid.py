"""The grid of configurations a tuning measures: defaults per device and kind, or a grid file."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from overnight.jobs.errors import ConfigError
from overnight.jobs.spec import read_job_file

CPU_GRID: dict[str, list[Any]] = {
    "beam_size": [1, 5],
    "batch_size": [4, 16],
    "compute_type": ["int8", "float32"],
}
GPU_GRID: dict[str, list[Any]] = {
    "engine": ["ctranslate2"],
    "compute_type": ["float16", "int8_float16"],
    "batch_size": [16, 64],
    "beam_size": [1, 5],
}
# The torch engine (workers/whisper_torch.py) is built for large batches on one GPU (CUDA
# graphs, bf16 SDPA); it runs float types only. Measured beside CTranslate2 where torch is
# installed (the GPU image). Not on CPU: there it runs at about half CTranslate2 int8's speed
# (scripts/bench_whisper_engines.py), so it could never be the cheapest.
GPU_TORCH_GRID: dict[str, list[Any]] = {
    "engine": ["torch"],
    "compute_type": ["auto"],
    "batch_size": [64, 256],
    "beam_size": [1, 5],
}
# The document job: vLLM on GPU and, where it is installed, on CPU; CTranslate2 otherwise.
PROCESS_VLLM_CPU_GRID: dict[str, list[Any]] = {
    "max_num_seqs": [16, 128],
}
PROCESS_CPU_GRID: dict[str, list[Any]] = {
    "compute_type": ["int8", "float32"],
    "max_batch_size": [4, 32],
}
PROCESS_GPU_GRID: dict[str, list[Any]] = {
    "max_num_seqs": [64, 256],
    "max_num_batched_tokens": [8192, 16384],
}


@dataclass(frozen=True)
class Candidate:
    name: str
    options: dict[str, Any]


def _cross(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    keys = list(grid)
    for k in keys:
        if not isinstance(grid[k], list) or not grid[k]:
            raise ConfigError(f"grid: {k} must be a non-empty list of values (got {grid[k]!r})")
    return [
        dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(grid[k] for k in keys))
    ]


def _names(configs: list[dict[str, Any]]) -> list[Candidate]:
    keys = list(dict.fromkeys(k for c in configs for k in c if k != "name"))
    varying = [
        k for k in keys if len({json.dumps(c.get(k), sort_keys=True) for c in configs}) > 1
    ] or keys
    out, seen = [], set()
    for i, c in enumerate(configs):
        options = {k: v for k, v in c.items() if k != "name"}
        name = str(
            c.get("name") or " ".join(f"{k}={options.get(k)}" for k in varying) or f"config-{i}"
        )
        if name in seen:
            name = f"{name} #{i}"
        seen.add(name)
        out.append(Candidate(name, options))
    return out


def default_grid(device: str, kind: str = "transcribe", backend: str = "auto") -> list[Candidate]:
    if kind == "process":
        if device == "cuda":
            return _names(_cross(PROCESS_GPU_GRID))
        if backend == "auto":
            from overnight.workers.llm.engine_options import default_llm_backend

            backend = default_llm_backend()
        return _names(_cross(PROCESS_VLLM_CPU_GRID if backend == "vllm" else PROCESS_CPU_GRID))
    if device != "cuda":
        return _names(_cross(CPU_GRID))
    import importlib.util

    torch = importlib.util.find_spec("torch") is not None
    return _names(_cross(GPU_GRID) + (_cross(GPU_TORCH_GRID) if torch else []))


def read_grid(path: str) -> list[Candidate]:
    """A grid file: ``base`` + ``grid`` (crossed) and/or ``configs`` (listed)."""
    if path.endswith(".json"):
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"grid file {path!r}: {exc}") from None
    else:
        data = read_job_file(path)
    # The shapes are checked before anything is read out of them: a list where the file's
    # top level belongs, or text where a table of options belongs, was a TypeError.
    if not isinstance(data, dict):
        raise ConfigError(
            f"grid file {path!r}: the top level must be a table (JSON object) with the "
            f"sections base, grid and configs (got a {type(data).__name__})"
        )
    unknown = set(data) - {"base", "grid", "configs"}
    if unknown:
        raise ConfigError(
            f"grid file {path!r}: use the sections base, grid and configs (got {sorted(unknown)})"
        )
    for section in ("base", "grid"):
        if data.get(section) is not None and not isinstance(data[section], dict):
            raise ConfigError(
                f"grid file {path!r}: {section} must be a table of options (got {data[section]!r})"
            )
    listed = data.get("configs")
    if listed is not None and not (
        isinstance(listed, list) and all(isinstance(c, dict) for c in listed)
    ):
        raise ConfigError(
            f"grid file {path!r}: configs must be a list of tables of options (got {listed!r})"
        )
    base = data.get("base") or {}
    configs = _cross(data["grid"]) if data.get("grid") else []
    configs += list(listed or [])
    if not configs:
        raise ConfigError(f"grid file {path!r} holds no configuration: add [grid] or [[configs]]")
    return _names([{**base, **c} for c in configs])
