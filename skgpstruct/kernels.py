"""Covariance functions on dense and sparse token features, with gradients.

Every kernel here works on float64 ndarrays and, except :class:`SklearnKernel`
and the ARD variant of :class:`RBFKernel`, on ``scipy.sparse`` CSR matrices
whose rows are tokens (CRF++ indicator features reach 100,000 columns and
more). Sparse inputs are never densified: inner products come from sparse
matrix products and squared distances from those products and the row norms,
``||x - y||^2 = ||x||^2 + ||y||^2 - 2 x.y``. Kernel matrices are always
returned dense, of shape ``(n_X, n_Y)``.

Hyperparameters follow :mod:`sklearn.gaussian_process.kernels`: they are
constructor arguments, their bounds are constructor arguments named
``<name>_bounds`` (a pair ``(low, high)``, or ``"fixed"`` to freeze them), and
an optimiser sees the logarithms of the free ones as ``theta`` with
log-space ``bounds``. Gradients are exposed only as vector-Jacobian
products, :meth:`Kernel.gradient_vjp` and :meth:`Kernel.diag_gradient_vjp`,
so no ``(n_X, n_Y, n_theta)`` tensor is ever formed by the built-in kernels.

Inputs are assumed finite: the sequence validation helper
(:func:`skgpstruct._sequences.check_sequence_features`) checks that once per
fit, and the kernels, called per chunk and per iteration, do not repeat it.

:data:`KERNELS` maps the names :func:`get_kernel` accepts to the classes.

Examples
--------
>>> import numpy as np
>>> import scipy.sparse as sp
>>> from skgpstruct.kernels import KERNELS, get_kernel
>>> sorted(KERNELS)
['linear', 'rbf']
>>> kernel = get_kernel("rbf")
>>> X = sp.csr_matrix(np.array([[0.0, 1.0], [1.0, 1.0], [0.0, 0.0]]))
>>> kernel(X).shape  # dense kernel matrix from sparse rows
(3, 3)
"""

import abc
import copy
import inspect
import math
import numbers
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp
from sklearn.gaussian_process import kernels as sk_kernels

from ._checks import check_flag, check_groups, check_integer
from ._sequences import canonical_csr

__all__ = [
    "Kernel",
    "LinearKernel",
    "GroupedLinearKernel",
    "RBFKernel",
    "SklearnKernel",
    "KERNELS",
    "get_kernel",
    "check_kernel",
]

# Memory budget for the (n, n, n_theta) gradient tensors that scikit-learn
# kernels build in ``SklearnKernel``; inputs are cut into blocks to stay below.
_SKLEARN_GRADIENT_BYTES = 32 * 2**20
# Rows per block when ``SklearnKernel`` differentiates a diagonal.
_SKLEARN_DIAG_BLOCK_ROWS = 256


# --------------------------------------------------------------------------
# Input handling
# --------------------------------------------------------------------------


def _as_features(X, name):
    """Return ``X`` as a float64 ndarray or a canonical float64 CSR matrix.

    Already-conforming inputs are returned as they are (no copy).
    """
    if sp.issparse(X):
        # Duplicate entries would corrupt the row norms. A matrix that is
        # not canonical is copied on every call: pass canonical CSR (as
        # ``check_sequence_features`` returns) on hot paths.
        X = canonical_csr(X)
    else:
        X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2:
        raise ValueError(
            f"{name} must be a 2-D matrix of shape (n_tokens, n_features), got "
            f"an array with {X.ndim} dimension(s)"
        )
    return X


def _check_inputs(X, Y):
    """Validate ``X`` and (optional) ``Y`` for a kernel evaluation."""
    X = _as_features(X, "X")
    if Y is None:
        return X, None
    Y = _as_features(Y, "Y")
    if X.shape[1] != Y.shape[1]:
        raise ValueError(
            f"X and Y must have the same number of features (columns), got "
            f"X with {X.shape[1]} and Y with {Y.shape[1]}"
        )
    return X, Y


def _check_weights(weights, shape, name):
    weights = np.asarray(weights, dtype=np.float64)
    if weights.shape != shape:
        raise ValueError(
            f"{name} must have shape {shape} (that of the kernel matrix it "
            f"weights), got shape {weights.shape}"
        )
    return weights


# Largest sparse right-hand side (rows x columns) densified by _inner_products.
_DENSE_Y_LIMIT = 2**22


def _inner_products(X, Y):
    """Dense ``X @ Y.T`` for any mix of dense and CSR inputs (``Y=None``: X).

    With ``Y=None`` the result is exactly symmetric.
    """
    if Y is None:
        gram = X @ X.T
        if sp.issparse(gram):
            gram = gram.toarray()
        # A product may round (i, j) and (j, i) differently; O(n^2) to fix.
        gram += gram.T
        gram *= 0.5
        return gram
    if sp.issparse(X) and sp.issparse(Y) and Y.shape[0] * Y.shape[1] <= _DENSE_Y_LIMIT:
        # A sparse-times-dense product is far cheaper than sparse-times-sparse
        # (no output structure to build) and sums the same products in the
        # same order (the extra terms are exact zeros).
        return np.ascontiguousarray(X @ Y.toarray().T)
    if sp.issparse(X):
        gram = X @ Y.T
    elif sp.issparse(Y):
        gram = (Y @ X.T).T
    else:
        return X @ Y.T
    if sp.issparse(gram):
        gram = gram.toarray()
    return np.ascontiguousarray(gram)


def _row_sq_norms(X):
    """Squared Euclidean norm of every row, shape (n_rows,)."""
    if sp.issparse(X):
        # Canonical CSR (no duplicate entries): sum the squared stored values,
        # row by row in storage order (a matrix-vector product with ones).
        X = X.tocsr()
        squares = sp.csr_matrix(
            (np.square(X.data, dtype=np.float64), X.indices, X.indptr),
            shape=X.shape,
        )
        return squares @ np.ones(X.shape[1])
    return np.einsum("ij,ij->i", X, X)


def _sq_distances(X, Y):
    """Squared Euclidean distances between rows, shape (n_X, n_Y).

    Computed from inner products and row norms, clipped at zero; with
    ``Y=None`` the result is symmetric with an exactly zero diagonal.
    """
    # Overflow gives inf distances (k = 0) or, as inf - inf, NaN: the
    # callers check for NaN (_checked_sq_distances).
    with np.errstate(over="ignore", invalid="ignore"):
        gram = _inner_products(X, Y)
        norms_x = _row_sq_norms(X)
        norms_y = norms_x if Y is None else _row_sq_norms(Y)
        # Outer sum first: exactly symmetric when Y is None, and so is gram.
        d2 = norms_x[:, None] + norms_y[None, :]
        gram *= 2.0
        d2 -= gram
    np.maximum(d2, 0.0, out=d2)
    if Y is None:
        np.fill_diagonal(d2, 0.0)
    return d2


def _checked_sq_distances(d2):
    """``d2``, unless some of it is NaN: a NaN or infinite input, or an
    overflow (inf - inf)."""
    if np.isnan(d2).any():
        raise ValueError(
            "the squared distances between the rows of X are not finite: X "
            "holds NaN or infinite values, or the distances overflow (the "
            "features are too large or too far apart for double precision; "
            "scale them down)"
        )
    return d2


# --------------------------------------------------------------------------
# Hyperparameter helpers
# --------------------------------------------------------------------------


class _Hyperparameter(NamedTuple):
    """One hyperparameter of a kernel, as seen by the optimiser.

    ``value`` has shape (n_elements,) and holds the natural-scale values;
    ``bounds`` has shape (n_elements, 2) (natural scale) or is None when the
    hyperparameter is fixed; ``scalar`` says whether the constructor argument
    is a scalar (as opposed to an array, for ARD length scales).
    """

    name: str
    value: np.ndarray
    bounds: np.ndarray | None
    scalar: bool


def _is_fixed(bounds):
    return isinstance(bounds, str) and bounds == "fixed"


