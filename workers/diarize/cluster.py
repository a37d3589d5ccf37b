"""Clustering window embeddings into speakers, in numpy.

Two methods, both over cosine similarities of unit GE2E embeddings:

- ``spectral``: NME-SC (Park et al., "Auto-tuning spectral clustering for speaker
  diarization using normalized maximum eigengap", IEEE SPL 2019). Each row of the affinity
  keeps its ``p`` nearest neighbours (binarised), symmetrised; the unnormalised Laplacian's
  largest eigengap among the smallest eigenvalues gives the speaker count, and ``p`` itself is
  chosen where ``p / gap`` is smallest, so there is no threshold to tune per corpus. k-means on
  the ``k`` first eigenvectors gives the labels.
- ``agglomerative``: average linkage on cosine distance, stopped at ``threshold``
  (or at ``k`` clusters).

Why numpy and not scikit-learn: the default install has neither scipy nor scikit-learn
(about 80 MB together with their wheels' libraries) and these take about 60 lines. A
contact-center call of 10 minutes has about 800 windows: one 800 x 800 symmetric eigen
decomposition per ``p`` is tens of milliseconds. ``scripts/bench_diarize.py`` compares the
two methods; ``spectral`` is the default (see that script's figures in ``diarize.py``).

A spectral eigengap cannot say "one speaker" (there is no gap before the first eigenvalue),
so after clustering, clusters whose centroids are closer than ``merge_similarity`` are merged
(down to ``min_speakers``).
"""

from __future__ import annotations

import numpy as np


def kmeans(x: np.ndarray, k: int, *, seed: int = 0, n_init: int = 4, iters: int = 50) -> np.ndarray:
    """Labels of k-means (k-means++ starts, best of ``n_init``); deterministic for a seed."""
    n = len(x)
    if k >= n:
        return np.arange(n) % max(k, 1)
    rng = np.random.default_rng(seed)
    best, best_cost = np.zeros(n, int), np.inf
    for _ in range(n_init):
        centers = [x[rng.integers(n)]]
        for _ in range(1, k):
            d = np.min(((x[:, None, :] - np.array(centers)[None]) ** 2).sum(-1), axis=1)
            total = d.sum()
            idx = rng.choice(n, p=d / total) if total > 0 else rng.integers(n)
            centers.append(x[idx])
        c = np.array(centers)
        labels = np.zeros(n, int)
        for _ in range(iters):
            dist = ((x[:, None, :] - c[None]) ** 2).sum(-1)
            new = dist.argmin(1)
            if np.array_equal(new, labels) and _ > 0:
                break
            labels = new
            for j in range(k):
                if np.any(labels == j):
                    c[j] = x[labels == j].mean(0)
        cost = float(((x - c[labels]) ** 2).sum())
        if cost < best_cost:
            best, best_cost = labels.copy(), cost
    return best


def _laplacian_eigs(affinity: np.ndarray, p: int) -> tuple[np.ndarray, np.ndarray]:
    n = len(affinity)
    a = affinity.copy()
    np.fill_diagonal(a, 0.0)
    keep = np.argsort(-a, axis=1)[:, :p]
    b = np.zeros_like(a)
    np.put_along_axis(b, keep, 1.0, axis=1)
    b = 0.5 * (b + b.T)
    lap = np.diag(b.sum(1)) - b
    vals, vecs = np.linalg.eigh(lap)
    return vals[: min(n, 64)], vecs


def estimate_k(
    vals: np.ndarray, min_k: int, max_k: int, hint: int | None, hint_margin: float
) -> tuple[int, float]:
    """The count with the largest eigengap in [min_k, max_k] (the hint wins unless another
    count's gap is ``hint_margin`` times larger); returns (k, normalised gap)."""
    gaps = np.diff(vals)
    lo, hi = max(min_k, 1), min(max_k, len(gaps))
    if hi < lo:
        return max(lo, 1), 0.0
    window = gaps[lo - 1 : hi]  # gaps[k - 1] separates the k smallest eigenvalues
    k = int(np.argmax(window)) + lo
    if hint is not None and lo <= hint <= hi and gaps[k - 1] < hint_margin * gaps[hint - 1]:
        k = hint
    return k, float(gaps[k - 1] / (vals[-1] + 1e-10))


