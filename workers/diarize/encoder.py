"""The GE2E speaker encoder of ``resemblyzer`` without torch: mel front end, 3-layer LSTM, linear.

The front end is resemblyzer's (``audio.wav_to_mel_spectrogram``, ``hparams.py``): 16 kHz,
a 400-sample (25 ms) periodic Hann window, 160-sample (10 ms) hop, centred frames with zero
padding, power spectrum, 40 Slaney mel bands (librosa's ``filters.mel`` default), no log.
The network is ``torch.nn.LSTM(40, 256, 3)`` run over the frames, the last layer's final
hidden state through ``Linear(256, 256)`` and ReLU, L2-normalised.

The LSTM runs over a batch of equal-length windows at once, in one of two engines:

- ``onnxruntime`` (the default; it comes with faster-whisper): the three layers as ONNX
  ``LSTM`` operators, a graph built from the prepared weights with the ``onnx`` package.
  Preparation writes it to the model cache beside the weights (``prepare.lstm_path``), because
  importing ``onnx`` takes 0.6-0.7 s (its ``ml_dtypes`` dependency), and every decode task
  process of a diarizing job would pay it before its first call; a graph that is missing,
  unreadable or of another ``LSTM_GRAPH_VERSION`` is built in memory instead. Its recurrence
  runs in C++ with the weights packed once. On the same calls the whole diarization took
  25-32% less time than with numpy (``scripts/bench_diarize.py --engines onnxruntime,numpy``,
  seeds 3-5, one thread), with the same turns; the embeddings agree within 1e-6.
- ``numpy``: the reference, written out step by step (each layer's input projection one matrix
  product over every frame of the batch, then one (windows, 256) x (256, 1024) product per
  frame). The tests check both against resemblyzer's own ``VoiceEncoder``.

Either runs on ``threads`` cores (default ``OMP_NUM_THREADS``, which Ray sets to a task's CPUs,
else 1), so a diarizing decode task does not take the Whisper actor's cores. Torch is never
imported.
"""

from __future__ import annotations

import os
from typing import Literal

import numpy as np

from overnight.workers.blas import one_blas_thread

SAMPLE_RATE = 16_000
N_FFT = 400
HOP = 160
N_MELS = 40
FRAMES_PER_SECOND = SAMPLE_RATE // HOP
PARTIAL_FRAMES = 160  # resemblyzer's 1.6 s partial utterance
NORM_TARGET_DBFS = -30.0
_INT16_MAX = 2**15 - 1


def _hz_to_mel(hz: np.ndarray | float) -> np.ndarray:
    """Slaney's mel scale (librosa ``hz_to_mel(htk=False)``): linear below 1 kHz, log above."""
    hz = np.asarray(hz, dtype=np.float64)
    f_sp = 200.0 / 3
    mels = hz / f_sp
    min_log_hz, min_log_mel, logstep = 1000.0, 1000.0 / f_sp, np.log(6.4) / 27.0
    log_t = hz >= min_log_hz
    mels = np.where(log_t, min_log_mel + np.log(np.maximum(hz, 1e-10) / min_log_hz) / logstep, mels)
    return mels


def _mel_to_hz(mels: np.ndarray) -> np.ndarray:
    mels = np.asarray(mels, dtype=np.float64)
    f_sp = 200.0 / 3
    freqs = f_sp * mels
    min_log_hz, min_log_mel, logstep = 1000.0, 1000.0 / f_sp, np.log(6.4) / 27.0
    log_t = mels >= min_log_mel
    return np.where(log_t, min_log_hz * np.exp(logstep * (mels - min_log_mel)), freqs)


