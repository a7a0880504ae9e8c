"""Synthetic sequence-labelling data."""

import numpy as np
import scipy.sparse as sp

from ._checks import (
    check_flag,
    check_integer,
    check_random_state_seed,
    is_integer,
    is_real,
)

__all__ = ["make_sequences"]


def make_sequences(
    n_sequences=100,
    *,
    n_classes=3,
    n_features=8,
    length_range=(5, 30),
    stickiness=0.8,
    noise=1.0,
    sparse=False,
    random_state=None,
):
    """Sequences of tokens whose labels follow a sticky Markov chain.

    Each label has a mean vector in feature space; a token's features are
    its label's mean plus Gaussian noise passed through a fixed non-linear
    map (a random rotation followed by ``tanh``), so neighbouring labels
    and non-linear token features both carry information.

    Parameters
    ----------
    n_sequences : int, default=100
    n_classes : int, default=3
    n_features : int, default=8
    length_range : (int, int), default=(5, 30)
        Inclusive range of sequence lengths, drawn uniformly.
    stickiness : float in [0, 1), default=0.8
        Probability that a label repeats at the next token.
    noise : float, default=1.0
        Standard deviation of the per-token noise.
    sparse : bool, default=False
        If True, return CSR matrices of binary indicators (the sign of each
        feature, one-hot over two columns per feature).
    random_state : int, RandomState instance, Generator or None, default=None

    Returns
    -------
    X : list of ndarray or CSR matrix of shape (T_n, n_features)
        With ``sparse=True`` the matrices have ``2 * n_features`` columns.
    y : list of ndarray of int of shape (T_n,)

    Examples
    --------
    >>> from skgpstruct.datasets import make_sequences
    >>> X, y = make_sequences(n_sequences=3, random_state=0)
    >>> len(X), X[0].shape[1], y[0].dtype.kind
    (3, 8, 'i')
    """
    for name, value, low in (
        ("n_sequences", n_sequences, 1),
        ("n_classes", n_classes, 2),
        ("n_features", n_features, 1),
    ):
        check_integer(value, name, low)
    try:
        lo, hi = length_range
    except (TypeError, ValueError):
        lo = hi = None
    if not (is_integer(lo) and is_integer(hi) and 1 <= lo <= hi):
        raise ValueError(
            f"length_range must be two integers 1 <= low <= high, got {length_range!r}"
        )
    for name, value, valid, accepted in (
        ("stickiness", stickiness, lambda v: 0 <= v < 1, "in [0, 1)"),
        ("noise", noise, lambda v: 0 <= v < np.inf, "a finite number >= 0"),
    ):
        if not is_real(value) or not valid(value):
            raise ValueError(f"{name} must be {accepted}, got {value!r}")
    sparse = check_flag(sparse, "sparse")
    rng = check_random_state_seed(random_state)
    means = 1.5 * rng.standard_normal((n_classes, n_features))
    rotation, _ = np.linalg.qr(rng.standard_normal((n_features, n_features)))
    X, y = [], []
    for _ in range(n_sequences):
        length = int(rng.integers(lo, hi + 1))
        labels = np.empty(length, dtype=np.int64)
        labels[0] = rng.integers(n_classes)
        for t in range(1, length):
            if rng.random() < stickiness:
                labels[t] = labels[t - 1]
            else:
                labels[t] = rng.integers(n_classes)
        latent = means[labels] + noise * rng.standard_normal((length, n_features))
        features = np.tanh(latent @ rotation)
        if sparse:
            positive = features > 0
            indicators = np.concatenate([positive, ~positive], axis=1).astype(float)
            features = sp.csr_matrix(indicators)
        X.append(features)
        y.append(labels)
    return X, y
