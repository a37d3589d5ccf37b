"""Who spoke when in a mono recording: speaker turns from speech regions.

1. Inside each speech region (in seconds; the job's come from ``regions.voice_regions``) the
   audio is cut into windows of ``window_s`` every ``step_s``; a region shorter than a window
   is one window of its own length (at least ``min_window_s``; shorter regions take the label
   of the nearest window).
2. Each window's GE2E embedding (``encoder.SpeakerEncoder``, onnxruntime).
3. The embeddings are clustered (``cluster.spectral`` by default) with an estimated number
   of speakers between ``min_speakers`` and ``max_speakers``, preferring ``hint_speakers``
   (2, a contact-center call) unless another count is clearly better; ``speakers=N`` fixes it.
   The estimate's clusters are split into at least ``overcluster`` (3), then merged back:
   clusters with under 20% of the windows into the nearest, and clusters whose centroids are
   similar (0.8; 0.83 on telephone band, where voices embed closer) into one; a merge below
   the hint needs 0.8 on wideband and 0.88 on telephone band.
4. Every 10 ms frame of speech takes the speaker whose windows covering it are most similar,
   each window weighed most at its centre (``centre_weights``); runs of one speaker are the
   turns. Speakers are named ``SPEAKER_00``, ``SPEAKER_01``, ... in order of first speech.

One speaker per instant: overlapping speech goes to one of the two. Parameters come from
``scripts/bench_diarize.py`` on seeds 1 and 2 (2-speaker telephone-band and wideband calls
of real voices, with 1- and 3-speaker calls and noisy telephone copies as checks); the
figures in docs/how-to/diarization.md are from seeds 3-5, which nothing was tuned on.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from overnight.workers.blas import one_blas_thread
from overnight.workers.diarize import cluster
from overnight.workers.diarize.encoder import (
    FRAMES_PER_SECOND,
    HOP,
    MEL_FILTERS,
    N_FFT,
    NORM_TARGET_DBFS,
    SAMPLE_RATE,
    SpeakerEncoder,
    mel_frames,
)


@dataclass(frozen=True)
class DiarizeOptions:
    """How speakers are found. Every field belongs in the row's ``options``."""

    # 1.2 s windows every 0.4 s: on seeds 1-2 (telephone band, 2 speakers) DER 4.3% and the
    # count right on 24 of 24 calls, against 6.7% and 23 with 1.5 s every 0.75 s (3-speaker
    # calls: the same DER, 33% right count either way).
    window_s: float = 1.2
    step_s: float = 0.4
    min_window_s: float = 0.4
    # Exactly this many speakers (``--speakers N``); None: estimated.
    speakers: int | None = None
    min_speakers: int = 1
    max_speakers: int = 8
    # The count preferred unless another is clearly better (a contact-center call: 2).
    hint_speakers: int | None = 2
    # Another count wins over the hint only with an eigengap this many times the hint's.
    hint_margin: float = 3.0
    # How the count is estimated: the eigengap, or the k-means silhouette on the spectral
    # embedding (the hint stays unless another count's is ``silhouette_margin`` higher).
    estimate: Literal["eigengap", "silhouette"] = "silhouette"
    silhouette_margin: float = 0.1
    method: Literal["spectral", "agglomerative"] = "spectral"
    # agglomerative: stop merging at this cosine distance.
    threshold: float = 0.35
    # The estimate's clusters are split into at least this many first (a 2-way spectral cut
    # often isolates a few straddling or overlapped windows instead of a voice), then merged.
    overcluster: int = 3
    # Clusters whose centroids are more similar than this are one speaker (finds 1-speaker
    # calls, which an eigengap cannot); telephone band (``narrowband``) puts voices closer.
    merge_similarity: float = 0.8
    narrowband_merge_similarity: float = 0.83
    # A merge that leaves fewer speakers than the hint needs centroids this similar. Telephone
    # band puts voices closer: on seeds 1-2 two real voices' centroids reached 0.77 on
    # wideband and 0.87 on telephone band, one voice split in two 0.84 and 0.87 at the least.
    hint_merge_similarity: float = 0.8
    narrowband_hint_merge_similarity: float = 0.88
    # An estimated speaker needs at least this share of the windows (see cluster.absorb_small).
    min_speaker_share: float = 0.2
    # A call with fewer windows than this is one speaker's (nothing to cluster).
    min_windows: int = 3
    # Windows beyond this are labelled by their nearest cluster centroid instead of being
    # clustered (bounds the eigen decompositions of multi-hour recordings).
    max_cluster_windows: int = 1500
    seed: int = 0

    def __post_init__(self) -> None:
        if self.speakers is not None and self.speakers < 1:
            raise ValueError(f"speakers={self.speakers}: give 1 or more, or None to estimate")
        if not 1 <= self.min_speakers <= self.max_speakers:
            raise ValueError(
                f"min_speakers={self.min_speakers}, max_speakers={self.max_speakers}: "
                "need 1 <= min_speakers <= max_speakers"
            )
        if not 0 < self.step_s <= self.window_s:
            raise ValueError(f"step_s={self.step_s} must be in (0, window_s={self.window_s}]")


