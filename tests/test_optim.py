"""The batch optimiser and its handling of box constraints."""

import numpy as np
import pytest
from scipy.optimize import rosen, rosen_der

from skgpstruct._linalg import same_vector
from skgpstruct._vectors import diagonal_bfgs_update, secant_inverse_sqrt
from skgpstruct.optim import lbfgs as lbfgs_module
from skgpstruct.optim import minimize_lbfgs, minimize_lbfgs_rounds
from skgpstruct.optim.box import SmoothBox, bound_arrays
from skgpstruct.optim.lbfgs import INITIAL_MATRICES, _LBFGSMemory

# One coordinate of every kind: both bounds, lower only, upper only, none.
BOUNDS = [(-2.0, 3.0), (0.5, None), (None, -1.0), (None, None)]
INITIAL = list(INITIAL_MATRICES)


def _box():
    return SmoothBox(*bound_arrays(BOUNDS, 4))


def test_same_vector_compares_every_entry():
    a = np.linspace(0.0, 1.0, 1001)
    assert same_vector(a, a.copy()) and same_vector(a, a)
    for index in (0, 500, 1000):  # memcmp must read to the last byte
        b = a.copy()
        b[index] = np.nextafter(b[index], 2.0)
        assert not same_vector(a, b)
    assert not same_vector(a, a[:-1])
    assert same_vector(np.empty(0), np.empty(0))
    # bit for bit: a NaN is the same point, -0.0 another one (a cache miss)
    nan = np.array([np.nan, 1.0])
    assert same_vector(nan, nan.copy())
    assert not same_vector(np.array([0.0]), np.array([-0.0]))
    # other arrays through numpy.array_equal
    grid = np.arange(6.0).reshape(2, 3)
    assert same_vector(grid, grid.copy()) and not same_vector(grid, grid + 1.0)
    assert same_vector(a[::2], a[::2].copy())
    assert not same_vector(a[::2], a[1::2])
    assert same_vector(np.arange(4), np.arange(4.0))
    # differing at the last entry only, whatever the layout or dtype
    for x in (a[::2], grid, np.arange(5)):
        y = x.copy()
        y.flat[-1] += 1
        assert not same_vector(x, y)


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


@pytest.mark.parametrize("width", [1e-6, 1e-9, 1e-12])
def test_smooth_box_maps_points_into_a_narrow_box(width):
    # Narrower than twice the margin of from_box, every point was clipped
    # outside the box and mapped to NaN (a fit with variance_bounds of
    # (1, 1 + 1e-9) failed: "theta must be finite, got [nan 0.]").
    box = SmoothBox(*bound_arrays([(0.0, width), (5.0, 5.0 + width)], 2))
    for x in ([0.0, 5.0], [width, 5.0 + width], [0.5 * width, 5.0 + 0.5 * width],
              [-1.0, 10.0]):
        z = box.from_box(np.array(x))
        assert np.all(np.isfinite(z))
        inside = box.to_box(z)
        assert 0.0 <= inside[0] <= width and 5.0 <= inside[1] <= 5.0 + width


def test_smooth_box_is_the_identity_well_inside():
    box = SmoothBox(*bound_arrays([(-50.0, 50.0), (-30.0, None)], 2))
    z = np.array([1.5, -5.0])
    np.testing.assert_allclose(box.to_box(z), z, atol=1e-10)
    np.testing.assert_allclose(box.chain(z, np.ones(2)), 1.0, atol=1e-10)


def test_longest_step_keeps_bounded_coordinates_near_their_bounds():
    # Bounds: both, lower only, upper only, none (BOUNDS). From z along p,
    # each bounded coordinate moving towards its bound may go 2 beyond it,
    # or 2 beyond itself when it is already beyond.
    box = _box()
    z = np.array([0.0, 1.0, 5.0, 0.0])
    cases = [
        # coordinate 0 up to 3 + 2 at speed 1: alpha 5
        (np.array([1.0, 0.0, 0.0, 0.0]), 5.0),
        # coordinate 1 from 1 down to 0.5 - 2 at speed 3: alpha 2.5 / 3
        # (coordinate 0 up: 5 / 2)
        (np.array([2.0, -3.0, 0.0, 0.0]), 2.5 / 3.0),
        # coordinate 2 is beyond its upper bound -1 already: 2 beyond itself
        (np.array([0.0, 0.0, 4.0, 0.0]), 0.5),
        # moving away from every bound, or unbounded: nothing limits
        (np.array([0.0, 1.0, -1.0, 100.0]), np.inf),
        (np.zeros(4), np.inf),
    ]
    for p, expected in cases:
        assert box.longest_step(z, p, 2.0) == pytest.approx(expected, rel=1e-15)


