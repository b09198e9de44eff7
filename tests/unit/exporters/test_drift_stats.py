"""Embedding-drift statistics on synthetic clusters: scores, calibrated thresholds, bad vectors."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest

from redline.exporters.drift import decode_vector, encode_vector, load_reference_npy
from redline.exporters.drift_stats import (
    METHODS,
    DriftDetector,
    DriftError,
    DriftSettings,
    build_clean_vectors,
    classifier_auc,
    cosine_distance,
    effective_window_size,
    mann_whitney_quantile,
    mean_cosine_distance,
    median_squared_distance,
    mmd2_unbiased,
    rank_auc,
)

DIM = 24
TOPICS = 5


def _centres(seed: int) -> np.ndarray:
    """Topic centres away from the origin, like sentence embeddings (all share a direction)."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((TOPICS + 1, DIM)) * 0.6 + 1.0).astype(np.float32)


def _sample(rng: np.random.Generator, centres: np.ndarray, n: int, topics: list[int]) -> np.ndarray:
    chosen = rng.choice(topics, n)
    x = centres[chosen] + rng.standard_normal((n, DIM)).astype(np.float32)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


BASE = list(range(TOPICS))
NEW = [TOPICS]
WINDOW = 200
SETTINGS = DriftSettings(window_size=WINDOW, calibration_draws=200, classifier_components=16)


@pytest.fixture(scope="module")
def world() -> tuple[np.random.Generator, np.ndarray, DriftDetector]:
    rng = np.random.default_rng(7)
    centres = _centres(7)
    reference = _sample(rng, centres, 1200, BASE)
    return rng, centres, DriftDetector(reference, SETTINGS)


def test_clean_vectors_skips_and_counts_each_kind_of_bad_row() -> None:
    rows = [
        [1.0, 2.0, 3.0],
        [1.0, float("nan"), 3.0],
        [1.0, 2.0],
        None,
        "not a vector",
        [float("inf"), 0.0, 0.0],
        np.array([4.0, 5.0, 6.0]),
        [[1.0, 2.0, 3.0]],
    ]
    clean = build_clean_vectors(rows, 3)
    assert clean.vectors.tolist() == [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
    assert clean.vectors.dtype == np.float32
    assert (clean.wrong_dimension, clean.non_finite, clean.undecodable) == (1, 2, 3)
    assert clean.invalid == 6
    assert clean.reasons() == {"wrong_dimension": 1, "non_finite": 2, "undecodable": 3}


def test_clean_vectors_on_arrays() -> None:
    matrix = np.ones((5, 4))
    matrix[1, 2] = np.nan
    matrix[3, 0] = -np.inf
    clean = build_clean_vectors(matrix, 4)
    assert clean.vectors.shape == (3, 4) and clean.non_finite == 2
    wrong = build_clean_vectors(np.ones((5, 3)), 4)
    assert wrong.vectors.shape == (0, 4) and wrong.wrong_dimension == 5
    inferred = build_clean_vectors([[1, 2], [3, 4], [5]], None)
    assert inferred.vectors.shape == (2, 2) and inferred.wrong_dimension == 1
    assert build_clean_vectors([], 8).vectors.shape == (0, 8)


def test_rank_auc_matches_pair_counting_with_ties() -> None:
    rng = np.random.default_rng(1)
    pos = rng.integers(0, 6, 40).astype(float)
    neg = rng.integers(0, 6, 30).astype(float)
    wins = sum(1.0 if p > q else 0.5 if p == q else 0.0 for p, q in itertools.product(pos, neg))
    assert rank_auc(pos, neg) == pytest.approx(wins / (40 * 30))
    assert rank_auc(np.array([3.0, 4.0]), np.array([1.0, 2.0])) == 1.0
    assert rank_auc(np.array([1.0, 2.0]), np.array([3.0, 4.0])) == 0.0
    with pytest.raises(DriftError):
        rank_auc(np.array([]), np.array([1.0]))


def test_exact_mmd_matches_the_definition() -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal((7, 3)).astype(np.float32)
    y = (rng.standard_normal((9, 3)) + 0.5).astype(np.float32)
    sigma2 = 1.7

    def k(a: np.ndarray, b: np.ndarray) -> float:
        return math.exp(-float(np.sum((a.astype(float) - b) ** 2)) / (2 * sigma2))

    xx = sum(k(x[i], x[j]) for i in range(7) for j in range(7) if i != j) / (7 * 6)
    yy = sum(k(y[i], y[j]) for i in range(9) for j in range(9) if i != j) / (9 * 8)
    xy = sum(k(a, b) for a in x for b in y) / (7 * 9)
    assert mmd2_unbiased(x, y, sigma2) == pytest.approx(xx + yy - 2 * xy, abs=1e-5)


def test_median_heuristic() -> None:
    points = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0]], np.float32)
    # squared distances 1, 4, 5
    assert median_squared_distance(points) == pytest.approx(4.0)
    with pytest.raises(DriftError, match="identical"):
        median_squared_distance(np.ones((5, 2), np.float32))