def _check_bounds(bounds, name, n_elements):
    """Parse ``<name>_bounds``: None for "fixed", else (n_elements, 2) array."""
    if isinstance(bounds, str):
        if bounds == "fixed":
            return None
        raise ValueError(
            f"{name}_bounds must be 'fixed' or a pair (low, high), got {bounds!r}"
        )
    try:
        arr = np.asarray(bounds, dtype=np.float64)
    except (TypeError, ValueError):
        arr = None
    if arr is not None and arr.shape == (2,):
        # One pair for every element (the common case, checked as floats:
        # this runs whenever a fit reads the hyperparameters).
        low, high = float(arr[0]), float(arr[1])
        valid = math.isfinite(low) and math.isfinite(high) and 0 < low < high
        arr = np.empty((n_elements, 2))
        arr[:] = (low, high)
    elif arr is None or arr.shape != (n_elements, 2):
        expected = "a pair (low, high)"
        if n_elements > 1:
            expected += f" or an array of shape ({n_elements}, 2)"
        raise ValueError(
            f"{name}_bounds must be 'fixed' or {expected}, got {bounds!r}"
        )
    else:
        valid = (
            np.all(np.isfinite(arr)) and np.all(arr[:, 0] > 0) and
            np.all(arr[:, 0] < arr[:, 1])
        )
    if not valid:
        raise ValueError(
            f"{name}_bounds must satisfy 0 < low < high with finite values "
            f"(they are used in log space; 'fixed' holds {name} at its value), "
            f"got {bounds!r}"
        )
    return arr


