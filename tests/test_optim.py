"""The batch optimiser and its handling of box constraints."""

import numpy as np
import pytest

from skgpstruct.optim import minimize_lbfgs
from skgpstruct.optim.box import SmoothBox, bound_arrays

# One coordinate of every kind: both bounds, lower only, upper only, none.
BOUNDS = [(-2.0, 3.0), (0.5, None), (None, -1.0), (None, None)]


def _box():
    return SmoothBox(*bound_arrays(BOUNDS, 4))


def test_bound_arrays_accepts_pairs_and_arrays():
    low, high = bound_arrays(BOUNDS, 4)
    np.testing.assert_array_equal(low, [-2.0, 0.5, -np.inf, -np.inf])
    np.testing.assert_array_equal(high, [3.0, np.inf, -1.0, np.inf])
    again = bound_arrays(np.column_stack([low, high]), 4)
    np.testing.assert_array_equal(again[0], low)
    np.testing.assert_array_equal(again[1], high)
    none = bound_arrays(None, 3)
    assert np.all(np.isneginf(none[0])) and np.all(np.isposinf(none[1]))


@pytest.mark.parametrize(
    "bounds, n, match",
    [
        ([(0.0, 1.0)], 2, r"shape \(2, 2\)"),
        ([(1.0, 1.0), (None, None)], 2, "low < high"),
        (np.array([[0.0, np.nan]]), 1, "low < high"),
    ],
)
def test_bound_arrays_rejects_malformed_bounds(bounds, n, match):
    with pytest.raises(ValueError, match=match):
        bound_arrays(bounds, n)


def test_smooth_box_round_trip_and_range():
    box = _box()
    rng = np.random.default_rng(0)
    low, high = bound_arrays(BOUNDS, 4)
    for _ in range(20):
        z = rng.normal(scale=4.0, size=4)
        x = box.to_box(z)
        assert np.all(x > low) and np.all(x < high)
        np.testing.assert_allclose(box.from_box(x), z, rtol=1e-9, atol=1e-9)
    # Far outside, the map saturates at the bounds and stays in the box.
    x = box.to_box(np.array([-1e3, -1e3, 1e3, 1e3]))
    assert np.all(x >= low) and np.all(x <= high)
    np.testing.assert_allclose(x[:3], [-2.0, 0.5, -1.0])


def test_smooth_box_is_the_identity_well_inside():
    box = SmoothBox(*bound_arrays([(-50.0, 50.0), (-30.0, None)], 2))
    z = np.array([1.5, -5.0])
    np.testing.assert_allclose(box.to_box(z), z, atol=1e-10)
    np.testing.assert_allclose(box.chain(z, np.ones(2)), 1.0, atol=1e-10)


def test_smooth_box_chain_matches_finite_differences():
    box = _box()
    rng = np.random.default_rng(1)
    h = 1e-6
    for _ in range(5):
        z = rng.normal(scale=3.0, size=4)
        slope = box.chain(z, np.ones(4))
        for i in range(4):
            step = np.zeros(4)
            step[i] = h
            finite = (box.to_box(z + step)[i] - box.to_box(z - step)[i]) / (2 * h)
            np.testing.assert_allclose(slope[i], finite, rtol=1e-6, atol=1e-10)


def test_minimize_lbfgs_respects_bounds_and_reaches_a_bound_optimum():
    # Maximise -|x - c|^2: the optimum is c clipped to the box. Every
    # evaluation must lie inside the box.
    c = np.array([5.0, -3.0, 2.0, 0.7])
    low, high = bound_arrays(BOUNDS, 4)
    seen = []

    def value_and_grad(x):
        seen.append(x.copy())
        return -np.sum((x - c) ** 2), -2.0 * (x - c)

    result = minimize_lbfgs(
        value_and_grad, np.array([0.0, 1.0, -2.0, 0.0]), bounds=BOUNDS,
        max_iter=500, tol=1e-12,
    )
    assert all(np.all(x >= low) and np.all(x <= high) for x in seen)
    np.testing.assert_allclose(result.x, np.clip(c, low, high), atol=1e-4)
    assert result.history[-1] == pytest.approx(result.value)


def test_minimize_lbfgs_without_bounds_finds_the_exact_optimum():
    rng = np.random.default_rng(2)
    A = rng.normal(size=(6, 6))
    A = A @ A.T + 6 * np.eye(6)
    b = rng.normal(size=6)

    def value_and_grad(x):
        return -0.5 * x @ A @ x + b @ x, -(A @ x) + b

    result = minimize_lbfgs(value_and_grad, np.zeros(6), max_iter=200, tol=1e-12)
    np.testing.assert_allclose(result.x, np.linalg.solve(A, b), atol=1e-6)
    assert result.converged
