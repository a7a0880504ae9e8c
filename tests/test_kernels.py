"""Tests of skgpstruct.kernels against independent NumPy / SciPy references."""

import pickle
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.spatial.distance import cdist
from sklearn.base import BaseEstimator, clone
from sklearn.gaussian_process.kernels import (
    RBF,
    ConstantKernel,
    DotProduct,
    WhiteKernel,
)

from skgpstruct import kernels as kernels_module
from skgpstruct.kernels import (
    KERNELS,
    GroupedLinearKernel,
    Kernel,
    LinearKernel,
    RBFKernel,
    SklearnKernel,
    check_kernel,
    get_kernel,
)

# ---------------------------------------------------------------------------
# References, written independently of the implementation
# ---------------------------------------------------------------------------


def linear_reference(X, Y, variance, bias):
    K = np.empty((X.shape[0], Y.shape[0]))
    for i in range(X.shape[0]):
        for j in range(Y.shape[0]):
            K[i, j] = variance * (np.sum(X[i] * Y[j]) + bias)
    return K


def rbf_reference(X, Y, variance, length_scale):
    length_scale = np.broadcast_to(np.asarray(length_scale, float), (X.shape[1],))
    d2 = cdist(X, Y, "seuclidean", V=length_scale**2) ** 2
    return variance * np.exp(-0.5 * d2)


def random_sparse(rng, n, d, density=0.3, binary=False):
    X = sp.random(n, d, density=density, format="csr", random_state=rng)
    if binary:
        X.data[:] = 1.0
    else:
        X.data = rng.normal(size=X.nnz)
    return X


def formats(X):
    """The same matrix as dense, CSR matrix and CSR array."""
    return {"dense": X, "csr_matrix": sp.csr_matrix(X), "csr_array": sp.csr_array(X)}


def as_format(X, fmt):
    return formats(X)[fmt]


FORMATS = ["dense", "csr_matrix", "csr_array"]

# (id, factory, supports sparse)
KERNEL_CASES = [
    ("linear", lambda: LinearKernel(variance=0.7, bias=1.3), True),
    ("linear-bias-fixed", lambda: LinearKernel(0.7, 0.4, bias_bounds="fixed"), True),
    ("linear-variance-fixed", lambda: LinearKernel(2.0, variance_bounds="fixed"), True),
    ("linear-no-bias", lambda: LinearKernel(1.5, 0.0, bias_bounds="fixed"), True),
    ("rbf", lambda: RBFKernel(variance=1.7, length_scale=1.4), True),
    ("rbf-ls-fixed", lambda: RBFKernel(0.8, 1.1, length_scale_bounds="fixed"), True),
    ("rbf-var-fixed", lambda: RBFKernel(0.8, 1.1, variance_bounds="fixed"), True),
    ("rbf-ard", lambda: RBFKernel(1.2, [0.8, 1.5, 2.0, 1.1]), False),
    (
        "sklearn-c-rbf",
        lambda: SklearnKernel(ConstantKernel(1.3) * RBF(length_scale=1.2)),
        False,
    ),
    (
        "sklearn-ard-white",
        lambda: SklearnKernel(
            RBF(length_scale=[0.9, 1.3, 1.1, 2.0]) * ConstantKernel(0.8)
            + WhiteKernel(0.1)
        ),
        False,
    ),
    (
        "sklearn-dot-fixed",
        lambda: SklearnKernel(
            ConstantKernel(0.5, constant_value_bounds="fixed") * DotProduct(0.7)
        ),
        False,
    ),
]
ALL_CASES = [pytest.param(f, s, id=i) for i, f, s in KERNEL_CASES]
# (factory, sparse input) for every input kind a kernel accepts.
INPUT_CASES = [
    pytest.param(f, sparse, id=f"{i}-{'sparse' if sparse else 'dense'}")
    for i, f, s in KERNEL_CASES
    for sparse in ([False, True] if s else [False])
]


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def data(rng, n_x=7, n_y=5, d=4):
    return rng.normal(size=(n_x, d)), rng.normal(size=(n_y, d))


# ---------------------------------------------------------------------------
# Values
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("fmt_x", FORMATS)
@pytest.mark.parametrize("fmt_y", FORMATS)
def test_linear_values_match_reference(rng, fmt_x, fmt_y):
    X = random_sparse(rng, 7, 6).toarray()
    Y = random_sparse(rng, 5, 6).toarray()
    kernel = LinearKernel(variance=0.6, bias=2.5)
    K = kernel(as_format(X, fmt_x), as_format(Y, fmt_y))
    assert type(K) is np.ndarray and K.shape == (7, 5)
    np.testing.assert_allclose(K, linear_reference(X, Y, 0.6, 2.5), rtol=1e-12)
    K_xx = kernel(as_format(X, fmt_x))
    np.testing.assert_allclose(K_xx, linear_reference(X, X, 0.6, 2.5), rtol=1e-12)
    np.testing.assert_array_equal(K_xx, K_xx.T)


@pytest.mark.parametrize("fmt_x", FORMATS)
@pytest.mark.parametrize("fmt_y", FORMATS)
def test_rbf_values_match_reference(rng, fmt_x, fmt_y):
    X = random_sparse(rng, 7, 6).toarray()
    Y = random_sparse(rng, 5, 6).toarray()
    kernel = RBFKernel(variance=1.5, length_scale=0.9)
    K = kernel(as_format(X, fmt_x), as_format(Y, fmt_y))
    assert type(K) is np.ndarray and K.shape == (7, 5)
    np.testing.assert_allclose(K, rbf_reference(X, Y, 1.5, 0.9), rtol=1e-10)
    K_xx = kernel(as_format(X, fmt_x))
    np.testing.assert_allclose(K_xx, rbf_reference(X, X, 1.5, 0.9), rtol=1e-10)
    np.testing.assert_array_equal(K_xx, K_xx.T)
    np.testing.assert_array_equal(np.diag(K_xx), 1.5)


def test_rbf_ard_matches_reference(rng):
    X, Y = data(rng)
    length_scale = np.array([0.5, 1.0, 2.0, 3.0])
    kernel = RBFKernel(variance=0.9, length_scale=length_scale)
    expected = rbf_reference(X, Y, 0.9, length_scale)
    np.testing.assert_allclose(kernel(X, Y), expected, rtol=1e-10)
    # An ARD kernel with equal length scales is the isotropic kernel.
    np.testing.assert_allclose(
        RBFKernel(0.9, [1.3] * 4)(X, Y), RBFKernel(0.9, 1.3)(X, Y), rtol=1e-12
    )