@dataclass(frozen=True)
class Turn:
    speaker: str
    start: float
    end: float


@dataclass
class Diarization:
    turns: list[Turn] = field(default_factory=list)
    num_speakers: int = 0
    windows: int = 0
    speech_s: float = 0.0
    diarize_s: float = 0.0

    def records(self) -> list[dict]:
        """The turns as rows of ``speaker``, ``start``, ``end`` (seconds)."""
        return [{"speaker": t.speaker, "start": t.start, "end": t.end} for t in self.turns]


def speaker_label(index: int) -> str:
    return f"SPEAKER_{index:02d}"


class Diarizer:
    """Load the encoder once (per actor or task); call on (audio, regions) of one recording."""

    def __init__(
        self, options: DiarizeOptions | None = None, encoder: SpeakerEncoder | None = None
    ):
        self.options = options or DiarizeOptions()
        self.encoder = encoder or SpeakerEncoder.load()

    def __call__(
        self, audio: np.ndarray, regions: list[tuple[float, float]] | None = None
    ) -> Diarization:
        """``audio``: 16 kHz mono float32; ``regions``: speech (start, end) seconds (the
        whole recording when None)."""
        started = time.perf_counter()
        audio = np.asarray(audio, dtype=np.float32)
        total = len(audio) / SAMPLE_RATE
        if regions is None:
            regions = [(0.0, total)]
        regions = [(max(0.0, a), min(total, b)) for a, b in regions if min(total, b) > a]
        mels = region_mels(audio, regions)
        result = self.from_mels(mels, regions)
        result.diarize_s = time.perf_counter() - started
        return result

    def from_mels(self, mels: list[np.ndarray], regions: list[tuple[float, float]]) -> Diarization:
        """The same from each region's mel frames (``region_mels``), for a stage that gets
        mel frames from the decode stage instead of samples."""
        opts = self.options
        win = max(1, round(opts.window_s * FRAMES_PER_SECOND))
        step = max(1, round(opts.step_s * FRAMES_PER_SECOND))
        min_win = max(1, round(opts.min_window_s * FRAMES_PER_SECOND))
        spans: list[tuple[int, int, int]] = []  # (region, first frame, frames)
        for r, mel in enumerate(mels):
            n = len(mel)
            if n < min_win:
                continue
            if n <= win:
                # Lengths in steps of 0.1 s: windows of one length share an LSTM batch, and
                # fine VAD regions would otherwise make a batch of one of each.
                spans.append((r, 0, max(min_win, n - n % 10)))
                continue
            starts = list(range(0, n - win + 1, step))
            if starts[-1] + win < n:
                starts.append(n - win)
            spans.extend((r, s, win) for s in starts)
        speech_s = sum(b - a for a, b in regions)
        if not spans:
            # Too little speech to embed: one speaker, if anyone spoke at all.
            turns = [Turn(speaker_label(0), a, b) for a, b in regions]
            return Diarization(turns, 1 if turns else 0, 0, speech_s)
        emb = self._embed(mels, spans)
        # The affinity products and eigen decompositions with one BLAS thread, as in a Ray
        # decode task, so that an in-process run finds the same speakers (workers.blas).
        with one_blas_thread():
            labels = self._cluster(emb, narrowband(mels))
            turns = _turns(mels, regions, spans, emb, labels)
        return Diarization(turns, len({t.speaker for t in turns}), len(spans), speech_s)

    def _embed(self, mels: list[np.ndarray], spans: list[tuple[int, int, int]]) -> np.ndarray:
        emb = np.zeros((len(spans), 256), np.float32)
        by_length: dict[int, list[int]] = {}
        for i, (_, _, n) in enumerate(spans):
            by_length.setdefault(n, []).append(i)
        for n, idx in by_length.items():
            batch = np.stack([mels[spans[i][0]][spans[i][1] : spans[i][1] + n] for i in idx])
            emb[idx] = self.encoder.embed(batch)
        return emb

    def _cluster(self, emb: np.ndarray, narrow: bool = False) -> np.ndarray:
        opts = self.options
        n = len(emb)
        if opts.speakers == 1 or n < opts.min_windows:
            return np.zeros(n, int)
        sample = np.arange(n)
        if n > opts.max_cluster_windows:
            sample = np.linspace(0, n - 1, opts.max_cluster_windows).round().astype(int)
        x = emb[sample]
        hint = opts.hint_speakers
        if hint is not None and not opts.min_speakers <= hint <= opts.max_speakers:
            hint = None
        eigs: cluster.Eigs = {}  # the graphs of ``x``, decomposed once for both passes
        if opts.method == "spectral":
            labels = cluster.spectral(x, opts, hint, eigs=eigs)
        else:
            labels = cluster.agglomerative(
                x, threshold=opts.threshold, k=opts.speakers, min_k=opts.min_speakers
            )
        if opts.speakers is None:
            labels = self._merged(x, labels, hint, narrow, eigs)
        if len(sample) == n:
            return labels
        cent = np.stack([x[labels == i].mean(0) for i in np.unique(labels)])
        return np.argmax(emb @ cent.T, axis=1)

    def _merged(
        self,
        x: np.ndarray,
        labels: np.ndarray,
        hint: int | None,
        narrow: bool,
        eigs: cluster.Eigs | None = None,
    ) -> np.ndarray:
        """The estimate's clusters, split into at least ``overcluster`` first, then merged:
        small clusters into the nearest, similar ones together (less readily below the hint)."""
        opts = self.options
        k = len(np.unique(labels))
        more = min(opts.overcluster, opts.max_speakers)
        if opts.method == "spectral" and k < more <= len(x) // 3:
            labels = cluster.spectral(x, opts, hint, k=more, eigs=eigs)
        labels = cluster.absorb_small(x, labels, opts.min_speaker_share, opts.min_speakers)
        merge, below_hint = opts.merge_similarity, opts.hint_merge_similarity
        if narrow:
            merge = opts.narrowband_merge_similarity
            below_hint = opts.narrowband_hint_merge_similarity
        return cluster.merge_similar(x, labels, merge, opts.min_speakers, hint, below_hint)


