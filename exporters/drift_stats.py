"""Embedding-drift statistics in plain numpy: MMD², mean-cosine distance, domain-classifier AUC.

Everything here is pure: arrays in, numbers out. `DriftDetector` prepares a reference set once
(split, kernel features, projections) and calibrates a threshold per method and window size from
the reference alone, so the false-positive rate is bounded without any labelled drift.

MMD² is the unbiased estimator under an RBF kernel whose bandwidth is the median pairwise
distance of the reference (median heuristic), computed on random Fourier features ([cos, sin] of
random projections, whose dot product approximates the kernel): a window then costs one
(n x dim) @ (dim x D/2) product instead of two n x n kernel matrices, and the score depends on the
window only through its mean feature vector. `mmd2_unbiased` is the exact O(n²) estimator.

Calibration. The reference is split (seeded) into a *comparison* part Y, against which windows
are scored, and a *pool* P of at least two windows. Null windows are drawn from P without
replacement and scored against Y exactly as a live window would be; the threshold is the
(1 - false_positive_rate) quantile of those null scores. For the statistics that depend on the
window only through its mean (MMD² on features, mean-cosine) each null mean is re-centred on the
whole reference's mean and its deviation scaled so its spread is that of a fresh window,
(|P| - 1) / (|P| - n) for drawing from a finite pool, times (1 + n/N) for not knowing the true
centre: the predictive distribution of a live window's mean under no drift. The classifier's
null is widened around its mean by the finite-pool factor (an approximation) and never set below
the Mann-Whitney quantile of a chance AUC.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, Literal, cast, get_args

import numpy as np
from numpy.typing import NDArray

DriftMethod = Literal["mmd", "mean_cosine", "classifier_auc"]
METHODS: tuple[DriftMethod, ...] = get_args(DriftMethod)

FloatMatrix = NDArray[np.float32]
Vector = NDArray[np.float64]


class DriftError(Exception):
    """Drift cannot be computed: a reference too small, an unknown method, no valid vectors."""


@dataclass(frozen=True)
class DriftSettings:
    """How a reference is prepared and calibrated; defaults suit 1000-vector windows."""

    window_size: int = 1000
    false_positive_rate: float = 0.01
    calibration_draws: int = 300
    classifier_draws: int = 100
    mmd_features: int = 256
    bandwidth_rows: int = 1000
    classifier_components: int = 64
    classifier_l2: float = 1.0
    classifier_iterations: int = 6
    seed: int = 0

    def __post_init__(self) -> None:
        if self.window_size < 2:
            raise DriftError(f"window_size must be >= 2, got {self.window_size}")
        if not 0.0 < self.false_positive_rate < 0.5:
            raise DriftError(
                f"false_positive_rate must be in (0, 0.5), got {self.false_positive_rate}"
            )
        if min(self.calibration_draws, self.classifier_draws) < 20:
            raise DriftError("calibration_draws and classifier_draws must be >= 20")
        if self.mmd_features < 2 or self.mmd_features % 2:
            raise DriftError(f"mmd_features must be an even number >= 2, got {self.mmd_features}")
        if self.bandwidth_rows < 2 or self.classifier_components < 1:
            raise DriftError("bandwidth_rows must be >= 2 and classifier_components >= 1")


@dataclass(frozen=True)
class CleanVectors:
    """The valid rows of a batch as float32, and how many rows were skipped and why."""

    vectors: FloatMatrix
    wrong_dimension: int = 0
    non_finite: int = 0
    undecodable: int = 0

    @property
    def invalid(self) -> int:
        """Rows skipped for any reason."""
        return self.wrong_dimension + self.non_finite + self.undecodable

    def reasons(self) -> dict[str, int]:
        """Skipped rows by reason (only non-zero reasons)."""
        counts = {
            "wrong_dimension": self.wrong_dimension,
            "non_finite": self.non_finite,
            "undecodable": self.undecodable,
        }
        return {reason: count for reason, count in counts.items() if count}


def build_clean_vectors(rows: Sequence[Any] | NDArray[Any], dim: int | None) -> CleanVectors:
    """Keep rows of length `dim` (or the first row's) with finite values; count the others.

    `rows` is a 2-D array or a sequence of 1-D vectors, where `None` marks a row that could not be
    decoded. Order is preserved.
    """
    if isinstance(rows, np.ndarray) and rows.ndim == 2 and rows.dtype.kind in "fiu":
        if dim is not None and rows.shape[1] != dim:
            return CleanVectors(np.empty((0, dim), np.float32), wrong_dimension=rows.shape[0])
        matrix = np.ascontiguousarray(rows, dtype=np.float32)
        finite = np.isfinite(matrix).all(axis=1)
        bad = int(finite.size - np.count_nonzero(finite))
        return CleanVectors(matrix if bad == 0 else matrix[finite], non_finite=bad)
    undecodable = wrong = 0
    kept: list[NDArray[np.float32]] = []
    for row in rows:
        if row is None:
            undecodable += 1
            continue
        try:
            vector = np.asarray(row, dtype=np.float32)
        except (TypeError, ValueError):
            undecodable += 1
            continue
        if vector.ndim != 1:
            undecodable += 1
            continue
        if dim is None:
            dim = int(vector.shape[0])
        if vector.shape[0] != dim or dim == 0:
            wrong += 1
            continue
        kept.append(vector)
    width = dim or 0
    matrix = np.stack(kept) if kept else np.empty((0, width), np.float32)
    finite = np.isfinite(matrix).all(axis=1)
    bad = int(finite.size - np.count_nonzero(finite))
    return CleanVectors(
        matrix if bad == 0 else matrix[finite],
        wrong_dimension=wrong,
        non_finite=bad,
        undecodable=undecodable,
    )


def median_squared_distance(x: FloatMatrix, max_rows: int = 1000, seed: int = 0) -> float:
    """Median squared Euclidean distance between distinct rows (of at most `max_rows` rows)."""
    if x.shape[0] < 2:
        raise DriftError("the median heuristic needs at least 2 vectors")
    if x.shape[0] > max_rows:
        x = x[np.random.default_rng(seed).choice(x.shape[0], max_rows, replace=False)]
    centred = (x - x.mean(axis=0)).astype(np.float64)
    norms = np.einsum("ij,ij->i", centred, centred)
    squared = norms[:, None] + norms[None, :] - 2.0 * (centred @ centred.T)
    upper = squared[np.triu_indices(x.shape[0], k=1)]
    median = float(np.median(np.maximum(upper, 0.0)))
    if not median > 0.0:
        raise DriftError("the reference vectors are all identical: no kernel bandwidth")
    return median


def _kernel_sum(x: FloatMatrix, y: FloatMatrix, sigma2: float, same: bool) -> float:
    """Sum of exp(-|x - y|² / (2 sigma2)) over all pairs (off-diagonal pairs when `same`)."""
    inv = np.float32(1.0 / sigma2)
    half = np.float32(0.5 / sigma2)
    xx = np.einsum("ij,ij->i", x, x)
    yy = xx if same else np.einsum("ij,ij->i", y, y)
    gram = x @ x.T if same else x @ y.T
    gram *= inv
    gram -= (xx * half)[:, None]
    gram -= (yy * half)[None, :]
    np.minimum(gram, 0.0, out=gram)
    np.exp(gram, out=gram)
    total = float(gram.sum(dtype=np.float64))
    if same:
        total -= float(np.trace(gram, dtype=np.float64))
    return total


def mmd2_unbiased(x: FloatMatrix, y: FloatMatrix, sigma2: float) -> float:
    """Unbiased MMD² of two samples under the RBF kernel exp(-|a - b|² / (2 sigma2)), exactly."""
    n, m = int(x.shape[0]), int(y.shape[0])
    if n < 2 or m < 2:
        raise DriftError("MMD² needs at least 2 vectors on each side")
    centre = y.mean(axis=0)
    x = np.ascontiguousarray(x - centre, dtype=np.float32)
    y = np.ascontiguousarray(y - centre, dtype=np.float32)
    within_x = _kernel_sum(x, x, sigma2, same=True) / (n * (n - 1))
    within_y = _kernel_sum(y, y, sigma2, same=True) / (m * (m - 1))
    cross = _kernel_sum(x, y, sigma2, same=False) / (n * m)
    return within_x + within_y - 2.0 * cross


def cosine_distance(a: NDArray[Any], b: NDArray[Any]) -> float:
    """1 - cos(a, b) of two vectors; 1.0 when either is the zero vector."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    norm = float(np.linalg.norm(a64) * np.linalg.norm(b64))
    if norm == 0.0:
        return 1.0
    return 1.0 - float(a64 @ b64) / norm


def mean_cosine_distance(x: FloatMatrix, y: FloatMatrix) -> float:
    """Cosine distance between the mean of `x` and the mean of `y`."""
    return cosine_distance(x.mean(axis=0, dtype=np.float64), y.mean(axis=0, dtype=np.float64))


def rank_auc(positive: NDArray[Any], negative: NDArray[Any]) -> float:
    """ROC AUC of scores (positives should score higher) via mid-ranks (Mann-Whitney U)."""
    n_pos, n_neg = int(positive.shape[0]), int(negative.shape[0])
    if n_pos == 0 or n_neg == 0:
        raise DriftError("AUC needs at least one score on each side")
    scores = np.concatenate([positive, negative]).astype(np.float64)
    order = np.argsort(scores, kind="mergesort")
    _, starts, counts = np.unique(scores[order], return_index=True, return_counts=True)
    ranks = np.empty(scores.shape[0], np.float64)
    ranks[order] = np.repeat(starts + (counts + 1) / 2.0, counts)
    u = float(ranks[:n_pos].sum()) - n_pos * (n_pos + 1) / 2.0
    return u / (n_pos * n_neg)


def fit_logistic(
    features: NDArray[Any], labels: NDArray[Any], l2: float, iterations: int
) -> Vector:
    """L2-regularised logistic regression by Newton steps; weights with the intercept last."""
    design = np.hstack([features.astype(np.float64), np.ones((features.shape[0], 1))])
    target = labels.astype(np.float64)
    penalty = np.full(design.shape[1], l2)
    penalty[-1] = 1e-8  # the intercept is not shrunk
    weights = np.zeros(design.shape[1])
    for _ in range(iterations):
        prob = 0.5 * (1.0 + np.tanh(0.5 * (design @ weights)))
        gradient = design.T @ (prob - target) + penalty * weights
        hessian = (design * (prob * (1.0 - prob))[:, None]).T @ design + np.diag(penalty)
        step = np.linalg.solve(hessian, gradient)
        weights -= step
        if float(np.abs(step).max()) < 1e-6:
            break
    return weights


def classifier_auc(
    x: NDArray[Any],
    y: NDArray[Any],
    *,
    l2: float = 1.0,
    iterations: int = 6,
    seed: int = 0,
) -> float:
    """Held-out AUC of a logistic classifier telling `x` rows from `y` rows (0.5: no drift).

    Each side is shuffled and halved; the classifier learns on one half and is scored on the
    other. Features should be on comparable scales (see `DriftDetector`, which whitens them).
    """
    if x.shape[0] < 4 or y.shape[0] < 4:
        raise DriftError("the domain classifier needs at least 4 vectors on each side")
    rng = np.random.default_rng(seed)
    xs = x[rng.permutation(x.shape[0])]
    ys = y[rng.permutation(y.shape[0])]
    hx, hy = xs.shape[0] // 2, ys.shape[0] // 2
    train = np.vstack([xs[:hx], ys[:hy]])
    labels = np.concatenate([np.ones(hx), np.zeros(hy)])
    weights = fit_logistic(train, labels, l2, iterations)
    return rank_auc(_logit(xs[hx:], weights), _logit(ys[hy:], weights))


def _logit(features: NDArray[Any], weights: Vector) -> Vector:
    result: Vector = features.astype(np.float64) @ weights[:-1] + weights[-1]
    return result


def mann_whitney_quantile(n_pos: int, n_neg: int, probability: float) -> float:
    """The `probability` quantile of a chance AUC between n_pos and n_neg scores (normal approx)."""
    sd = math.sqrt((n_pos + n_neg + 1) / (12.0 * n_pos * n_neg))
    return 0.5 + NormalDist().inv_cdf(probability) * sd


def effective_window_size(available: int, window_size: int, min_window: int) -> int:
    """The largest of window_size, window_size/2, /4, ... that fits `available` (0 if < min)."""
    size = window_size
    while size > available and size // 2 >= min_window:
        size //= 2
    return size if min_window <= size <= available else 0


@dataclass(frozen=True)
class Calibration:
    """A method's calibrated threshold for one window size, from null windows of the reference."""

    method: DriftMethod
    window_size: int
    threshold: float
    null_mean: float
    null_std: float
    draws: int
    false_positive_rate: float


@dataclass(frozen=True)
class DriftResult:
    """One evaluation of one window."""

    method: DriftMethod
    score: float
    threshold: float
    window_samples: int

    @property
    def drifted(self) -> bool:
        """True when the score exceeds the calibrated threshold."""
        return self.score > self.threshold


class DriftDetector:
    """A prepared reference set: scores windows against it, thresholds calibrated and cached."""

    def __init__(self, reference: FloatMatrix, settings: DriftSettings | None = None) -> None:
        self.settings = settings or DriftSettings()
        ref = np.ascontiguousarray(reference, dtype=np.float32)
        if ref.ndim != 2 or not np.isfinite(ref).all():
            raise DriftError("the reference must be a 2-D array of finite values")
        window = self.settings.window_size
        rows = ref.shape[0]
        if rows < 3 * window:
            raise DriftError(
                f"the reference has {rows} vectors; a window of {window} needs at least "
                f"{3 * window} (2 windows to calibrate the threshold, 1 to compare against)"
            )
        self.dim = int(ref.shape[1])
        self.reference_rows = rows
        rng = np.random.default_rng(self.settings.seed)
        order = rng.permutation(rows)
        # Half the reference (at least 2, at most 8 windows) is the pool that calibrates.
        pool_size = max(2 * window, min(rows // 2, 8 * window))
        self._pool = ref[order[:pool_size]]
        self._compare = ref[order[pool_size:]]
        self._centre = self._compare.mean(axis=0)
        self.sigma2 = median_squared_distance(
            self._compare, self.settings.bandwidth_rows, self.settings.seed
        )
        self._compare_mean = self._compare.mean(axis=0, dtype=np.float64)
        self._lock = threading.Lock()
        self._calibrations: dict[tuple[DriftMethod, int], Calibration] = {}
        self._prepare_kernel(rng)
        self._prepare_classifier(rng)

    @property
    def comparison(self) -> FloatMatrix:
        """The reference rows windows are scored against (the rest calibrates)."""
        return self._compare

    def _prepare_kernel(self, rng: np.random.Generator) -> None:
        omega = rng.standard_normal((self.dim, self.settings.mmd_features // 2))
        self._omega = (omega / math.sqrt(self.sigma2)).astype(np.float32)
        self._compare_features = self._features(self._compare).mean(axis=0, dtype=np.float64)
        m = int(self._compare.shape[0])
        within = m * float(self._compare_features @ self._compare_features) - 1.0
        self._within_compare = within / (m - 1)
        self._pool_features = self._features(self._pool)

    def _prepare_classifier(self, rng: np.random.Generator) -> None:
        centred = (self._compare - self._centre).astype(np.float64)
        covariance = centred.T @ centred / max(centred.shape[0] - 1, 1)
        values, vectors = np.linalg.eigh(covariance)
        keep = min(self.settings.classifier_components, self.dim)
        top = np.argsort(values)[::-1][:keep]
        scale = 1.0 / np.sqrt(np.maximum(values[top], values[top].max() * 1e-6 + 1e-12))
        self._projection = (vectors[:, top] * scale).astype(np.float32)
        rows = min(self.settings.window_size, self._compare.shape[0])
        pick = rng.choice(self._compare.shape[0], rows, replace=False)
        self._classifier_ref = self._project(self._compare[pick])

    def _features(self, x: FloatMatrix) -> FloatMatrix:
        """Random Fourier features [cos, sin] / sqrt(D/2): their dot product ≈ the RBF kernel."""
        phase = (x - self._centre) @ self._omega
        half = np.float32(1.0 / math.sqrt(self._omega.shape[1]))
        return np.hstack([np.cos(phase), np.sin(phase)]) * half

    def _feature_mean(self, x: FloatMatrix) -> Vector:
        """Mean of `_features(x)` without building the feature matrix."""
        phase = (x - self._centre) @ self._omega
        half = 1.0 / math.sqrt(self._omega.shape[1])
        cos = np.cos(phase).mean(axis=0, dtype=np.float64)
        sin = np.sin(phase).mean(axis=0, dtype=np.float64)
        return np.concatenate([cos, sin]) * half

    def _project(self, x: FloatMatrix) -> FloatMatrix:
        return cast(FloatMatrix, (x - self._centre) @ self._projection)

    def _mmd_from_mean(self, mean: Vector, n: int) -> float:
        # Each feature row has unit norm, so the off-diagonal within-window sum is n²|mean|² - n.
        within = (n * float(mean @ mean) - 1.0) / (n - 1)
        return within + self._within_compare - 2.0 * float(mean @ self._compare_features)

    def _classifier(self, projected: FloatMatrix, seed: int) -> float:
        return classifier_auc(
            projected,
            self._classifier_ref,
            l2=self.settings.classifier_l2,
            iterations=self.settings.classifier_iterations,
            seed=seed,
        )

    def score(self, window: FloatMatrix, method: DriftMethod = "mmd") -> float:
        """The drift score of a clean window (higher: further from the reference)."""
        x = self._check(window, method)
        n = x.shape[0]
        if method == "mmd":
            return self._mmd_from_mean(self._feature_mean(x), n)
        if method == "mean_cosine":
            return cosine_distance(x.mean(axis=0, dtype=np.float64), self._compare_mean)
        return self._classifier(self._project(x), self.settings.seed)

    def _check(self, window: FloatMatrix, method: DriftMethod) -> FloatMatrix:
        if method not in METHODS:
            raise DriftError(f"unknown drift method {method!r}; allowed: {', '.join(METHODS)}")
        if window.ndim != 2 or window.shape[1] != self.dim:
            raise DriftError(f"window shape {window.shape} does not match dimension {self.dim}")
        largest = self._pool.shape[0] // 2
        if not 2 <= window.shape[0] <= largest:
            raise DriftError(f"window of {window.shape[0]} vectors; expected 2..{largest}")
        return np.ascontiguousarray(window, dtype=np.float32)

    def calibration(self, method: DriftMethod, window_size: int) -> Calibration:
        """The calibrated threshold of `method` for windows of `window_size` (computed once)."""
        key = (method, window_size)
        with self._lock:
            found = self._calibrations.get(key)
            if found is None:
                found = self._calibrate(method, window_size)
                self._calibrations[key] = found
            return found

    def _calibrate(self, method: DriftMethod, n: int) -> Calibration:
        self._check(np.empty((n, self.dim), np.float32), method)
        # Each classifier draw fits a model: fewer draws, floored by the Mann-Whitney quantile.
        draws = (
            self.settings.classifier_draws
            if method == "classifier_auc"
            else self.settings.calibration_draws
        )
        rng = np.random.default_rng([self.settings.seed, n, METHODS.index(method)])
        pool_rows = self._pool.shape[0]
        inflate = math.sqrt((pool_rows - 1) / max(pool_rows - n, 1))
        null = np.empty(draws, np.float64)
        if method != "classifier_auc":
            source = self._pool_features if method == "mmd" else self._pool
            pool_mean = source.mean(axis=0, dtype=np.float64)
            compare = self._compare_features if method == "mmd" else self._compare_mean
            rows = self.reference_rows
            # A live window's mean is predicted to be centred on the whole reference's mean, with
            # the spread of a fresh window plus the uncertainty of that centre (1/n + 1/N).
            centre = (pool_rows * pool_mean + (rows - pool_rows) * compare) / rows
            spread = inflate * math.sqrt(1.0 + n / rows)
            for i in range(draws):
                picked = source[rng.choice(pool_rows, n, replace=False)]
                mean = centre + (picked.mean(axis=0, dtype=np.float64) - pool_mean) * spread
                if method == "mmd":
                    null[i] = self._mmd_from_mean(mean, n)
                else:
                    null[i] = cosine_distance(mean, self._compare_mean)
        else:
            projected = self._project(self._pool)
            for i in range(draws):
                picked = projected[rng.choice(pool_rows, n, replace=False)]
                null[i] = self._classifier(picked, self.settings.seed)
            # Not a function of the window mean: widen around the null mean (approximate).
            null = null.mean() + (null - null.mean()) * inflate
        probability = 1.0 - self.settings.false_positive_rate
        threshold = float(np.quantile(null, probability))
        if method == "classifier_auc":
            held_out = (
                n - n // 2,
                self._classifier_ref.shape[0] - self._classifier_ref.shape[0] // 2,
            )
            threshold = max(threshold, mann_whitney_quantile(*held_out, probability))
        return Calibration(
            method=method,
            window_size=n,
            threshold=threshold,
            null_mean=float(null.mean()),
            null_std=float(null.std()),
            draws=draws,
            false_positive_rate=self.settings.false_positive_rate,
        )

    def evaluate(self, window: FloatMatrix, method: DriftMethod = "mmd") -> DriftResult:
        """Score a clean window and compare it with the calibrated threshold for its size."""
        score = self.score(window, method)
        calibration = self.calibration(method, window.shape[0])
        return DriftResult(method, score, calibration.threshold, window.shape[0])