def test_feature_mmd_tracks_the_exact_estimator(
    world: tuple[np.random.Generator, np.ndarray, DriftDetector],
) -> None:
    rng, centres, _ = world
    reference = _sample(rng, centres, 1200, BASE)
    detector = DriftDetector(reference, DriftSettings(window_size=WINDOW, mmd_features=8192))
    compare = detector.comparison
    for topics in (BASE, [0, 1], NEW):
        window = _sample(rng, centres, WINDOW, topics)
        exact = mmd2_unbiased(window, compare, detector.sigma2)
        assert detector.score(window, "mmd") == pytest.approx(exact, abs=0.003 + 0.1 * exact)


def test_shifted_window_is_above_the_calibrated_threshold_for_every_method(
    world: tuple[np.random.Generator, np.ndarray, DriftDetector],
) -> None:
    rng, centres, detector = world
    shifted = _sample(rng, centres, WINDOW, NEW)
    for method in METHODS:
        result = detector.evaluate(shifted, method)
        assert result.drifted, (method, result)
        assert result.window_samples == WINDOW


def test_same_distribution_windows_stay_below_threshold(
    world: tuple[np.random.Generator, np.ndarray, DriftDetector],
) -> None:
    rng, centres, detector = world
    windows = [_sample(rng, centres, WINDOW, BASE) for _ in range(30)]
    for method in METHODS:
        false_alarms = sum(detector.evaluate(w, method).drifted for w in windows)
        # Calibrated at 1 %: 3 or more of 30 would have probability < 0.4 %.
        assert false_alarms <= 2, method
    aucs = [detector.score(w, "classifier_auc") for w in windows]
    assert 0.45 < float(np.mean(aucs)) < 0.55


def test_partial_shift_is_detected_by_the_default_method(
    world: tuple[np.random.Generator, np.ndarray, DriftDetector],
) -> None:
    rng, centres, detector = world
    hits = 0
    for _ in range(5):
        window = np.vstack(
            [_sample(rng, centres, WINDOW - 40, BASE), _sample(rng, centres, 40, NEW)]
        )
        hits += detector.evaluate(window).drifted
    assert hits >= 4


def test_false_positive_rate_is_bounded_across_references() -> None:
    """Fresh references and windows: the calibration must hold on average, not for one split."""
    alarms = trials = 0
    for seed in range(6):
        rng = np.random.default_rng(100 + seed)
        centres = _centres(100 + seed)
        detector = DriftDetector(
            _sample(rng, centres, 1200, BASE),
            DriftSettings(window_size=WINDOW, calibration_draws=200, seed=seed),
        )
        for _ in range(15):
            alarms += detector.evaluate(_sample(rng, centres, WINDOW, BASE)).drifted
            trials += 1
    assert alarms / trials <= 0.05


