"""What accelerator a worker holds, as a short price-table key (h100, a100, ..., gpu)."""

from __future__ import annotations

import os
import shutil
import subprocess

# GPU product names as they appear in nvidia-smi, longest first ("a100" before "a10").
_GPU_KINDS = (
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
    for kind in _GPU_KINDS:
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