def test_line_search_never_tries_beyond_its_longest_step():
    # f = |x|^2 with x0 bounded below by 0.9, from z = (1, 1) along
    # p = 10 (-g): the unit step would take z0 far below the bound, and
    # MAX_OVERSHOOT = 2 below it is z0 = -1.1, at alpha = 2.1 / -p0 (about
    # 0.12). Every trial and the step stay within it, and the step still
    # decreases f.
    box = SmoothBox(*bound_arrays([(0.9, None), (None, None)], 2))
    objective = lbfgs_module._Objective(lambda x: (-float(x @ x), -2.0 * x), box)
    z = np.array([1.0, 1.0])
    f, g = objective(z)
    p = -10.0 * g
    longest = box.longest_step(z, p, lbfgs_module.MAX_OVERSHOOT)
    assert longest == pytest.approx(2.1 / -p[0], rel=1e-12) and longest < 0.5
    step = lbfgs_module._line_search(objective, z, f, g, p)
    assert step is not None and step[1] < f
    assert objective.steps and max(a for a, _ in objective.steps) <= longest + 1e-15
    alpha = (step[0][1] - z[1]) / p[1]  # the step is z + alpha p
    assert 0 < alpha <= longest + 1e-15
    np.testing.assert_allclose(step[0], z + alpha * p, rtol=1e-14)


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


# --------------------------------------------------------------------------- #
# The L-BFGS itself, against independent references


def _maximise(fun, jac):
    """``value_and_grad`` maximising ``-fun``, counting the points evaluated."""
    points = []

    def value_and_grad(x):
        points.append(np.array(x))
        return -fun(x), -np.asarray(jac(x))

    return value_and_grad, points


def _two_loop(pairs, g, initial=None):
    """Textbook two-loop recursion (Nocedal and Wright, Algorithm 7.4): H g,
    with ``H0 = diag(initial)``, or ``gamma I`` of the newest pair (their
    eq. 7.20) when None."""
    q = np.array(g, dtype=np.float64)
    alphas = []
    for s, y in reversed(pairs):
        alpha = (s @ q) / (s @ y)
        q -= alpha * y
        alphas.append(alpha)
    s, y = pairs[-1]
    r = (s @ y) / (y @ y) * q if initial is None else initial * q
    for (s, y), alpha in zip(pairs, reversed(alphas), strict=True):
        beta = (y @ r) / (s @ y)
        r += (alpha - beta) * s
    return r


def _diagonal_hessian(pairs):
    """The diagonal Hessian approximation after ``pairs``, with dense
    matrices: start at ``1 / gamma`` of the first pair; for every pair,
    scale ``B`` so that ``s^T B s = s^T y``, take the BFGS update of the
    Hessian (Nocedal and Wright, eq. 6.19) and keep its diagonal, floored
    at ``1e-12 / gamma`` of that pair."""
    s, y = pairs[0]
    B = np.diag(np.full(s.size, (y @ y) / (s @ y)))
    for s, y in pairs:
        B = B * (s @ y) / (s @ B @ s)
        Bs = B @ s
        B = B - np.outer(Bs, Bs) / (s @ Bs) + np.outer(y, y) / (s @ y)
        B = np.diag(np.maximum(np.diag(B), 1e-12 * (y @ y) / (s @ y)))
    return np.diag(B)


def _spd(n, seed):
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(n, n))
    return A @ A.T / n + 0.1 * np.eye(n), rng.normal(size=n)


@pytest.mark.parametrize("initial", INITIAL)
def test_minimize_lbfgs_reaches_the_minimiser_of_a_convex_quadratic(initial):
    A, b = _spd(50, 3)
    value_and_grad, _ = _maximise(lambda x: 0.5 * x @ A @ x - b @ x,
                                  lambda x: A @ x - b)
    result = minimize_lbfgs(
        value_and_grad, np.zeros(50), max_iter=1000, tol=1e-14, initial=initial
    )
    np.testing.assert_allclose(result.x, np.linalg.solve(A, b), atol=1e-6)
    assert result.converged and "CONVERGENCE" in result.message
    assert len(result.history) == result.n_iter
    # No iteration worsens the objective, and x is the best point.
    assert np.all(np.diff(result.history) >= 0)
    assert result.value == pytest.approx(result.history[-1])


@pytest.mark.parametrize("initial", INITIAL)
@pytest.mark.parametrize("n", [2, 10])
def test_minimize_lbfgs_finds_the_rosenbrock_minimum(n, initial):
    value_and_grad, _ = _maximise(rosen, rosen_der)
    x0 = np.array([-1.2, 1.0]) if n == 2 else np.full(n, -1.2)
    result = minimize_lbfgs(
        value_and_grad, x0, max_iter=500, tol=1e-14, initial=initial
    )
    np.testing.assert_allclose(result.x, np.ones(n), atol=1e-5)
    assert result.converged and result.n_iter < 500
    assert result.value == pytest.approx(0.0, abs=1e-10)


