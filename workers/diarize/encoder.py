"""The GE2E speaker encoder of ``resemblyzer`` in numpy: mel front end, 3-layer LSTM, linear.

The front end is resemblyzer's (``audio.wav_to_mel_spectrogram``, ``hparams.py``): 16 kHz,
a 400-sample (25 ms) periodic Hann window, 160-sample (10 ms) hop, centred frames with zero
padding, power spectrum, 40 Slaney mel bands (librosa's ``filters.mel`` default), no log.
The network is ``torch.nn.LSTM(40, 256, 3)`` run over the frames, the last layer's final
hidden state through ``Linear(256, 256)`` and ReLU, L2-normalised.

The LSTM runs over a batch of equal-length windows at once: each layer's input projection is
one matrix product over every frame of the batch, then one (windows, 256) x (256, 1024)
product per frame. With one BLAS thread (what a Ray task gets) the whole diarization took
4-10 ms per second of audio at a 0.75 s step on this project's 2-core machines
(``scripts/bench_diarize.py``); torch is never imported.
"""

from __future__ import annotations

import numpy as np

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
    return power @ MEL_FILTERS.T


def _sigmoid(x: np.ndarray) -> np.ndarray:
    # 1 / (1 + exp(-x)) without overflow warnings: tanh form.
    return 0.5 * (np.tanh(0.5 * x) + 1.0)


class SpeakerEncoder:
    """``embed(mels)``: (windows, frames, 40) mel frames → (windows, 256) unit embeddings."""

    def __init__(self, weights: dict[str, np.ndarray]):
        self.layers = []
        for layer in range(3):
            w_ih = np.ascontiguousarray(weights[f"lstm.weight_ih_l{layer}"].T)
            w_hh = np.ascontiguousarray(weights[f"lstm.weight_hh_l{layer}"].T)
            bias = weights[f"lstm.bias_ih_l{layer}"] + weights[f"lstm.bias_hh_l{layer}"]
            self.layers.append((w_ih, w_hh, bias.astype(np.float32)))
        self.linear_w = np.ascontiguousarray(weights["linear.weight"].T)
        self.linear_b = weights["linear.bias"]
        self.hidden = self.layers[0][1].shape[0]

    @classmethod
    def load(cls, cache_dir=None) -> SpeakerEncoder:
        """The prepared weights (``prepare.load_weights``; ``DiarizerModelMissing`` if none)."""
        from overnight.workers.diarize.prepare import load_weights

        return cls(load_weights(cache_dir))

    def embed(self, mels: np.ndarray, batch_size: int = 256) -> np.ndarray:
        mels = np.asarray(mels, dtype=np.float32)
        if mels.ndim != 3 or mels.shape[2] != N_MELS:
            raise ValueError(f"mels must be (windows, frames, {N_MELS}), not {mels.shape}")
        out = [self._embed(mels[i : i + batch_size]) for i in range(0, len(mels), batch_size)]
        return np.concatenate(out) if out else np.zeros((0, 256), np.float32)

    def _embed(self, x: np.ndarray) -> np.ndarray:
        batch, steps, _ = x.shape
        h_size = self.hidden
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
        raw = np.maximum(h @ self.linear_w + self.linear_b, 0.0)
        norm = np.linalg.norm(raw, axis=1, keepdims=True)
        return raw / np.maximum(norm, 1e-12)

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