def mel_filterbank(
    sr: int = SAMPLE_RATE, n_fft: int = N_FFT, n_mels: int = N_MELS, fmin: float = 0.0
) -> np.ndarray:
    """librosa.filters.mel(sr=sr, n_fft=n_fft, n_mels=n_mels) (Slaney scale and area
    normalisation), shape (n_mels, 1 + n_fft // 2), float32."""
    fmax = sr / 2.0
    fftfreqs = np.linspace(0, sr / 2.0, 1 + n_fft // 2)
    mel_f = _mel_to_hz(np.linspace(_hz_to_mel(fmin), _hz_to_mel(fmax), n_mels + 2))
    fdiff = np.diff(mel_f)
    ramps = mel_f[:, None] - fftfreqs[None, :]
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    weights = np.maximum(0.0, np.minimum(lower, upper))
    weights *= (2.0 / (mel_f[2 : n_mels + 2] - mel_f[:n_mels]))[:, None]
    return weights.astype(np.float32)


MEL_FILTERS = mel_filterbank()
# Periodic Hann (scipy.signal.get_window("hann", N_FFT), librosa's default window).
_WINDOW = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(N_FFT) / N_FFT)).astype(np.float32)


def normalize_volume(wav: np.ndarray, target_dbfs: float = NORM_TARGET_DBFS) -> np.ndarray:
    """resemblyzer's ``normalize_volume(increase_only=True)``: raise quiet audio to -30 dBFS."""
    if wav.size == 0:
        return wav
    rms = float(np.sqrt(np.mean((wav.astype(np.float64) * _INT16_MAX) ** 2)))
    if rms <= 0:
        return wav
    change = target_dbfs - 20 * np.log10(rms / _INT16_MAX)
    return wav if change < 0 else (wav * 10 ** (change / 20)).astype(np.float32)


