"""Whisper in PyTorch: the second engine behind the Whisper worker, built for GPUs.

Why an object shaped like ``ctranslate2.models.Whisper`` (``TorchWhisper``): faster-whisper's
``BatchedInferencePipeline`` and ``WhisperModel`` do everything above the model (prompts,
timestamp tokens to segments, compression ratios, word alignment from DTW jumps, punctuation
merging) and reach the model only through ``self.model.encode``, ``.generate``,
``.detect_language``, ``.align``, ``.is_multilingual`` and ``.n_mels``
(faster_whisper/transcribe.py 1.2.1). Answering exactly those calls, with CTranslate2's
semantics, keeps the worker's code path (``workers.whisper``), its guard and fallback
(``SamplingModel`` passes ``sampling_temperature``/``num_hypotheses`` through ``generate``)
and every segment and word rule the same for both engines; only the arithmetic differs.
``faster_whisper_model`` wraps an engine in a ``WhisperModel`` for the worker.

The CTranslate2 semantics kept (``src/models/whisper.cc``, ``src/decoding.cc``): the prompt up
to the last task token is run first and the no-speech probability read at the
start-of-transcript position; ``max_length`` caps decoding steps at
``min(max_length // 2, max_length - prompt)``; suppressed tokens (``-1``: the config's),
begin-suppressed tokens at the first step, the timestamp rules (pairs, non-decreasing, the
sum of timestamp probabilities against the best text token, ``max_initial_timestamp_index``);
a greedy score is the sum of log-probabilities, end-of-text included, divided by the length
(end-of-text excluded) to the ``length_penalty``; beam search keeps ``2 x beam`` candidates a
step, registers a hypothesis when a top-``beam`` candidate ends, and stops a window at
``round(beam x patience)`` of them; sampling draws from the full distribution at the
temperature and scores with the unscaled log-probabilities. Alignment (word timestamps):
the configured cross-attention heads' weights, softmaxed over the window's frames,
normalized over tokens, median-filtered (width 7, reflected edges), averaged over heads, and
a negative DTW, per window (CTranslate2 normalizes a batch whose windows all have one
length over its padded tokens too; this does not, so a window's words do not depend on its
batch-mates). Not supported (an error that says so): ``repetition_penalty`` other than 1,
``no_repeat_ngram_size``, a forced prefix after the task tokens.

How it runs:

- weights from a CTranslate2 ``model.bin`` or a transformers folder (``workers.whisper_weights``),
  or random in any shape (``TorchWhisper.random``, for the device check);
- bfloat16 on CUDA, float32 on CPU; attention is ``scaled_dot_product_attention``;
- the decoder has a static key/value cache of the window's length, and the cross-attention
  keys and values are computed once per window; beams and sampled hypotheses share their
  window's cross keys and values (queries of a window's hypotheses attend together);
- greedy decoding keeps tokens, scores and the end-of-text mask on the device and looks at
  the mask every ``check_every`` steps (a host sync), never per step;
- on CUDA one decoder step is captured as a CUDA graph per (batch bucket, hypotheses,
  cache length, window length) and replayed; batches are padded to a power of two so few
  graphs are captured; ``cuda_graphs=False`` or any capture failure runs eagerly;
- ``LogMel`` computes faster-whisper's features with ``torch.stft`` on the engine's device;
  ``chunk_features`` is the worker's front end when chunks come as samples
  (``AudioOptions.features_on_model``).

Imports torch at module level: only the worker's ``engine = "torch"`` path, the tests and the
scripts import this module. Torch is not a dependency of the default install.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from overnight.workers.whisper_weights import WhisperCheckpoint, WhisperDims, load_checkpoint

_NEG_INF = float("-inf")


class UnsupportedOption(ValueError):
    """A generate option the torch engine does not implement."""


@dataclass
class GenerationResult:
    """What ``ctranslate2.models.WhisperGenerationResult`` holds that faster-whisper reads."""

    sequences_ids: list[list[int]]
    scores: list[float]
    no_speech_prob: float


@dataclass
class AlignmentResult:
    """``ctranslate2.models.WhisperAlignmentResult``: (text index, time index) pairs and the
    probability of each text token."""

    alignments: list[tuple[int, int]]
    text_token_probs: list[float]


def resolve_dtype(device: str, compute_type: str = "auto") -> torch.dtype:
    """The engine's dtype: bfloat16 on CUDA, float32 on CPU for ``auto``; ``float16``,
    ``bfloat16``, ``float32`` as named. Integer types are CTranslate2's only."""
    if compute_type in ("auto", "default"):
        return torch.bfloat16 if device == "cuda" else torch.float32
    table = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
    if compute_type not in table:
        raise UnsupportedOption(
            f"compute_type {compute_type!r} is not supported by the torch engine: use auto, "
            "float32, float16 or bfloat16 (int8 is the ctranslate2 engine's)"
        )
    return table[compute_type]


# --- the front end ------------------------------------------------------------------------


def mel_filters(n_mels: int, sr: int = 16000, n_fft: int = 400) -> np.ndarray:
    """faster-whisper's mel filter bank (``FeatureExtractor.get_mel_filters``: Slaney mel
    scale, Slaney normalization, as librosa), float32. Written out here so that the front
    end needs neither faster-whisper nor CTranslate2 (a GPU image may have neither)."""
    fftfreqs = np.fft.rfftfreq(n=n_fft, d=1.0 / sr)
    mels = np.linspace(0.0, 45.245640471924965, n_mels + 2)
    f_sp = 200.0 / 3
    freqs = f_sp * mels
    min_log_hz, min_log_mel, logstep = 1000.0, 1000.0 / f_sp, np.log(6.4) / 27.0
    log_t = mels >= min_log_mel
    freqs[log_t] = min_log_hz * np.exp(logstep * (mels[log_t] - min_log_mel))
    fdiff = np.diff(freqs)
    ramps = freqs.reshape(-1, 1) - fftfreqs.reshape(1, -1)
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    weights = np.maximum(0, np.minimum(lower, upper))
    weights *= (2.0 / (freqs[2 : n_mels + 2] - freqs[:n_mels]))[:, None]
    return weights.astype(np.float32)


