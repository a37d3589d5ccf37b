"""Whisper weights as numpy arrays, from a CTranslate2 folder or a transformers checkpoint.

The torch engine (``workers.whisper_torch``) runs the same model the CTranslate2 engine runs,
so it reads CTranslate2's ``model.bin`` itself, after the layout CTranslate2 writes
(``python/ctranslate2/specs/model_spec.py``, ``ModelSpec._serialize``) and reads
(``src/models/model.cc``), all little-endian:

- ``uint32`` binary version (6 today; 4 or later carry a dtype id per variable), the spec's
  name (``WhisperSpec``) and ``uint32`` spec revision;
- ``uint32`` variable count, then per variable: its name, ``uint8`` rank, ``uint32`` per
  dimension, ``uint8`` dtype id (the order of ``DataType`` in ``include/ctranslate2/types.h``:
  float32, int8, int16, int32, float16, bfloat16), ``uint32`` byte count, the bytes;
- ``uint32`` alias count, then (alias, variable name) pairs (``decoder/projection/weight`` is
  the embedding, tied).

A string is a ``uint16`` length that counts a trailing NUL, then the bytes. A quantized weight
(int8 or int16) has a ``<name>_scale`` sibling: int8 scales each output row
(``weight * scale`` rounded), int16 the whole matrix; they are undone here, so the engine
always gets floats. Names are CTranslate2's Whisper spec's (``whisper_spec.py``,
``transformer_spec.py``): fused query/key/value in ``self_attention/linear_0``, the
cross-attention's query in ``attention/linear_0`` and fused key/value in ``linear_1``. A
transformers ``WhisperForConditionalGeneration`` folder is mapped onto the same names
(``hf_to_ct2``), with the fusions CTranslate2's converter does, so one engine loads both.

numpy only: no torch, CTranslate2 or transformers at import.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

# CTranslate2's DataType enum, in order (include/ctranslate2/types.h).
_DTYPES = ("float32", "int8", "int16", "int32", "float16", "bfloat16")
_SUPPORTED_BINARY_VERSIONS = range(4, 7)


class WeightsError(ValueError):
    """A weights file that is not a Whisper model this reader knows."""


@dataclass(frozen=True)
class WhisperDims:
    """The shape of a Whisper model."""

    n_mels: int
    n_audio_ctx: int  # encoder positions (1500 for 30 s)
    n_state: int  # d_model
    n_encoder_layers: int
    n_encoder_heads: int
    n_decoder_layers: int
    n_decoder_heads: int
    n_vocab: int
    n_text_ctx: int = 448
    n_encoder_ffn: int = 0  # 0: 4 x n_state
    n_decoder_ffn: int = 0

    @property
    def encoder_ffn(self) -> int:
        return self.n_encoder_ffn or 4 * self.n_state

    @property
    def decoder_ffn(self) -> int:
        return self.n_decoder_ffn or 4 * self.n_state


@dataclass
class WhisperCheckpoint:
    """Everything the engine needs from a model folder: shape, float weights under
    CTranslate2's names, the generation config (``suppress_ids``, ``suppress_ids_begin``,
    ``lang_ids``, ``alignment_heads``) and the vocabulary (token strings by id)."""

    dims: WhisperDims
    weights: dict[str, np.ndarray]
    config: dict[str, Any]
    vocabulary: list[str]
    source: str = ""
    info: dict[str, Any] = field(default_factory=dict)


def _read(f: BinaryIO, fmt: str) -> Any:
    size = struct.calcsize(fmt)
    data = f.read(size)
    if len(data) != size:
        raise WeightsError("model.bin ends early")
    return struct.unpack("<" + fmt, data)[0]


def _read_string(f: BinaryIO) -> str:
    n = _read(f, "H")
    return f.read(n)[:-1].decode("utf-8")


def _decode(raw: bytes, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    if dtype == "bfloat16":  # numpy has none: the high half of a float32
        halves = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        return halves.view(np.float32).reshape(shape)
    return np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<")).reshape(shape)


def read_ct2_variables(path: str | Path) -> tuple[str, int, dict[str, np.ndarray]]:
    """(spec name, spec revision, variables) of a CTranslate2 ``model.bin``; aliases resolved,
    values as stored (quantized weights stay quantized, see ``dequantize``)."""
    variables: dict[str, np.ndarray] = {}
    with open(path, "rb") as f:
        version = _read(f, "I")
        if version not in _SUPPORTED_BINARY_VERSIONS:
            raise WeightsError(
                f"{path}: CTranslate2 binary version {version}; this reader knows 4-6"
            )
        spec = _read_string(f)
        revision = _read(f, "I")
        for _ in range(_read(f, "I")):
            name = _read_string(f)
            rank = _read(f, "B")
            shape = tuple(_read(f, "I") for _ in range(rank))
            type_id = _read(f, "B")
            if type_id >= len(_DTYPES):
                raise WeightsError(f"{path}: variable {name} has unknown dtype id {type_id}")
            num_bytes = _read(f, "I")
            raw = f.read(num_bytes)
            if len(raw) != num_bytes:
                raise WeightsError(f"{path}: variable {name} ends early")
            variables[name] = _decode(raw, _DTYPES[type_id], shape)
        for _ in range(_read(f, "I")):
            alias, target = _read_string(f), _read_string(f)
            variables[alias] = variables[target]
    return spec, revision, variables


def dequantize(variables: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Float32 weights: int8/int16 weights divided by their ``_scale``, floats widened;
    scalars (flags, head counts) kept as Python ints."""
    out: dict[str, np.ndarray] = {}
    done: dict[int, np.ndarray] = {}  # an alias converts once and stays one array
    for name, value in variables.items():
        if name.endswith("_scale"):
            continue
        if id(value) in done:
            out[name] = done[id(value)]
            continue
        scale = variables.get(name + "_scale")
        if scale is not None and value.dtype in (np.int8, np.int16):
            w = value.astype(np.float32)
            s = np.asarray(scale, np.float32)
            if s.ndim == 1:  # int8: one scale per output row (conv weights: per channel)
                s = s.reshape((-1,) + (1,) * (w.ndim - 1))
            out[name] = w / s
        elif value.dtype.kind == "f":
            out[name] = value.astype(np.float32)
        else:
            out[name] = value
        done[id(value)] = out[name]
    return out


