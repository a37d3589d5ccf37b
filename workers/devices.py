"""Where a worker runs: the accelerator it holds as a short price-table key (h100, a100,
..., gpu), the one ``auto`` device rule, and the one worker id of every dataset's rows."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Callable
from typing import Literal, get_args

# Where a job asks its models to run; auto: the one rule below (``resolve_device``).
Device = Literal["auto", "cpu", "cuda"]
DEVICES: tuple[str, ...] = get_args(Device)

# GPU product names as they appear in nvidia-smi, longest first ("a100" before "a10").
# CTranslate2's compute types (``ctranslate2.get_supported_compute_types`` names those a
# device runs; it falls back where one is not, so each is a valid request).
CT2_COMPUTE_TYPES = (
    "int8",
    "int8_float32",
    "int8_float16",
    "int8_bfloat16",
    "int16",
    "float16",
    "bfloat16",
    "float32",
)
GPU_KINDS = (
    "gh200",
    "h200",
    "h100",
    "h20",
    "b200",
    "b100",
    "a100",
    "a10g",
    "a10",
    "l40s",
    "l40",
    "l4",
    "a6000",
    "v100",
    "t4",
)


def gpu_kind(product_name: str) -> str:
    """``h100`` for "NVIDIA H100 80GB HBM3" and so on; ``gpu`` for names we do not know."""
    compact = product_name.lower().replace(" ", "").replace("-", "")
    for kind in GPU_KINDS:
        if kind in compact:
            return kind
    return "gpu"


def detect_gpu_kind() -> str:
    """The kind of the first visible GPU according to ``nvidia-smi``; ``gpu`` when unknown."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return "gpu"
    try:
        names = subprocess.run(
            [exe, "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return "gpu"
    lines = [line.strip() for line in names.splitlines() if line.strip()]
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    if first.isdigit() and int(first) < len(lines):
        lines = [lines[int(first)]]
    return gpu_kind(lines[0]) if lines else "gpu"


def local_cuda() -> bool:
    """Whether CTranslate2 (both engines' CPU/CUDA runtime here) sees a CUDA device."""
    import ctranslate2

    return ctranslate2.get_cuda_device_count() > 0


def resolve_device(wanted: str, has_gpu: Callable[[], bool] = local_cuda) -> str:
    """The one ``auto`` rule: ``cuda`` when ``has_gpu()``, else ``cpu``; any other value is
    kept. On the driver ``has_gpu`` asks the Ray cluster, in an actor this process."""
    if wanted != "auto":
        return wanted
    return "cuda" if has_gpu() else "cpu"


def worker_id() -> str:
    """Where a row was made, for the ``worker`` column of every dataset: the Ray node and
    actor (or task), ``<node>/actor=<actor>``; ``host=<name> pid=<pid>`` outside Ray."""
    fallback = f"host={socket.gethostname()} pid={os.getpid()}"
    try:
        import ray

        if not ray.is_initialized():  # get_runtime_context() would start a local Ray
            return fallback
        ctx = ray.get_runtime_context()
        actor = ctx.get_actor_id()
        who = f"actor={actor[:12]}" if actor else f"task={ctx.get_worker_id()[:12]}"
        return f"{ctx.get_node_id()[:12]}/{who}"
    except Exception:
        return fallback