def test_high_dimensional_sparse_indicators(rng):
    # CRF++-like rows: a few active binary features out of 200,000.
    n_features = 200_000
    rows = [rng.choice(n_features, size=12, replace=False) for _ in range(30)]
    rows += [rows[0]]  # an exact duplicate token
    indptr = np.arange(0, 12 * len(rows) + 1, 12)
    X = sp.csr_matrix(
        (np.ones(indptr[-1]), np.concatenate(rows), indptr),
        shape=(len(rows), n_features),
    )
    # Reference on the compressed set of used columns (never densify all D).
    used = np.unique(X.indices)
    dense = X[:, used].toarray()
    Z = X[:10]
    np.testing.assert_allclose(
        LinearKernel(0.5, 1.0)(X, Z), linear_reference(dense, dense[:10], 0.5, 1.0)
    )
    K = RBFKernel(2.0, 3.0)(X, Z)
    np.testing.assert_allclose(K, rbf_reference(dense, dense[:10], 2.0, 3.0))
    assert K[-1, 0] == 2.0  # identical rows: distance exactly zero


def _with_duplicates(x):
    """``x`` as a CSR matrix storing every entry as two halves (as a COO
    build sums them): the same matrix for scipy, not in canonical form."""
    c = sp.csr_matrix(x)
    data, indices = [], []
    for a, b in zip(c.indptr[:-1], c.indptr[1:], strict=True):
        data.append(np.r_[c.data[a:b], c.data[a:b]] / 2)
        indices.append(np.r_[c.indices[a:b], c.indices[a:b]])
    indptr = np.r_[0, np.cumsum(2 * np.diff(c.indptr))]
    out = sp.csr_matrix(
        (np.concatenate(data), np.concatenate(indices), indptr), shape=c.shape
    )
    out.has_canonical_format = False
    return out


def test_sparse_input_formats_and_duplicates(rng):
    X = random_sparse(rng, 6, 5)
    dense = X.toarray()
    expected = rbf_reference(dense, dense, 1.0, 1.0)
    kernel = RBFKernel()
    for variant in (X.tocoo(), X.tocsc()):
        np.testing.assert_allclose(kernel(variant), expected, rtol=1e-10)
    X32 = X.astype(np.float32)
    dense32 = X32.toarray().astype(np.float64)
    np.testing.assert_allclose(
        kernel(X32), rbf_reference(dense32, dense32, 1.0, 1.0), rtol=1e-10
    )
    # Non-canonical CSR: entries split in duplicates that must be summed.
    duplicated = _with_duplicates(X)
    np.testing.assert_allclose(duplicated.toarray(), dense)
    np.testing.assert_allclose(kernel(duplicated), expected, rtol=1e-10)
    np.testing.assert_allclose(kernel.diag(duplicated), 1.0)
    np.testing.assert_allclose(
        LinearKernel().diag(duplicated), np.sum(dense**2, axis=1) + 1.0
    )


@pytest.mark.parametrize("fmt", FORMATS)
def test_all_zero_and_empty_inputs(fmt):
    Z = np.zeros((3, 4))
    for kernel in (LinearKernel(2.0, 0.5), RBFKernel(2.0, 0.5)):
        expected = np.full((3, 2), 1.0 if isinstance(kernel, LinearKernel) else 2.0)
        np.testing.assert_array_equal(
            kernel(as_format(Z, fmt), as_format(Z[:2], fmt)), expected
        )
        assert kernel(as_format(Z[:0], fmt), as_format(Z, fmt)).shape == (0, 3)
        assert kernel.diag(as_format(Z[:0], fmt)).shape == (0,)


@pytest.mark.parametrize(("factory", "supports_sparse"), ALL_CASES)
def test_no_rows_give_empty_matrices(rng, factory, supports_sparse):
    # Every kernel, scikit-learn's wrapped ones included (their stationary
    # kernels gave a (1, 1) matrix for no rows).
    X, _ = data(rng)
    kernel = factory()
    assert kernel(X[:0]).shape == (0, 0)
    assert kernel(X[:0], X).shape == (0, X.shape[0])
    assert kernel(X, X[:0]).shape == (X.shape[0], 0)
    assert kernel.diag(X[:0]).shape == (0,)


def test_integer_and_list_inputs(rng):
    X = rng.integers(0, 2, size=(4, 3))
    np.testing.assert_allclose(
        LinearKernel()(X.tolist()), linear_reference(X.astype(float), X, 1.0, 1.0)
    )


@pytest.mark.parametrize(("factory", "supports_sparse"), ALL_CASES)
def test_diag_matches_full_matrix(rng, factory, supports_sparse):
    X, _ = data(rng)
    kernel = factory()
    diag = kernel.diag(X)
    assert diag.shape == (X.shape[0],)
    np.testing.assert_allclose(diag, np.diag(kernel(X)), rtol=1e-12)
    if supports_sparse:
        Xs = sp.csr_matrix(X)
        np.testing.assert_allclose(kernel.diag(Xs), diag, rtol=1e-12)
        np.testing.assert_allclose(kernel(Xs), kernel(X), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(("factory", "supports_sparse"), ALL_CASES)
def test_kernel_matrices_are_psd(factory, supports_sparse):
    rng = np.random.default_rng(3)
    # Duplicated rows make the matrix singular, the hardest case.
    X = rng.normal(size=(25, 4))
    X = np.vstack([X, X[:5]])
    kernel = factory()
    inputs = [X, sp.csr_matrix(X)] if supports_sparse else [X]
    for Xi in inputs:
        K = kernel(Xi)
        np.testing.assert_array_equal(K, K.T)
        eigenvalues = np.linalg.eigvalsh(K)
        assert eigenvalues.min() >= -1e-10 * np.abs(eigenvalues).max()


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 8),
    d=st.integers(1, 6),
    density=st.floats(0.0, 1.0),
    variance=st.floats(0.1, 10.0),
    length_scale=st.floats(0.1, 10.0),
)
def test_dense_and_sparse_agree_property(seed, n, d, density, variance, length_scale):
    rng = np.random.default_rng(seed)
    X = random_sparse(rng, n, d, density=density)
    Y = random_sparse(rng, 3, d, density=density)
    for kernel in (LinearKernel(variance, 0.5), RBFKernel(variance, length_scale)):
        np.testing.assert_allclose(
            kernel(X, Y), kernel(X.toarray(), Y.toarray()), rtol=1e-9, atol=1e-12
        )
        K = kernel(X)
        assert np.all(np.linalg.eigvalsh(K) >= -1e-10 * max(1.0, np.abs(K).max()))