def _scalar(variables: Mapping[str, np.ndarray], name: str) -> int:
    return int(np.asarray(variables[name]).reshape(-1)[0])


def _count_layers(names: Iterable[str], prefix: str) -> int:
    layers = {n[len(prefix) :].split("/")[0] for n in names if n.startswith(prefix)}
    return sum(1 for layer in layers if layer.isdigit())


def dims_of(
    weights: Mapping[str, np.ndarray], encoder_heads: int, decoder_heads: int
) -> WhisperDims:
    """The shape of a model from its (CTranslate2-named) weights."""
    emb = weights["decoder/embeddings/weight"]
    return WhisperDims(
        n_mels=int(weights["encoder/conv1/weight"].shape[1]),
        n_audio_ctx=int(weights["encoder/position_encodings/encodings"].shape[0]),
        n_state=int(emb.shape[1]),
        n_encoder_layers=_count_layers(weights, "encoder/layer_"),
        n_encoder_heads=encoder_heads,
        n_decoder_layers=_count_layers(weights, "decoder/layer_"),
        n_decoder_heads=decoder_heads,
        n_vocab=int(emb.shape[0]),
        n_text_ctx=int(weights["decoder/position_encodings/encodings"].shape[0]),
        n_encoder_ffn=int(weights["encoder/layer_0/ffn/linear_0/weight"].shape[0]),
        n_decoder_ffn=int(weights["decoder/layer_0/ffn/linear_0/weight"].shape[0]),
    )


