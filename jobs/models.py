"""Model folders kept in object storage, copied once per node into the local cache (I/O stays
in jobs, with the job's storage settings; the workers get a local path)."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from overnight.jobs.dataset import storage


def model_cache_dir(url: str) -> Path:
    root = Path(os.environ.get("OVERNIGHT_CACHE") or Path.home() / ".cache" / "overnight")
    return root / "models" / hashlib.sha256(url.encode()).hexdigest()[:16]


def fetch_model(url: str, storage_config: storage.StorageConfig) -> str:
    """Copy a model folder from object storage into this node's cache, once per node."""
    target = model_cache_dir(url)
    if (target / "model.bin").is_file():
        return str(target)
    loc = storage.resolve(url, storage_config)
    tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    for path in storage.list_files(loc):
        local = tmp / path[len(loc.path) :].lstrip("/")
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_bytes(storage.read_bytes(loc.url(path), storage_config))
    try:
        os.replace(tmp, target)  # atomic; another actor on this node may have won the race
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return str(target)