# ---------------------------------------------------------------------------
# Gradients against central finite differences
# ---------------------------------------------------------------------------


def finite_difference(function, theta, step=1e-6):
    grad = np.empty_like(theta)
    for p in range(theta.size):
        up, down = theta.copy(), theta.copy()
        up[p] += step
        down[p] -= step
        grad[p] = (function(up) - function(down)) / (2 * step)
    return grad


@pytest.mark.parametrize("with_y", [False, True], ids=["Y=None", "Y"])
@pytest.mark.parametrize(("factory", "sparse"), INPUT_CASES)
def test_gradient_vjp_matches_finite_differences(rng, factory, sparse, with_y):
    X, Y = data(rng)
    if sparse:
        X, Y = sp.csr_matrix(X), sp.csr_matrix(Y)
    Y = Y if with_y else None
    kernel = factory()
    theta = kernel.theta
    G = rng.normal(size=(X.shape[0], X.shape[0] if Y is None else Y.shape[0]))
    grad = kernel.gradient_vjp(X, Y, G)
    assert grad.shape == (kernel.n_dims,)

    def objective(t):
        return np.sum(G * kernel.clone_with_theta(t)(X, Y))

    expected = finite_difference(objective, theta)
    np.testing.assert_allclose(grad, expected, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(kernel.theta, theta)  # not modified


@pytest.mark.parametrize(("factory", "sparse"), INPUT_CASES)
def test_diag_gradient_vjp_matches_finite_differences(rng, factory, sparse):
    X, _ = data(rng)
    X = sp.csr_matrix(X) if sparse else X
    kernel = factory()
    g = rng.normal(size=X.shape[0])
    grad = kernel.diag_gradient_vjp(X, g)
    assert grad.shape == (kernel.n_dims,)

    def objective(t):
        return g @ kernel.clone_with_theta(t).diag(X)

    expected = finite_difference(objective, kernel.theta)
    np.testing.assert_allclose(grad, expected, rtol=1e-6, atol=1e-7)


def test_gradient_vjp_with_everything_fixed(rng):
    X, Y = data(rng)
    kernel = LinearKernel(variance_bounds="fixed", bias_bounds="fixed")
    assert kernel.n_dims == 0
    assert kernel.gradient_vjp(X, Y, np.ones((7, 5))).shape == (0,)
    assert kernel.diag_gradient_vjp(X, np.ones(7)).shape == (0,)
    assert kernel.bounds.shape == (0, 2)
    assert kernel.hyperparameter_names == []


@pytest.mark.parametrize(
    "sk_kernel",
    [
        ConstantKernel(1.3) * RBF(length_scale=[0.9, 1.3, 1.1, 2.0])
        + WhiteKernel(0.1),
        ConstantKernel(0.5) * DotProduct(0.7) + WhiteKernel(0.2),
    ],
    ids=["stationary", "non-stationary"],
)
def test_sklearn_blocked_gradients_match_unblocked(rng, monkeypatch, sk_kernel):
    X, Y = data(rng, n_x=11, n_y=9)
    kernel = SklearnKernel(sk_kernel)
    G_xx = rng.normal(size=(11, 11))
    G_xy = rng.normal(size=(11, 9))
    g = rng.normal(size=11)
    whole = (
        kernel.gradient_vjp(X, None, G_xx),
        kernel.gradient_vjp(X, Y, G_xy),
        kernel.diag_gradient_vjp(X, g),
    )
    # Force blocks of a few rows.
    budget = 8 * kernel.n_dims * 25  # blocks of 5 stacked rows
    monkeypatch.setattr(kernels_module, "_SKLEARN_GRADIENT_BYTES", budget)
    monkeypatch.setattr(kernels_module, "_SKLEARN_DIAG_BLOCK_ROWS", 3)
    assert kernel._block_rows() == 5
    blocked = (
        kernel.gradient_vjp(X, None, G_xx),
        kernel.gradient_vjp(X, Y, G_xy),
        kernel.diag_gradient_vjp(X, g),
    )
    for b, w in zip(blocked, whole, strict=True):
        np.testing.assert_allclose(b, w, rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------------------
# scikit-learn adapter
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sk_kernel",
    [RBF(length_scale=0.7) * ConstantKernel(2.0), ConstantKernel() * RBF()],
)
def test_sklearn_kernel_matches_sklearn(rng, sk_kernel):
    X, Y = data(rng)
    kernel = SklearnKernel(sk_kernel)
    np.testing.assert_allclose(kernel(X, Y), sk_kernel(X, Y))
    np.testing.assert_allclose(kernel(X), sk_kernel(X))
    np.testing.assert_allclose(kernel.diag(X), sk_kernel.diag(X))
    np.testing.assert_array_equal(kernel.theta, sk_kernel.theta)
    np.testing.assert_array_equal(kernel.bounds, sk_kernel.bounds)
    # The symmetric gradient is sklearn's own Jacobian contracted with G.
    G = rng.normal(size=(7, 7))
    _, jacobian = sk_kernel(X, eval_gradient=True)
    np.testing.assert_allclose(
        kernel.gradient_vjp(X, None, G), np.einsum("ij,ijp->p", G, jacobian)
    )


def test_sklearn_kernel_refuses_sparse(rng):
    X, Y = data(rng)
    kernel = SklearnKernel(ConstantKernel() * RBF())
    Xs = sp.csr_matrix(X)
    for call in (
        lambda: kernel(Xs),
        lambda: kernel(X, sp.csr_matrix(Y)),
        lambda: kernel.diag(Xs),
        lambda: kernel.gradient_vjp(Xs, None, np.ones((7, 7))),
        lambda: kernel.diag_gradient_vjp(Xs, np.ones(7)),
    ):
        with pytest.raises(ValueError, match="dense"):
            call()


def test_sklearn_kernel_names_and_theta():
    sk_kernel = ConstantKernel(2.0, constant_value_bounds="fixed") * RBF([1.0, 2.0])
    kernel = SklearnKernel(sk_kernel)
    assert kernel.hyperparameter_names == ["k2__length_scale[0]", "k2__length_scale[1]"]
    kernel.theta = np.log([3.0, 4.0])
    np.testing.assert_allclose(sk_kernel.k2.length_scale, [3.0, 4.0])
    clone_ = kernel.clone_with_theta(np.log([5.0, 6.0]))
    np.testing.assert_allclose(sk_kernel.k2.length_scale, [3.0, 4.0])
    np.testing.assert_allclose(clone_.kernel.k2.length_scale, [5.0, 6.0])
    with pytest.raises(ValueError, match="shape"):
        kernel.theta = [1.0]
    with pytest.raises(ValueError, match="sklearn.gaussian_process"):
        SklearnKernel("rbf").theta  # noqa: B018


# ---------------------------------------------------------------------------
# Hyperparameters, parameters and specifications
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(("factory", "supports_sparse"), ALL_CASES)
def test_theta_round_trip_and_bounds(factory, supports_sparse):
    kernel = factory()
    theta = kernel.theta
    assert theta.shape == (kernel.n_dims,)
    assert kernel.bounds.shape == (kernel.n_dims, 2)
    assert len(kernel.hyperparameter_names) == kernel.n_dims
    assert np.all(kernel.bounds[:, 0] <= theta)
    assert np.all(theta <= kernel.bounds[:, 1])
    new_theta = theta + np.linspace(-0.3, 0.4, theta.size)
    kernel.theta = new_theta
    np.testing.assert_allclose(kernel.theta, new_theta, rtol=1e-13)
    # The same values through clone_with_theta, leaving the original alone.
    clone_ = factory().clone_with_theta(new_theta)
    np.testing.assert_allclose(clone_.theta, new_theta, rtol=1e-13)


def test_theta_maps_to_hyperparameters():
    kernel = LinearKernel(variance=2.0, bias=0.5, bias_bounds=(0.1, 10.0))
    assert kernel.hyperparameter_names == ["variance", "bias"]
    np.testing.assert_allclose(kernel.theta, np.log([2.0, 0.5]))
    np.testing.assert_allclose(kernel.bounds, np.log([[1e-5, 1e5], [0.1, 10.0]]))
    kernel.theta = np.log([3.0, 0.25])
    assert kernel.variance == pytest.approx(3.0)
    assert kernel.bias == pytest.approx(0.25)
    assert isinstance(kernel.variance, float)

    fixed = RBFKernel(variance=2.0, length_scale=0.5, variance_bounds="fixed")
    assert fixed.hyperparameter_names == ["length_scale"]
    fixed.theta = [np.log(4.0)]
    assert fixed.variance == 2.0
    assert fixed.length_scale == pytest.approx(4.0)

    ard = RBFKernel(length_scale=[1.0, 2.0], length_scale_bounds=[[0.1, 5], [1, 3]])
    names = ["variance", "length_scale[0]", "length_scale[1]"]
    assert ard.hyperparameter_names == names
    np.testing.assert_allclose(ard.bounds[1:], np.log([[0.1, 5], [1, 3]]))
    ard.theta = np.log([1.0, 3.0, 4.0])
    np.testing.assert_allclose(ard.length_scale, [3.0, 4.0])


def test_clone_with_theta_leaves_original_unchanged():
    kernel = RBFKernel(variance=1.5, length_scale=0.3)
    other = kernel.clone_with_theta(np.log([2.0, 5.0]))
    assert other is not kernel
    assert (kernel.variance, kernel.length_scale) == (1.5, 0.3)
    assert other.variance == pytest.approx(2.0)
    assert other.length_scale == pytest.approx(5.0)


class _Holder(BaseEstimator):
    def __init__(self, kernel="linear"):
        self.kernel = kernel


@pytest.mark.parametrize(
    "kernel",
    [
        RBFKernel(1.5, 0.3, length_scale_bounds="fixed"),
        LinearKernel(bias=0.0, bias_bounds="fixed"),
        RBFKernel(length_scale=np.array([1.0, 2.0])),
        SklearnKernel(ConstantKernel() * RBF()),
    ],
    ids=repr,
)
def test_sklearn_clone_of_holder(kernel):
    holder = _Holder(kernel=kernel)
    cloned = clone(holder)
    assert cloned.kernel is not kernel
    assert type(cloned.kernel) is type(kernel)
    np.testing.assert_array_equal(cloned.kernel.theta, kernel.theta)
    cloned.kernel.theta = cloned.kernel.theta + 1.0
    assert not np.allclose(cloned.kernel.theta, kernel.theta)
    assert repr(clone(holder).kernel) == repr(kernel)
    assert clone(holder).kernel == kernel
    restored = pickle.loads(pickle.dumps(kernel))
    assert repr(restored) == repr(kernel)
    assert restored == kernel


def test_kernels_compare_by_class_and_parameters():
    assert RBFKernel(1.5, 0.3) == RBFKernel(variance=1.5, length_scale=0.3)
    assert RBFKernel(1.5, 0.3) != RBFKernel(1.5, 0.4)
    assert RBFKernel(length_scale=[1.0, 2.0]) == RBFKernel(
        length_scale=np.array([1.0, 2.0])
    )
    assert RBFKernel(length_scale=[1.0, 2.0]) != RBFKernel(length_scale=[1.0, 3.0])
    assert RBFKernel(length_scale=[1.0, 2.0]) != RBFKernel(length_scale=[1.0])
    assert LinearKernel(bias_bounds="fixed") != LinearKernel()
    assert LinearKernel() != RBFKernel()  # another class, whatever the values
    grouped = GroupedLinearKernel([0, 0, 1], variance=[2.0, 0.5])
    assert grouped == GroupedLinearKernel(np.array([0, 0, 1]), variance=[2.0, 0.5])
    assert grouped != GroupedLinearKernel([0, 1, 1], variance=[2.0, 0.5])
    wrapped = SklearnKernel(ConstantKernel(2.0) * RBF(1.0))
    assert wrapped == SklearnKernel(ConstantKernel(2.0) * RBF(1.0))
    assert wrapped != SklearnKernel(ConstantKernel(2.0) * RBF(3.0))
    assert RBFKernel() != "RBFKernel()"
    with pytest.raises(TypeError, match="unhashable"):
        hash(RBFKernel())  # equal kernels would need equal hashes


def test_get_params_set_params():
    kernel = LinearKernel(variance=2.0)
    assert kernel.get_params() == {
        "variance": 2.0,
        "bias": 1.0,
        "variance_bounds": (1e-5, 1e5),
        "bias_bounds": (1e-5, 1e5),
    }
    assert kernel.set_params(bias=0.5, bias_bounds="fixed") is kernel
    assert kernel.hyperparameter_names == ["variance"]
    with pytest.raises(ValueError, match="invalid parameter 'length_scale'"):
        kernel.set_params(length_scale=1.0)
    wrapped = SklearnKernel(ConstantKernel(2.0) * RBF(1.0))
    params = wrapped.get_params(deep=True)
    assert params["kernel__k2__length_scale"] == 1.0
    wrapped.set_params(kernel__k2__length_scale=3.0)
    assert wrapped.kernel.k2.length_scale == 3.0
    assert set(wrapped.get_params(deep=False)) == {"kernel"}


def test_repr():
    assert repr(RBFKernel(variance=1.5, length_scale=0.3)) == (
        "RBFKernel(variance=1.5, length_scale=0.3)"
    )
    assert repr(LinearKernel(bias=0.0, bias_bounds="fixed")) == (
        "LinearKernel(variance=1, bias=0, bias_bounds='fixed')"
    )
    assert repr(RBFKernel(length_scale=[1.0, 2.5])) == (
        "RBFKernel(variance=1, length_scale=[1, 2.5])"
    )
    assert repr(SklearnKernel(RBF(2.0))) == "SklearnKernel(kernel=RBF(length_scale=2))"


def test_get_kernel():
    assert set(KERNELS) == {"linear", "rbf"}
    assert isinstance(get_kernel("linear"), LinearKernel)
    assert isinstance(get_kernel("rbf"), RBFKernel)
    assert get_kernel("rbf") is not get_kernel("rbf")
    user = RBFKernel(variance=2.0)
    copied = get_kernel(user)
    assert copied is not user and repr(copied) == repr(user)
    copied.theta = [0.0, 0.0]
    assert user.variance == 2.0
    sk_kernel = ConstantKernel(2.0) * RBF(1.0)
    wrapped = get_kernel(sk_kernel)
    assert isinstance(wrapped, SklearnKernel) and wrapped.kernel is not sk_kernel
    wrapped.theta = [0.0, 0.0]
    assert sk_kernel.k1.constant_value == 2.0
    with pytest.raises(ValueError, match=r"unknown kernel 'poly'.*'linear', 'rbf'"):
        get_kernel("poly")
    for bad in (None, 3):
        with pytest.raises(ValueError, match="kernel must be one of"):
            get_kernel(bad)
    # A class for an instance: said as get_likelihood says it ("got ABCMeta").
    for cls in (RBFKernel, RBF):
        with pytest.raises(ValueError, match=f"kernel must be a kernel instance, "
                           f"got the class {cls.__name__}; pass {cls.__name__}"):
            get_kernel(cls)


def test_check_kernel_refuses_a_start_outside_the_bounds():
    # The optimiser clipped it, the hyperprior stayed centred outside the
    # bounds, and the fit ended at a bound (LinearKernel(variance=1e9)).
    from skgpstruct import GPStructClassifier
    from skgpstruct.datasets import make_sequences
    from skgpstruct.kernels import GroupedLinearKernel

    with pytest.raises(ValueError, match=r"variance=1e\+09 lies outside "
                       r"variance_bounds \(1e-05, 1e\+05\)"):
        check_kernel(LinearKernel(variance=1e9), sparse=False)
    with pytest.raises(ValueError, match=r"length_scale=1e-08 lies outside"):
        check_kernel(RBFKernel(length_scale=1e-8), sparse=False)
    with pytest.raises(ValueError, match=r"variance\[1\]=1e\+07 lies outside"):
        check_kernel(GroupedLinearKernel(groups=[0, 1], variance=[1, 1e7]),
                     sparse=False)
    with pytest.raises(ValueError, match=r"length_scale=1e-09 lies outside"):
        check_kernel(RBF(length_scale=1e-9), sparse=False)
    # at a bound (where a fit may end) and inside it: accepted
    check_kernel(LinearKernel(variance=1e5), sparse=False)
    check_kernel(LinearKernel(variance=1e9, variance_bounds="fixed"), sparse=False)
    X, y = make_sequences(n_sequences=5, random_state=0)
    with pytest.raises(ValueError, match="lies outside variance_bounds"):
        GPStructClassifier(kernel=LinearKernel(variance=1e9)).fit(X, y)


def test_check_kernel():
    assert isinstance(check_kernel("rbf", sparse=True), RBFKernel)
    assert isinstance(check_kernel(RBF(), sparse=False), SklearnKernel)
    with pytest.raises(ValueError, match="scikit-learn kernel.*sparse"):
        check_kernel(RBF(), sparse=True)
    with pytest.raises(ValueError, match="ARD"):
        check_kernel(RBFKernel(length_scale=[1.0, 2.0]), sparse=True)
    with pytest.raises(ValueError, match="variance must be finite and > 0"):
        check_kernel(LinearKernel(variance=-1.0), sparse=False)
    with pytest.raises(ValueError, match="bias must be finite and > 0"):
        check_kernel(LinearKernel(bias=0.0), sparse=False)
    with pytest.raises(ValueError, match="bias_bounds must be 'fixed' or a pair"):
        check_kernel(LinearKernel(bias_bounds="free"), sparse=False)
    with pytest.raises(ValueError, match="0 < low < high"):
        check_kernel(RBFKernel(length_scale_bounds=(0.0, 1.0)), sparse=False)
    # Equal bounds failed inside the optimiser ("bounds must have low < high
    # on every coordinate"); "fixed" is the way to hold a hyperparameter.
    with pytest.raises(ValueError, match=r"variance_bounds must satisfy 0 < low "
                       r"< high .* 'fixed' holds variance at its value"):
        check_kernel(LinearKernel(variance_bounds=(1.0, 1.0)), sparse=False)
    with pytest.raises(ValueError, match=r"array of shape \(2, 2\)"):
        check_kernel(
            RBFKernel(length_scale=[1.0, 2.0], length_scale_bounds=[1, 2, 3]),
            sparse=False,
        )


@pytest.mark.parametrize(
    "bounds",
    [(1.0, 0.5), (1.0, 1.0), (0.0, 1.0), (-1.0, 1.0), (1e-5, np.inf), (np.nan, 1.0),
     np.array([[1e-5, 1e5], [2.0, 1.0]]), np.array([[1e-5, 1e5], [1e-5, np.nan]])],
)
def test_bounds_outside_zero_low_high_are_refused(bounds):
    # One pair for every group, or a row per group: checked the same way.
    from skgpstruct.kernels import GroupedLinearKernel

    kernel = GroupedLinearKernel([0, 1, 1], variance_bounds=bounds)
    with pytest.raises(ValueError, match="variance_bounds must satisfy 0 < low"):
        kernel.clone_with_theta(np.zeros(3))


def test_a_pair_of_bounds_is_every_groups_bounds():
    from skgpstruct.kernels import GroupedLinearKernel

    kernel = GroupedLinearKernel([0, 1, 2], variance_bounds=(0.1, 10.0))
    np.testing.assert_allclose(
        kernel.bounds, np.log([[0.1, 10.0]] * 3 + [[1e-5, 1e5]])
    )


# ---------------------------------------------------------------------------
# Input validation
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(("factory", "supports_sparse"), ALL_CASES)
def test_input_errors(rng, factory, supports_sparse):
    kernel = factory()
    X = rng.normal(size=(4, 4))
    with pytest.raises(ValueError, match="X and Y must have the same number"):
        kernel(X, rng.normal(size=(3, 5)))
    with pytest.raises(ValueError, match="X with 4 and Y with 5"):
        kernel.gradient_vjp(X, rng.normal(size=(3, 5)), np.ones((4, 3)))
    with pytest.raises(ValueError, match="X must be a 2-D matrix"):
        kernel(np.ones(4))
    with pytest.raises(ValueError, match=r"G must have shape \(4, 4\)"):
        kernel.gradient_vjp(X, None, np.ones((4, 3)))
    with pytest.raises(ValueError, match=r"g must have shape \(4,\)"):
        kernel.diag_gradient_vjp(X, np.ones(3))
    with pytest.raises(ValueError, match="theta must have shape"):
        kernel.theta = np.zeros(kernel.n_dims + 1)


def test_ard_errors(rng):
    kernel = RBFKernel(length_scale=[1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="3 entries .* 4 features"):
        kernel(rng.normal(size=(3, 4)))
    with pytest.raises(ValueError, match="ARD.*dense"):
        kernel(sp.csr_matrix(rng.normal(size=(3, 3))))


def test_kernel_is_abstract():
    with pytest.raises(TypeError):
        Kernel()


# --------------------------------------------------------------------------
# GroupedLinearKernel
def _grouped_reference(X, Y, groups, variance, bias):
    """sum_g variance_g x_g . y_g + bias, by explicit loops."""
    X, Y = np.asarray(X), np.asarray(Y)
    K = np.full((X.shape[0], Y.shape[0]), float(bias))
    for i in range(X.shape[0]):
        for j in range(Y.shape[0]):
            for d in range(X.shape[1]):
                K[i, j] += variance[groups[d]] * X[i, d] * Y[j, d]
    return K


@pytest.mark.parametrize("sparse", [False, True])
def test_grouped_linear_values_gradients_and_feature_map(sparse):
    from skgpstruct.kernels import GroupedLinearKernel

    rng = np.random.default_rng(0)
    groups = np.array([0, 1, 1, 2, 0, 2])
    variance = np.array([0.5, 2.0, 1.5])
    Xd = rng.normal(size=(4, 6)) * (rng.random((4, 6)) < 0.6)
    Yd = rng.normal(size=(3, 6)) * (rng.random((3, 6)) < 0.6)
    X = sp.csr_matrix(Xd) if sparse else Xd
    Y = sp.csr_matrix(Yd) if sparse else Yd
    kernel = GroupedLinearKernel(groups, variance=variance, bias=0.3)
    np.testing.assert_allclose(
        kernel(X, Y), _grouped_reference(Xd, Yd, groups, variance, 0.3), rtol=1e-12
    )
    np.testing.assert_allclose(kernel.diag(X), np.diag(kernel(X)), rtol=1e-12)
    # The explicit feature map reproduces the kernel.
    scales = kernel.feature_scales(6)
    phi_x = np.hstack([Xd, np.ones((4, 1))]) * scales
    phi_y = np.hstack([Yd, np.ones((3, 1))]) * scales
    np.testing.assert_allclose(phi_x @ phi_y.T, kernel(X, Y), rtol=1e-12)
    # Gradients against central finite differences in theta.
    G = rng.normal(size=(4, 3))
    g = rng.normal(size=4)
    d_scales = rng.normal(size=7)
    theta = kernel.theta
    h = 1e-6
    for i in range(theta.size):
        step = np.zeros_like(theta)
        step[i] = h
        plus, minus = kernel.clone_with_theta(theta + step), kernel.clone_with_theta(
            theta - step
        )
        fd = (np.sum(G * plus(X, Y)) - np.sum(G * minus(X, Y))) / (2 * h)
        np.testing.assert_allclose(kernel.gradient_vjp(X, Y, G)[i], fd, rtol=1e-6)
        fd_sym = (
            np.sum(np.outer(g, g) * plus(X)) - np.sum(np.outer(g, g) * minus(X))
        ) / (2 * h)
        np.testing.assert_allclose(
            kernel.gradient_vjp(X, None, np.outer(g, g))[i], fd_sym, rtol=1e-6
        )
        fd_diag = (g @ plus.diag(X) - g @ minus.diag(X)) / (2 * h)
        np.testing.assert_allclose(
            kernel.diag_gradient_vjp(X, g)[i], fd_diag, rtol=1e-6
        )
        fd_scales = (
            d_scales @ plus.feature_scales(6) - d_scales @ minus.feature_scales(6)
        ) / (2 * h)
        np.testing.assert_allclose(
            kernel.feature_scales_vjp(d_scales)[i], fd_scales, rtol=1e-6
        )


def test_linear_feature_map_matches_kernel_and_gradient():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(3, 5))
    kernel = LinearKernel(variance=1.7, bias=0.4)
    scales = kernel.feature_scales(5)
    phi = np.hstack([X, np.ones((3, 1))]) * scales
    np.testing.assert_allclose(phi @ phi.T, kernel(X), rtol=1e-12)
    d_scales = rng.normal(size=6)
    h = 1e-6
    for i in range(2):
        step = np.zeros(2)
        step[i] = h
        fd = (
            d_scales @ kernel.clone_with_theta(kernel.theta + step).feature_scales(5)
            - d_scales @ kernel.clone_with_theta(kernel.theta - step).feature_scales(5)
        ) / (2 * h)
        np.testing.assert_allclose(
            kernel.feature_scales_vjp(d_scales)[i], fd, rtol=1e-6
        )


@pytest.mark.parametrize("grouped", [False, True])
def test_feature_map_of_some_columns_is_the_whole_designs_there(grouped):
    # Inducing features over the active columns of a wide design (hashed
    # features) ask the linear kernels for those columns' scales and the VJP
    # of a gradient on them: the same as the whole design's with the other
    # columns' gradient zero, at the cost of the columns asked for.
    rng = np.random.default_rng(5)
    n, columns = 9, np.array([1, 4, 5, 8])
    groups = np.array([3, 0, 3, 1, 0, 1, 1, 3, 0])
    kernel = (
        GroupedLinearKernel(groups, variance=[0.5, 2.0, 1.5], bias=0.3)
        if grouped else LinearKernel(variance=1.7, bias=0.4)
    )
    # Closed form: a column's scale is the square root of its group's
    # variance (ids 0, 1, 3 in increasing order), the offset's of the bias
    # (times the variance for LinearKernel).
    if grouped:
        variance = np.array([0.5, 2.0, 1.5])[np.searchsorted([0, 1, 3], groups)]
        expected = np.sqrt(np.append(variance[columns], 0.3))
    else:
        expected = np.sqrt(np.append(np.full(columns.size, 1.7), 1.7 * 0.4))
    np.testing.assert_allclose(kernel._column_scales(n, columns), expected, rtol=1e-15)
    d_scales = rng.normal(size=columns.size + 1)
    # The VJP against central finite differences in theta.
    def projected(theta):
        return d_scales @ kernel.clone_with_theta(theta)._column_scales(n, columns)

    h = 1e-6
    for i in range(kernel.theta.size):
        step = np.zeros_like(kernel.theta)
        step[i] = h
        fd = (projected(kernel.theta + step) - projected(kernel.theta - step)) / (2 * h)
        np.testing.assert_allclose(
            kernel._column_scales_vjp(d_scales, n, columns)[i], fd, rtol=1e-6
        )
    whole = kernel.feature_scales(n)
    np.testing.assert_array_equal(
        kernel._column_scales(n, columns), np.append(whole[columns], whole[-1])
    )
    spread = np.zeros(n + 1)
    spread[columns], spread[-1] = d_scales[:-1], d_scales[-1]
    np.testing.assert_allclose(
        kernel._column_scales_vjp(d_scales, n, columns),
        kernel.feature_scales_vjp(spread), rtol=1e-13,
    )
    if grouped:
        with pytest.raises(ValueError, match="groups has 9 entries but X has 8"):
            kernel._column_scales(8, columns)


def test_grouped_linear_refuses_bad_groups():
    from skgpstruct.kernels import GroupedLinearKernel

    X = np.ones((2, 3))
    with pytest.raises(ValueError, match="groups has 2 entries"):
        GroupedLinearKernel([0, 1])(X)
    for bad in ([0.5, 1.0, 2.0], [], [[0, 1, 1]]):
        with pytest.raises(ValueError, match="groups must hold one non-negative "
                           "integer group index per feature, got an array"):
            GroupedLinearKernel(bad)(X)
    with pytest.raises(ValueError, match="groups must hold non-negative group "
                       "indices, got -1 at position 1"):
        GroupedLinearKernel([0, -1, 1])(X)
    with pytest.raises(ValueError, match="one per distinct value of groups"):
        GroupedLinearKernel([0, 1, 1], variance=[1.0, 2.0, 3.0])(X)


def test_grouped_linear_group_ids_are_labels():
    # Ids are labels: a kernel with gaps and a huge id is the kernel with the
    # ids 0..G-1 in the same order (a 10**9 id asked for a table of 10**9
    # variances, and a gap for a variance no column used).
    from skgpstruct.kernels import GroupedLinearKernel

    rng = np.random.default_rng(3)
    X = rng.normal(size=(4, 6))
    g = rng.normal(size=4)
    d_scales = rng.normal(size=7)
    variance = [0.5, 2.0, 1.5, 0.7]
    compact = GroupedLinearKernel([1, 2, 2, 1, 3, 0], variance=variance, bias=0.3)
    for ids in ([5, 9, 9, 5, 10**9, 0], [1, 3, 3, 1, 4, 0]):
        kernel = GroupedLinearKernel(ids, variance=variance, bias=0.3)
        np.testing.assert_array_equal(kernel.group_ids, np.unique(ids))
        assert kernel.n_groups == 4
        np.testing.assert_array_equal(kernel(X), compact(X))
        np.testing.assert_array_equal(
            kernel.diag_gradient_vjp(X, g), compact.diag_gradient_vjp(X, g)
        )
        np.testing.assert_array_equal(
            kernel.feature_scales_vjp(d_scales), compact.feature_scales_vjp(d_scales)
        )
        np.testing.assert_array_equal(kernel.theta, compact.theta)
    with pytest.raises(ValueError, match="array of 4 positive finite values"):
        GroupedLinearKernel([5, 9, 9, 5, 10**9, 0], variance=np.ones(10))(X)


def test_grouped_linear_new_groups_are_read_again():
    # The groups' positions are kept per groups object: set_params and
    # clone_with_theta must not see stale ones.
    from skgpstruct.kernels import GroupedLinearKernel

    X = np.random.default_rng(4).normal(size=(3, 3))
    kernel = GroupedLinearKernel([0, 1, 1], variance=[0.5, 2.0])
    before = kernel(X)
    kernel.set_params(groups=[1, 1, 0])
    np.testing.assert_array_equal(
        kernel(X), GroupedLinearKernel([1, 1, 0], variance=[0.5, 2.0])(X)
    )
    assert not np.allclose(kernel(X), before)
    clone = kernel.clone_with_theta(kernel.theta)
    np.testing.assert_array_equal(clone(X), kernel(X))
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(kernel))(X), kernel(X))