def read_vocabulary(folder: Path) -> list[str]:
    """Token strings by id: ``vocabulary.txt`` or ``vocabulary.json`` (CTranslate2), else the
    ``tokenizer.json`` model's vocabulary plus its added tokens, then timestamp tokens up to
    ``n_vocab`` are named as CTranslate2's converter names them (``<|0.00|>``...)."""
    txt, js = folder / "vocabulary.txt", folder / "vocabulary.json"
    if txt.is_file():
        lines = txt.read_text(encoding="utf-8").split("\n")
        return lines[:-1] if lines and lines[-1] == "" else lines
    if js.is_file():
        return list(json.loads(js.read_text(encoding="utf-8")))
    tok = folder / "tokenizer.json"
    if not tok.is_file():
        raise WeightsError(f"{folder}: no vocabulary.txt, vocabulary.json or tokenizer.json")
    data = json.loads(tok.read_text(encoding="utf-8"))
    by_id = {int(i): t for t, i in data["model"]["vocab"].items()}
    for added in data.get("added_tokens", []):
        by_id[int(added["id"])] = added["content"]
    return [by_id.get(i, "") for i in range(max(by_id) + 1)]


def _with_timestamps(vocabulary: list[str], n_vocab: int) -> list[str]:
    extra = n_vocab - len(vocabulary)
    return vocabulary + ["<|%.2f|>" % (i * 0.02) for i in range(max(0, extra))]


def load_ct2_folder(folder: str | Path) -> WhisperCheckpoint:
    """A CTranslate2 Whisper folder (``model.bin``, ``config.json``, vocabulary)."""
    folder = Path(folder)
    spec, revision, raw = read_ct2_variables(folder / "model.bin")
    if spec != "WhisperSpec":
        raise WeightsError(f"{folder}: a {spec} model, not Whisper")
    weights = dequantize(raw)
    dims = dims_of(weights, _scalar(raw, "encoder/num_heads"), _scalar(raw, "decoder/num_heads"))
    config_file = folder / "config.json"
    config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    vocabulary = _with_timestamps(read_vocabulary(folder), dims.n_vocab)
    stored = {str(v.dtype) for n, v in raw.items() if n.endswith("weight")}
    info = {"format": "ctranslate2", "spec_revision": revision, "stored_dtypes": sorted(stored)}
    return WhisperCheckpoint(dims, weights, config, vocabulary, str(folder), info)


# --- transformers checkpoints -------------------------------------------------------------


def _fuse(*arrays: np.ndarray) -> np.ndarray:
    return np.concatenate(arrays, axis=0)