class LogMel:
    """faster-whisper's ``FeatureExtractor.__call__`` (160 samples of padding, periodic Hann
    window, centred reflect-padded STFT, power spectrum without its last frame, mel, log10
    floored at 1e-10 and at the maximum - 8, (x + 4) / 4) in torch on ``device``: a batch of
    equal-length waveforms in, (batch, n_mels, frames) out. The maximum is per waveform, as
    faster-whisper computes it per call."""

    def __init__(self, n_mels: int = 80, device: str | torch.device = "cpu"):
        self.device = torch.device(device)
        self.filters = torch.from_numpy(mel_filters(n_mels)).to(self.device)
        self.window = torch.hann_window(400, periodic=True, device=self.device)

    @torch.inference_mode()
    def __call__(self, audio: np.ndarray | torch.Tensor) -> torch.Tensor:
        x = torch.as_tensor(audio, dtype=torch.float32).to(self.device)
        if x.ndim == 1:
            x = x[None]
        x = F.pad(x, (0, 160))
        spec = torch.stft(x, 400, 160, window=self.window, center=True, return_complex=True)
        power = spec[..., :-1].abs() ** 2
        mel = self.filters @ power
        log = torch.clamp(mel, min=1e-10).log10()
        top = log.amax(dim=(-2, -1), keepdim=True)
        log = torch.maximum(log, top - 8.0)
        return (log + 4.0) / 4.0


_LOG_MELS: dict[tuple[int, str], LogMel] = {}
_LOG_MELS_LOCK = threading.Lock()
# Waveforms of one length computed together: 32 chunks of 30 s are 61 MB of samples and
# 150 MB of spectrum on the device.
LOG_MEL_GROUP = 32


def log_mel(n_mels: int, device: str | torch.device) -> LogMel:
    """The process's ``LogMel`` for ``n_mels`` on ``device`` (filters and window built once)."""
    key = (n_mels, str(torch.device(device)))
    with _LOG_MELS_LOCK:
        if key not in _LOG_MELS:
            _LOG_MELS[key] = LogMel(n_mels, device)
        return _LOG_MELS[key]


def chunk_features(
    samples: Sequence[np.ndarray], n_mels: int, device: str | torch.device
) -> list[np.ndarray]:
    """Each chunk's features from its 16 kHz samples, as the decode stage computes them
    (``workers.audio.features_of``: the log-mel without its last frame), with ``LogMel`` on
    ``device``, back on the host as float32 (n_mels, frames) arrays: the worker pads, batches
    and aligns words on host features whichever stage computed them. Chunks of one length go
    through together, ``LOG_MEL_GROUP`` at a time; ``LogMel``'s maximum is per waveform, so a
    chunk's features do not depend on its group."""
    mel = log_mel(n_mels, device)
    out: list[np.ndarray | None] = [None] * len(samples)
    by_length: dict[int, list[int]] = {}
    for i, s in enumerate(samples):
        by_length.setdefault(len(s), []).append(i)
    for idx in by_length.values():
        for start in range(0, len(idx), LOG_MEL_GROUP):
            part = idx[start : start + LOG_MEL_GROUP]
            wave = np.stack([samples[i] for i in part]).astype(np.float32, copy=False)
            feats = mel(wave)[..., :-1].cpu().numpy()
            for i, f in zip(part, feats, strict=True):
                out[i] = f
    return [f for f in out if f is not None]


# --- alignment helpers (host) -------------------------------------------------------------


def negative_dtw(x: np.ndarray) -> list[tuple[int, int]]:
    """CTranslate2's ``negative_dtw`` (src/dtw.cc): the monotonic path through ``x`` (text
    rows, time columns) of the largest sum, as (row, column) pairs; ties prefer the diagonal's
    rival order of the original (diagonal only when strictly best, then up, else left).
    Computed an anti-diagonal at a time (the recurrence only looks up, left and up-left)."""
    n, m = x.shape
    cost = np.full((n + 1, m + 1), np.inf, np.float32)
    trace = np.full((n + 1, m + 1), -1, np.int8)
    cost[0, 0] = 0
    x = np.asarray(x, np.float32)
    for d in range(2, n + m + 1):
        i = np.arange(max(1, d - m), min(n, d - 1) + 1)
        j = d - i
        c0, c1, c2 = cost[i - 1, j - 1], cost[i - 1, j], cost[i, j - 1]
        t = np.where((c0 < c1) & (c0 < c2), 0, np.where((c1 < c0) & (c1 < c2), 1, 2))
        c = np.choose(t, [c0, c1, c2])
        cost[i, j] = -x[i - 1, j - 1] + c
        trace[i, j] = t
    trace[0, :] = 2
    trace[:, 0] = 1
    i, j = n, m
    path: list[tuple[int, int]] = []
    while i > 0 or j > 0:
        path.append((i - 1, j - 1))
        t = trace[i, j]
        if t == 0:
            i, j = i - 1, j - 1
        elif t == 1:
            i -= 1
        else:
            j -= 1
    path.reverse()
    return path


def median_filter(x: torch.Tensor, width: int) -> torch.Tensor:
    """Median over the last axis in windows of ``width``, edges reflected (CTranslate2's
    ``MedianFilter``; an axis no longer than half the width passes through)."""
    half = width // 2
    if x.shape[-1] <= half:
        return x
    shape = x.shape
    padded = F.pad(x.reshape(-1, 1, shape[-1]), (half, half), mode="reflect")
    return padded.unfold(-1, width, 1).median(dim=-1).values.reshape(shape)


# --- the model ----------------------------------------------------------------------------


@dataclass
class _Layer:
    tensors: dict[str, torch.Tensor]

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.tensors[name]


class _State:
    """A batch's decoder state: cross keys/values per layer (B, H, S, Dh) and the self
    cache per layer (B x W, H, T, Dh)."""

    def __init__(self, cross_k, cross_v, self_k, self_v):
        self.cross_k: list[torch.Tensor] = cross_k
        self.cross_v: list[torch.Tensor] = cross_v
        self.self_k: list[torch.Tensor] = self_k
        self.self_v: list[torch.Tensor] = self_v


class _Graph:
    """A captured decoder step with its static inputs, output and state."""

    def __init__(self, graph, tokens, position, logits, state):
        self.graph, self.tokens, self.position = graph, tokens, position
        self.logits, self.state = logits, state
        self.busy = False  # replayed by a generate call now