def test_grouped_linear_repr_summarises_groups():
    from skgpstruct.kernels import GroupedLinearKernel

    text = repr(GroupedLinearKernel(groups=np.arange(5000) % 3, variance=[1, 2, 3.5]))
    assert text == (
        "GroupedLinearKernel(groups=<5000 features in 3 groups>, "
        "variance=[1, 2, 3.5], bias=1)"
    )
    # Bounds that differ from the defaults are shown, as by the other
    # kernels (they were left out).
    text = repr(GroupedLinearKernel(groups=[0, 1], bias_bounds=(1e-2, 10)))
    assert text == (
        "GroupedLinearKernel(groups=<2 features in 2 groups>, variance=1, "
        "bias=1, bias_bounds=(0.01, 10))"
    )


# ---------------------------------------------------------------------------
# Values refused when the kernel is checked (they failed deep inside fit)


@pytest.mark.parametrize(
    ("kernel", "message"),
    [
        (RBF(length_scale=0.0), r"not finite and positive: "
         r"\{'length_scale': 0.0\}"),
        (RBF(length_scale=np.nan), "not finite and positive"),
        (RBF(length_scale=[1.0, np.nan]), r"'length_scale\[1\]': nan"),
        (RBF(length_scale=-1.0), "not finite and positive"),
        (WhiteKernel(noise_level=0.0), "not finite and positive"),
        (ConstantKernel(-1.0) * RBF(), r"positive: \{'k1__constant_value': -1.0\}"),
        (RBF(length_scale_bounds=(5.0, 1.0)),
         "bounds of length_scale must have low < high"),
    ],
    ids=["zero", "NaN", "ARD NaN", "negative", "white zero", "product", "bounds"],
)
def test_sklearn_kernel_values_are_checked(kernel, message):
    with pytest.raises(ValueError, match=message):
        check_kernel(kernel, sparse=False)