def hf_to_ct2(hf: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A transformers Whisper state dict under CTranslate2's names, fused as its converter
    fuses them (the key projections have no bias: zeros)."""
    src = {k.removeprefix("model."): np.asarray(v, np.float32) for k, v in hf.items()}
    out: dict[str, np.ndarray] = {}

    def linear(dst: str, name: str) -> None:
        out[dst + "/weight"] = src[name + ".weight"]
        if name + ".bias" in src:
            out[dst + "/bias"] = src[name + ".bias"]

    def norm(dst: str, name: str) -> None:
        out[dst + "/gamma"], out[dst + "/beta"] = src[name + ".weight"], src[name + ".bias"]

    def attention(dst: str, name: str, fuse_q: bool) -> None:
        q, k, v = (src[f"{name}.{p}_proj.weight"] for p in "qkv")
        qb, vb = src[f"{name}.q_proj.bias"], src[f"{name}.v_proj.bias"]
        kb = src.get(f"{name}.k_proj.bias", np.zeros_like(qb))
        if fuse_q:  # self-attention: q, k, v in linear_0; out in linear_1
            out[dst + "/linear_0/weight"], out[dst + "/linear_0/bias"] = (
                _fuse(q, k, v),
                _fuse(qb, kb, vb),
            )
            linear(dst + "/linear_1", name + ".out_proj")
        else:  # cross-attention: q in linear_0, k and v in linear_1, out in linear_2
            out[dst + "/linear_0/weight"], out[dst + "/linear_0/bias"] = q, qb
            out[dst + "/linear_1/weight"], out[dst + "/linear_1/bias"] = _fuse(k, v), _fuse(kb, vb)
            linear(dst + "/linear_2", name + ".out_proj")

    for part in ("encoder", "decoder"):
        n = len({k.split(".")[2] for k in src if k.startswith(f"{part}.layers.")})
        for i in range(n):
            s, d = f"{part}.layers.{i}", f"{part}/layer_{i}"
            attention(d + "/self_attention", s + ".self_attn", fuse_q=True)
            norm(d + "/self_attention/layer_norm", s + ".self_attn_layer_norm")
            if part == "decoder":
                attention(d + "/attention", s + ".encoder_attn", fuse_q=False)
                norm(d + "/attention/layer_norm", s + ".encoder_attn_layer_norm")
            linear(d + "/ffn/linear_0", s + ".fc1")
            linear(d + "/ffn/linear_1", s + ".fc2")
            norm(d + "/ffn/layer_norm", s + ".final_layer_norm")
        out[f"{part}/position_encodings/encodings"] = src[f"{part}.embed_positions.weight"]
        norm(f"{part}/layer_norm", f"{part}.layer_norm")
    for conv in ("conv1", "conv2"):
        linear(f"encoder/{conv}", f"encoder.{conv}")
    out["decoder/embeddings/weight"] = src["decoder.embed_tokens.weight"]
    return out


def _hf_state_dict(folder: Path) -> dict[str, np.ndarray]:
    files = sorted(folder.glob("*.safetensors"))
    if files:
        from safetensors.numpy import load_file

        state: dict[str, np.ndarray] = {}
        try:
            for f in files:
                state.update(load_file(str(f)))
        except TypeError:  # bfloat16 has no numpy dtype: read through torch
            from safetensors.torch import load_file as load_torch

            for f in files:
                state.update({k: v.float().numpy() for k, v in load_torch(str(f)).items()})
        return state
    bin_file = folder / "pytorch_model.bin"
    if bin_file.is_file():
        import torch

        loaded = torch.load(bin_file, map_location="cpu", weights_only=True)
        return {k: v.float().numpy() for k, v in loaded.items()}
    raise WeightsError(f"{folder}: no *.safetensors or pytorch_model.bin")


def load_hf_folder(folder: str | Path) -> WhisperCheckpoint:
    """A transformers Whisper folder (``config.json`` with ``model_type`` whisper, weights,
    ``tokenizer.json``; ``generation_config.json`` for the suppressed tokens, languages and
    alignment heads, as CTranslate2's converter reads them)."""
    folder = Path(folder)
    hf_config = json.loads((folder / "config.json").read_text())
    weights = hf_to_ct2(_hf_state_dict(folder))
    dims = dims_of(
        weights,
        int(hf_config["encoder_attention_heads"]),
        int(hf_config["decoder_attention_heads"]),
    )
    gen_file = folder / "generation_config.json"
    gen = json.loads(gen_file.read_text()) if gen_file.is_file() else {}
    heads = gen.get("alignment_heads") or [
        [layer, head]
        for layer in range(dims.n_decoder_layers // 2, dims.n_decoder_layers)
        for head in range(dims.n_decoder_heads)
    ]
    config = {
        "suppress_ids": gen.get("suppress_tokens", hf_config.get("suppress_tokens")) or [],
        "suppress_ids_begin": gen.get(
            "begin_suppress_tokens", hf_config.get("begin_suppress_tokens")
        )
        or [],
        "lang_ids": sorted((gen.get("lang_to_id") or {}).values()),
        "alignment_heads": heads,
    }
    vocabulary = _with_timestamps(read_vocabulary(folder), dims.n_vocab)
    return WhisperCheckpoint(
        dims, weights, config, vocabulary, str(folder), {"format": "transformers"}
    )


def load_checkpoint(folder: str | Path) -> WhisperCheckpoint:
    """A CTranslate2 folder (``model.bin``) or a transformers one (``config.json`` of
    ``model_type`` whisper with safetensors or ``pytorch_model.bin``)."""
    folder = Path(folder)
    if (folder / "model.bin").is_file():
        return load_ct2_folder(folder)
    config = folder / "config.json"
    if config.is_file() and json.loads(config.read_text()).get("model_type") == "whisper":
        return load_hf_folder(folder)
    raise WeightsError(
        f"{folder}: neither a CTranslate2 Whisper folder (model.bin) nor a transformers one "
        "(config.json with model_type 'whisper')"
    )
