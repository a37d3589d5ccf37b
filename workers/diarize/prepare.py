"""The speaker encoder's weights, read out of the ``resemblyzer`` wheel without torch.

``resemblyzer`` 0.1.4 (Apache-2.0) ships a trained GE2E speaker encoder as
``resemblyzer/pretrained.pt``: a legacy (pre-zip) torch checkpoint, that is a few pickles in
a row followed by the raw bytes of every tensor storage. A restricted unpickler (it builds
only dicts, OrderedDicts and tensor placeholders, and refuses any other global) reads the
pickles, then the storages are read as numpy arrays. The LSTM and linear weights are written
to one ``.npz`` in overnight's model cache; the checkpoint's optimizer state is dropped. The
LSTM is also written as an ONNX graph beside it (``encoder.lstm_graph``), which the
onnxruntime engine loads without importing ``onnx`` (0.6-0.7 s in each process otherwise).

Preparation runs once, at install (``python -m overnight.workers.diarize.prepare``, which
``scripts/install.sh`` calls). It takes the weights from the first of: a wheel or
``pretrained.pt`` given on the command line, an installed ``resemblyzer`` package (the dev
install has it), or ``pip download --no-deps resemblyzer==0.1.4`` from the package index
into a temporary folder. The checkpoint's SHA-256 is checked, so a changed upload is refused
instead of silently giving other embeddings.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import io
import os
import pickle
import subprocess
import sys
import tempfile
import zipfile
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

from overnight.workers.whisper_models import ModelLoadError

RESEMBLYZER_VERSION = "0.1.4"
CHECKPOINT_MEMBER = "resemblyzer/pretrained.pt"
CHECKPOINT_SHA256 = "39373b86598fa3da9fcddee6142382efe09777e8d37dc9c0561f41f0070f134e"
ENCODER_FILE = f"resemblyzer-{RESEMBLYZER_VERSION}-ge2e.npz"
LSTM_FILE = f"resemblyzer-{RESEMBLYZER_VERSION}-ge2e-lstm.onnx"
# The tensors the encoder runs on (the checkpoint also holds GE2E's similarity scale/bias and
# the optimizer state, which inference does not use).
WEIGHT_NAMES = tuple(
    [f"lstm.{kind}_l{layer}" for layer in range(3) for kind in ("weight_ih", "weight_hh")]
    + [f"lstm.{kind}_l{layer}" for layer in range(3) for kind in ("bias_ih", "bias_hh")]
    + ["linear.weight", "linear.bias"]
)
PREPARE_COMMAND = "python -m overnight.workers.diarize.prepare"


class DiarizerModelMissing(ModelLoadError):
    """The speaker encoder has not been prepared (or its file is damaged)."""


class DiarizerPreparationError(RuntimeError):
    """The speaker encoder's weights could not be read; the message says what to do."""


def default_cache_root() -> Path:
    """``$OVERNIGHT_CACHE/models``, else ``~/.cache/overnight/models`` (as the LLM's)."""
    from overnight.workers.llm.prepare import default_cache_root as llm_cache_root

    return llm_cache_root()