# Mel bands centred above 4 kHz, which 8 kHz telephone audio (decoded to 16 kHz) leaves
# empty: their share of the speech's mel power was 1e-6 on telephone-band calls (with line
# noise too) and 1.7e-4 to 6.5e-2 on wideband ones.
_FREQS = np.fft.rfftfreq(N_FFT, 1 / SAMPLE_RATE)
_HIGH_BANDS = (MEL_FILTERS @ _FREQS) / MEL_FILTERS.sum(1) > 4000
NARROWBAND_SHARE = 2e-5


def narrowband(mels: list[np.ndarray]) -> bool:
    """Whether the speech is telephone band (nothing above 4 kHz)."""
    total = sum(float(m.sum()) for m in mels)
    high = sum(float(m[:, _HIGH_BANDS].sum()) for m in mels)
    return total > 0 and high < NARROWBAND_SHARE * total


def region_mels(audio: np.ndarray, regions: list[tuple[float, float]]) -> list[np.ndarray]:
    """Each speech region's mel frames, the recording's speech raised to -30 dBFS first
    (resemblyzer's preprocessing; quieter calls would otherwise embed differently)."""
    cuts = [(int(a * SAMPLE_RATE), int(b * SAMPLE_RATE)) for a, b in regions]
    speech = [audio[a:b] for a, b in cuts]
    if not speech:
        return []
    probe = np.concatenate(speech)
    probe = probe[:: max(1, len(probe) // 400_000)].astype(np.float64)
    rms = float(np.sqrt(np.mean(probe**2))) if probe.size else 0.0
    change = NORM_TARGET_DBFS - 20 * np.log10(rms) if rms > 0 else 0.0
    gain = np.float32(10 ** (change / 20) if change > 0 else 1.0)
    return [mel_frames(s * gain)[: max(0, len(s) // HOP)] for s in speech]


def centre_weights(frames: int) -> np.ndarray:
    """How much a window's embedding says about each of its frames: a Hann window, most at
    its centre, a little at its edges (pyannote.audio's sliding-window ``Inference`` sums
    overlapping chunks' frame outputs the same way, under a Hamming window). A window that
    straddles a speaker change then speaks less for the frames past the change, where the
    windows centred there know better: with equal weights a change came out up to a step
    early or late. On seeds 1-2 (24 telephone calls): words on the right speaker 95.4% ->
    96.1%, DER 4.4% -> 4.2% (Hamming 96.0%, sharper windows no better)."""
    x = (np.arange(frames) + 0.5) / frames
    # The small floor keeps an edge frame that only one window covers from scoring zero.
    return np.sin(np.pi * x) ** 2 + 1e-3


def _turns(
    mels: list[np.ndarray],
    regions: list[tuple[float, float]],
    spans: list[tuple[int, int, int]],
    emb: np.ndarray,
    labels: np.ndarray,
) -> list[Turn]:
    ids = np.unique(labels)
    cent = np.stack([emb[labels == i].mean(0) for i in ids])
    cent /= np.linalg.norm(cent, axis=1, keepdims=True)
    sims = emb @ cent.T  # (windows, speakers)
    per_region: dict[int, list[int]] = {}
    for i, (r, _, _) in enumerate(spans):
        per_region.setdefault(r, []).append(i)
    centres = np.array([(regions[r][0] + (s + n / 2) / FRAMES_PER_SECOND) for r, s, n in spans])
    frame_labels: list[tuple[float, np.ndarray]] = []
    for r, mel in enumerate(mels):
        n = len(mel)
        if n == 0:
            continue
        mine = per_region.get(r)
        score = np.zeros((n, len(ids)))
        if mine:
            covered = np.zeros(n, bool)
            for i in mine:
                _, s, w = spans[i]
                score[s : s + w] += centre_weights(w)[:, None] * sims[i]
                covered[s : s + w] = True
            if not covered.all():  # the tail of a short region: its nearest covered frame
                idx = np.flatnonzero(covered)
                nearest = idx[np.clip(np.searchsorted(idx, np.arange(n)), 0, len(idx) - 1)]
                score[~covered] = score[nearest[~covered]]
        else:  # a region too short to embed: its nearest window in time
            middle = (regions[r][0] + regions[r][1]) / 2
            score[:] = sims[int(np.argmin(np.abs(centres - middle)))]
        frame_labels.append((regions[r][0], ids[score.argmax(1)]))
    # Name speakers by first appearance.
    order: dict[int, str] = {}
    for _, lab in frame_labels:
        for value in lab:
            if int(value) not in order:
                order[int(value)] = speaker_label(len(order))
    turns: list[Turn] = []
    for start, lab in frame_labels:
        change = np.flatnonzero(np.diff(lab)) + 1
        bounds = [0, *change.tolist(), len(lab)]
        for a, b in itertools.pairwise(bounds):
            turns.append(
                Turn(
                    order[int(lab[a])],
                    round(start + a / FRAMES_PER_SECOND, 3),
                    round(start + b / FRAMES_PER_SECOND, 3),
                )
            )
    return turns
