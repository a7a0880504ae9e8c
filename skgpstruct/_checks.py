"""Checks of scalar arguments shared by the public API.

``bool`` is a subclass of ``int`` in Python: a flag given where a count or a
number is expected (``n_bins=True``) passes an ``isinstance`` check of
``numbers.Integral`` and means 1. These helpers refuse it.
"""

import numbers

__all__ = ["check_integer", "is_integer", "is_real"]


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