class TorchWhisper:
    """Whisper in PyTorch, answering the calls faster-whisper makes on
    ``ctranslate2.models.Whisper`` (see the module docstring)."""

    def __init__(
        self,
        checkpoint: WhisperCheckpoint,
        device: str = "cpu",
        compute_type: str = "auto",
        cuda_graphs: bool = True,
        check_every: int = 8,
    ):
        self.dims: WhisperDims = checkpoint.dims
        self.config = dict(checkpoint.config)
        self.vocabulary = list(checkpoint.vocabulary)
        self.source = checkpoint.source
        self.torch_device = torch.device(device)
        self.device = self.torch_device.type  # "cpu" / "cuda", as CTranslate2 names it
        self.device_index = [self.torch_device.index or 0]
        self.dtype = resolve_dtype(self.device, compute_type)
        self.compute_type = str(self.dtype).removeprefix("torch.")
        self.check_every = max(1, check_every)
        self.cuda_graphs = cuda_graphs and self.device == "cuda"
        self._graphs: OrderedDict[tuple, list[_Graph]] = OrderedDict()
        self._graph_lock = threading.Lock()
        self._max_graphs = 6
        # Run eagerly what a graph would replay (tensor position, whole masked cache, padded
        # batch): how the CPU tests check the captured step's arithmetic.
        self.static_steps = self.cuda_graphs
        self.graph_failures: list[str] = []
        self._load(checkpoint.weights)
        ids = {tok: i for i, tok in enumerate(self.vocabulary)}
        self.sot_id = ids["<|startoftranscript|>"]
        self.eot_id = ids["<|endoftext|>"]
        self.no_timestamps_id = ids["<|notimestamps|>"]
        self.no_speech_id = ids.get("<|nospeech|>", ids.get("<|nocaptions|>", -1))
        self.timestamp_begin_id = self.no_timestamps_id + 1
        self.timestamp_end_id = self.dims.n_vocab - 1
        self.lang_ids = [int(i) for i in self.config.get("lang_ids") or []]
        self.alignment_heads = [tuple(h) for h in self.config.get("alignment_heads") or []]
        self._suppress_default = [int(i) for i in self.config.get("suppress_ids") or []]
        self._suppress_begin = [int(i) for i in self.config.get("suppress_ids_begin") or []]

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def from_path(cls, path: str | Path, device: str = "cpu", **kwargs: Any) -> TorchWhisper:
        """From a CTranslate2 folder (``model.bin``) or a transformers Whisper folder."""
        return cls(load_checkpoint(path), device=device, **kwargs)

    @classmethod
    def random(
        cls,
        dims: WhisperDims,
        config: dict[str, Any],
        vocabulary: list[str],
        device: str = "cpu",
        seed: int = 0,
        **kwargs: Any,
    ) -> TorchWhisper:
        """Random weights in ``dims``'s shape, built on ``device`` (for timing only)."""
        names = _weight_shapes(dims)
        gen = torch.Generator(device=device).manual_seed(seed)
        weights: dict[str, Any] = {}
        for name, shape in names.items():
            if name.endswith("gamma"):
                weights[name] = torch.ones(shape, device=device)
            elif name.endswith(("beta", "bias")):
                weights[name] = torch.zeros(shape, device=device)
            else:
                weights[name] = torch.randn(shape, generator=gen, device=device) * 0.02
        vocab = list(vocabulary) + [
            "<|%.2f|>" % (i * 0.02) for i in range(dims.n_vocab - len(vocabulary))
        ]
        checkpoint = WhisperCheckpoint(dims, weights, config, vocab[: dims.n_vocab], "random")
        return cls(checkpoint, device=device, **kwargs)

    def _load(self, weights: dict[str, Any]) -> None:
        dev, dt = self.torch_device, self.dtype

        def t(name: str) -> torch.Tensor:
            return torch.as_tensor(weights[name]).to(device=dev, dtype=dt).contiguous()

        def layer(prefix: str, parts: Sequence[str]) -> _Layer:
            out = {}
            for part in parts:
                for leaf in ("weight", "bias", "gamma", "beta"):
                    name = f"{prefix}/{part}/{leaf}"
                    if name in weights:
                        out[f"{part}/{leaf}"] = t(name)
            return _Layer(out)

        d = self.dims
        self.conv1_w, self.conv1_b = t("encoder/conv1/weight"), t("encoder/conv1/bias")
        self.conv2_w, self.conv2_b = t("encoder/conv2/weight"), t("encoder/conv2/bias")
        self.enc_pos = t("encoder/position_encodings/encodings")
        enc_parts = (
            "self_attention/layer_norm",
            "self_attention/linear_0",
            "self_attention/linear_1",
            "ffn/layer_norm",
            "ffn/linear_0",
            "ffn/linear_1",
        )
        dec_parts = (
            *enc_parts,
            "attention/layer_norm",
            "attention/linear_0",
            "attention/linear_1",
            "attention/linear_2",
        )
        self.enc_layers = [
            layer(f"encoder/layer_{i}", enc_parts) for i in range(d.n_encoder_layers)
        ]
        self.enc_ln = (t("encoder/layer_norm/gamma"), t("encoder/layer_norm/beta"))
        self.embedding = t("decoder/embeddings/weight")
        self.dec_pos = t("decoder/position_encodings/encodings")
        self.dec_layers = [
            layer(f"decoder/layer_{i}", dec_parts) for i in range(d.n_decoder_layers)
        ]
        self.dec_ln = (t("decoder/layer_norm/gamma"), t("decoder/layer_norm/beta"))

    # -- what faster-whisper reads -----------------------------------------------------------
    @property
    def is_multilingual(self) -> bool:
        return self.dims.n_vocab >= 51865

    @property
    def n_mels(self) -> int:
        return self.dims.n_mels

    @property
    def num_languages(self) -> int:
        return len(self.lang_ids)

    # -- tensors in and out ----------------------------------------------------------------
    def from_host(self, array: np.ndarray) -> torch.Tensor:
        """An encoder output kept on the host, back on the engine's device."""
        return torch.as_tensor(np.asarray(array)).to(self.torch_device, self.dtype)

    def _tensor(self, x: Any) -> torch.Tensor:
        if isinstance(x, torch.Tensor):
            return x.to(self.torch_device)
        return torch.as_tensor(np.asarray(x)).to(self.torch_device)

    def _memory(self, x: Any) -> torch.Tensor:
        """An encoder output from features or from an encoder output (as CTranslate2's
        ``maybe_encode``: a last axis of d_model whose second is not n_mels)."""
        t = self._tensor(x)
        if t.ndim == 3 and t.shape[-1] == self.dims.n_state and t.shape[1] != self.dims.n_mels:
            return t.to(self.dtype)
        return self.encode(t)

    # -- encoder ---------------------------------------------------------------------------
    @torch.inference_mode()
    def encode(self, features: Any, to_cpu: bool = False) -> torch.Tensor:
        """Log-mel features (B, n_mels, frames) to the encoder output (B, frames / 2, d)."""
        x = self._tensor(features).to(self.dtype)
        if x.ndim == 2:
            x = x[None]
        x = F.gelu(F.conv1d(x, self.conv1_w, self.conv1_b, padding=1))
        x = F.gelu(F.conv1d(x, self.conv2_w, self.conv2_b, stride=2, padding=1))
        x = x.transpose(1, 2)
        x = x + self.enc_pos[: x.shape[1]]
        b, s, d = x.shape
        h = self.dims.n_encoder_heads
        for L in self.enc_layers:
            y = F.layer_norm(
                x, (d,), L["self_attention/layer_norm/gamma"], L["self_attention/layer_norm/beta"]
            )
            qkv = F.linear(
                y, L["self_attention/linear_0/weight"], L["self_attention/linear_0/bias"]
            )
            q, k, v = qkv.view(b, s, 3, h, d // h).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v)
            a = a.transpose(1, 2).reshape(b, s, d)
            x = x + F.linear(
                a, L["self_attention/linear_1/weight"], L["self_attention/linear_1/bias"]
            )
            x = x + self._ffn(L, x)
        x = F.layer_norm(x, (d,), *self.enc_ln)
        return x.cpu() if to_cpu else x

    @staticmethod
    def _ffn(L: _Layer, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1]
        y = F.layer_norm(x, (d,), L["ffn/layer_norm/gamma"], L["ffn/layer_norm/beta"])
        y = F.gelu(F.linear(y, L["ffn/linear_0/weight"], L["ffn/linear_0/bias"]))
        return F.linear(y, L["ffn/linear_1/weight"], L["ffn/linear_1/bias"])

    # -- decoder ---------------------------------------------------------------------------
    def _cross(self, memory: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        b, s, d = memory.shape
        h = self.dims.n_decoder_heads
        ks, vs = [], []
        for L in self.dec_layers:
            kv = F.linear(memory, L["attention/linear_1/weight"], L["attention/linear_1/bias"])
            k, v = kv.view(b, s, 2, h, d // h).permute(2, 0, 3, 1, 4)
            ks.append(k.contiguous())
            vs.append(v.contiguous())
        return ks, vs

    def _new_state(self, memory: torch.Tensor, hyps: int, length: int) -> _State:
        b = memory.shape[0]
        h, d = self.dims.n_decoder_heads, self.dims.n_state
        ck, cv = self._cross(memory)
        shape = (b * hyps, h, length, d // h)
        sk = [torch.zeros(shape, device=memory.device, dtype=self.dtype) for _ in self.dec_layers]
        sv = [torch.zeros(shape, device=memory.device, dtype=self.dtype) for _ in self.dec_layers]
        return _State(ck, cv, sk, sv)

    def _decode(
        self,
        tokens: torch.Tensor,
        start: int | torch.Tensor,
        state: _State,
        hyps: int,
        qk_heads: dict[int, list[int]] | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Logits (N, Tq, V) for ``tokens`` (N = B x hyps, Tq) at positions ``start`` + i,
        writing their keys and values into the self cache. ``start`` as a tensor (1,) is the
        graph-safe form: the whole cache is attended with a mask. ``qk_heads``: layer ->
        heads whose cross-attention scores are returned (alignment)."""
        n, tq = tokens.shape
        d, h = self.dims.n_state, self.dims.n_decoder_heads
        dh = d // h
        b = n // hyps
        if isinstance(start, torch.Tensor):
            positions = start + torch.arange(tq, device=tokens.device)
            x = self.embedding[tokens] + self.dec_pos.index_select(0, positions)[None]
            cache_len = state.self_k[0].shape[2]
            mask = torch.arange(cache_len, device=tokens.device)[None] <= positions[:, None]
        else:
            positions = None
            x = self.embedding[tokens] + self.dec_pos[start : start + tq][None]
            mask = None
            if tq > 1:
                keys = torch.arange(start + tq, device=tokens.device)
                mask = keys[None] <= (start + torch.arange(tq, device=tokens.device))[:, None]
        scores: list[torch.Tensor] = []
        for index, L in enumerate(self.dec_layers):
            y = F.layer_norm(
                x, (d,), L["self_attention/layer_norm/gamma"], L["self_attention/layer_norm/beta"]
            )
            qkv = F.linear(
                y, L["self_attention/linear_0/weight"], L["self_attention/linear_0/bias"]
            )
            q, k, v = qkv.view(n, tq, 3, h, dh).permute(2, 0, 3, 1, 4)
            ck, cv = state.self_k[index], state.self_v[index]
            if positions is not None:
                ck.index_copy_(2, positions, k)
                cv.index_copy_(2, positions, v)
                keys_k, keys_v = ck, cv
            else:
                assert isinstance(start, int)
                ck[:, :, start : start + tq] = k
                cv[:, :, start : start + tq] = v
                keys_k, keys_v = ck[:, :, : start + tq], cv[:, :, : start + tq]
            a = F.scaled_dot_product_attention(q, keys_k, keys_v, attn_mask=mask)
            x = x + F.linear(
                a.transpose(1, 2).reshape(n, tq, d),
                L["self_attention/linear_1/weight"],
                L["self_attention/linear_1/bias"],
            )
            y = F.layer_norm(
                x, (d,), L["attention/layer_norm/gamma"], L["attention/layer_norm/beta"]
            )
            q = F.linear(y, L["attention/linear_0/weight"], L["attention/linear_0/bias"])
            # A window's hypotheses query its cross keys together: (B, H, hyps x Tq, Dh).
            q = q.view(b, hyps, tq, h, dh).permute(0, 3, 1, 2, 4).reshape(b, h, hyps * tq, dh)
            kx, vx = state.cross_k[index], state.cross_v[index]
            if qk_heads and index in qk_heads:
                heads = qk_heads[index]
                raw = (q[:, heads].float() @ kx[:, heads].float().transpose(-1, -2)) / math.sqrt(dh)
                scores.append(raw)
            a = F.scaled_dot_product_attention(q, kx, vx)
            a = a.view(b, h, hyps, tq, dh).permute(0, 2, 3, 1, 4).reshape(n, tq, d)
            x = x + F.linear(a, L["attention/linear_2/weight"], L["attention/linear_2/bias"])
            x = x + self._ffn(L, x)
        x = F.layer_norm(x, (d,), *self.dec_ln)
        return F.linear(x, self.embedding), scores

    # -- CUDA graphs -----------------------------------------------------------------------
    def _graph_for(self, memory: torch.Tensor, hyps: int, length: int) -> _Graph | None:
        """A captured step for this batch shape that no other thread is replaying, its
        cross keys and values set from ``memory``; the caller gives it back
        (``busy = False``). None when graphs are off, capture failed, or every graph of
        this shape is busy and no more may be captured: the caller runs eagerly."""
        if not self.cuda_graphs:
            return None
        b, s, _ = memory.shape
        key = (b, hyps, length, s)
        with self._graph_lock:  # captures one at a time; model workers share the engine
            pool = self._graphs.setdefault(key, [])
            self._graphs.move_to_end(key)
            graph = next((g for g in pool if not g.busy), None)
            if graph is None:
                if not self._evict_one():
                    return None
                try:
                    graph = self._capture(memory, hyps, length)
                except Exception as exc:  # a capture that fails costs speed, not results
                    self.graph_failures.append(f"{key}: {type(exc).__name__}: {exc}")
                    self.cuda_graphs = False
                    return None
                pool.append(graph)
            graph.busy = True
        ck, cv = self._cross(memory)
        for dst, src in zip(graph.state.cross_k + graph.state.cross_v, ck + cv, strict=True):
            dst.copy_(src)
        return graph

    def _evict_one(self) -> bool:
        """Room for one more graph (the least recently used idle one goes); False if all
        ``max_graphs`` are busy."""
        if sum(len(pool) for pool in self._graphs.values()) < self._max_graphs:
            return True
        for pool in self._graphs.values():  # oldest shape first
            for g in pool:
                if not g.busy:
                    pool.remove(g)
                    return True
        return False

    def _capture(self, memory: torch.Tensor, hyps: int, length: int) -> _Graph:
        state = self._new_state(memory, hyps, length)
        n = memory.shape[0] * hyps
        tokens = torch.zeros((n, 1), dtype=torch.long, device=memory.device)
        position = torch.zeros((1,), dtype=torch.long, device=memory.device)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._decode(tokens, position, state, hyps)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            logits, _ = self._decode(tokens, position, state, hyps)
        return _Graph(graph, tokens, position, logits, state)

    # -- generate --------------------------------------------------------------------------
    def _prompt_layout(self, prompts: Sequence[Sequence[int]]) -> tuple[int, int]:
        """(sot index, prompt length): the prompt length runs from the start of transcript
        over the task tokens (ids from sot to no-timestamps), the same for every prompt."""
        layout = None
        for p in prompts:
            if self.sot_id not in p:
                raise ValueError("<|startoftranscript|> token was not found in the prompt")
            sot = list(p).index(self.sot_id)
            end = sot
            while end < len(p) and self.sot_id <= p[end] <= self.no_timestamps_id:
                end += 1
            if layout is None:
                layout = (sot, end)
            elif layout != (sot, end):
                raise ValueError(
                    "every prompt of a batch needs <|startoftranscript|> at the same position "
                    "and the same task tokens after it"
                )
        assert layout is not None
        return layout

    @torch.inference_mode()
    def generate(
        self,
        features: Any,
        prompts: Sequence[Sequence[int]],
        *,
        beam_size: int = 5,
        patience: float = 1,
        num_hypotheses: int = 1,
        length_penalty: float = 1,
        repetition_penalty: float = 1,
        no_repeat_ngram_size: int = 0,
        max_length: int = 448,
        return_scores: bool = False,
        return_no_speech_prob: bool = False,
        max_initial_timestamp_index: int = 50,
        suppress_blank: bool = True,
        suppress_tokens: Sequence[int] | None = (-1,),
        sampling_topk: int = 1,
        sampling_temperature: float = 1,
        **other: Any,
    ) -> list[GenerationResult]:
        """``ctranslate2.models.Whisper.generate`` with token-id prompts."""
        if repetition_penalty != 1 or no_repeat_ngram_size:
            raise UnsupportedOption(
                "the torch Whisper engine has no repetition_penalty or no_repeat_ngram_size; "
                "use engine = 'ctranslate2' for them"
            )
        unknown = {k for k, v in other.items() if v not in (None, False, 0)}
        if unknown:
            raise UnsupportedOption(f"the torch Whisper engine does not take {sorted(unknown)}")
        if not prompts:
            return []
        prompts = [[int(t) for t in p] for p in prompts]
        sot_index, prompt_length = self._prompt_layout(prompts)
        if any(len(p) != prompt_length for p in prompts):
            raise UnsupportedOption(
                "the torch Whisper engine takes no forced prefix after the task tokens"
            )
        memory = self._memory(features)
        b = memory.shape[0]
        start_step = prompt_length - 1
        max_steps = min(max_length // 2, max_length - start_step)
        sampling = sampling_topk != 1 and sampling_temperature > 0
        if beam_size > 1 and not sampling:
            hyps, beam = beam_size, True
        else:
            hyps, beam = max(1, num_hypotheses), False
        cache_len = start_step + max_steps
        # Batch padded to a power of two and the cache to a multiple of 64 positions on
        # CUDA, so a few captured graphs serve every batch (the worker's token cap varies).
        padded = b
        if self.cuda_graphs or self.static_steps:
            cache_len = min(self.dims.n_text_ctx, -(-cache_len // 64) * 64)
            padded = 1 << (b - 1).bit_length()
            if padded != b:
                memory = torch.cat([memory, memory[-1:].expand(padded - b, -1, -1)])
                prompts = prompts + [prompts[-1]] * (padded - b)
        graph = self._graph_for(memory, hyps, cache_len)
        try:
            state = graph.state if graph is not None else self._new_state(memory, hyps, cache_len)
            dev = memory.device
            prompt_t = torch.tensor(prompts, dtype=torch.long, device=dev)  # (B, P)
            n = padded * hyps
            rows = prompt_t.repeat_interleave(hyps, dim=0)  # (N, P)
            no_speech = torch.zeros(padded, device=dev)
            if start_step > 0:
                logits, _ = self._decode(rows[:, :start_step], 0, state, hyps)
                if return_no_speech_prob and sot_index < start_step:
                    probs = logits[::hyps, sot_index].float().softmax(-1)
                    no_speech = probs[:, self.no_speech_id]
            no_speech_at_step0 = return_no_speech_prob and sot_index == start_step

            suppress = self._suppress_ids(suppress_tokens)
            bias = torch.zeros(self.dims.n_vocab, device=dev)
            if suppress:
                bias[suppress] = _NEG_INF
            begin_bias = torch.zeros(self.dims.n_vocab, device=dev)
            if suppress_blank and self._suppress_begin:
                begin_bias[self._suppress_begin] = _NEG_INF
            timestamps = prompts[0][prompt_length - 1] != self.no_timestamps_id
            rules = (
                _TimestampRules(self, n, dev, max_initial_timestamp_index) if timestamps else None
            )

            first: list[
                torch.Tensor
            ] = []  # the first step's probabilities, when no-speech needs them

            def step_logits(tokens: torch.Tensor, step: int) -> torch.Tensor:
                position = start_step + step
                if graph is not None:
                    graph.tokens.copy_(tokens[:, None])
                    graph.position.fill_(position)
                    graph.graph.replay()
                    out = graph.logits[:, 0].float()
                else:
                    at: int | torch.Tensor = position
                    if self.static_steps:
                        at = torch.tensor([position], device=dev)
                    out = self._decode(tokens[:, None], at, state, hyps)[0][:, 0].float()
                if step == 0 and no_speech_at_step0:
                    first.append(out.softmax(-1))
                return out

            def process(logits: torch.Tensor, step: int) -> torch.Tensor:
                logits = logits + bias
                if step == 0:
                    logits = logits + begin_bias
                if rules is not None:
                    logits = rules.apply(logits, step)
                return logits

            tokens = rows[:, start_step]
            if beam:
                seqs, scores, lengths = self._beam(
                    step_logits, process, state, tokens, padded, hyps, max_steps, start_step,
                    rules, patience, length_penalty,
                )  # fmt: skip
            else:
                seqs, scores, lengths = self._greedy(
                    step_logits, process, tokens, n, max_steps, rules, sampling,
                    sampling_temperature, sampling_topk, length_penalty,
                )  # fmt: skip
            if first:
                no_speech = first[0][::hyps, self.no_speech_id]
            seqs_h, scores_h, lengths_h = (
                seqs.cpu().numpy(),
                scores.cpu().numpy(),
                lengths.cpu().numpy(),
            )
            no_speech_h = no_speech.float().cpu().numpy()
            results = []
            per = seqs_h.shape[0] // padded
            for i in range(b):
                cands = [
                    (
                        float(scores_h[i * per + k]),
                        seqs_h[i * per + k, : lengths_h[i * per + k]].tolist(),
                    )
                    for k in range(per)
                ]
                cands.sort(key=lambda c: -c[0])
                cands = cands[: max(1, num_hypotheses)]
                results.append(
                    GenerationResult(
                        sequences_ids=[c[1] for c in cands],
                        scores=[c[0] for c in cands] if return_scores else [],
                        no_speech_prob=float(no_speech_h[i]) if return_no_speech_prob else 0.0,
                    )
                )
            return results
        finally:
            if graph is not None:
                graph.busy = False

    def _suppress_ids(self, suppress_tokens: Sequence[int] | None) -> list[int]:
        ids: list[int] = []
        for t in suppress_tokens or []:
            if t >= 0:
                ids.append(int(t))
            elif t == -1:
                ids.extend(self._suppress_default)
        return ids

    def _greedy(
        self, step_logits, process, tokens, n, max_steps, rules, sampling, temperature, topk,
        length_penalty,
    ):  # fmt: skip
        """Greedy (or sampled) decoding of N rows, all on the device; the end-of-text mask
        is read every ``check_every`` steps. Returns (tokens, normalized scores, lengths)."""
        dev = tokens.device
        out = torch.full((n, max_steps), self.eot_id, dtype=torch.long, device=dev)
        alive = torch.ones(n, dtype=torch.bool, device=dev)
        lengths = torch.zeros(n, dtype=torch.long, device=dev)
        cum = torch.zeros(n, device=dev)
        for step in range(max_steps):
            logits = process(step_logits(tokens, step), step)
            logprobs = logits.log_softmax(-1)
            if sampling:
                scaled = logits / temperature
                if topk > 1:
                    kth = scaled.topk(topk, dim=-1).values[:, -1:]
                    scaled = scaled.masked_fill(scaled < kth, _NEG_INF)
                nxt = torch.multinomial(scaled.softmax(-1), 1)[:, 0]
            else:
                nxt = logits.argmax(-1)
            cum += torch.where(alive, logprobs.gather(1, nxt[:, None])[:, 0], 0.0)
            ended = nxt == self.eot_id
            out[:, step] = torch.where(alive, nxt, self.eot_id)
            lengths += (alive & ~ended).long()
            alive &= ~ended
            if rules is not None:
                rules.update(nxt)
            tokens = nxt
            if (step + 1) % self.check_every == 0 and not bool(alive.any()):
                break
        return out, _normalize(cum, lengths, length_penalty), lengths

    def _beam(
        self, step_logits, process, state, tokens, b, width, max_steps, start_step, rules,
        patience, length_penalty,
    ):  # fmt: skip
        """CTranslate2's beam search (see the module docstring), batched on the device.
        Returns the finished hypotheses as (B x slots) rows: tokens, scores, lengths."""
        dev = tokens.device
        v = self.dims.n_vocab
        max_cand = max(1, round(width * patience))
        slots = max_cand + width
        cand = 2 * width
        beam_scores = torch.full((b, width), _NEG_INF, device=dev)
        beam_scores[:, 0] = 0
        alive_seq = torch.full((b * width, max_steps), self.eot_id, dtype=torch.long, device=dev)
        fin_tokens = torch.full((b, slots, max_steps), self.eot_id, dtype=torch.long, device=dev)
        fin_scores = torch.full((b, slots), _NEG_INF, device=dev)
        fin_len = torch.zeros((b, slots), dtype=torch.long, device=dev)
        fin_count = torch.zeros(b, dtype=torch.long, device=dev)
        done = torch.zeros(b, dtype=torch.bool, device=dev)
        batch_base = (torch.arange(b, device=dev) * width)[:, None]
        order_key = torch.arange(cand, device=dev)[None]
        for step in range(max_steps):
            logits = process(step_logits(tokens, step), step)
            logprobs = logits.log_softmax(-1).view(b, width, v) + beam_scores[..., None]
            top_s, top_i = logprobs.view(b, width * v).topk(cand, dim=-1)
            origin, token = top_i // v, top_i % v
            is_eos = token == self.eot_id
            last = step == max_steps - 1
            # Hypotheses that end here: top-beam candidates that say end-of-text (all of
            # them at the last step), for windows still collecting.
            reg = (is_eos[:, :width] | last) & ~done[:, None]
            slot = (fin_count[:, None] + reg.long().cumsum(1) - 1).clamp(0, slots - 1)
            src_rows = (batch_base + origin[:, :width]).reshape(-1)
            seq = alive_seq[src_rows].view(b, width, max_steps).clone()
            keep_tok = ~is_eos[:, :width]
            seq[:, :, step] = torch.where(keep_tok, token[:, :width], self.eot_id)
            length = torch.where(keep_tok, step + 1, step)
            bi = torch.arange(b, device=dev)[:, None].expand(b, width)
            sel = reg.nonzero(as_tuple=True)
            fb, fs = bi[sel], slot[sel]
            fin_tokens[fb, fs] = seq[sel]
            fin_scores[fb, fs] = top_s[:, :width][sel]
            fin_len[fb, fs] = length[sel]
            fin_count += reg.long().sum(1)
            done |= fin_count >= max_cand
            if last:
                break
            # The next beams: the first ``width`` candidates that do not end.
            pick = (is_eos.long() * cand + order_key).argsort(dim=-1)[:, :width]
            beam_scores = top_s.gather(1, pick)
            new_tok = token.gather(1, pick)
            rows = (batch_base + origin.gather(1, pick)).reshape(-1)
            alive_seq = alive_seq[rows]
            alive_seq[:, step] = new_tok.reshape(-1)
            upto = start_step + step + 1
            for cache in state.self_k + state.self_v:
                cache[:, :, :upto] = cache[rows, :, :upto]
            if rules is not None:
                rules.reorder(rows)
                rules.update(new_tok.reshape(-1))
            tokens = new_tok.reshape(-1)
            if (step + 1) % self.check_every == 0 and bool(done.all()):
                break
        scores = _normalize(fin_scores.view(-1), fin_len.view(-1), length_penalty)
        return fin_tokens.view(b * slots, max_steps), scores, fin_len.view(-1)

    # -- language detection ----------------------------------------------------------------
    @torch.inference_mode()
    def detect_language(self, features: Any) -> list[list[tuple[str, float]]]:
        if not self.is_multilingual:
            raise RuntimeError("detect_language can only be called on multilingual models")
        memory = self._memory(features)
        b = memory.shape[0]
        state = self._new_state(memory, 1, 1)
        sot = torch.full((b, 1), self.sot_id, dtype=torch.long, device=memory.device)
        logits, _ = self._decode(sot, 0, state, 1)
        probs = logits[:, 0, self.lang_ids].float().softmax(-1).cpu().numpy()
        out = []
        for row in probs:
            pairs = [
                (self.vocabulary[i], float(p)) for i, p in zip(self.lang_ids, row, strict=True)
            ]
            pairs.sort(key=lambda x: -x[1])
            out.append(pairs)
        return out

    # -- alignment -------------------------------------------------------------------------
    @torch.inference_mode()
    def align(
        self,
        features: Any,
        start_sequence: Sequence[int],
        text_tokens: Sequence[Sequence[int]],
        num_frames: Sequence[int] | int,
        median_filter_width: int = 7,
    ) -> list[AlignmentResult]:
        """``ctranslate2.models.Whisper.align``: per window, the DTW path of its text tokens
        over its frames and each text token's probability."""
        b = len(text_tokens)
        if b == 0:
            return []
        frames = (
            [int(num_frames)] * b if isinstance(num_frames, int) else [int(f) for f in num_frames]
        )
        memory = self._memory(features)
        seqs = [[*start_sequence, self.no_timestamps_id, *t, self.eot_id] for t in text_tokens]
        longest = max(len(s) for s in seqs)
        dev = memory.device
        tokens = torch.full((b, longest), self.eot_id, dtype=torch.long, device=dev)
        for i, s in enumerate(seqs):
            tokens[i, : len(s)] = torch.tensor(s, device=dev)
        heads: dict[int, list[int]] = {}
        for layer, head in self.alignment_heads:
            heads.setdefault(int(layer), []).append(int(head))
        state = self._new_state(memory, 1, longest)
        logits, raw = self._decode(tokens, 0, state, 1, qk_heads=heads)
        targets = torch.cat([tokens[:, 1:], torch.zeros_like(tokens[:, :1])], dim=1)
        text_probs = logits[..., : self.eot_id].float().softmax(-1)
        gathered = text_probs.gather(-1, targets.clamp(max=self.eot_id - 1)[..., None])[..., 0]
        token_probs = gathered.cpu().numpy()
        weights = torch.cat(raw, dim=1)  # (B, heads, T, S)
        sot_len = len(start_sequence)
        results = []
        for i, text in enumerate(text_tokens):
            n = frames[i] // 2
            probs = token_probs[i, sot_len : sot_len + len(text)].tolist()
            if n == 0:
                results.append(AlignmentResult([], probs))
                continue
            w = weights[i, :, : len(seqs[i]), :n].softmax(-1)
            mean = w.mean(dim=-2, keepdim=True)
            std = (w - mean).pow(2).mean(dim=-2, keepdim=True).sqrt()
            w = (w - mean) / std
            w = median_filter(w, median_filter_width)
            matrix = w.mean(dim=0)[sot_len : sot_len + len(text) + 1]
            results.append(AlignmentResult(negative_dtw(matrix.cpu().numpy()), probs))
        return results


def _normalize(cum: torch.Tensor, lengths: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTranslate2's final score: the sum of log-probabilities over length ** penalty."""
    denom = lengths.float().pow(penalty)
    return torch.where(denom > 0, cum / denom.clamp(min=1e-9), torch.full_like(cum, _NEG_INF))


class _TimestampRules:
    """CTranslate2's ``ApplyTimestampRules`` for N rows at once, on the device: the last and
    second-to-last tokens and the last timestamp of each row are kept as tensors."""

    def __init__(self, model: TorchWhisper, n: int, device: torch.device, max_initial: int):
        self.tb, self.te = model.timestamp_begin_id, model.timestamp_end_id
        self.eot, self.no_ts = model.eot_id, model.no_timestamps_id
        self.max_initial = self.tb + max_initial
        self.idx = torch.arange(model.dims.n_vocab, device=device)
        self.last = torch.full((n,), -1, dtype=torch.long, device=device)
        self.pen = torch.full((n,), -1, dtype=torch.long, device=device)
        self.last_ts = torch.full((n,), -1, dtype=torch.long, device=device)
        self.step = 0

    def apply(self, logits: torch.Tensor, step: int) -> torch.Tensor:
        idx = self.idx[None]
        disable = (idx == self.no_ts).expand_as(logits)
        if step == 0:
            disable = disable | (idx < self.tb) | (idx > self.max_initial)
            return logits.masked_fill(disable, _NEG_INF)
        ts = idx >= self.tb
        last_is_ts = self.last >= self.tb
        pen_is_ts = last_is_ts if step == 1 else self.pen >= self.tb
        both = (last_is_ts & pen_is_ts)[:, None]
        after_one = (last_is_ts & ~pen_is_ts)[:, None]
        text = (~last_is_ts)[:, None]
        disable = disable | (both & ts)
        disable = disable | (after_one & ((idx < self.eot) | (ts & (idx < self.last[:, None]))))
        disable = disable | (text & ts & (idx <= self.last_ts[:, None]))
        logits = logits.masked_fill(disable, _NEG_INF)
        check = (after_one | text)[:, 0]
        logprobs = logits.log_softmax(-1)
        ts_mass = logprobs[:, self.tb :].logsumexp(-1)
        best_text = logprobs[:, : self.tb].max(-1).values
        force = (check & (ts_mass > best_text))[:, None]
        return logits.masked_fill(force & (idx < self.tb), _NEG_INF)

    def update(self, tokens: torch.Tensor) -> None:
        self.pen = self.last
        self.last = tokens
        self.last_ts = torch.where(tokens >= self.tb, tokens, self.last_ts)

    def reorder(self, rows: torch.Tensor) -> None:
        self.last, self.pen, self.last_ts = self.last[rows], self.pen[rows], self.last_ts[rows]


def _weight_shapes(dims: WhisperDims) -> dict[str, tuple[int, ...]]:
    """CTranslate2's Whisper variable names and shapes for ``dims``."""
    d = dims.n_state
    shapes: dict[str, tuple[int, ...]] = {
        "encoder/conv1/weight": (d, dims.n_mels, 3),
        "encoder/conv1/bias": (d,),
        "encoder/conv2/weight": (d, d, 3),
        "encoder/conv2/bias": (d,),
        "encoder/position_encodings/encodings": (dims.n_audio_ctx, d),
        "encoder/layer_norm/gamma": (d,),
        "encoder/layer_norm/beta": (d,),
        "decoder/embeddings/weight": (dims.n_vocab, d),
        "decoder/position_encodings/encodings": (dims.n_text_ctx, d),
        "decoder/layer_norm/gamma": (d,),
        "decoder/layer_norm/beta": (d,),
    }

    def block(prefix: str, ffn: int, cross: bool) -> None:
        for norm in ("self_attention", "ffn", *(["attention"] if cross else [])):
            shapes[f"{prefix}/{norm}/layer_norm/gamma"] = (d,)
            shapes[f"{prefix}/{norm}/layer_norm/beta"] = (d,)
        linears = {
            "self_attention/linear_0": (3 * d, d),
            "self_attention/linear_1": (d, d),
            "ffn/linear_0": (ffn, d),
            "ffn/linear_1": (d, ffn),
        }
        if cross:
            linears.update(
                {
                    "attention/linear_0": (d, d),
                    "attention/linear_1": (2 * d, d),
                    "attention/linear_2": (d, d),
                }
            )
        for name, shape in linears.items():
            shapes[f"{prefix}/{name}/weight"] = shape
            shapes[f"{prefix}/{name}/bias"] = (shape[0],)

    for i in range(dims.n_encoder_layers):
        block(f"encoder/layer_{i}", dims.encoder_ffn, cross=False)
    for i in range(dims.n_decoder_layers):
        block(f"decoder/layer_{i}", dims.decoder_ffn, cross=True)
    return shapes


# --- the worker's view --------------------------------------------------------------------


def faster_whisper_model(engine: TorchWhisper, model_path: str, encoder_batch: int = 0) -> Any:
    """A faster-whisper ``WhisperModel`` whose model is ``engine``: the worker and the
    batched pipeline use it as they use the CTranslate2 one. ``encoder_batch`` > 0 encodes
    that many windows at a time (the CPU rule of ``workers.whisper.encoder_batch``)."""
    import tokenizers
    from faster_whisper import WhisperModel
    from faster_whisper.feature_extractor import FeatureExtractor
    from faster_whisper.utils import get_logger

    class TorchWhisperModel(WhisperModel):
        # faster-whisper's constructor builds a CTranslate2 model: set what it sets instead.
        def __init__(self) -> None:
            self.logger = get_logger()
            self.model = engine  # type: ignore[assignment]
            self.hf_tokenizer = tokenizers.Tokenizer.from_file(
                str(Path(model_path) / "tokenizer.json")
            )
            self.feat_kwargs = self._get_feature_kwargs(model_path, None)
            self.feat_kwargs.setdefault("feature_size", engine.n_mels)
            self.feature_extractor = FeatureExtractor(**self.feat_kwargs)
            self.input_stride = 2
            self.num_samples_per_token = self.feature_extractor.hop_length * self.input_stride
            self.frames_per_second = (
                self.feature_extractor.sampling_rate // self.feature_extractor.hop_length
            )
            self.tokens_per_second = (
                self.feature_extractor.sampling_rate // self.num_samples_per_token
            )
            self.time_precision = 0.02
            self.max_length = 448

        def encode(self, features: np.ndarray) -> Any:  # type: ignore[override]
            if features.ndim == 2:
                features = features[None]
            if encoder_batch <= 0 or len(features) <= encoder_batch:
                return engine.encode(features)
            parts = [
                engine.encode(features[i : i + encoder_batch])
                for i in range(0, len(features), encoder_batch)
            ]
            return torch.cat(parts)

    return TorchWhisperModel()