def mel_frames(wav: np.ndarray) -> np.ndarray:
    """Mel power frames (frames, 40) float32 of 16 kHz audio: 1 + len(wav) // 160 frames,
    frame i centred on sample 160 * i (as librosa's ``center=True``, zero padded)."""
    wav = np.asarray(wav, dtype=np.float32)
    padded = np.pad(wav, (N_FFT // 2, N_FFT // 2))
    n_frames = 1 + len(wav) // HOP
    frames = np.lib.stride_tricks.as_strided(
        padded, shape=(n_frames, N_FFT), strides=(HOP * padded.strides[0], padded.strides[0])
    )
    spectrum = np.fft.rfft(frames * _WINDOW, axis=1)
    power = (spectrum.real**2 + spectrum.imag**2).astype(np.float32)
    # One BLAS thread, as in a Ray decode task, wherever this runs (see workers.blas).
    with one_blas_thread():
        return power @ MEL_FILTERS.T


def _sigmoid(x: np.ndarray) -> np.ndarray:
    # 1 / (1 + exp(-x)) without overflow warnings: tanh form.
    return 0.5 * (np.tanh(0.5 * x) + 1.0)


Engine = Literal["onnxruntime", "numpy"]
ENGINES: tuple[Engine, ...] = ("onnxruntime", "numpy")


def _default_threads() -> int:
    try:
        return max(1, int(os.environ.get("OMP_NUM_THREADS", "1")))
    except ValueError:
        return 1


# Raised whenever lstm_graph builds something else: a prepared graph of another version is
# not used (it is built in memory instead) until preparation writes it again.
LSTM_GRAPH_VERSION = 1
_GRAPH_VERSION_KEY = "overnight_lstm_graph_version"


def lstm_graph(weights: dict[str, np.ndarray]) -> bytes:
    """The encoder's three LSTM layers as a serialized ONNX model: input ``mels`` (frames,
    windows, 40), output ``hidden`` (1, windows, 256), the last layer's final hidden state.

    torch orders an LSTM's gates input, forget, cell, output; ONNX input, output, forget,
    cell; its bias is the input and the recurrent bias side by side, as torch keeps them."""
    from onnx import TensorProto, helper, numpy_helper

    def onnx_gates(m: np.ndarray) -> np.ndarray:
        i, f, g, o = np.split(np.asarray(m, np.float32), 4, axis=0)
        return np.concatenate([i, o, f, g], axis=0)

    hidden = weights["lstm.weight_hh_l0"].shape[1]
    nodes, initializers, previous = [], [], "mels"
    for layer in range(3):
        w = onnx_gates(weights[f"lstm.weight_ih_l{layer}"])[None]
        r = onnx_gates(weights[f"lstm.weight_hh_l{layer}"])[None]
        b = np.concatenate(
            [
                onnx_gates(weights[f"lstm.bias_ih_l{layer}"]),
                onnx_gates(weights[f"lstm.bias_hh_l{layer}"]),
            ]
        )[None]
        for name, value in ((f"W{layer}", w), (f"R{layer}", r), (f"B{layer}", b)):
            initializers.append(numpy_helper.from_array(value, name))
        last = layer == 2
        nodes.append(
            helper.make_node(
                "LSTM",
                [previous, f"W{layer}", f"R{layer}", f"B{layer}"],
                ["", "hidden"] if last else [f"Y{layer}"],
                hidden_size=hidden,
            )
        )
        if not last:  # Y is (frames, directions=1, windows, hidden): drop the direction axis
            initializers.append(numpy_helper.from_array(np.array([1], np.int64), f"axis{layer}"))
            nodes.append(helper.make_node("Squeeze", [f"Y{layer}", f"axis{layer}"], [f"S{layer}"]))
            previous = f"S{layer}"
    graph = helper.make_graph(
        nodes,
        "ge2e_lstm",
        [helper.make_tensor_value_info("mels", TensorProto.FLOAT, ["frames", "windows", N_MELS])],
        [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, [1, "windows", hidden])],
        initializers,
    )
    # Opset 17 and IR 8: what every onnxruntime of faster-whisper's range (>=1.14) runs.
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    helper.set_model_props(model, {_GRAPH_VERSION_KEY: str(LSTM_GRAPH_VERSION)})
    return model.SerializeToString()


def graph_version(path: str | os.PathLike[str]) -> int | None:
    """The ``LSTM_GRAPH_VERSION`` a prepared graph file was built with; None if it has none
    or cannot be read as a model."""
    import onnxruntime

    return _version_of(_session_or_none(onnxruntime, path, onnxruntime.SessionOptions()))


def _session_or_none(onnxruntime, path, so):
    if path is None or not os.path.isfile(path):
        return None
    try:
        return onnxruntime.InferenceSession(os.fspath(path), so, providers=["CPUExecutionProvider"])
    except Exception:  # any unreadable file (onnxruntime raises its own types): built instead
        return None


def _version_of(session) -> int | None:
    if session is None:
        return None
    value = session.get_modelmeta().custom_metadata_map.get(_GRAPH_VERSION_KEY, "")
    return int(value) if value.isdigit() else None


def _prepared_session(onnxruntime, path, so):
    session = _session_or_none(onnxruntime, path, so)
    return session if _version_of(session) == LSTM_GRAPH_VERSION else None


class SpeakerEncoder:
    """``embed(mels)``: (windows, frames, 40) mel frames → (windows, 256) unit embeddings."""

    def __init__(
        self,
        weights: dict[str, np.ndarray],
        engine: Engine = "onnxruntime",
        threads: int | None = None,
        graph: str | os.PathLike[str] | None = None,
    ):
        """``graph``: the prepared ONNX file of ``weights``' LSTM (``prepare.lstm_path``),
        used by the onnxruntime engine when it is readable and of this ``LSTM_GRAPH_VERSION``;
        otherwise the graph is built from ``weights``."""
        if engine not in ENGINES:
            raise ValueError(f"engine={engine!r}: use one of {', '.join(ENGINES)}")
        self.engine = engine
        self.linear_w = np.ascontiguousarray(weights["linear.weight"].T)
        self.linear_b = weights["linear.bias"]
        self.hidden = weights["lstm.weight_hh_l0"].shape[1]
        # The numpy engine's layers (onnxruntime holds its own copy of the weights).
        self.layers: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._session = None
        if engine == "numpy":
            for layer in range(3):
                w_ih = np.ascontiguousarray(weights[f"lstm.weight_ih_l{layer}"].T)
                w_hh = np.ascontiguousarray(weights[f"lstm.weight_hh_l{layer}"].T)
                bias = weights[f"lstm.bias_ih_l{layer}"] + weights[f"lstm.bias_hh_l{layer}"]
                self.layers.append((w_ih, w_hh, bias.astype(np.float32)))
        else:
            import onnxruntime

            so = onnxruntime.SessionOptions()
            so.intra_op_num_threads = threads or _default_threads()
            so.inter_op_num_threads = 1
            # Spinning threads would take CPU from the Whisper actor between calls.
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")
            self._session = _prepared_session(onnxruntime, graph, so)
            if self._session is None:
                self._session = onnxruntime.InferenceSession(
                    lstm_graph(weights), so, providers=["CPUExecutionProvider"]
                )

    @classmethod
    def load(cls, cache_dir=None, engine: Engine = "onnxruntime") -> SpeakerEncoder:
        """The prepared weights (``prepare.load_weights``; ``DiarizerModelMissing`` if none),
        and the prepared LSTM graph beside them where there is one."""
        from overnight.workers.diarize.prepare import load_weights, lstm_path

        return cls(load_weights(cache_dir), engine=engine, graph=lstm_path(cache_dir))

    def embed(self, mels: np.ndarray, batch_size: int = 256) -> np.ndarray:
        mels = np.asarray(mels, dtype=np.float32)
        if mels.ndim != 3 or mels.shape[2] != N_MELS:
            raise ValueError(f"mels must be (windows, frames, {N_MELS}), not {mels.shape}")
        out = [self._embed(mels[i : i + batch_size]) for i in range(0, len(mels), batch_size)]
        return np.concatenate(out) if out else np.zeros((0, 256), np.float32)

    def _embed(self, x: np.ndarray) -> np.ndarray:
        if self._session is not None:
            frames_first = np.ascontiguousarray(x.transpose(1, 0, 2))
            h = self._session.run(["hidden"], {"mels": frames_first})[0][0]
        else:
            h = self._lstm_numpy(x)
        raw = np.maximum(h @ self.linear_w + self.linear_b, 0.0)
        norm = np.linalg.norm(raw, axis=1, keepdims=True)
        return raw / np.maximum(norm, 1e-12)

    def _lstm_numpy(self, x: np.ndarray) -> np.ndarray:
        """The last layer's final hidden state (windows, 256), step by step."""
        batch, steps, _ = x.shape
        h_size = self.hidden
        h = np.zeros((batch, h_size), np.float32)
        for w_ih, w_hh, bias in self.layers:
            gates_x = (x.reshape(batch * steps, -1) @ w_ih).reshape(batch, steps, 4 * h_size)
            gates_x += bias
            h = np.zeros((batch, h_size), np.float32)
            c = np.zeros((batch, h_size), np.float32)
            seq = np.empty((batch, steps, h_size), np.float32)
            for t in range(steps):
                g = gates_x[:, t] + h @ w_hh
                i = _sigmoid(g[:, :h_size])
                f = _sigmoid(g[:, h_size : 2 * h_size])
                cell = np.tanh(g[:, 2 * h_size : 3 * h_size])
                o = _sigmoid(g[:, 3 * h_size :])
                c = f * c + i * cell
                h = o * np.tanh(c)
                seq[:, t] = h
            x = seq
        return h

    def embed_utterance(
        self, wav: np.ndarray, rate: float = 1.3, min_coverage: float = 0.75
    ) -> np.ndarray:
        """resemblyzer's ``VoiceEncoder.embed_utterance`` on an already preprocessed wav:
        1.6 s partials ``rate`` per second, their mean embedding, L2-normalised."""
        n_frames = int(np.ceil((len(wav) + 1) / HOP))
        step = int(np.round((SAMPLE_RATE / rate) / HOP))
        starts = list(range(0, max(1, n_frames - PARTIAL_FRAMES + step + 1), step))
        coverage = (len(wav) - starts[-1] * HOP) / (PARTIAL_FRAMES * HOP)
        if coverage < min_coverage and len(starts) > 1:
            starts = starts[:-1]
        needed = (starts[-1] + PARTIAL_FRAMES) * HOP
        if needed >= len(wav):
            wav = np.pad(wav, (0, needed - len(wav)))
        mel = mel_frames(wav)
        partials = self.embed(np.stack([mel[s : s + PARTIAL_FRAMES] for s in starts]))
        mean = partials.mean(axis=0)
        return mean / np.linalg.norm(mean)