def test_sklearn_compound_kernel_is_refused():
    from sklearn.gaussian_process.kernels import CompoundKernel

    with pytest.raises(ValueError, match="is a CompoundKernel"):
        check_kernel(CompoundKernel([RBF(), RBF()]), sparse=False)


@pytest.mark.parametrize(
    "variance", [[1.0, np.inf], [1.0, np.nan], [True, True], True, [True, 2.0]]
)
def test_grouped_variance_must_be_finite_and_numeric(variance):
    # An infinite variance gave NaN on dense rows and finite values on sparse.
    kernel = kernels_module.GroupedLinearKernel([0, 0, 1], variance=variance)
    with pytest.raises(ValueError, match="variance must be"):
        kernel(np.ones((2, 3)))


@pytest.mark.parametrize("kernel", [RBFKernel(), LinearKernel()], ids=repr)
def test_theta_that_over_or_underflows_is_refused(kernel):
    with pytest.raises(ValueError, match=r"exp\(theta\) over- or underflows"):
        kernel.clone_with_theta(np.array([1000.0, -1000.0]))
    with pytest.raises(ValueError, match=r"exp\(theta\) over- or underflows"):
        kernel.theta = np.array([800.0, 0.0])


@pytest.mark.parametrize(
    "length_scale", [[True, 2.0], np.array([True, False]), (1.0, True)]
)
def test_ard_length_scale_refuses_bools(length_scale):
    # NumPy read [True, 2.0] as [1.0, 2.0]: a flag taken for a length scale.
    with pytest.raises(ValueError, match="length_scale must hold numbers, not bools"):
        RBFKernel(length_scale=length_scale)(np.ones((2, 2)))


