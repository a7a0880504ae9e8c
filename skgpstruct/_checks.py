"""Checks of scalar arguments shared by the public API.

``bool`` is a subclass of ``int`` in Python: a flag given where a count or a
number is expected (``n_bins=True``) passes an ``isinstance`` check of
``numbers.Integral`` and means 1. These helpers refuse it.

Also :func:`outside_stacklevel`, which points a warning at the code that
called skgpstruct.
"""

import numbers
import sys

import numpy as np

__all__ = [
    "check_flag", "check_groups", "check_integer", "check_n_jobs",
    "check_random_state_seed", "is_integer", "is_real", "outside_stacklevel",
]


def outside_stacklevel():
    """The ``stacklevel`` for :func:`warnings.warn`, called from skgpstruct's
    code, of the first frame outside the package: the warning points at the
    line that called skgpstruct, whichever public function or method it
    called and however deep the warning is raised. Called through another
    library (scikit-learn's ``Pipeline``, ``GridSearchCV``), that is the
    other library's line."""
    frame, level = sys._getframe(1), 1
    while frame is not None and _in_package(frame.f_globals.get("__name__")):
        frame, level = frame.f_back, level + 1
    return level


def _in_package(module):
    """Whether the module named ``module`` belongs to skgpstruct."""
    return module is not None and (
        module == __package__ or module.startswith(__package__ + ".")
    )


def is_integer(value):
    """Whether ``value`` is an integer (Python or NumPy), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value):
    """Whether ``value`` is a real number (Python or NumPy), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_integer(value, name, low):
    """``value`` if it is an integer ``>= low``, else a ValueError naming
    ``name`` and what is accepted."""
    if not is_integer(value) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


def check_flag(value, name):
    """``value`` if it is True or False (Python or NumPy), else a ValueError
    naming ``name``: a truthy string such as ``"no"`` must not mean yes."""
    if not isinstance(value, bool | np.bool_):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def check_groups(groups, name, n_features=None):
    """``groups`` as an int64 array of one non-negative integer group index
    per feature column (``n_features`` of them when given), else a
    ValueError naming ``name`` and what is accepted."""
    try:
        array = np.asarray(groups)
    except ValueError:  # ragged
        array = np.asarray(groups, dtype=object)
    if array.size == 0 and n_features == 0 and array.ndim == 1:
        return array.astype(np.int64)  # no column, no group ([] is float)
    if array.ndim == 1 and array.size and array.dtype.kind == "i" and array.min() < 0:
        where = int(np.argmin(array >= 0))
        raise ValueError(
            f"{name} must hold non-negative group indices, got {array[where]} "
            f"at position {where}"
        )
    if (
        array.ndim != 1 or array.size == 0 or array.dtype.kind not in "iu"
        or (n_features is not None and array.size != n_features)
    ):
        count = "" if n_features is None else f" ({n_features})"
        raise ValueError(
            f"{name} must hold one non-negative integer group index per "
            f"feature{count}, got an array of shape {array.shape} and dtype "
            f"{array.dtype}"
        )
    return array.astype(np.int64, copy=False)


def check_n_jobs(value, name="n_jobs"):
    """``value`` if it is None or a non-zero integer (joblib's ``n_jobs``:
    -1 for every core), else a ValueError naming ``name``."""
    if value is not None and (not is_integer(value) or value == 0):
        raise ValueError(
            f"{name} must be None or a non-zero integer (-1 for all cores), "
            f"got {value!r}"
        )
    return value


def check_random_state_seed(value, name="random_state"):
    """A NumPy ``Generator`` from ``value``: None, a non-negative integer, a
    ``RandomState`` (its next integer seeds the generator) or a ``Generator``
    (used as it is); else a ValueError naming ``name``."""
    if isinstance(value, np.random.Generator):
        return value
    if isinstance(value, np.random.RandomState):
        return np.random.default_rng(value.randint(2**31))
    if value is None or (is_integer(value) and value >= 0):
        return np.random.default_rng(value)
    raise ValueError(
        f"{name} must be None, a non-negative int, a RandomState or a "
        f"Generator, got {value!r}"
    )