def test_calibration_is_cached_per_method_and_size(
    world: tuple[np.random.Generator, np.ndarray, DriftDetector],
) -> None:
    _, _, detector = world
    first = detector.calibration("mmd", WINDOW)
    assert detector.calibration("mmd", WINDOW) is first
    smaller = detector.calibration("mmd", WINDOW // 2)
    assert smaller is not first and smaller.window_size == WINDOW // 2
    # Smaller windows are noisier: their null spreads wider.
    assert smaller.null_std > first.null_std
    assert first.draws == 200 and first.false_positive_rate == 0.01
    assert detector.calibration("classifier_auc", WINDOW).draws == 100


def test_mean_cosine_and_classifier_basics() -> None:
    assert cosine_distance(np.array([1.0, 0.0]), np.array([0.0, 2.0])) == pytest.approx(1.0)
    assert cosine_distance(np.array([1.0, 1.0]), np.array([2.0, 2.0])) == pytest.approx(0.0)
    assert cosine_distance(np.zeros(2), np.ones(2)) == 1.0
    x = np.array([[1.0, 0.0], [1.0, 0.2]], np.float32)
    y = np.array([[0.0, 1.0], [0.2, 1.0]], np.float32)
    assert mean_cosine_distance(x, y) == pytest.approx(1 - 0.2 / 1.01, abs=1e-6)
    rng = np.random.default_rng(3)
    apart = classifier_auc(rng.normal(2, 1, (200, 4)), rng.normal(0, 1, (200, 4)))
    assert apart > 0.9
    assert mann_whitney_quantile(100, 100, 0.5) == pytest.approx(0.5)
    assert mann_whitney_quantile(100, 100, 0.99) > 0.58


def test_effective_window_size_halves_down_to_the_minimum() -> None:
    assert effective_window_size(5000, 1000, 100) == 1000
    assert effective_window_size(1000, 1000, 100) == 1000
    assert effective_window_size(999, 1000, 100) == 500
    assert effective_window_size(260, 1000, 100) == 250
    assert effective_window_size(130, 1000, 100) == 125
    assert effective_window_size(120, 1000, 100) == 0
    assert effective_window_size(99, 1000, 100) == 0


def test_bad_configuration_and_inputs_get_clear_errors(
    world: tuple[np.random.Generator, np.ndarray, DriftDetector],
) -> None:
    _, _, detector = world
    with pytest.raises(DriftError, match="needs at least 3000"):
        DriftDetector(np.ones((2000, 4), np.float32) + np.eye(4)[np.arange(2000) % 4])
    with pytest.raises(DriftError, match="finite"):
        DriftDetector(np.full((3000, 4), np.nan, np.float32))
    with pytest.raises(DriftError, match="unknown drift method 'ks'"):
        detector.score(np.ones((WINDOW, DIM), np.float32), "ks")  # type: ignore[arg-type]
    with pytest.raises(DriftError, match="dimension 24"):
        detector.score(np.ones((WINDOW, 3), np.float32))
    with pytest.raises(DriftError, match="expected 2.."):
        detector.score(np.ones((1, DIM), np.float32))
    with pytest.raises(DriftError, match="false_positive_rate"):
        DriftSettings(false_positive_rate=0.7)
    with pytest.raises(DriftError, match="classifier_draws"):
        DriftSettings(classifier_draws=5)
    with pytest.raises(DriftError, match="mmd_features"):
        DriftSettings(mmd_features=7)


def test_stream_vector_decoding() -> None:
    vector = np.array([1.5, -2.0, 3.25], np.float32)
    assert decode_vector(encode_vector(vector), "float32").tolist() == [1.5, -2.0, 3.25]
    assert decode_vector(b"\x00\x01\x02", "float32") is None
    assert decode_vector(None, "float32") is None
    assert decode_vector(b"[1, 2.5, NaN]", "json") is not None
    assert decode_vector(b"[1, true]", "json") is None
    assert decode_vector(b'{"a": 1}', "json") is None
    assert decode_vector(b"[[1, 2]]", "json") is None
    assert decode_vector(b"\xff\xfe", "json") is None
    clean = build_clean_vectors([decode_vector(b"[1, 2.5, NaN]", "json")], 3)
    assert clean.non_finite == 1


def test_npy_reference_errors_name_the_file(tmp_path: Path) -> None:
    good = tmp_path / "good.npy"
    np.save(good, np.ones((4, 3), np.float32))
    assert load_reference_npy(good).shape == (4, 3)
    flat = tmp_path / "flat.npy"
    np.save(flat, np.ones(5))
    with pytest.raises(DriftError, match=r"flat\.npy: expected a 2-D numeric array"):
        load_reference_npy(flat)
    text = tmp_path / "text.npy"
    text.write_text("not numpy")
    with pytest.raises(DriftError, match=r"text\.npy: not a \.npy array"):
        load_reference_npy(text)
    with pytest.raises(DriftError, match=r"missing\.npy: cannot read"):
        load_reference_npy(tmp_path / "missing.npy")
    objects = tmp_path / "objects.npy"
    np.save(objects, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(DriftError, match=r"objects\.npy: not a \.npy array"):
        load_reference_npy(objects)