def spectral(
    emb: np.ndarray,
    *,
    k: int | None = None,
    min_k: int = 1,
    max_k: int = 8,
    hint: int | None = 2,
    hint_margin: float = 1.5,
    seed: int = 0,
) -> np.ndarray:
    """NME-SC labels of unit embeddings (rows); ``k`` given: exactly that many clusters."""
    n = len(emb)
    if n <= 2:
        return np.zeros(n, int) if (k or 1) == 1 or n < 2 else np.arange(n)
    affinity = np.clip(emb @ emb.T, -1.0, 1.0)
    best: tuple[float, int, np.ndarray] | None = None
    max_k = min(max_k, n - 1)
    for frac in (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5):
        p = max(2, round(frac * n))
        if p >= n:
            break
        vals, vecs = _laplacian_eigs(affinity, p)
        if k is None:
            kk, gap = estimate_k(vals, max(min_k, 2), max_k, hint, hint_margin)
        else:
            kk, gap = k, float(np.diff(vals)[max(k - 1, 0)] / (vals[-1] + 1e-10))
        ratio = p / max(gap, 1e-10)
        if best is None or ratio < best[0]:
            best = (ratio, kk, vecs[:, :kk])
    assert best is not None
    _, kk, vectors = best
    return kmeans(vectors, kk, seed=seed)


def agglomerative(
    emb: np.ndarray, *, threshold: float = 0.4, k: int | None = None, min_k: int = 1
) -> np.ndarray:
    """Average-linkage clusters on cosine distance: merge while the closest pair of clusters
    is nearer than ``threshold`` (or until ``k`` clusters remain)."""
    n = len(emb)
    if n == 0:
        return np.zeros(0, int)
    dist = 1.0 - np.clip(emb @ emb.T, -1.0, 1.0)
    np.fill_diagonal(dist, np.inf)
    sizes = np.ones(n)
    members = {i: [i] for i in range(n)}
    active = np.ones(n, bool)
    while active.sum() > max(k or 1, min_k, 1):
        i, j = np.unravel_index(np.argmin(dist), dist.shape)
        if k is None and dist[i, j] > threshold:
            break
        # Lance-Williams for average linkage, j into i.
        merged = (sizes[i] * dist[i] + sizes[j] * dist[j]) / (sizes[i] + sizes[j])
        dist[i], dist[:, i] = merged, merged
        dist[i, i] = np.inf
        dist[j], dist[:, j] = np.inf, np.inf
        sizes[i] += sizes[j]
        active[j] = False
        members[int(i)] += members.pop(int(j))
    labels = np.zeros(n, int)
    for label, rows in enumerate(members.values()):
        labels[rows] = label
    return labels


def merge_similar(
    emb: np.ndarray, labels: np.ndarray, merge_similarity: float, min_k: int = 1
) -> np.ndarray:
    """Merge the two clusters with the most similar centroids while that similarity exceeds
    ``merge_similarity`` and more than ``min_k`` clusters remain; labels renumbered 0..k-1."""
    labels = labels.copy()
    while True:
        ids = np.unique(labels)
        if len(ids) <= max(min_k, 1):
            break
        cent = np.stack([emb[labels == i].mean(0) for i in ids])
        cent /= np.linalg.norm(cent, axis=1, keepdims=True)
        sim = cent @ cent.T
        np.fill_diagonal(sim, -np.inf)
        a, b = np.unravel_index(np.argmax(sim), sim.shape)
        if sim[a, b] < merge_similarity:
            break
        labels[labels == ids[b]] = ids[a]
    _, labels = np.unique(labels, return_inverse=True)
    return labels


def absorb_small(
    emb: np.ndarray, labels: np.ndarray, min_share: float, min_k: int = 1
) -> np.ndarray:
    """Clusters holding fewer than ``min_share`` of the windows (at least 2 windows) join the
    nearest larger cluster: they are mostly windows that straddle a change of speaker or
    hold two voices at once, not a speaker of their own."""
    labels = labels.copy()
    floor = max(2.0, min_share * len(labels))
    while True:
        ids, counts = np.unique(labels, return_counts=True)
        if len(ids) <= max(min_k, 1) or counts.min() >= floor:
            break
        small = ids[np.argmin(counts)]
        rest = [i for i in ids if i != small]
        cent = np.stack([emb[labels == i].mean(0) for i in rest])
        mine = labels == small
        labels[mine] = np.array(rest)[np.argmax(emb[mine] @ cent.T, axis=1)]
    _, labels = np.unique(labels, return_inverse=True)
    return labels