def encoder_path(cache_dir: str | Path | None = None) -> Path:
    """Where the prepared encoder weights are (or go)."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_root()
    return root / ENCODER_FILE


def lstm_path(cache_dir: str | Path | None = None) -> Path:
    """Where the prepared LSTM graph is (or goes): beside the weights."""
    return encoder_path(cache_dir).with_name(LSTM_FILE)


def missing_message(path: Path) -> str:
    """One paragraph: what is missing and the one command that makes it."""
    return (
        f"the speaker model for diarization is missing: {path} does not exist. Diarization "
        "uses the GE2E speaker encoder shipped in the resemblyzer wheel, read into a numpy "
        f"file once at install; prepare it with `{PREPARE_COMMAND}` (it runs pip download "
        f"--no-deps resemblyzer=={RESEMBLYZER_VERSION} from the package index; no torch is "
        "needed), or run scripts/install.sh, or turn diarization off."
    )


def load_weights(cache_dir: str | Path | None = None) -> dict[str, np.ndarray]:
    """The prepared encoder weights; ``DiarizerModelMissing`` when absent or damaged."""
    path = encoder_path(cache_dir)
    if not path.is_file():
        raise DiarizerModelMissing(missing_message(path))
    try:
        with np.load(path) as npz:
            weights = {name: np.asarray(npz[name], dtype=np.float32) for name in WEIGHT_NAMES}
    except (OSError, KeyError, ValueError, zipfile.BadZipFile) as exc:
        raise DiarizerModelMissing(
            f"the speaker model for diarization at {path} cannot be read ({exc}); delete it "
            f"and prepare it again with `{PREPARE_COMMAND}`."
        ) from None
    return weights


# -- reading a legacy torch checkpoint ---------------------------------------------------------

_STORAGE_DTYPES = {
    "FloatStorage": np.float32,
    "DoubleStorage": np.float64,
    "HalfStorage": np.float16,
    "LongStorage": np.int64,
    "IntStorage": np.int32,
    "ShortStorage": np.int16,
    "CharStorage": np.int8,
    "ByteStorage": np.uint8,
    "BoolStorage": np.bool_,
}
_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C


class _StorageType:
    def __init__(self, name: str):
        self.dtype = np.dtype(_STORAGE_DTYPES[name])


class _Tensor:
    """A tensor placeholder: its storage key and view, materialised once storages are read."""

    def __init__(self, key: str, offset: int, size: tuple[int, ...], stride: tuple[int, ...]):
        self.key, self.offset, self.size, self.stride = key, offset, tuple(size), tuple(stride)


def _rebuild_tensor(storage: tuple[str, np.dtype], offset, size, stride, *_: Any) -> _Tensor:
    return _Tensor(storage[0], offset, size, stride)


class _CheckpointUnpickler(pickle.Unpickler):
    """Builds nothing but containers and tensor placeholders: a pickle is code, and this one
    comes from a download."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("collections", "OrderedDict"):
            return OrderedDict
        if module == "torch._utils" and name in ("_rebuild_tensor_v2", "_rebuild_tensor"):
            return _rebuild_tensor
        if module == "torch" and name in _STORAGE_DTYPES:
            return _StorageType(name)
        raise pickle.UnpicklingError(f"the checkpoint refers to {module}.{name}, not allowed")

    def persistent_load(self, pid: Any) -> tuple[str, np.dtype]:
        # ('storage', storage_type, key, location, numel[, view_metadata])
        if not (isinstance(pid, tuple) and pid and pid[0] == "storage"):
            raise pickle.UnpicklingError(f"unexpected persistent id {pid!r}")
        storage_type, key = pid[1], str(pid[2])
        if not isinstance(storage_type, _StorageType):
            raise pickle.UnpicklingError(f"unexpected storage type {storage_type!r}")
        if len(pid) > 5 and pid[5] is not None:
            raise pickle.UnpicklingError("storage views are not supported")
        self.dtypes[key] = storage_type.dtype
        return key, storage_type.dtype

    dtypes: dict[str, np.dtype]


def read_legacy_checkpoint(data: bytes) -> dict[str, np.ndarray]:
    """The model_state tensors of a legacy torch checkpoint as float32 numpy arrays."""
    f = io.BytesIO(data)
    if pickle.load(f) != _LEGACY_MAGIC:  # the first pickle is a plain int: safe to load
        raise DiarizerPreparationError("not a legacy torch checkpoint (wrong magic number)")
    pickle.load(f)  # protocol version
    pickle.load(f)  # sys info (plain dict)
    unpickler = _CheckpointUnpickler(f)
    unpickler.dtypes = {}
    checkpoint = unpickler.load()
    keys = pickle.load(f)  # list of storage keys, in the order their bytes follow
    storages: dict[str, np.ndarray] = {}
    for key in keys:
        numel = int.from_bytes(f.read(8), "little")
        dtype = unpickler.dtypes[str(key)]
        raw = f.read(numel * dtype.itemsize)
        storages[str(key)] = np.frombuffer(raw, dtype=dtype.newbyteorder("<"), count=numel)
    state = checkpoint.get("model_state", checkpoint)
    out: dict[str, np.ndarray] = {}
    for name, ref in state.items():
        if not isinstance(ref, _Tensor):
            continue
        base = storages[ref.key]
        itemsize = base.dtype.itemsize
        view = np.lib.stride_tricks.as_strided(
            base[ref.offset :],
            shape=ref.size,
            strides=tuple(s * itemsize for s in ref.stride),
        )
        out[name] = np.array(view, dtype=np.float32)
    return out