def _initial_diagonal(pairs):
    """H0 of the diagonal initial matrix after ``pairs``: ``t / sqrt(b)``
    with ``y^T H0 y = s^T y`` for the newest pair."""
    root = 1.0 / np.sqrt(_diagonal_hessian(pairs))
    s, y = pairs[-1]
    return (s @ y) / (y @ (root * y)) * root


def _expected_direction(pairs, m, g, initial):
    """H g of the memory after ``pairs`` (it keeps the last ``m``; the
    diagonal has seen them all)."""
    diagonal = None if initial == "scalar" else _initial_diagonal(pairs)
    return _two_loop(pairs[-m:], g, diagonal)


@pytest.mark.parametrize("initial", INITIAL)
def test_direction_equals_the_two_loop_recursion(initial):
    # Random pairs with positive curvature (y = B s, B SPD), more of them
    # than the memory keeps, so that the ring buffer wraps around.
    n, m = 30, 5
    B, _ = _spd(n, 4)
    rng = np.random.default_rng(5)
    memory = _LBFGSMemory(n, m, initial=initial)
    pairs = []
    for k in range(12):
        s = rng.normal(size=n) * rng.uniform(0.1, 3.0)
        y = B @ s + 0.01 * rng.normal(size=n)
        assert s @ y > 0
        assert memory.push(s, y)
        pairs.append((s, y))
        assert len(memory) == min(k + 1, m)
        g = rng.normal(size=n)
        expected = _expected_direction(pairs, m, g, initial)
        np.testing.assert_allclose(
            memory.inverse_hessian_times(g), expected, rtol=1e-10, atol=1e-12
        )
        if initial == "diagonal":
            np.testing.assert_allclose(
                memory.hessian_diagonal, _diagonal_hessian(pairs), rtol=1e-10
            )
            np.testing.assert_allclose(
                memory.initial_diagonal, _initial_diagonal(pairs), rtol=1e-10
            )
            # the secant scaling of gamma I: y^T H0 y = s^T y
            assert y @ (memory.initial_diagonal * y) == pytest.approx(s @ y, rel=1e-12)
        else:
            assert memory.hessian_diagonal is None and memory.initial_diagonal is None
        for scale in (-1.0, 0.5):
            out = np.empty(n)
            result = memory.inverse_hessian_times(g, scale=scale, out=out)
            assert result is out
            np.testing.assert_allclose(out, scale * expected, rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(memory.inverse_hessian_times(g, scale=0.0), 0.0)
    # An empty memory is the identity, and forgets the diagonal.
    memory.reset()
    assert memory.hessian_diagonal is None and memory.initial_diagonal is None
    np.testing.assert_array_equal(memory.inverse_hessian_times(g), g)


def test_the_true_diagonal_of_a_diagonal_hessian_is_kept():
    # On a quadratic with a diagonal Hessian h, y = h s: the scaled update
    # keeps b = h (s^T B s = s^T y, c = 1, and the BFGS terms cancel), and
    # H0 is t / sqrt(h).
    n, m = 12, 4
    rng = np.random.default_rng(21)
    h = np.exp(rng.uniform(-4.0, 4.0, size=n))
    memory = _LBFGSMemory(n, m)
    s = rng.normal(size=n)
    assert memory.push(s, h * s)
    memory.hessian_diagonal[:] = h
    for _ in range(6):
        s = rng.normal(size=n)
        assert memory.push(s, h * s)
        np.testing.assert_allclose(memory.hessian_diagonal, h, rtol=1e-12)
        ratio = memory.initial_diagonal * np.sqrt(h)
        np.testing.assert_allclose(ratio, ratio[0], rtol=1e-12)


def test_diagonal_bfgs_update_against_its_formula():
    rng = np.random.default_rng(22)
    n = 1003  # not a multiple of the kernel's eight partial sums
    b = np.exp(rng.normal(size=n))
    s, y = rng.normal(size=n), rng.normal(size=n)
    y += 3.0 * s  # positive curvature
    sy = float(s @ y)
    c = sy / np.sum(b * s * s)
    expected = c * b - (c * b * s) ** 2 / sy + y**2 / sy
    floor = np.quantile(expected, 0.1)
    updated = b.copy()
    assert diagonal_bfgs_update(updated, s, y, sy, floor) == pytest.approx(c, rel=1e-13)
    np.testing.assert_allclose(updated, np.maximum(expected, floor), rtol=1e-12)
    assert np.count_nonzero(updated == floor) >= n // 10
    empty = np.empty(0)
    assert diagonal_bfgs_update(empty, empty, empty, 1.0, 0.0) == 1.0


@pytest.mark.parametrize(
    "args, match",
    [
        ((np.ones(3), np.ones(2), np.ones(3), 1.0), "the same length"),
        ((np.ones(3), np.ones(3), np.ones(3), 0.0), "sy must be positive"),
        ((np.ones(3), np.zeros(3), np.ones(3), 1.0), "s\\^T B s must be positive"),
        ((-np.ones(3), np.ones(3), np.ones(3), 1.0), "s\\^T B s must be positive"),
    ],
)
def test_diagonal_bfgs_update_rejects_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        diagonal_bfgs_update(*args, 0.0)


def test_diagonal_bfgs_update_refuses_to_update_its_own_pair():
    v = np.ones(4)
    with pytest.raises(ValueError, match="must not share memory"):
        diagonal_bfgs_update(v, v, np.ones(4), 1.0, 0.0)


def test_secant_inverse_sqrt_against_its_formula():
    rng = np.random.default_rng(23)
    n = 1001
    b, y = np.exp(rng.normal(size=n)), rng.normal(size=n)
    out = np.empty(n)
    t = secant_inverse_sqrt(b, y, 2.5, out)
    assert t == pytest.approx(2.5 / np.sum(y**2 / np.sqrt(b)), rel=1e-13)
    np.testing.assert_allclose(out, t / np.sqrt(b), rtol=1e-14)
    assert y @ (out * y) == pytest.approx(2.5, rel=1e-13)
    empty = np.empty(0)
    assert secant_inverse_sqrt(empty, empty, 1.0, empty) == 1.0


@pytest.mark.parametrize(
    "b, y, sy, match",
    [
        (np.ones(3), np.ones(2), 1.0, "the same length"),
        (np.ones(3), np.ones(3), -1.0, "sy must be positive"),
        (np.ones(3), np.zeros(3), 1.0, "positive and finite"),
        (np.zeros(3), np.ones(3), 1.0, "positive and finite"),
    ],
)
def test_secant_inverse_sqrt_rejects_bad_input(b, y, sy, match):
    with pytest.raises(ValueError, match=match):
        secant_inverse_sqrt(b, y, sy, np.empty(3))
    v = np.ones(3)
    with pytest.raises(ValueError, match="must not share memory"):
        secant_inverse_sqrt(v, np.ones(3), 1.0, v)


@pytest.mark.parametrize("initial", INITIAL)
def test_products_kept_from_the_gradients_give_the_same_direction(initial):
    # As in minimize_lbfgs: the direction at g, then the pair with
    # y = g_new - g and both gradients, so that the memory's products with y
    # come from those kept with g; more pairs than the memory keeps.
    n, m = 30, 4
    B, b = _spd(n, 7)
    rng = np.random.default_rng(8)
    memory = _LBFGSMemory(n, m, initial=initial)
    plain = _LBFGSMemory(n, m, initial=initial)
    x = rng.normal(size=n)
    g = B @ x - b
    pairs = []
    for _ in range(10):
        direction = memory.inverse_hessian_times(g, scale=-1.0)
        np.testing.assert_allclose(
            direction, -_expected_direction(pairs, m, g, initial) if pairs else -g,
            rtol=1e-9, atol=1e-12,
        )
        s = 0.5 * direction + 0.1 * rng.normal(size=n)
        g_new = B @ (x + s) - b
        y = g_new - g
        assert memory.push(s, y, gradient=g_new, previous_gradient=g)
        assert plain.push(s, y)
        pairs.append((s, y))
        k = len(memory)
        S = np.array([p[0] for p in pairs[-k:]])
        Y = np.array([p[1] for p in pairs[-k:]])
        order = memory.order
        # s_i^T y_j for i not newer than j, against the pairs.
        sy = memory.sy[np.ix_(order, order)]
        np.testing.assert_allclose(np.triu(sy), np.triu(S @ Y.T), rtol=1e-9, atol=1e-10)
        x, g = x + s, g_new
    np.testing.assert_allclose(
        memory.inverse_hessian_times(g), plain.inverse_hessian_times(g), rtol=1e-9
    )


@pytest.mark.parametrize("initial", INITIAL)
def test_single_precision_memory_gives_the_direction_to_single_precision(initial):
    # The products-kept path of minimize_lbfgs with the pairs stored in
    # float32 (minimize_lbfgs' storage) against the same pairs in float64:
    # the directions agree to about float32's resolution, and are those of
    # the two-loop recursion on the rounded pairs (with the diagonal, which
    # stays in double precision, of the pairs as given).
    n, m = 200, 6
    B, b = _spd(n, 11)
    rng = np.random.default_rng(12)
    single = _LBFGSMemory(n, m, dtype=np.float32, initial=initial)
    double = _LBFGSMemory(n, m, initial=initial)
    assert single.pairs.dtype == np.float32 and double.pairs.dtype == np.float64
    x = rng.normal(size=n)
    g = B @ x - b
    pairs = []
    for _ in range(15):
        direction = single.inverse_hessian_times(g, scale=-1.0)
        reference = double.inverse_hessian_times(g, scale=-1.0)
        assert direction.dtype == np.float64
        scale = np.linalg.norm(reference)
        assert np.linalg.norm(direction - reference) <= 1e-5 * scale
        if pairs:
            rounded = [
                (s.astype(np.float32).astype(float), y.astype(np.float32).astype(float))
                for s, y in pairs[-m:]
            ]
            diagonal = None if initial == "scalar" else _initial_diagonal(pairs)
            expected = -_two_loop(rounded, g, diagonal)
            assert np.linalg.norm(direction - expected) <= 1e-5 * scale
        out = np.empty(n)
        assert single.inverse_hessian_times(g, scale=-1.0, out=out) is out
        np.testing.assert_array_equal(out, direction)
        s = 0.5 * reference + 0.1 * rng.normal(size=n)
        g_new = B @ (x + s) - b
        y = g_new - g
        assert single.push(s, y, gradient=g_new, previous_gradient=g)
        assert double.push(s, y, gradient=g_new, previous_gradient=g)
        pairs.append((s, y))
        x, g = x + s, g_new


def test_memory_rejects_other_storage_and_initial_matrices():
    with pytest.raises(ValueError, match="dtype must be float64 or float32"):
        _LBFGSMemory(4, 2, dtype=np.float16)
    with pytest.raises(ValueError, match="initial must be one of"):
        _LBFGSMemory(4, 2, initial="identity")
    with pytest.raises(ValueError, match="initial must be one of"):
        minimize_lbfgs(lambda x: (0.0, x), np.ones(2), initial="identity")


def _orthogonal(s, r):
    """A vector orthogonal to ``s``, 1000 times longer (so that the rounding
    error of ``s^T y``, about ``eps |s| |y|``, is far below ``eps y^T y``)."""
    y = r - (s @ r) / (s @ s) * s
    return 1e3 * np.linalg.norm(s) / np.linalg.norm(y) * y


@pytest.mark.parametrize(
    "bad_y",
    [
        lambda s, r: r - ((s @ r) / (s @ s) + 1.0) * s,  # s^T y = -s^T s
        _orthogonal,  # s^T y = 0
        # 0 < s^T y = (eps / 2) y^T y: below L-BFGS-B's threshold.
        lambda s, r: _orthogonal(s, r) + 0.5 * np.finfo(float).eps
        * (_orthogonal(s, r) @ _orthogonal(s, r)) / (s @ s) * s,
        lambda s, r: np.full_like(r, np.nan),
    ],
    ids=["negative", "zero", "below-eps", "nan"],
)
def test_a_pair_without_enough_curvature_is_not_stored(bad_y):
    n = 8
    rng = np.random.default_rng(6)
    memory = _LBFGSMemory(n, 3)
    kept = []
    for _ in range(2):
        s = rng.normal(size=n)
        y = s + 0.1 * rng.normal(size=n)
        assert memory.push(s, y)
        kept.append((s, y))
    g = rng.normal(size=n)
    before = memory.inverse_hessian_times(g)
    diagonal = memory.hessian_diagonal.copy()
    s = rng.normal(size=n)
    y = bad_y(s, rng.normal(size=n))
    assert not (s @ y > np.finfo(float).eps * (y @ y))  # the case is as named
    assert not memory.push(s, y)
    assert len(memory) == 2
    np.testing.assert_array_equal(memory.hessian_diagonal, diagonal)
    np.testing.assert_array_equal(memory.inverse_hessian_times(g), before)
    np.testing.assert_allclose(
        before, _expected_direction(kept, 3, g, "diagonal"), rtol=1e-10
    )


def test_max_iter_reached_is_not_convergence():
    value_and_grad, _ = _maximise(rosen, rosen_der)
    result = minimize_lbfgs(value_and_grad, np.full(10, -1.2), max_iter=7, tol=1e-14)
    assert not result.converged
    assert "ITERATIONS REACHED LIMIT" in result.message
    assert result.n_iter == 7 and len(result.history) == 7


def test_callback_once_per_iteration_with_the_point_in_the_box():
    calls = []
    value_and_grad, _ = _maximise(rosen, rosen_der)
    result = minimize_lbfgs(
        value_and_grad, np.array([-1.2, 1.0]), bounds=[(-2.0, 2.0), (None, None)],
        max_iter=300, tol=1e-12,
        callback=lambda i, value, x: calls.append((i, value, x.copy())),
    )
    assert [i for i, _, _ in calls] == list(range(1, result.n_iter + 1))
    assert [v for _, v, _ in calls] == result.history
    for _, value, x in calls:
        assert -2.0 < x[0] < 2.0
        assert value == pytest.approx(-rosen(x), rel=1e-12, abs=1e-300)
    np.testing.assert_array_equal(calls[-1][2], result.x)


def test_minimize_lbfgs_is_deterministic():
    A, b = _spd(20, 7)
    runs = []
    for _ in range(2):
        value_and_grad, points = _maximise(
            lambda x: 0.5 * x @ A @ x - b @ x + np.sum(x**4), lambda x: A @ x - b
            + 4 * x**3,
        )
        runs.append((minimize_lbfgs(value_and_grad, np.ones(20), tol=1e-10), points))
    (a, points_a), (b_, points_b) = runs
    np.testing.assert_array_equal(a.x, b_.x)
    assert a.history == b_.history and a.n_iter == b_.n_iter
    assert len(points_a) == len(points_b)
    # Each point is evaluated once (the line search's value and gradient
    # requests at a point share one evaluation).
    assert len({p.tobytes() for p in points_a}) == len(points_a)


@pytest.mark.parametrize(
    "value, grad, match",
    [
        (np.nan, [1.0, 1.0], "objective is not finite at x0"),
        (-np.inf, [1.0, 1.0], "objective is not finite at x0"),
        (1.0, [np.nan, 1.0], r"gradient is not finite at x0 \(1 of 2"),
        (1.0, [np.inf, -np.inf], r"gradient is not finite at x0 \(2 of 2"),
    ],
)
def test_a_non_finite_objective_at_x0_is_refused(value, grad, match):
    with pytest.raises(ValueError, match=match):
        minimize_lbfgs(lambda x: (value, np.array(grad)), np.zeros(2))


def _cliff(points):
    """Maximise ``-(x - 10)^2`` where it is defined, ``x <= 3``: -inf beyond."""

    def value_and_grad(x):
        points.append(float(x[0]))
        if x[0] > 3.0:
            return -np.inf, np.array([np.nan])
        return -((x[0] - 10.0) ** 2), np.array([-2.0 * (x[0] - 10.0)])

    return value_and_grad


def test_an_infinite_objective_beyond_a_cliff_is_backtracked_from():
    # The supremum is at the edge x = 3, and the unit steps of the first
    # iterations land beyond it (the gradient, 14, is large).
    points = []
    result = minimize_lbfgs(_cliff(points), np.array([2.9]), max_iter=100, tol=1e-10)
    assert any(p > 3.0 for p in points)  # the cliff was hit
    assert 2.999 < result.x[0] <= 3.0
    assert np.isfinite(result.value) and result.value > -((2.9 - 10.0) ** 2)
    assert all(np.isfinite(result.history))
    assert np.all(np.diff(result.history) >= 0)
    assert result.value == max(result.history)


def test_backtracking_takes_over_when_the_wolfe_search_fails(monkeypatch):
    # scipy's line search giving up at every iteration: halving steps still
    # reach the optimum of a quadratic.
    def failing(f, fprime, xk, pk, **kwargs):
        f(xk + pk)  # it evaluates something, then gives up
        return None, 1, 0, None, kwargs.get("old_fval"), None

    monkeypatch.setattr(lbfgs_module, "line_search", failing)
    A, b = _spd(5, 8)
    value_and_grad, _ = _maximise(lambda x: 0.5 * x @ A @ x - b @ x,
                                  lambda x: A @ x - b)
    result = minimize_lbfgs(value_and_grad, np.zeros(5), max_iter=2000, tol=1e-14)
    np.testing.assert_allclose(result.x, np.linalg.solve(A, b), atol=1e-6)
    assert np.all(np.diff(result.history) >= 0)


def test_no_descent_stops_with_a_line_search_failure_at_the_start_point():
    # The gradient has the wrong sign: no step along the supposed ascent
    # direction improves the objective. x0 is returned, not a worse point.
    x0 = np.array([1.0, -2.0])

    def value_and_grad(x):
        return -np.sum(x**2), 2.0 * x

    result = minimize_lbfgs(value_and_grad, x0, max_iter=50)
    assert not result.converged
    assert "line search failed" in result.message
    assert result.n_iter == 0 and result.history == []
    np.testing.assert_array_equal(result.x, x0)
    assert result.value == -5.0


@pytest.mark.parametrize("x0", [np.ones(3), np.zeros(3)])
def test_a_step_that_gains_nothing_is_not_taken_as_convergence(x0):
    # The wrong-sign gradient again, where the shortest halved step still
    # moves the point (in its last bit) but leaves f unchanged: Armijo's
    # margin C1 * alpha * slope is below f's rounding, so f_new == f passed
    # it; the step was taken and the zero change reported as convergence.
    def value_and_grad(x):
        return -float(np.sum((x - 3.0) ** 2)), 2.0 * (x - 3.0)

    result = minimize_lbfgs(value_and_grad, x0, max_iter=50)
    assert not result.converged and "line search failed" in result.message
    assert result.n_iter == 0
    np.testing.assert_array_equal(result.x, x0)
    rounds = minimize_lbfgs_rounds(lambda r, x: value_and_grad, x0, round_size=1,
                                   max_iter=50)
    assert not rounds.converged and "line search failed" in rounds.message
    assert rounds.n_iter == 0
    np.testing.assert_array_equal(rounds.x, x0)


def test_stops_at_the_first_small_relative_change_with_its_floor_of_one():
    # The rule: stop after the first iteration whose change of the objective
    # is at most tol times max(|f_k|, |f_k+1|, 1). Values well below 1 here,
    # where the floor of 1 decides (without it the run went on).
    scale, tol = 1e-3, 1e-6

    def value_and_grad(x):
        return -scale * float(np.sum((x - 1.0) ** 2 * np.arange(1, 6))), (
            -2.0 * scale * (x - 1.0) * np.arange(1, 6)
        )

    x0 = np.zeros(5)
    result = minimize_lbfgs(value_and_grad, x0, tol=tol, max_iter=200)
    assert result.converged and "RELATIVE REDUCTION" in result.message
    values = [value_and_grad(x0)[0]] + list(result.history)
    changes = [
        abs(a - b) / max(abs(a), abs(b), 1.0)
        for a, b in zip(values[:-1], values[1:], strict=True)
    ]
    assert changes[-1] <= tol
    assert all(change > tol for change in changes[:-1])
    assert all(abs(v) < 1 for v in values[-3:])

def test_rounds_return_the_start_with_the_highest_fresh_estimate():
    # Each round's surrogate is the objective plus the round's own offset
    # (a Monte Carlo estimate's error); they drift down after round 2. The
    # point returned is the round start (or the last end, estimated afresh)
    # whose fresh estimate is highest: round 2's start here, not round 0's.
    offsets = [0.0, 3.0, 6.0, -4.0]
    fresh = []

    def make(round_index, x_start):
        shift = offsets[min(round_index, len(offsets) - 1)]

        def value_and_grad(x):
            return -float((x[0] - 1.0) ** 2) + shift, np.array([-2.0 * (x[0] - 1.0)])

        fresh.append((value_and_grad(x_start)[0], float(x_start[0])))
        return value_and_grad

    result = minimize_lbfgs_rounds(
        make, np.array([-3.0]), round_size=1, max_iter=4, tol=1e-12
    )
    best_value, best_x = max(fresh)
    assert [x for _, x in fresh][:3] != [best_x] * 3  # starts that differ
    assert result.x[0] == best_x
    assert result.value == best_value

def test_each_round_evaluates_its_start_once_and_counts_iterations_only():
    # A round's start is needed for its fresh estimate and by its run: one
    # evaluation serves both (the score estimator's importance-weighted
    # evaluation is the costliest step of a round). A round that makes no
    # iteration (here the last, at the optimum) is not counted as one.
    centre = np.array([3.0, -1.0, 0.5, 2.0, 1.0])

    def value_and_grad(x):
        return -float(np.sum((x - centre) ** 2)), -2.0 * (x - centre)

    calls = []

    def make(round_index, x_start):
        def counted(x):
            calls.append((round_index, x.tobytes()))
            return value_and_grad(x)
        return counted

    result = minimize_lbfgs_rounds(make, np.zeros(5), round_size=1, max_iter=100,
                                   tol=1e-12)
    assert result.converged
    assert len(calls) == len(set(calls)), "a point evaluated twice in one round"
    # Where a bound is near, the run's first point taken to the unbounded
    # coordinates and back is not x0 in the last bit: the start must still
    # be evaluated once (an exact comparison with it missed every round).
    starts, points = [], []

    def make_recording(round_index, x_start):
        starts.append(x_start.copy())

        def recorded(x):
            points.append((round_index, x.copy()))
            return value_and_grad(x)
        return recorded

    bounded = minimize_lbfgs_rounds(
        make_recording, np.array([0.51, 0.55, 0.7, 1.5, 1.9]),
        bounds=[(0.5, 2.0)] * 5, round_size=1, max_iter=100, tol=1e-12,
    )
    assert bounded.n_iter > 1
    box = SmoothBox(*bound_arrays([(0.5, 2.0)] * 5, 5))
    n_once = 0
    for r, start in enumerate(starts[:-1]):  # (the last: the end's estimate)
        near = [np.abs(x - start).max() < 1e-12 for k, x in points if k == r]
        assert near[0]
        # (on a bound the run's first point is elsewhere, and evaluated)
        if lbfgs_module._same_to_rounding(box.to_box(box.from_box(start)), start):
            assert not any(near[1:]), f"round {r}'s start evaluated twice"
            n_once += 1
    assert n_once > len(starts) // 2
    n_rounds = max(r for r, _ in calls)  # the last key: the end's estimate
    assert result.n_iter == len(result.history) <= n_rounds


@pytest.mark.parametrize("x0", [3.0, 1.0, 1 - 1e-12, 0.3])
def test_a_given_start_is_used_only_where_the_first_point_is_x0(x0):
    # The run's first point is x0 taken to the unbounded coordinates and
    # back: on or beyond a bound that is another point, whose value a given
    # start (the value at x0) is not; there the point is evaluated, and the
    # value reported is the objective's at the x returned.
    calls = []

    def value_and_grad(x):
        calls.append(x.copy())
        return -float((x[0] - 0.5) ** 2), np.array([-2.0 * (x[0] - 0.5)])

    x0 = np.array([x0])
    start = value_and_grad(x0)
    calls.clear()
    result = minimize_lbfgs(value_and_grad, x0, bounds=[(0.0, 1.0)], max_iter=0,
                            start=start)
    inside = 0.0 < x0[0] < 1.0 - 1e-6
    assert len(calls) == (0 if inside else 1)
    assert result.value == value_and_grad(result.x)[0]
def test_a_zero_gradient_at_x0_converges_without_iterating():
    result = minimize_lbfgs(lambda x: (-np.sum(x**2), -2 * x), np.zeros(3))
    assert result.converged and result.n_iter == 0 and result.history == []
    np.testing.assert_array_equal(result.x, np.zeros(3))


def test_minimize_lbfgs_rounds_on_a_fixed_objective():
    # Every round maximises the same quadratic: the rounds' result is its
    # optimum, with the iterations of every round counted.
    A, b = _spd(8, 9)
    value_and_grad, _ = _maximise(lambda x: 0.5 * x @ A @ x - b @ x,
                                  lambda x: A @ x - b)
    rounds = []

    def make(round_index, x_start):
        rounds.append(round_index)
        return value_and_grad

    result = minimize_lbfgs_rounds(make, np.zeros(8), round_size=3, max_iter=300,
                                   tol=1e-12)
    np.testing.assert_allclose(result.x, np.linalg.solve(A, b), atol=1e-5)
    assert result.converged and rounds == list(range(len(rounds)))
    assert len(rounds) > 1 and len(result.history) <= result.n_iter


def test_minimize_lbfgs_rounds_returns_its_best_fresh_estimate():
    # Round r's surrogate peaks at r + 1 but is 10 r lower everywhere: each
    # round climbs its own surrogate while the fresh estimates at the round
    # starts (-1, -11, -21, ...) fall. The run returned its last, worst
    # point (a score fit of the pseudo-likelihood drifted from -976 to
    # -2829); it returns the best round start, with that estimate.
    def make(round_index, x_start):
        def value_and_grad(x):
            d = x - (round_index + 1)
            return -float(d @ d) - 10.0 * round_index, -2.0 * d
        return value_and_grad

    result = minimize_lbfgs_rounds(make, np.zeros(1), round_size=5, max_iter=40,
                                   tol=1e-12)
    assert result.n_iter >= 10
    np.testing.assert_array_equal(result.x, [0.0])
    assert result.value == -1.0


def test_the_best_point_of_a_failed_wolfe_search_is_taken(monkeypatch):
    # scipy's search evaluates a good point and gives up: that point, if it
    # decreases the objective enough, is the step (no further evaluation).
    def failing(f, fprime, xk, pk, **kwargs):
        f(xk + 0.5 * pk)
        return None, 1, 0, None, kwargs.get("old_fval"), None

    monkeypatch.setattr(lbfgs_module, "line_search", failing)
    A, b = _spd(4, 10)
    value_and_grad, points = _maximise(lambda x: 0.5 * x @ A @ x - b @ x,
                                       lambda x: A @ x - b)
    result = minimize_lbfgs(value_and_grad, np.zeros(4), max_iter=20, tol=0.0)
    assert result.n_iter == 20
    # x0, then one point per iteration, but for the odd iteration where the
    # half step does not decrease the objective enough and is halved again
    # (without that point taken, every iteration evaluates at least two).
    assert len(points) <= 1 + result.n_iter + result.n_iter // 4


def test_the_best_point_evaluated_is_returned(monkeypatch):
    # A line search that accepts a short step after evaluating a better,
    # longer one: the result is the better point, not the last iterate.
    def short_step(f, fprime, xk, pk, **kwargs):
        f(xk + pk)
        alpha = 1e-3
        value = f(xk + alpha * pk)
        return alpha, 2, 0, value, kwargs.get("old_fval"), fprime(xk + alpha * pk)

    monkeypatch.setattr(lbfgs_module, "line_search", short_step)
    values = []

    def value_and_grad(x):
        values.append(-np.sum((x - 1.0) ** 2))
        return values[-1], -2.0 * (x - 1.0)

    result = minimize_lbfgs(value_and_grad, np.zeros(3), max_iter=1)
    assert result.n_iter == 1 and result.value > result.history[-1]
    assert result.value == max(values)
    assert -np.sum((result.x - 1.0) ** 2) == result.value