def test_nested_parameter_of_a_plain_value_is_refused():
    # 'variance__foo' on a float variance was an AttributeError.
    with pytest.raises(ValueError, match=r"invalid parameter 'variance__foo' for "
                       r"kernel RBFKernel: 'variance' is a value"):
        RBFKernel().set_params(variance__foo=1.0)


def test_rbf_of_huge_values_is_refused():
    # The squared distances overflowed to inf - inf: a NaN kernel matrix,
    # with only a RuntimeWarning.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="squared distances between the rows "
                           "of X are not finite.*or the distances overflow"):
            RBFKernel()(np.array([[1e160], [2e160]]))


def test_rbf_of_nan_names_the_nan():
    # It was reported as an overflow, with the advice to scale the features
    # down.
    with pytest.raises(ValueError, match="X holds NaN or infinite values"):
        RBFKernel()(np.array([[0.0], [np.nan]]))


@pytest.mark.parametrize("length_scale", [1e-300, 1e300, [1.0, 1e-200]])
def test_rbf_length_scale_whose_square_overflows_is_refused(length_scale):
    # 1e-300 was a ZeroDivisionError, 1e300 an OverflowError.
    with pytest.raises(ValueError, match=r"within \[1e-150, 1e150\]"):
        RBFKernel(length_scale=length_scale)(np.ones((2, 2)))