def _check_positive(value, name, *, allow_zero=False):
    """Validate a scalar hyperparameter value and return it as a float."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        # Accept 0-d arrays, reject everything else.
        arr = np.asarray(value)
        if arr.ndim != 0 or not np.issubdtype(arr.dtype, np.number):
            raise ValueError(f"{name} must be a real number, got {value!r}")
        value = arr.item()
    value = float(value)
    ok = value >= 0 if allow_zero else value > 0
    if not (np.isfinite(value) and ok):
        relation = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be finite and {relation}, got {value!r}")
    return value


def _check_squarable(length_scale):
    """Refuse length scales whose square over- or underflows (1 / ell^2 was
    a ZeroDivisionError or an OverflowError)."""
    if np.any(np.abs(np.log10(length_scale)) > 150):
        raise ValueError(
            "length_scale must be within [1e-150, 1e150] (its square must be a "
            f"finite non-zero double), got {length_scale!r}"
        )


def _has_bool(value):
    """Whether an array-like hyperparameter holds a bool (NumPy turns
    ``[True, 2.0]`` into ``[1.0, 2.0]``)."""
    if isinstance(value, list | tuple):
        return any(isinstance(v, bool | np.bool_) or _has_bool(v) for v in value)
    return np.asarray(value).dtype == bool


def _same_value(a, b):
    """Whether two constructor parameter values are the same: strings and
    objects with parameters of their own by ``==``, numbers and array-likes
    by shape and entries."""
    if isinstance(a, str) or isinstance(b, str):
        return isinstance(a, str) and isinstance(b, str) and a == b
    if hasattr(a, "get_params") or hasattr(b, "get_params"):
        return bool(a == b)
    try:
        a, b = np.asarray(a), np.asarray(b)
    except ValueError:  # ragged
        return False
    return a.shape == b.shape and bool(np.array_equal(a, b))


def _format_value(value):
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return f"{value:.4g}"
    if isinstance(value, np.ndarray | list | tuple):
        items = ", ".join(_format_value(v) for v in value)
        return f"({items})" if isinstance(value, tuple) else f"[{items}]"
    return repr(value)


# --------------------------------------------------------------------------
# Base class
# --------------------------------------------------------------------------


class Kernel(abc.ABC):
    """Base class of the covariance functions used by skgpstruct.

    Public methods validate their inputs and call private methods that
    subclasses implement: ``_call``, ``_diag``, ``_gradient_vjp``,
    ``_diag_gradient_vjp`` and ``_hyperparameters`` (the list of
    hyperparameters with their values and bounds), plus
    ``_set_hyperparameter``. Constructor arguments are the parameters of
    :meth:`get_params` / :meth:`set_params`, so :func:`sklearn.base.clone`
    works on an estimator holding a kernel.

    The public interface every kernel shares: ``kernel(X, Y=None)`` returns
    the dense ``(n_X, n_Y)`` kernel matrix, :meth:`diag` its diagonal of
    shape ``(n_X,)``; :attr:`theta` (shape ``(n_dims,)``) holds the
    logarithms of the free hyperparameters, :attr:`bounds` (shape
    ``(n_dims, 2)``) their log-space bounds, :attr:`hyperparameter_names`
    their names; :meth:`gradient_vjp` and :meth:`diag_gradient_vjp` return
    gradients with respect to :attr:`theta` as vector-Jacobian products.

    Examples
    --------
    The interface, shown on :class:`LinearKernel`,
    ``k(x, x') = variance * (x . x' + bias)``:

    >>> import numpy as np
    >>> from skgpstruct.kernels import Kernel, LinearKernel
    >>> kernel = LinearKernel(variance=2.0, bias=0.5)
    >>> isinstance(kernel, Kernel)
    True
    >>> X = np.array([[1.0, 0.0], [1.0, 1.0]])
    >>> kernel(X)
    array([[3., 3.],
           [3., 5.]])
    >>> kernel.diag(X)
    array([3., 5.])
    >>> kernel.hyperparameter_names, np.exp(kernel.theta)
    (['variance', 'bias'], array([2. , 0.5]))
    >>> kernel.bounds.shape  # log-space (low, high) per entry of theta
    (2, 2)

    The gradient of ``sum(G * K)`` in ``theta = [log variance, log bias]``:

    >>> kernel.gradient_vjp(X, None, np.ones((2, 2)))
    array([14.,  4.])
    >>> kernel.clone_with_theta(np.log([1.0, 1.0]))
    LinearKernel(variance=1, bias=1)
    """

    # ---- scikit-learn style parameters -----------------------------------

    @classmethod
    def _get_param_names(cls):
        signature = inspect.signature(cls.__init__)
        names = []
        for parameter in signature.parameters.values():
            if parameter.name == "self":
                continue
            if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
                raise RuntimeError(
                    f"{cls.__name__}.__init__ must not take *args or **kwargs"
                )
            names.append(parameter.name)
        return sorted(names)

    def get_params(self, deep=True):
        """Get the constructor parameters of this kernel.

        Parameters
        ----------
        deep : bool, default=True
            If True, also return the parameters of nested objects (such as the
            scikit-learn kernel of :class:`SklearnKernel`) as
            ``<param>__<nested_param>``.

        Returns
        -------
        params : dict
            Parameter names mapped to their values.
        """
        params = {}
        for name in self._get_param_names():
            value = getattr(self, name)
            if deep and hasattr(value, "get_params") and not isinstance(value, type):
                for key, sub_value in value.get_params(deep=True).items():
                    params[f"{name}__{key}"] = sub_value
            params[name] = value
        return params

    def set_params(self, **params):
        """Set the constructor parameters of this kernel.

        Parameters
        ----------
        **params : dict
            Parameter names (``<param>__<nested_param>`` for nested objects)
            mapped to new values.

        Returns
        -------
        self : Kernel
            This kernel, modified in place.
        """
        if not params:
            return self
        valid = self.get_params(deep=True)
        nested = {}
        for key, value in params.items():
            name, delim, sub_key = key.partition("__")
            if name not in valid:
                raise ValueError(
                    f"invalid parameter {name!r} for kernel {type(self).__name__}; "
                    f"valid parameters are {self._get_param_names()}"
                )
            if delim:
                if not hasattr(valid[name], "set_params"):
                    raise ValueError(
                        f"invalid parameter {key!r} for kernel "
                        f"{type(self).__name__}: {name!r} is a value, not an "
                        "object with parameters of its own"
                    )
                nested.setdefault(name, {})[sub_key] = value
            else:
                setattr(self, name, value)
                valid[name] = value
        for name, sub_params in nested.items():
            valid[name].set_params(**sub_params)
        return self

    def __eq__(self, other):
        """Whether ``other`` is a kernel of the same class with the same
        constructor parameters (arrays compared entry by entry, nested
        scikit-learn kernels with their own ``==``), as scikit-learn's
        kernels compare. Kernels are therefore not hashable."""
        if type(self) is not type(other):
            return False
        mine, theirs = self.get_params(deep=False), other.get_params(deep=False)
        return all(_same_value(mine[name], theirs[name]) for name in mine)

    __hash__ = None

    def __repr__(self):
        # Hyperparameter values first, in constructor order, then the bounds
        # that differ from their defaults.
        signature = inspect.signature(type(self).__init__)
        values = [
            f"{name}={_format_value(getattr(self, name))}"
            for name in signature.parameters
            if name != "self" and not name.endswith("_bounds")
        ]
        return f"{type(self).__name__}({', '.join(values + self._bounds_reprs())})"

    def _bounds_reprs(self):
        """``name=value`` of every ``*_bounds`` parameter that differs from
        its default, in constructor order (for ``__repr__``)."""
        signature = inspect.signature(type(self).__init__)
        return [
            f"{name}={_format_value(getattr(self, name))}"
            for name in signature.parameters
            if name.endswith("_bounds")
            and not _same_value(getattr(self, name), signature.parameters[name].default)
        ]

    # ---- hyperparameters ---------------------------------------------------

    @abc.abstractmethod
    def _hyperparameters(self):
        """List of :class:`_Hyperparameter`, validated, in theta order."""

    @abc.abstractmethod
    def _set_hyperparameter(self, name, value):
        """Set one hyperparameter (natural scale, float or 1-D array)."""

    def _free_hyperparameters(self):
        return [h for h in self._hyperparameters() if h.bounds is not None]

    @property
    def theta(self):
        """Log of the free (non-fixed) hyperparameters.

        Returns
        -------
        theta : ndarray of shape (n_dims,)
            Concatenated natural logarithms of the free hyperparameters, in the
            order of :attr:`hyperparameter_names`. Assigning to it sets the
            hyperparameters from their logarithms (fixed ones are untouched).
        """
        free = [np.log(h.value) for h in self._free_hyperparameters()]
        return np.concatenate(free) if free else np.empty(0)

    @theta.setter
    def theta(self, theta):
        theta = np.asarray(theta, dtype=np.float64)
        free = self._free_hyperparameters()
        n_dims = sum(h.value.size for h in free)
        if theta.shape != (n_dims,):
            raise ValueError(
                f"theta must have shape ({n_dims},) for {self!r} (free "
                f"hyperparameters {self.hyperparameter_names}), got shape "
                f"{theta.shape}"
            )
        if not np.all(np.isfinite(theta)):
            raise ValueError(f"theta must be finite, got {theta}")
        with np.errstate(over="ignore"):
            natural = np.exp(theta)
        if not np.all((natural > 0) & np.isfinite(natural)):
            raise ValueError(
                "theta must be the log of finite positive hyperparameters; "
                f"exp(theta) over- or underflows for {theta}"
            )
        start = 0
        for h in free:
            values = natural[start:start + h.value.size]
            start += h.value.size
            self._set_hyperparameter(h.name, float(values[0]) if h.scalar else values)

    @property
    def bounds(self):
        """Log-space bounds of the free hyperparameters.

        Returns
        -------
        bounds : ndarray of shape (n_dims, 2)
            Row ``i`` holds ``(log low, log high)`` for ``theta[i]``.
        """
        rows = [np.log(h.bounds) for h in self._free_hyperparameters()]
        return np.vstack(rows) if rows else np.empty((0, 2))

    @property
    def hyperparameter_names(self):
        """Names of the free hyperparameters, one per entry of :attr:`theta`.

        Returns
        -------
        names : list of str
            Scalar hyperparameters appear under their constructor name; an
            array-valued one (ARD length scales) contributes ``name[i]`` for
            each of its elements.
        """
        names = []
        for h in self._hyperparameters():
            if h.bounds is None:
                continue
            if h.scalar:
                names.append(h.name)
            else:
                names.extend(f"{h.name}[{i}]" for i in range(h.value.size))
        return names

    @property
    def n_dims(self):
        """Number of free hyperparameters, ``len(self.theta)``."""
        return sum(h.value.size for h in self._free_hyperparameters())

    def clone_with_theta(self, theta):
        """Return a copy of this kernel with the given log hyperparameters.

        Parameters
        ----------
        theta : array-like of shape (n_dims,)
            Log of the free hyperparameters.

        Returns
        -------
        kernel : Kernel
            A new kernel; ``self`` is unchanged.
        """
        cloned = copy.deepcopy(self)
        cloned.theta = theta
        return cloned

    def _free_flags(self):
        """Whether each hyperparameter is free, in ``_hyperparameters`` order."""
        return [h.bounds is not None for h in self._hyperparameters()]

    # ---- evaluation ----------------------------------------------------------

    def __call__(self, X, Y=None):
        """Kernel matrix between the rows of ``X`` and ``Y``.

        Parameters
        ----------
        X : ndarray or sparse matrix of shape (n_X, n_features)
            Left inputs, one row per token. CSR float64 is used as is; other
            sparse formats and dtypes are converted once.
        Y : ndarray or sparse matrix of shape (n_Y, n_features), default=None
            Right inputs. If None, ``Y = X`` and the result is exactly
            symmetric.

        Returns
        -------
        K : ndarray of shape (n_X, n_Y)
            Dense kernel matrix (``n_Y = n_X`` when ``Y`` is None).
        """
        X, Y = _check_inputs(X, Y)
        n_y = X.shape[0] if Y is None else Y.shape[0]
        if X.shape[0] == 0 or n_y == 0:
            # No pair to evaluate (scikit-learn's stationary kernels gave a
            # (1, 1) matrix for no rows).
            return np.zeros((X.shape[0], n_y))
        return self._call(X, Y)

    def diag(self, X):
        """Diagonal of the kernel matrix ``self(X)``, computed without it.

        Parameters
        ----------
        X : ndarray or sparse matrix of shape (n_X, n_features)
            Inputs, one row per token.

        Returns
        -------
        k_diag : ndarray of shape (n_X,)
            ``k(x_i, x_i)`` for every row.
        """
        X, _ = _check_inputs(X, None)
        return self._diag(X)

    def gradient_vjp(self, X, Y, G):
        """Gradient of ``sum(G * self(X, Y))`` with respect to :attr:`theta`.

        This is the vector-Jacobian product of the kernel matrix with ``G``;
        the ``(n_X, n_Y, n_dims)`` Jacobian itself is not formed.

        Parameters
        ----------
        X : ndarray or sparse matrix of shape (n_X, n_features)
            Left inputs.
        Y : ndarray or sparse matrix of shape (n_Y, n_features) or None
            Right inputs; None means ``Y = X``.
        G : array-like of shape (n_X, n_Y)
            Weights, typically the gradient of an objective with respect to
            the kernel matrix.

        Returns
        -------
        grad : ndarray of shape (n_dims,)
            ``d/dtheta sum_ij G_ij k(x_i, y_j)``, in :attr:`theta` order.
        """
        X, Y = _check_inputs(X, Y)
        n_y = X.shape[0] if Y is None else Y.shape[0]
        G = _check_weights(G, (X.shape[0], n_y), "G")
        if self.n_dims == 0:
            return np.empty(0)
        return self._gradient_vjp(X, Y, G)

    def diag_gradient_vjp(self, X, g):
        """Gradient of ``sum(g * self.diag(X))`` with respect to :attr:`theta`.

        Parameters
        ----------
        X : ndarray or sparse matrix of shape (n_X, n_features)
            Inputs.
        g : array-like of shape (n_X,)
            Weights of the diagonal entries.

        Returns
        -------
        grad : ndarray of shape (n_dims,)
            ``d/dtheta sum_i g_i k(x_i, x_i)``, in :attr:`theta` order.
        """
        X, _ = _check_inputs(X, None)
        g = _check_weights(g, (X.shape[0],), "g")
        if self.n_dims == 0:
            return np.empty(0)
        return self._diag_gradient_vjp(X, g)

    @abc.abstractmethod
    def _call(self, X, Y):
        """Kernel matrix on validated inputs (``Y`` may be None)."""

    @abc.abstractmethod
    def _diag(self, X):
        """Diagonal on validated inputs."""

    @abc.abstractmethod
    def _gradient_vjp(self, X, Y, G):
        """VJP on validated inputs; ``Y`` may be None; returns (n_dims,)."""

    @abc.abstractmethod
    def _diag_gradient_vjp(self, X, g):
        """Diagonal VJP on validated inputs; returns (n_dims,)."""


def _select_free(gradients, free):
    """Concatenate the gradients of the free hyperparameters."""
    parts = [np.atleast_1d(gr) for gr, f in zip(gradients, free, strict=True) if f]
    return np.concatenate(parts) if parts else np.empty(0)


# --------------------------------------------------------------------------
# Linear kernel
# --------------------------------------------------------------------------


class _FeatureMapKernel(Kernel):
    """A kernel with an explicit diagonal feature map, ``k(x, x') = phi(x) .
    phi(x')`` with ``phi(x) = scales * [x, 1]``: what inducing features
    need. Subclasses give the scales (``_scales``) and their VJP
    (``_scales_vjp``), and may give a few columns' of a wide design
    without the others (``_column_scales``, ``_column_scales_vjp``; the
    defaults go through the whole design's): a subclass of a kernel that
    overrides those and changes its scales overrides all four. A kernel of
    another hierarchy qualifies by providing the two public methods."""

    def feature_scales(self, n_features):
        """The scales of the explicit feature map ``phi(x) = scales * [x, 1]``
        (used by inducing features).

        Parameters
        ----------
        n_features : int
            Number of feature columns (>= 0).

        Returns
        -------
        scales : ndarray of shape (n_features + 1,)
            The columns' scales, then the offset's.
        """
        return self._scales(check_integer(n_features, "n_features", 0))

    def feature_scales_vjp(self, d_scales):
        """Gradient in :attr:`theta` from the gradient with respect to
        :meth:`feature_scales`.

        Parameters
        ----------
        d_scales : ndarray of shape (n_features + 1,)
            Gradient of a scalar with respect to ``feature_scales(n_features)``.

        Returns
        -------
        ndarray of shape (n_free,)
            Its gradient with respect to the free entries of :attr:`theta`.
        """
        return self._scales_vjp(np.asarray(d_scales, dtype=np.float64))

    def _scales(self, n_features):
        raise NotImplementedError

    def _scales_vjp(self, d_scales):
        raise NotImplementedError

    def _column_scales(self, n_features, columns):
        """``feature_scales(n_features)`` at ``columns``, then the offset's.

        Inducing features over a few active columns of a wide design (2**20
        hashed columns) call this and :meth:`_column_scales_vjp` at every
        ELBO evaluation (:func:`_feature_scales_at`); subclasses override
        both to cost the columns asked for, not the design's width.
        """
        return _whole_design_scales_at(self, n_features, columns)

    def _column_scales_vjp(self, d_scales, n_features, columns):
        """``feature_scales_vjp`` of a gradient with respect to
        :meth:`_column_scales` (zero at the other columns)."""
        return _whole_design_scales_vjp_at(self, d_scales, n_features, columns)


def _whole_design_scales_at(kernel, n_features, columns):
    """``kernel.feature_scales(n_features)`` at ``columns``, then the
    offset's, from the whole design's scales."""
    scales = kernel.feature_scales(n_features)
    return np.append(scales[columns], scales[-1])


def _whole_design_scales_vjp_at(kernel, d_scales, n_features, columns):
    """The theta gradient of a gradient ``d_scales`` with respect to
    :func:`_whole_design_scales_at`, through the whole design's VJP."""
    full = np.zeros(n_features + 1)
    full[columns] = d_scales[:-1]
    full[-1] = d_scales[-1]
    return kernel.feature_scales_vjp(full)


def _feature_scales_at(kernel, n_features, columns):
    """The scales of a kernel's feature map at ``columns`` of a design of
    ``n_features``, then the offset's: the columns' own where the kernel
    computes them (this module's linear kernels), else from the whole
    design's (a kernel of another hierarchy with the two public methods)."""
    if isinstance(kernel, _FeatureMapKernel):
        return kernel._column_scales(n_features, columns)
    return _whole_design_scales_at(kernel, n_features, columns)


def _feature_scales_vjp_at(kernel, d_scales, n_features, columns):
    """The theta gradient of a gradient with respect to
    :func:`_feature_scales_at`."""
    if isinstance(kernel, _FeatureMapKernel):
        return kernel._column_scales_vjp(d_scales, n_features, columns)
    return _whole_design_scales_vjp_at(kernel, d_scales, n_features, columns)


class LinearKernel(_FeatureMapKernel):
    r"""Linear (dot-product) kernel with a bias.

    .. math:: k(x, x') = \sigma^2 (x \cdot x' + b)

    With it, each label's latent function is ``f_j(x) = w_j . x + c_j`` with
    Gaussian priors ``w_j ~ N(0, variance I)`` and ``c_j ~ N(0, variance *
    bias)``: a Bayesian linear-chain CRF whose L2 strength (and offset prior)
    is learned from the ELBO. A bias > 0 gives every label a learnable offset.

    Parameters
    ----------
    variance : float, default=1.0
        Prior variance of the weights, ``sigma^2 > 0``.
    bias : float, default=1.0
        Offset term ``b``; must be > 0 when learned, may be 0 when
        ``bias_bounds="fixed"`` (a homogeneous linear kernel).
    variance_bounds : pair of float or "fixed", default=(1e-5, 1e5)
        Bounds ``(low, high)`` of ``variance`` (natural scale), or "fixed" to
        leave it out of :attr:`theta`.
    bias_bounds : pair of float or "fixed", default=(1e-5, 1e5)
        Bounds of ``bias``, or "fixed".

    Notes
    -----
    ``theta = [log variance, log bias]`` (free ones only). Cost of
    ``K(X, Y)``: one (sparse) matrix product, ``O(n_X n_Y D)`` dense or about
    ``O(nnz(X) * nnz per column of Y)`` sparse.

    It has an explicit feature map (:meth:`feature_scales`), so
    :class:`~skgpstruct.GPStructClassifier` can use the feature weights
    themselves as inducing variables (``inducing="features"``).

    Examples
    --------
    >>> import numpy as np
    >>> import scipy.sparse as sp
    >>> from skgpstruct.kernels import LinearKernel
    >>> kernel = LinearKernel(variance=2.0, bias=0.5)
    >>> X = np.array([[1.0, 0.0], [1.0, 1.0]])
    >>> kernel(X, X[:1])  # 2 * (x . x' + 0.5)
    array([[3.],
           [3.]])
    >>> bool(np.array_equal(kernel(sp.csr_matrix(X)), kernel(X)))
    True
    >>> kernel.feature_scales(2)  # phi(x) = scales * [x, 1]
    array([1.41421356, 1.41421356, 1.        ])

    A homogeneous kernel (no offset) fixes the bias at 0:

    >>> LinearKernel(bias=0.0, bias_bounds="fixed").hyperparameter_names
    ['variance']
    """

    def __init__(
        self,
        variance=1.0,
        bias=1.0,
        variance_bounds=(1e-5, 1e5),
        bias_bounds=(1e-5, 1e5),
    ):
        self.variance = variance
        self.bias = bias
        self.variance_bounds = variance_bounds
        self.bias_bounds = bias_bounds

    def _values(self):
        variance = _check_positive(self.variance, "variance")
        bias = _check_positive(
            self.bias, "bias", allow_zero=_is_fixed(self.bias_bounds)
        )
        return variance, bias

    def _hyperparameters(self):
        variance, bias = self._values()
        return [
            _Hyperparameter(
                "variance", np.array([variance]),
                _check_bounds(self.variance_bounds, "variance", 1), True,
            ),
            _Hyperparameter(
                "bias", np.array([bias]),
                _check_bounds(self.bias_bounds, "bias", 1), True,
            ),
        ]

    def _set_hyperparameter(self, name, value):
        setattr(self, name, value)

    def _call(self, X, Y):
        variance, bias = self._values()
        K = _inner_products(X, Y)
        K += bias
        K *= variance
        return K

    def _diag(self, X):
        variance, bias = self._values()
        return variance * (_row_sq_norms(X) + bias)

    def _gradient_vjp(self, X, Y, G):
        variance, bias = self._values()
        free_v, free_b = self._free_flags()
        # dK/dlog(variance) = K; dK/dlog(bias) = variance * bias (constant).
        grad_v = 0.0
        if free_v:
            gram = _inner_products(X, Y)
            grad_v = variance * (np.vdot(G, gram) + bias * G.sum())
        grad_b = variance * bias * G.sum() if free_b else 0.0
        return _select_free([grad_v, grad_b], [free_v, free_b])

    def _diag_gradient_vjp(self, X, g):
        variance, bias = self._values()
        free_v, free_b = self._free_flags()
        grad_v = variance * (g @ _row_sq_norms(X) + bias * g.sum()) if free_v else 0.0
        grad_b = variance * bias * g.sum() if free_b else 0.0
        return _select_free([grad_v, grad_b], [free_v, free_b])

    def _scales(self, n_features):
        variance, bias = self._values()
        scales = np.full(n_features + 1, np.sqrt(variance))
        scales[-1] *= np.sqrt(bias)
        return scales

    def _scales_vjp(self, d_scales):
        scales = self._scales(d_scales.size - 1)
        free_v, free_b = self._free_flags()
        # every scale is proportional to sqrt(variance); the last to sqrt(bias)
        grad_v = 0.5 * np.dot(d_scales, scales)
        grad_b = 0.5 * d_scales[-1] * scales[-1]
        return _select_free([grad_v, grad_b], [free_v, free_b])

    # Every column has the same scale, and the VJP needs the gradient's
    # entries only where it is not zero.
    def _column_scales(self, n_features, columns):
        return self._scales(len(columns))

    def _column_scales_vjp(self, d_scales, n_features, columns):
        return self._scales_vjp(d_scales)


class GroupedLinearKernel(_FeatureMapKernel):
    r"""Linear kernel with one prior variance per group of features (ARD).

    .. math:: k(x, x') = \sum_g \sigma_g^2 \, x_g \cdot x'_g + b

    Each label's latent function is ``f_j(x) = w_j . x + c_j`` with
    ``w_jd ~ N(0, sigma^2_{g(d)})`` and ``c_j ~ N(0, b)``. Grouping the
    columns by the CRF++ template that produced them (see
    :attr:`skgpstruct.features.CRFppTemplateVectorizer.feature_groups_`)
    lets the ELBO learn how much each template matters: templates of
    frequent, informative features get broad priors, templates of rare
    features narrow ones, instead of one compromise for all.

    Parameters
    ----------
    groups : array-like of int of shape (n_features,)
        Group of every column: any non-negative integers, read as labels
        (like a classifier's ``y``). The groups are the distinct values,
        in increasing order (:attr:`group_ids`); an id no column has is not
        a group, so gaps (a template all of whose features were dropped)
        cost nothing. Read once per object: to change the groups, give a
        new array (``set_params(groups=...)``), not the old one changed in
        place.
    variance : float or array-like of shape (n_groups,), default=1.0
        Prior variance of the weights of each group, in the order of
        :attr:`group_ids`.
    bias : float, default=1.0
        Prior variance ``b`` of each label's offset (> 0 when learned; unlike
        :class:`LinearKernel`, not multiplied by a variance).
    variance_bounds : pair of float or "fixed", default=(1e-5, 1e5)
        Bounds ``(low, high)`` of every group's variance (natural scale), an
        array of shape (n_groups, 2) to set them one by one, or "fixed".
    bias_bounds : pair of float or "fixed", default=(1e-5, 1e5)
        Bounds of ``bias``, or "fixed".

    Notes
    -----
    ``theta = [log variance_0, ..., log variance_{G-1}, log bias]`` (free ones
    only), ``variance_k`` being the group ``group_ids[k]``'s.

    Examples
    --------
    >>> import numpy as np
    >>> from skgpstruct.kernels import GroupedLinearKernel
    >>> kernel = GroupedLinearKernel(groups=[0, 0, 1], variance=[2.0, 0.5])
    >>> X = np.array([[1.0, 1.0, 1.0]])
    >>> round(float(kernel(X)[0, 0]), 10)  # 2 * (1 + 1) + 0.5 * 1 + bias 1
    5.5
    >>> kernel = GroupedLinearKernel(groups=[3, 3, 7], variance=[2.0, 0.5])
    >>> kernel.group_ids.tolist(), kernel.n_groups
    ([3, 7], 2)
    """

    def __init__(
        self,
        groups,
        variance=1.0,
        bias=1.0,
        variance_bounds=(1e-5, 1e5),
        bias_bounds=(1e-5, 1e5),
    ):
        self.groups = groups
        self.variance = variance
        self.bias = bias
        self.variance_bounds = variance_bounds
        self.bias_bounds = bias_bounds

    def __repr__(self):
        groups = np.asarray(self.groups)
        variance = np.asarray(self.variance, dtype=np.float64)
        shown = (
            f"{float(variance):.4g}" if variance.ndim == 0
            else "[" + ", ".join(f"{v:.4g}" for v in variance) + "]"
        )
        try:
            n_groups = self.n_groups
        except ValueError:
            n_groups = "?"
        bounds = "".join(f", {part}" for part in self._bounds_reprs())
        return (
            f"GroupedLinearKernel(groups=<{groups.size} features in {n_groups} "
            f"groups>, variance={shown}, bias={float(self.bias):.4g}{bounds})"
        )

    def _groups(self):
        return check_groups(self.groups, "groups")

    def _group_positions(self):
        """``(group_ids, position)``: the distinct ids in increasing order, and
        every column's group as a position in them.

        Worked out once per ``groups`` object (a fit asks for them a dozen
        times per ELBO evaluation); a copy of the kernel keeps them.
        """
        cached = self.__dict__.get("_positions")
        if cached is not None and cached[0] is self.groups:
            return cached[1], cached[2]
        group_ids, position = self._compute_group_positions()
        self._positions = (self.groups, group_ids, position)
        return group_ids, position

    def _compute_group_positions(self):
        groups = self._groups()
        largest = int(groups.max())
        if largest < groups.size:
            # Ids below the number of columns (the usual case, and every
            # CRFppTemplateVectorizer's): a table of ids, linear in columns.
            present = np.bincount(groups, minlength=largest + 1) > 0
            if present.all():
                return np.arange(largest + 1), groups
            rank = np.cumsum(present) - 1
            return np.flatnonzero(present), rank[groups]
        # Large or sparse ids are labels: no table as long as the largest one.
        group_ids, position = np.unique(groups, return_inverse=True)
        return group_ids, position.astype(np.int64, copy=False)

    @property
    def group_ids(self):
        """The distinct values of ``groups``, in increasing order (one variance
        each)."""
        return self._group_positions()[0]

    @property
    def n_groups(self):
        """Number of groups (distinct values of ``groups``)."""
        return self.group_ids.size

    def _values(self):
        n_groups = self.n_groups
        if np.ndim(self.variance) == 0:
            variance = np.full(n_groups, _check_positive(self.variance, "variance"))
        else:
            try:
                variance = np.asarray(self.variance, dtype=np.float64)
            except (TypeError, ValueError):
                variance = None
            if (
                variance is None
                or _has_bool(self.variance)
                or variance.shape != (n_groups,)
                or not np.all((variance > 0) & np.isfinite(variance))
            ):
                raise ValueError(
                    f"variance must be a positive float or an array of {n_groups} "
                    f"positive finite values (one per distinct value of groups, "
                    f"in increasing order), got {self.variance!r}"
                )
        bias = _check_positive(
            self.bias, "bias", allow_zero=_is_fixed(self.bias_bounds)
        )
        return variance, bias

    def _hyperparameters(self):
        variance, bias = self._values()
        return [
            _Hyperparameter(
                "variance", variance,
                _check_bounds(self.variance_bounds, "variance", variance.size),
                False,  # one variance per group, even when given as a scalar
            ),
            _Hyperparameter(
                "bias", np.array([bias]),
                _check_bounds(self.bias_bounds, "bias", 1), True,
            ),
        ]

    def _set_hyperparameter(self, name, value):
        setattr(self, name, value)

    def _column_positions(self, n_features):
        """Every column's group as a position in :attr:`group_ids`, checked
        against the design's ``n_features``."""
        groups = self._groups()
        if groups.size != n_features:
            raise ValueError(
                f"groups has {groups.size} entries but X has {n_features} features"
            )
        return self._group_positions()[1]

    def _column_variance(self, n_features):
        return self._values()[0][self._column_positions(n_features)]

    def _scaled(self, X):
        scale = np.sqrt(self._column_variance(X.shape[1]))
        return X.multiply(scale[None, :]).tocsr() if sp.issparse(X) else X * scale

    def _call(self, X, Y):
        Xs = self._scaled(X)
        K = _inner_products(Xs, None if Y is None else self._scaled(Y))
        K += self._values()[1]
        return K

    def _diag(self, X):
        col_var = self._column_variance(X.shape[1])
        sq = X.multiply(X) if sp.issparse(X) else X * X
        return np.asarray(sq @ col_var).ravel() + self._values()[1]

    def _group_sums(self, per_column, positions=None):
        """Sums of ``per_column`` by group; ``positions``: the entries' groups
        (as positions in :attr:`group_ids`) when not every column's."""
        group_ids, every_column = self._group_positions()
        if positions is None:
            positions = every_column
        return np.bincount(positions, weights=per_column, minlength=group_ids.size)

    def _gradient_vjp(self, X, Y, G):
        variance, bias = self._values()
        free_v, free_b = self._free_flags()
        grad_v = 0.0
        if free_v:
            # d/dlog var_g sum(G * K) = var_g sum_{d in g} sum_i X_id (G Y)_id
            Y = X if Y is None else Y
            GY = G @ Y if not sp.issparse(Y) else (Y.T @ G.T).T
            GY = np.asarray(GY)
            if sp.issparse(X):
                per_column = np.asarray(X.multiply(GY).sum(axis=0)).ravel()
            else:
                per_column = np.einsum("id,id->d", X, GY)
            grad_v = variance * self._group_sums(per_column)
        grad_b = bias * G.sum() if free_b else 0.0
        return _select_free([grad_v, grad_b], [free_v, free_b])

    def _diag_gradient_vjp(self, X, g):
        variance, bias = self._values()
        free_v, free_b = self._free_flags()
        grad_v = 0.0
        if free_v:
            sq = X.multiply(X) if sp.issparse(X) else X * X
            per_column = np.asarray(sq.T @ g).ravel()
            grad_v = variance * self._group_sums(per_column)
        grad_b = bias * g.sum() if free_b else 0.0
        return _select_free([grad_v, grad_b], [free_v, free_b])

    def _scales(self, n_features):
        return self._column_scales(n_features, None)

    def _scales_vjp(self, d_scales):
        return self._column_scales_vjp(d_scales, d_scales.size - 1, None)

    def _positions_and_scales(self, n_features, columns):
        """The groups (positions in :attr:`group_ids`) of ``columns`` (every
        column when None) and their scales, then the offset's."""
        variance, bias = self._values()
        positions = self._column_positions(n_features)
        if columns is not None:
            positions = positions[columns]
        return positions, np.sqrt(np.append(variance[positions], bias))

    def _column_scales(self, n_features, columns):
        return self._positions_and_scales(n_features, columns)[1]

    def _column_scales_vjp(self, d_scales, n_features, columns):
        free_v, free_b = self._free_flags()
        positions, scales = self._positions_and_scales(n_features, columns)
        # scale = sqrt(var)  =>  d scale / d log var = scale / 2
        per_column = 0.5 * d_scales[:-1] * scales[:-1]
        grad_v = self._group_sums(per_column, positions)
        grad_b = 0.5 * d_scales[-1] * scales[-1]
        return _select_free([grad_v, grad_b], [free_v, free_b])


# --------------------------------------------------------------------------
# RBF kernel
# --------------------------------------------------------------------------


class RBFKernel(Kernel):
    r"""Squared-exponential (RBF) kernel.

    .. math:: k(x, x') = \sigma^2 \exp\left(-\frac{\|x - x'\|^2}{2 \ell^2}\right)

    Parameters
    ----------
    variance : float, default=1.0
        Signal variance ``sigma^2 > 0``; ``k(x, x) = variance``.
    length_scale : float or array-like of shape (n_features,), default=1.0
        Isotropic length scale ``ell > 0``, or one per feature (ARD:
        ``||x - x'||^2 / ell^2`` becomes ``sum_d (x_d - x'_d)^2 / ell_d^2``).
        ARD needs dense inputs.
    variance_bounds : pair of float or "fixed", default=(1e-5, 1e5)
        Bounds of ``variance`` (natural scale), or "fixed".
    length_scale_bounds : pair of float or "fixed", default=(1e-5, 1e5)
        Bounds of ``length_scale``, or "fixed". Under ARD a pair applies to
        every element; an array of shape (n_features, 2) sets them one by one.

    Notes
    -----
    ``theta = [log variance, log length_scale...]`` (free ones only).
    Squared distances are ``||x||^2 + ||y||^2 - 2 x.y``, computed with one
    (sparse) matrix product, clipped at 0. On sparse rows this is the only
    practical route; its rounding error is about ``1e-16 * ||x||^2``, which is
    negligible unless inputs lie far from the origin relative to
    ``length_scale``: standardise features with large offsets (e.g. with
    :class:`sklearn.preprocessing.StandardScaler`), as for scikit-learn's
    own distances. Centring them inside the kernel was tried and broke the
    agreement, to rounding, between ``k(X, Y)`` and the rows of ``k(Y)``
    that conditionals at training points rely on (dense self-pairs in
    ``k(X, Y)`` can differ from the variance by about ``1e-14``; ``k(Y)``'s
    diagonal is exact). Distances that overflow
    (``inf - inf``) are refused.

    Examples
    --------
    >>> import numpy as np
    >>> from skgpstruct.kernels import RBFKernel
    >>> kernel = RBFKernel(variance=1.0, length_scale=2.0)
    >>> X = np.array([[0.0], [2.0]])
    >>> kernel(X)  # exp(-2**2 / (2 * 2**2)) off the diagonal
    array([[1.        , 0.60653066],
           [0.60653066, 1.        ]])
    >>> RBFKernel(length_scale=[1.0, 2.0]).hyperparameter_names  # ARD
    ['variance', 'length_scale[0]', 'length_scale[1]']
    """

    def __init__(
        self,
        variance=1.0,
        length_scale=1.0,
        variance_bounds=(1e-5, 1e5),
        length_scale_bounds=(1e-5, 1e5),
    ):
        self.variance = variance
        self.length_scale = length_scale
        self.variance_bounds = variance_bounds
        self.length_scale_bounds = length_scale_bounds

    @property
    def anisotropic(self):
        """Whether ``length_scale`` is an array (ARD, dense inputs only)."""
        return np.ndim(self.length_scale) > 0

    def _values(self):
        variance = _check_positive(self.variance, "variance")
        if not self.anisotropic:
            length_scale = _check_positive(self.length_scale, "length_scale")
            _check_squarable(length_scale)
            return variance, length_scale
        if _has_bool(self.length_scale):
            raise ValueError(
                f"length_scale must hold numbers, not bools, got {self.length_scale!r}"
            )
        length_scale = np.asarray(self.length_scale, dtype=np.float64)
        if length_scale.ndim != 1 or length_scale.size == 0:
            raise ValueError(
                "length_scale must be a positive float or a 1-D array with one "
                f"entry per feature, got shape {length_scale.shape}"
            )
        if not np.all(np.isfinite(length_scale) & (length_scale > 0)):
            raise ValueError(
                f"length_scale must be finite and > 0, got {self.length_scale!r}"
            )
        _check_squarable(length_scale)
        return variance, length_scale

    def _hyperparameters(self):
        variance, length_scale = self._values()
        ls = np.atleast_1d(length_scale).astype(np.float64)
        ls_bounds = _check_bounds(self.length_scale_bounds, "length_scale", ls.size)
        if ls_bounds is not None and np.any(np.abs(np.log10(ls_bounds)) > 150):
            # Else a theta within the bounds would give a kernel that refuses
            # its own length scale (clone_with_theta, then any call).
            raise ValueError(
                "length_scale_bounds must lie within [1e-150, 1e150] (the "
                "length scale's square must be a finite non-zero double), got "
                f"{self.length_scale_bounds!r}"
            )
        return [
            _Hyperparameter(
                "variance", np.array([variance]),
                _check_bounds(self.variance_bounds, "variance", 1), True,
            ),
            _Hyperparameter("length_scale", ls, ls_bounds, not self.anisotropic),
        ]

    def _set_hyperparameter(self, name, value):
        setattr(self, name, value)

    def _check_ard_inputs(self, X, Y, length_scale):
        """Refuse inputs ARD length scales cannot scale (sparse, or of
        another number of features)."""
        if sp.issparse(X) or (Y is not None and sp.issparse(Y)):
            raise ValueError(
                "RBFKernel with an array length_scale (ARD) needs dense X; got a "
                "scipy.sparse matrix. Use a scalar length_scale for sparse "
                "features, or convert small inputs with .toarray()"
            )
        if length_scale.size != X.shape[1]:
            raise ValueError(
                f"length_scale has {length_scale.size} entries (ARD) but X has "
                f"{X.shape[1]} features; give one length scale per feature"
            )

    def _scaled_inputs(self, X, Y, length_scale):
        """Inputs divided by the ARD length scales (dense only)."""
        self._check_ard_inputs(X, Y, length_scale)
        return X / length_scale, None if Y is None else Y / length_scale

    def _scaled_sq_distances(self, X, Y, length_scale):
        """``||x - y||^2 / ell^2`` (per-feature scaling under ARD)."""
        if self.anisotropic:
            Xs, Ys = self._scaled_inputs(X, Y, length_scale)
            return _checked_sq_distances(_sq_distances(Xs, Ys))
        d2 = _checked_sq_distances(_sq_distances(X, Y))
        d2 *= 1.0 / length_scale**2
        return d2

    def _call(self, X, Y):
        variance, length_scale = self._values()
        K = self._scaled_sq_distances(X, Y, length_scale)
        K *= -0.5
        np.exp(K, out=K)
        K *= variance
        return K

    def _diag(self, X):
        variance, length_scale = self._values()
        if self.anisotropic:  # the inputs __call__ would refuse
            self._check_ard_inputs(X, None, length_scale)
        return np.full(X.shape[0], variance)

    def _gradient_vjp(self, X, Y, G):
        variance, length_scale = self._values()
        free_v, free_l = self._free_flags()
        d2 = self._scaled_sq_distances(X, Y, length_scale)
        # W = G * K, the weights of both partial derivatives.
        W = np.exp(-0.5 * d2)
        W *= variance
        W *= G
        grad_v = W.sum() if free_v else 0.0  # dK/dlog(variance) = K
        grad_l = 0.0
        if free_l and not self.anisotropic:
            # dK/dlog(ell) = K * ||x - y||^2 / ell^2
            grad_l = np.vdot(W, d2)
        elif free_l:
            # dK/dlog(ell_d) = K * (x_d - y_d)^2 / ell_d^2; summed against G
            # per feature without an (n_X, n_Y, D) tensor:
            # sum_ij W_ij (a_id - b_jd)^2 = a_d^2 . rowsum(W) + b_d^2 . colsum(W)
            #                               - 2 sum_i a_id (W b)_id.
            Xs, Ys = self._scaled_inputs(X, Y, length_scale)
            Ys = Xs if Ys is None else Ys
            grad_l = (
                W.sum(axis=1) @ Xs**2
                + W.sum(axis=0) @ Ys**2
                - 2.0 * np.einsum("id,id->d", Xs, W @ Ys)
            )
        return _select_free([grad_v, grad_l], [free_v, free_l])

    def _diag_gradient_vjp(self, X, g):
        variance, length_scale = self._values()
        if self.anisotropic:  # the inputs __call__ would refuse
            self._check_ard_inputs(X, None, length_scale)
        free_v, free_l = self._free_flags()
        grad_v = variance * g.sum() if free_v else 0.0
        grad_l = np.zeros(np.size(length_scale)) if free_l else 0.0
        return _select_free([grad_v, grad_l], [free_v, free_l])


# --------------------------------------------------------------------------
# Adapter for scikit-learn kernels
# --------------------------------------------------------------------------


def _einsum_cross_block(kernel, A, B, G):
    """``sum_ij G_ij dk(a_i, b_j)/dtheta`` from the stacked ``[A; B]``."""
    _, dK = kernel(np.vstack([A, B]), eval_gradient=True)
    return np.einsum("ij,ijp->p", G, dK[: A.shape[0], A.shape[0]:, :])


def _sklearn_theta_names(kernel):
    """The names of a scikit-learn kernel's ``theta`` entries, in order."""
    names = []
    for hp in kernel.hyperparameters:
        if not hp.fixed:
            names += [hp.name] if hp.n_elements == 1 else [
                f"{hp.name}[{i}]" for i in range(hp.n_elements)
            ]
    return names


class SklearnKernel(Kernel):
    """Adapter for a :mod:`sklearn.gaussian_process.kernels` kernel.

    Works on dense inputs only: scikit-learn's GP kernels compute on dense
    arrays, so sparse ``X`` is refused rather than silently densified. Its
    :attr:`theta`, :attr:`bounds` and their order are those of the wrapped
    kernel (already log-transformed there). Setting :attr:`theta` modifies
    the wrapped kernel; :func:`get_kernel` wraps a copy of the user's kernel.

    Parameters
    ----------
    kernel : sklearn.gaussian_process.kernels.Kernel
        The scikit-learn kernel, e.g. ``ConstantKernel() * RBF()``.

    Notes
    -----
    scikit-learn kernels expose gradients only as full ``(n, n, n_theta)``
    tensors of ``k(X, X)``. :meth:`gradient_vjp` with ``Y`` given evaluates
    the gradient on stacked blocks ``[X_a; Y_b]`` and keeps the off-diagonal
    block, which is exact but costs up to about 4 times the work of forming
    the Jacobian of ``K(X, Y)`` itself (``O(n_X n_Y n_theta)`` memory-bounded
    work per block); blocks are sized so that each tensor stays under 32 MiB.
    :meth:`diag_gradient_vjp` needs one row for stationary kernels and
    ``O(n_X * 256 * n_theta)`` work otherwise.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn.gaussian_process.kernels import RBF, ConstantKernel
    >>> from skgpstruct.kernels import SklearnKernel
    >>> kernel = SklearnKernel(ConstantKernel(2.0) * RBF(1.0))
    >>> kernel.hyperparameter_names
    ['k1__constant_value', 'k2__length_scale']
    >>> kernel.theta  # the wrapped kernel's theta: log 2, log 1
    array([0.69314718, 0.        ])
    >>> X = np.array([[0.0], [1.0]])
    >>> bool(np.allclose(kernel(X), (ConstantKernel(2.0) * RBF(1.0))(X)))
    True
    """

    def __init__(self, kernel):
        self.kernel = kernel

    def _sklearn_kernel(self):
        if not isinstance(self.kernel, sk_kernels.Kernel):
            raise ValueError(
                "SklearnKernel needs an instance of "
                "sklearn.gaussian_process.kernels.Kernel, got "
                f"{type(self.kernel).__name__}"
            )
        if isinstance(self.kernel, sk_kernels.CompoundKernel):
            raise ValueError(
                f"kernel {self.kernel!r} is a CompoundKernel, whose value is one "
                "matrix per kernel; the GP needs a single covariance (combine "
                "kernels with + or * instead)"
            )
        return self.kernel

    def __repr__(self):
        return f"SklearnKernel(kernel={self.kernel!r})"

    # theta, bounds and their order come straight from scikit-learn.
    @property
    def theta(self):
        """Log of the free hyperparameters of the wrapped kernel.

        Returns
        -------
        theta : ndarray of shape (n_dims,)
            ``kernel.theta``; assigning sets ``kernel.theta``.
        """
        return np.array(self._sklearn_kernel().theta, dtype=np.float64)

    @theta.setter
    def theta(self, theta):
        kernel = self._sklearn_kernel()
        theta = np.asarray(theta, dtype=np.float64)
        n_dims = len(kernel.theta)
        if theta.shape != (n_dims,):
            raise ValueError(
                f"theta must have shape ({n_dims},) for {self!r}, got shape "
                f"{theta.shape}"
            )
        if not np.all(np.isfinite(theta)):
            raise ValueError(f"theta must be finite, got {theta}")
        kernel.theta = theta

    @property
    def bounds(self):
        """Log-space bounds of the wrapped kernel, shape (n_dims, 2)."""
        return np.asarray(self._sklearn_kernel().bounds, dtype=np.float64).reshape(
            -1, 2
        )

    def _hyperparameters(self):
        kernel = self._sklearn_kernel()
        params = kernel.get_params(deep=True)
        values = {
            hp.name: np.atleast_1d(np.asarray(params[hp.name], dtype=np.float64))
            for hp in kernel.hyperparameters
        }
        with np.errstate(divide="ignore", invalid="ignore"):  # refused below
            theta = np.asarray(kernel.theta, dtype=np.float64)
            shown = repr(kernel)  # scikit-learn prints a negative constant's sqrt
        if not np.all(np.isfinite(theta)):
            # Named with the values as given (scikit-learn shows a negative
            # constant as nan**2, and its log is NaN).
            free = np.concatenate([
                values[hp.name] for hp in kernel.hyperparameters if not hp.fixed
            ])
            bad = {
                name: float(value)
                for name, value, log in zip(
                    _sklearn_theta_names(kernel), free, theta, strict=True
                )
                if not np.isfinite(log)
            }
            raise ValueError(
                f"kernel {shown} has hyperparameters that are not finite and "
                f"positive: {bad}"
            )
        for hp in kernel.hyperparameters:
            if not hp.fixed:
                bounds = np.asarray(hp.bounds, dtype=np.float64).reshape(-1, 2)
                if not np.all(bounds[:, 0] < bounds[:, 1]):
                    raise ValueError(
                        f"kernel {kernel!r}: the bounds of {hp.name} must have "
                        f"low < high (use 'fixed' to fix it), got {hp.bounds!r}"
                    )
        result = []
        for hp in kernel.hyperparameters:
            bounds = (
                None if hp.fixed
                else np.asarray(hp.bounds, dtype=np.float64).reshape(-1, 2)
            )
            result.append(
                _Hyperparameter(hp.name, values[hp.name], bounds, hp.n_elements == 1)
            )
        return result

    def _set_hyperparameter(self, name, value):
        # Not reached through ``theta`` (delegated to scikit-learn above).
        self._sklearn_kernel().set_params(**{name: value})

    def _dense(self, X, name):
        if sp.issparse(X):
            raise ValueError(
                f"SklearnKernel cannot take sparse {name}: scikit-learn's GP "
                "kernels work on dense arrays, and densifying high-dimensional "
                "sparse features is what this library avoids. Use LinearKernel "
                "or RBFKernel (both accept scipy.sparse rows), or pass dense "
                f"{name}"
            )
        return X

    def _call(self, X, Y):
        X = self._dense(X, "X")
        Y = None if Y is None else self._dense(Y, "Y")
        return np.asarray(self._sklearn_kernel()(X, Y), dtype=np.float64)

    def _diag(self, X):
        X = self._dense(X, "X")
        return np.asarray(self._sklearn_kernel().diag(X), dtype=np.float64)

    def _block_rows(self):
        """Largest stacked size whose gradient tensor fits the budget."""
        per_entry = 8.0 * max(self.n_dims, 1)
        return max(int(np.sqrt(_SKLEARN_GRADIENT_BYTES / per_entry)), 2)

    def _gradient_vjp(self, X, Y, G):
        kernel = self._sklearn_kernel()
        X = self._dense(X, "X")
        rows = self._block_rows()
        n_x = X.shape[0]
        if Y is None:
            if n_x <= rows:
                _, dK = kernel(X, eval_gradient=True)
                return np.einsum("ij,ijp->p", G, dK)
            size = max(rows // 2, 1)
            grad = np.zeros(self.n_dims)
            starts = range(0, n_x, size)
            for a in starts:
                sa = slice(a, a + size)
                _, dK = kernel(X[sa], eval_gradient=True)
                grad += np.einsum("ij,ijp->p", G[sa, sa], dK)
                for b in starts:
                    if b <= a:
                        continue
                    sb = slice(b, b + size)
                    # K is symmetric: the (b, a) block is the (a, b) transpose.
                    G_ab = G[sa, sb] + G[sb, sa].T
                    grad += _einsum_cross_block(kernel, X[sa], X[sb], G_ab)
            return grad
        Y = self._dense(Y, "Y")
        n_y = Y.shape[0]
        if n_x + n_y <= rows:
            return _einsum_cross_block(kernel, X, Y, G)
        size = max(rows // 2, 1)
        grad = np.zeros(self.n_dims)
        for a in range(0, n_x, size):
            for b in range(0, n_y, size):
                sa, sb = slice(a, a + size), slice(b, b + size)
                grad += _einsum_cross_block(kernel, X[sa], Y[sb], G[sa, sb])
        return grad

    def _diag_gradient_vjp(self, X, g):
        kernel = self._sklearn_kernel()
        X = self._dense(X, "X")
        if X.shape[0] == 0:
            return np.zeros(self.n_dims)
        if kernel.is_stationary():
            # k(x, x) is the same for every x.
            _, dK = kernel(X[:1], eval_gradient=True)
            return g.sum() * dK[0, 0, :]
        grad = np.zeros(self.n_dims)
        size = _SKLEARN_DIAG_BLOCK_ROWS
        for a in range(0, X.shape[0], size):
            s = slice(a, a + size)
            _, dK = kernel(X[s], eval_gradient=True)
            grad += np.einsum("i,iip->p", g[s], dK)
        return grad


# --------------------------------------------------------------------------
# Kernel specifications
# --------------------------------------------------------------------------

#: Kernels accepted by name in :func:`get_kernel`.
KERNELS = {"linear": LinearKernel, "rbf": RBFKernel}


def get_kernel(spec):
    """Turn a kernel specification into a new :class:`Kernel`.

    Parameters
    ----------
    spec : str, Kernel or sklearn.gaussian_process.kernels.Kernel
        A name from :data:`KERNELS` (``"linear"``, ``"rbf"``; default
        hyperparameters: :class:`~skgpstruct.GPStructClassifier` instead
        starts the named kernels from its training data), a :class:`Kernel`,
        or a scikit-learn GP kernel (wrapped in :class:`SklearnKernel`).

    Returns
    -------
    kernel : Kernel
        A new object: kernel instances are deep-copied, so optimising the
        returned kernel's hyperparameters never modifies the caller's object.

    Raises
    ------
    ValueError
        If ``spec`` is an unknown name or of an unsupported type.

    Examples
    --------
    >>> from sklearn.gaussian_process.kernels import RBF
    >>> from skgpstruct.kernels import LinearKernel, get_kernel
    >>> get_kernel("rbf")
    RBFKernel(variance=1, length_scale=1)
    >>> get_kernel(RBF(length_scale=2.0))
    SklearnKernel(kernel=RBF(length_scale=2))
    >>> mine = LinearKernel(variance=0.5)
    >>> get_kernel(mine) is mine  # a copy: fitting never changes ``mine``
    False
    """
    if isinstance(spec, str):
        if spec not in KERNELS:
            raise ValueError(
                f"unknown kernel {spec!r}; accepted names are "
                f"{sorted(KERNELS)}, or pass a skgpstruct.kernels.Kernel or a "
                "sklearn.gaussian_process.kernels.Kernel instance"
            )
        return KERNELS[spec]()
    if isinstance(spec, Kernel):
        return copy.deepcopy(spec)
    if isinstance(spec, sk_kernels.Kernel):
        return SklearnKernel(copy.deepcopy(spec))
    if isinstance(spec, type) and issubclass(spec, Kernel | sk_kernels.Kernel):
        raise ValueError(
            f"kernel must be a kernel instance, got the class {spec.__name__}; "
            f"pass {spec.__name__}()"
        )
    raise ValueError(
        f"kernel must be one of {sorted(KERNELS)}, a skgpstruct.kernels.Kernel "
        "or a sklearn.gaussian_process.kernels.Kernel instance, got "
        f"{type(spec).__name__}"
    )


def check_kernel(spec, *, sparse):
    """Build a kernel with :func:`get_kernel` and validate it for the data.

    Parameters
    ----------
    spec : str, Kernel or sklearn.gaussian_process.kernels.Kernel
        Kernel specification, as for :func:`get_kernel`.
    sparse : bool
        Whether the features are scipy.sparse matrices.

    Returns
    -------
    kernel : Kernel
        A new kernel (never the caller's object) whose hyperparameters and
        bounds are valid.

    Raises
    ------
    ValueError
        If the specification is invalid, a hyperparameter or its bounds are
        invalid, a hyperparameter starts outside its bounds, or the kernel
        cannot take sparse inputs while ``sparse`` is True
        (:class:`SklearnKernel`, ARD :class:`RBFKernel`).

    Examples
    --------
    >>> from sklearn.gaussian_process.kernels import RBF
    >>> from skgpstruct.kernels import check_kernel
    >>> check_kernel("rbf", sparse=True)
    RBFKernel(variance=1, length_scale=1)
    >>> check_kernel(RBF(), sparse=True)
    Traceback (most recent call last):
        ...
    ValueError: kernel RBF(length_scale=1) is a scikit-learn kernel, which needs ...
    """
    sparse = check_flag(sparse, "sparse")
    kernel = get_kernel(spec)
    # Validates hyperparameter values and bounds; a start outside its bounds
    # was clipped by the optimiser, with the hyperprior left centred outside
    # them (LinearKernel(variance=1e9) ended at the upper bound).
    for hp in kernel._hyperparameters():
        if hp.bounds is None:
            continue
        low, high = hp.bounds[:, 0], hp.bounds[:, 1]
        # a relative margin for values a fit ended at (rounded at a bound)
        outside = (hp.value < low * (1 - 1e-9)) | (hp.value > high * (1 + 1e-9))
        if np.any(outside):
            i = int(np.flatnonzero(outside)[0])
            where = "" if hp.scalar else f"[{i}]"
            raise ValueError(
                f"{hp.name}{where}={hp.value[i]:.4g} lies outside "
                f"{hp.name}_bounds ({low[i]:.4g}, {high[i]:.4g}): start the "
                f"kernel inside its bounds, or widen {hp.name}_bounds"
            )
    if sparse and isinstance(kernel, SklearnKernel):
        raise ValueError(
            f"kernel {kernel.kernel!r} is a scikit-learn kernel, which needs "
            "dense features, but X is sparse; use 'linear', 'rbf' or another "
            "skgpstruct.kernels.Kernel that accepts scipy.sparse rows"
        )
    if sparse and isinstance(kernel, RBFKernel) and kernel.anisotropic:
        raise ValueError(
            "RBFKernel with an array length_scale (ARD) needs dense features, "
            "but X is sparse; use a scalar length_scale"
        )
    return kernel
