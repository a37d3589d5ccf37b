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

The speaker count (``estimate="silhouette"``, the default): k-means on the first k
eigenvectors of NME-SC's chosen graph for each k in [min_k, max_k] (at least 5 windows a
cluster), and the hint (2) stays unless another k's mean cosine silhouette is 0.05 higher.
On seed 1 of ``scripts/bench_diarize.py`` (30 real-voice 2-speaker calls, speech regions from
the construction) it found the right count on 96.7% of wideband and 86.7% of telephone calls,
against 93.3% and 86.7% for the eigengap with the hint kept unless another gap is 3x larger;
agglomerative clustering (average linkage, cosine distance stopped at a threshold) was worse
on 2-speaker calls (count right on 40-60% at the thresholds tried), because one threshold does
not suit both telephone band (every voice more alike) and wideband.

Then clean-ups the estimate cannot do (``Diarizer``): the estimate's clusters are split into
at least 3; a cluster with under ``min_share`` (20%) of the windows joins the nearest
(windows straddling a change of speaker formed a "speaker" of their own); and clusters whose
centroids are more similar than ``merge_similarity`` merge, less readily below the hint
(``merge_similar``). That is how a one-speaker call comes out as one (a spectral estimate has
no gap before the first eigenvalue). On seeds 1-2, telephone band, 2 speakers: the count
right on 24 of 24 calls with this, 21 of 24 with the 2-way cut merged at 0.86.

Why numpy and not scikit-learn: the default install has neither scipy nor scikit-learn
(about 80 MB of wheels together), and NME-SC, k-means, the silhouette and average linkage take
about 150 lines here. A 10-minute call has about 800 windows: one 800 x 800 symmetric eigen
decomposition per pruning value is tens of milliseconds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from overnight.workers.diarize.diarize import DiarizeOptions


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


# The eigen decompositions of one embedding matrix's pruned graphs, by ``p``: a diarization
# asks for the same graphs up to three times (each pruning value for the estimate, the chosen
# one again for the silhouette, each again for the split into ``overcluster``), and they were
# most of its clustering time on long calls (17 ``eigh`` calls of 0.66 s in 0.9 s on a 6-minute
# call's 557 windows; the time grows as the cube of the windows).
Eigs = dict[int, tuple[np.ndarray, np.ndarray]]


def _laplacian_eigs(
    affinity: np.ndarray, p: int, cache: Eigs | None = None
) -> tuple[np.ndarray, np.ndarray]:
    if cache is not None:
        if p not in cache:
            cache[p] = _laplacian_eigs(affinity, p)
        return cache[p]
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
    options: DiarizeOptions,
    hint: int | None,
    k: int | None = None,
    eigs: Eigs | None = None,
) -> np.ndarray:
    """NME-SC labels of unit embeddings (rows): ``k`` clusters (default ``options.speakers``),
    or a count estimated between ``options.min_speakers`` and ``max_speakers`` as
    ``options.estimate`` says, preferring ``hint``. ``eigs``: a cache of this ``emb``'s graph
    decompositions, shared by calls on the same embeddings (filled here)."""
    eigs = {} if eigs is None else eigs
    k = options.speakers if k is None else k
    min_k, max_k, seed = options.min_speakers, options.max_speakers, options.seed
    hint_margin, silhouette_margin = options.hint_margin, options.silhouette_margin
    estimate = options.estimate
    n = len(emb)
    if n <= 2:
        return np.zeros(n, int) if (k or 1) == 1 or n < 2 else np.arange(n)
    affinity = np.clip(emb @ emb.T, -1.0, 1.0)
    best: tuple[float, int, np.ndarray] | None = None
    best_p = 2
    max_k = min(max_k, n - 1)
    for frac in (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5):
        p = max(2, round(frac * n))
        if p >= n:
            break
        vals, vecs = _laplacian_eigs(affinity, p, eigs)
        if k is None:
            kk, gap = estimate_k(vals, max(min_k, 2), max_k, hint, hint_margin)
        else:
            # A short recording has fewer windows (so eigenvalues) than the speakers asked:
            # no gap past its last one, and k-means gives each window its own speaker.
            gaps = np.diff(vals)
            gap = float(gaps[k - 1] / (vals[-1] + 1e-10)) if 0 < k <= len(gaps) else 0.0
            kk = k
        ratio = p / max(gap, 1e-10)
        if best is None or ratio < best[0]:
            best, best_p = (ratio, kk, vecs[:, :kk]), p
    assert best is not None
    _, kk, vectors = best
    # A silhouette needs a few windows a cluster: short calls keep the eigengap's count.
    if k is not None or estimate == "eigengap" or min(max_k, n // 5) < max(min_k, 2):
        return kmeans(vectors, kk, seed=seed)
    # Silhouette: each count's k-means on that many eigenvectors of the chosen graph; the hint
    # stays unless another count's mean silhouette is ``silhouette_margin`` higher.
    _, all_vecs = _laplacian_eigs(affinity, best_p, eigs)
    dist = 1.0 - affinity
    scores = {}
    for kk in range(max(min_k, 2), min(max_k, n // 5) + 1):
        labels = kmeans(all_vecs[:, :kk], kk, seed=seed)
        scores[kk] = (silhouette(dist, labels), labels)
    top = max(scores, key=lambda c: scores[c][0])
    if hint in scores and scores[top][0] - scores[hint][0] < silhouette_margin:
        top = hint
    return scores[top][1]


def silhouette(dist: np.ndarray, labels: np.ndarray) -> float:
    """Mean silhouette of ``labels`` under the distance matrix ``dist``."""
    ids = np.unique(labels)
    if len(ids) < 2:
        return 0.0
    onehot = (labels[:, None] == ids[None]).astype(float)
    counts = onehot.sum(0)
    sums = dist @ onehot  # (n, clusters): summed distance to each cluster
    own = labels[:, None] == ids[None]
    a = (sums * own).sum(1) / np.maximum((counts * own).sum(1) - 1, 1)
    other = np.where(own, np.inf, sums / counts)
    b = other.min(1)
    return float(np.mean((b - a) / np.maximum(np.maximum(a, b), 1e-10)))


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
    emb: np.ndarray,
    labels: np.ndarray,
    merge_similarity: float,
    min_k: int = 1,
    hint: int | None = None,
    hint_similarity: float | None = None,
) -> np.ndarray:
    """Merge the two clusters with the most similar centroids while that similarity exceeds
    ``merge_similarity`` and more than ``min_k`` clusters remain; a merge that leaves fewer
    than ``hint`` clusters needs ``hint_similarity`` instead. Labels renumbered 0..k-1."""
    labels = labels.copy()
    while True:
        ids = np.unique(labels)
        if len(ids) <= max(min_k, 1):
            break
        need = merge_similarity
        if hint is not None and hint_similarity is not None and len(ids) <= hint:
            need = max(merge_similarity, hint_similarity)
        cent = np.stack([emb[labels == i].mean(0) for i in ids])
        cent /= np.linalg.norm(cent, axis=1, keepdims=True)
        sim = cent @ cent.T
        np.fill_diagonal(sim, -np.inf)
        a, b = np.unravel_index(np.argmax(sim), sim.shape)
        if sim[a, b] < need:
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