@pytest.mark.parametrize("bounds", [(1e-5, 1e200), (1e-200, 1.0)])
def test_rbf_length_scale_bounds_within_the_usable_range(bounds):
    # Such bounds were accepted, and a theta inside them gave a kernel that
    # refused its own length scale (clone_with_theta, then any call).
    kernel = RBFKernel(length_scale=1.0, length_scale_bounds=bounds)
    with pytest.raises(ValueError, match=r"length_scale_bounds must lie within "
                       r"\[1e-150, 1e150\]"):
        _ = kernel.bounds
    ok = RBFKernel(length_scale_bounds=(1e-150, 1e150))
    low, high = ok.bounds[1]
    for theta in ([0.0, low], [0.0, high]):
        np.testing.assert_allclose(ok.clone_with_theta(np.array(theta)).theta, theta)


def test_rbf_ard_diagonals_refuse_what_the_matrix_refuses():
    # diag_gradient_vjp answered for inputs of another width, and both
    # diagonal methods for sparse inputs, which __call__ refuses under ARD.
    ard = RBFKernel(length_scale=[1.0, 2.0])
    X = np.ones((4, 3))
    for method in (ard.diag, lambda Z: ard.diag_gradient_vjp(Z, np.ones(4))):
        with pytest.raises(ValueError, match="length_scale has 2 entries"):
            method(X)
        with pytest.raises(ValueError, match=r"\(ARD\) needs dense X"):
            method(sp.csr_matrix(X[:, :2]))
    np.testing.assert_array_equal(ard.diag(X[:, :2]), np.ones(4))


@pytest.mark.parametrize(
    "kernel",
    [LinearKernel(variance=0.7, bias=2.0), RBFKernel(length_scale=2.0),
     GroupedLinearKernel([0, 0, 1, 1, 2, 2], variance=[0.5, 1.0, 2.0])],
    ids=["linear", "rbf", "grouped"],
)
def test_sparse_inputs_with_duplicate_entries_are_their_sums(kernel):
    # scipy reads duplicate entries of a CSR matrix as their sum: the
    # kernel values are those of the dense matrix.
    rng = np.random.default_rng(0)
    X, Y = rng.normal(size=(5, 6)), rng.normal(size=(4, 6))
    Xd, Yd = _with_duplicates(X), _with_duplicates(Y)
    np.testing.assert_allclose(Xd.toarray(), X)
    np.testing.assert_allclose(kernel.diag(Xd), kernel.diag(X), rtol=1e-12)
    np.testing.assert_allclose(kernel(Xd), kernel(X), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(kernel(Xd, Yd), kernel(X, Y), rtol=1e-12, atol=1e-14)