# -- where the checkpoint comes from ----------------------------------------------------------


def _checkpoint_bytes(source: Path | None) -> bytes:
    if source is not None:
        if source.suffix == ".whl":
            with zipfile.ZipFile(source) as wheel:
                return wheel.read(CHECKPOINT_MEMBER)
        return source.read_bytes()
    spec = importlib.util.find_spec("resemblyzer")  # locate only: importing needs torch
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            candidate = Path(location) / "pretrained.pt"
            if candidate.is_file():
                return candidate.read_bytes()
    with tempfile.TemporaryDirectory(prefix="overnight-resemblyzer-") as tmp:
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--quiet",
            "--dest",
            tmp,
            f"resemblyzer=={RESEMBLYZER_VERSION}",
        ]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        wheels = sorted(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            raise DiarizerPreparationError(
                f"could not download resemblyzer=={RESEMBLYZER_VERSION} from the package index "
                f"(pip said: {done.stderr.strip()[-400:] or 'nothing'}); download the wheel "
                f"elsewhere and run `{PREPARE_COMMAND} --source PATH.whl`."
            )
        with zipfile.ZipFile(wheels[0]) as wheel:
            return wheel.read(CHECKPOINT_MEMBER)


def prepare_encoder(
    source: str | Path | None = None, cache_dir: str | Path | None = None, *, force: bool = False
) -> Path:
    """Write the encoder weights, and their LSTM graph, to the model cache (idempotent: a cache
    prepared before the graph existed gains only the graph); returns the ``.npz`` path.

    ``source``: a resemblyzer wheel or its ``pretrained.pt``; default the installed package,
    else a ``pip download`` of the pinned wheel.
    """
    target = encoder_path(cache_dir)
    if force or not target.is_file():
        _write_weights(source, target)
    prepare_lstm_graph(cache_dir, force=force)
    return target


def prepare_lstm_graph(cache_dir: str | Path | None = None, *, force: bool = False) -> Path:
    """Write the LSTM graph of the prepared weights (``encoder.lstm_graph``) beside them,
    unless one of this ``LSTM_GRAPH_VERSION`` is there; returns its path."""
    from overnight.workers.diarize.encoder import LSTM_GRAPH_VERSION, graph_version, lstm_graph

    path = lstm_path(cache_dir)
    if force or graph_version(path) != LSTM_GRAPH_VERSION:
        data = lstm_graph(load_weights(cache_dir))
        _write_atomically(path, lambda out: out.write(data))
    return path


def _write_weights(source: str | Path | None, target: Path) -> None:
    data = _checkpoint_bytes(Path(source) if source is not None else None)
    digest = hashlib.sha256(data).hexdigest()
    if digest != CHECKPOINT_SHA256:
        raise DiarizerPreparationError(
            f"the resemblyzer checkpoint has SHA-256 {digest}, not the {CHECKPOINT_SHA256} of "
            f"resemblyzer {RESEMBLYZER_VERSION}: refusing weights nobody checked."
        )
    state = read_legacy_checkpoint(data)
    missing = [name for name in WEIGHT_NAMES if name not in state]
    if missing:
        raise DiarizerPreparationError(f"the checkpoint lacks {', '.join(missing)}")
    arrays = {name: state[name] for name in WEIGHT_NAMES}
    _write_atomically(target, lambda out: np.savez(out, **arrays))  # type: ignore[arg-type]


def _write_atomically(target: Path, write) -> None:
    """Written beside the target and renamed: concurrent preparations never leave half a file."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".encoder-", suffix=target.suffix, dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            write(out)
        # mkstemp makes it 0600: a cache prepared by the image's build user is read by others.
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", help="a resemblyzer wheel or its pretrained.pt")
    parser.add_argument("--cache-dir", help="model cache folder (default: overnight's)")
    parser.add_argument("--force", action="store_true", help="prepare again")
    args = parser.parse_args(argv)
    try:
        path = prepare_encoder(args.source, args.cache_dir, force=args.force)
    except DiarizerPreparationError as exc:
        print(f"prepare: {exc}", file=sys.stderr)
        return 5
    graph = lstm_path(args.cache_dir)
    print(
        f"speaker encoder ready: {path} ({path.stat().st_size / 1e6:.1f} MB) and its LSTM "
        f"graph {graph.name}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
