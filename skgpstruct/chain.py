"""Exact inference in linear-chain CRFs over ragged batches of sequences.

All sequences of a batch are concatenated along the token axis and delimited
by ``offsets``: sequence ``n`` holds tokens ``offsets[n]:offsets[n + 1]``.
Potentials may carry a leading samples axis ``S`` (e.g. posterior draws of a
GP), and one call processes every sample and sequence in compiled code with
the GIL released.

The model of one sequence with labels ``y`` of length ``T`` is::

    log p(y) = sum_t unary[t, y_t] + sum_{t < T-1} pairwise[y_t, y_{t+1}] - log_z

Inputs are validated here, once; the loops live in ``skgpstruct._chain``,
or, for forward-backward at 8 labels or more, in its AVX2 build
``_chain_avx2`` where the processor supports it (that build's Viterbi, and
its forward-backward at fewer labels, were slower).
``KERNEL_BUILD`` says which build this process loaded (see the
installation guide, "Compiled kernels and the processor").

Examples
--------
>>> from skgpstruct import chain
>>> chain.KERNEL_BUILD in ("avx2", "baseline")
True
"""

import numpy as np

from ._checks import check_flag
from ._simd import KERNEL_BUILD, baseline_kernels, kernels

__all__ = ["forward_backward", "viterbi", "log_likelihood", "KERNEL_BUILD"]

# Which build runs which kernel, from benchmarks/bench_builds.py (both
# builds timed in turn in one process; doc/benchmarks.rst, "The two builds
# of the kernels"): the AVX2 build's forward-backward took 0.74 to 0.91
# times the baseline's at 8 to 45 labels, 0.98 to 1.04 at 5 and 1.04 to
# 1.15 at 2 and 3. So forward-backward runs the AVX2 build (where it runs
# at all) from FB_AVX2_MIN_LABELS labels on. Viterbi's row-wise step took
# about the same time in both builds; its column-wise step (vector compares
# and blends over the labels) was faster than the row-wise one from
# _chain.VITERBI_COLUMNS_FROM labels on, in the AVX2 build most of all. So
# Viterbi runs the AVX2 build from there on (where that step runs) and the
# baseline build below (the two give the same bits: no step of Viterbi
# rounds differently). The path scores run the baseline build.
FB_AVX2_MIN_LABELS = 8
_chain = kernels("_chain")
_baseline_chain = baseline_kernels("_chain")


def _fb_kernels(n_labels):
    """The build of the chain kernels forward-backward runs at ``n_labels``."""
    return _chain if n_labels >= FB_AVX2_MIN_LABELS else _baseline_chain


def _viterbi_kernels(n_labels):
    """The build of the chain kernels Viterbi runs at ``n_labels``."""
    columns_from = _baseline_chain.VITERBI_COLUMNS_FROM
    return _chain if n_labels >= columns_from else _baseline_chain


# A path score adds at most n_tokens unary and n_tokens pairwise terms; inputs
# whose magnitudes could overflow that sum are refused.
_MAX_PATH_MAGNITUDE = 1e300


def _fits_path_limit(unary_magnitude, pairwise_magnitude, offsets):
    """Whether path scores of potentials of these largest magnitudes stay
    within ``_MAX_PATH_MAGNITUDE`` on the longest sequence of ``offsets``."""
    longest = int(np.max(np.diff(offsets), initial=0))
    # Python floats: an overflow here is an infinite bound, refused below,
    # not NumPy's RuntimeWarning (an error under warnings-as-errors, raised
    # before the ValueError this check exists for).
    total = float(unary_magnitude) + float(pairwise_magnitude)
    return total * (longest + 1) <= _MAX_PATH_MAGNITUDE


def _as_float_array(x, name, ndim, shape_doc):
    x = np.asarray(x)
    if x.dtype.kind not in "fiu":
        raise ValueError(
            f"{name} must be an array of real numbers, got dtype {x.dtype}"
        )
    if x.ndim != ndim:
        raise ValueError(
            f"{name} must have shape {shape_doc}, got an array with "
            f"{x.ndim} dimension(s) of shape {x.shape}"
        )
    x = np.ascontiguousarray(x, dtype=np.float64)
    if x.size:
        magnitude = np.max(np.abs(x))
        if not np.isfinite(magnitude):
            raise ValueError(f"{name} contains NaN or infinite values")
    else:
        magnitude = 0.0
    return x, magnitude


def _check_offsets(offsets, n_tokens):
    offsets = np.asarray(offsets)
    if offsets.dtype.kind not in "iu":
        raise ValueError(
            f"offsets must be an array of integers, got dtype {offsets.dtype}"
        )
    if offsets.ndim != 1 or offsets.shape[0] < 1:
        raise ValueError(
            "offsets must have shape (n_seq + 1,) with n_seq >= 0, got shape "
            f"{offsets.shape}"
        )
    if offsets[0] != 0:
        raise ValueError(f"offsets[0] must be 0, got {offsets[0]}")
    if offsets[-1] != n_tokens:
        raise ValueError(
            f"offsets[-1] must equal the number of tokens ({n_tokens}), "
            f"got {offsets[-1]}"
        )
    if offsets.dtype.kind == "u" and offsets.max() > n_tokens:
        raise ValueError(f"offsets must lie in [0, {n_tokens}]")
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    if np.any(offsets[1:] < offsets[:-1]):
        raise ValueError("offsets must be non-decreasing")
    return offsets


def _check_chain(unary, pairwise, offsets, *, with_samples):
    if with_samples:
        unary, u_mag = _as_float_array(unary, "unary", 3, "(S, n_tokens, V)")
        pairwise, p_mag = _as_float_array(pairwise, "pairwise", 3, "(S, V, V)")
        n_samples, n_tokens, n_labels = unary.shape
        expected = (n_samples, n_labels, n_labels)
    else:
        unary, u_mag = _as_float_array(unary, "unary", 2, "(n_tokens, V)")
        pairwise, p_mag = _as_float_array(pairwise, "pairwise", 2, "(V, V)")
        n_tokens, n_labels = unary.shape
        expected = (n_labels, n_labels)
    if n_labels < 1:
        raise ValueError("unary must have at least one label (V >= 1)")
    if pairwise.shape != expected:
        raise ValueError(
            f"pairwise must have shape {expected} to match unary of shape "
            f"{unary.shape}, got {pairwise.shape}"
        )
    offsets = _check_offsets(offsets, n_tokens)
    if not _fits_path_limit(u_mag, p_mag, offsets):
        raise ValueError(
            "unary and pairwise are too large in magnitude: a path score "
            "would overflow float64"
        )
    return unary, pairwise, offsets


def _check_labels(labels, n_tokens, n_labels):
    labels = np.asarray(labels)
    if labels.dtype.kind not in "iu":
        raise ValueError(
            f"labels must be an array of integers, got dtype {labels.dtype}"
        )
    if labels.shape != (n_tokens,):
        raise ValueError(
            f"labels must have shape (n_tokens,) = ({n_tokens},), got "
            f"{labels.shape}"
        )
    if n_tokens and (labels.min() < 0 or labels.max() >= n_labels):
        raise ValueError(
            f"labels must lie in [0, {n_labels}), got values in "
            f"[{labels.min()}, {labels.max()}]"
        )
    return np.ascontiguousarray(labels, dtype=np.int64)


def _forward_backward(unary, pairwise, offsets, with_marginals, with_pairs=True):
    """Kernel call on validated arrays; marginals (or the pair marginals,
    ``with_pairs=False``) are None when not wanted."""
    n_samples, n_tokens, n_labels = unary.shape
    n_seq = offsets.shape[0] - 1
    log_z = np.zeros((n_samples, n_seq))
    with_pairs = with_pairs and with_marginals
    marginals = (
        np.empty((n_samples, n_tokens, n_labels)) if with_marginals
        else np.empty((0, 0, 0))
    )
    pair_marginals = (
        np.zeros((n_samples, n_seq, n_labels, n_labels)) if with_pairs
        else np.empty((0, 0, 0, 0))
    )
    _fb_kernels(n_labels).forward_backward(
        unary, pairwise, offsets, log_z, marginals, pair_marginals,
        with_marginals, with_pairs,
    )
    return (
        log_z,
        marginals if with_marginals else None,
        pair_marginals if with_pairs else None,
    )


def _log_likelihood_unchecked(unary, pairwise, offsets, labels, return_gradient):
    """:func:`log_likelihood` on arguments it has already validated.

    Also for a caller that evaluates thousands of states of one problem (the
    ESS sampler) after ``log_likelihood`` has checked its arrays once:
    ``unary`` (S, n_tokens, V) and ``pairwise`` (S, V, V) C-contiguous
    float64 and finite, ``offsets`` and ``labels`` valid int64 arrays.
    """
    n_samples, n_tokens, n_labels = unary.shape
    n_seq = offsets.shape[0] - 1
    log_z, marginals, pair_marginals = _forward_backward(
        unary, pairwise, offsets, with_marginals=return_gradient
    )
    scores = np.empty((n_samples, n_seq))
    _baseline_chain.path_scores(unary, pairwise, offsets, labels, scores)
    loglik = scores - log_z
    if not return_gradient:
        return loglik

    grad_unary = np.negative(marginals, out=marginals)
    grad_unary[:, np.arange(n_tokens), labels] += 1.0

    sequence = np.repeat(np.arange(n_seq), np.diff(offsets))
    within = sequence[:-1] == sequence[1:]
    flat = (sequence[:-1][within] * n_labels + labels[:-1][within]) * n_labels
    flat += labels[1:][within]
    counts = np.bincount(flat, minlength=n_seq * n_labels * n_labels)
    counts = counts.reshape(n_seq, n_labels, n_labels).astype(np.float64)
    grad_pairwise = np.subtract(counts, pair_marginals, out=pair_marginals)
    return loglik, grad_unary, grad_pairwise


def forward_backward(unary, pairwise, offsets):
    """Log-partition function and marginals of linear-chain CRFs.

    Parameters
    ----------
    unary : ndarray of shape (S, n_tokens, V)
        Unary log potentials of every token of the concatenated sequences, for
        ``S`` samples and ``V`` labels. Converted to float64 if needed; must
        be finite.
    pairwise : ndarray of shape (S, V, V)
        ``pairwise[s, i, j]`` is the log potential of label ``i`` at a token
        followed by label ``j`` at the next token of the same sequence; shared
        by all sequences of sample ``s``.
    offsets : ndarray of int of shape (n_seq + 1,)
        Sequence boundaries: ``offsets[0] == 0``, ``offsets[-1] == n_tokens``,
        non-decreasing. Equal consecutive offsets give empty sequences.

    Returns
    -------
    log_z : ndarray of shape (S, n_seq)
        Log-partition function of every sequence (0 for empty sequences).
    marginals : ndarray of shape (S, n_tokens, V)
        ``p(y_t = v)``; every row sums to one.
    pair_marginals : ndarray of shape (S, n_seq, V, V)
        ``sum_t p(y_t = i, y_{t+1} = j)`` over the transitions of each
        sequence (zero for sequences shorter than two tokens).

    Raises
    ------
    ValueError
        If an argument has the wrong shape or dtype, holds non-finite
        values, or ``offsets`` is not a valid partition of the tokens.

    Notes
    -----
    Samples whose pairwise range ``max - min`` is at most 300 run in scaled
    probability space (no exponential per ``V**2`` cell); the others run in
    log space. Both are exact to rounding for any unary range.

    Examples
    --------
    Two sequences (3 tokens and 1 token), 2 labels, one sample. With all
    potentials 0 every labelling is equally likely: ``log Z = T log 2``.

    >>> import numpy as np
    >>> from skgpstruct.chain import forward_backward
    >>> unary = np.zeros((1, 4, 2))
    >>> pairwise = np.zeros((1, 2, 2))
    >>> offsets = np.array([0, 3, 4])
    >>> log_z, marginals, pair_marginals = forward_backward(unary, pairwise, offsets)
    >>> bool(np.allclose(log_z, [[3 * np.log(2), np.log(2)]]))
    True
    >>> marginals.shape, pair_marginals.shape
    ((1, 4, 2), (1, 2, 2, 2))
    >>> marginals[0, 0]
    array([0.5, 0.5])
    >>> pair_marginals[0].sum(axis=(1, 2))  # two transitions, then none
    array([2., 0.])
    """
    unary, pairwise, offsets = _check_chain(
        unary, pairwise, offsets, with_samples=True
    )
    return _forward_backward(unary, pairwise, offsets, with_marginals=True)


def viterbi(unary, pairwise, offsets):
    """Most probable labelling of every sequence (max-plus, log space).

    Parameters
    ----------
    unary : ndarray of shape (n_tokens, V)
        Unary log potentials of the concatenated sequences.
    pairwise : ndarray of shape (V, V)
        Transition log potentials, ``pairwise[i, j]`` for label ``i``
        followed by label ``j``.
    offsets : ndarray of int of shape (n_seq + 1,)
        Sequence boundaries, as in :func:`forward_backward`.

    Returns
    -------
    labels : ndarray of int64 of shape (n_tokens,)
        Best label of every token, in ``[0, V)``. Among equally good
        labellings of a sequence, the lexicographically smallest one (lowest
        label index first) is returned.
    scores : ndarray of shape (n_seq,)
        Unnormalised log potential of each best labelling (0 for empty
        sequences).

    Raises
    ------
    ValueError
        If an argument has the wrong shape or dtype, holds non-finite
        values, or ``offsets`` is not a valid partition of the tokens.

    Examples
    --------
    Changing label costs 3, so the middle token of the first sequence keeps
    label 0 although its own potential prefers label 1:

    >>> import numpy as np
    >>> from skgpstruct.chain import viterbi
    >>> unary = np.array([[2.0, 0.0], [0.0, 1.0], [2.0, 0.0],   # sequence 0
    ...                   [0.0, 1.0]])                          # sequence 1
    >>> pairwise = np.array([[0.0, -3.0], [-3.0, 0.0]])
    >>> labels, scores = viterbi(unary, pairwise, np.array([0, 3, 4]))
    >>> labels
    array([0, 0, 0, 1])
    >>> scores
    array([4., 1.])
    """
    return _viterbi(*_check_chain(unary, pairwise, offsets, with_samples=False))


def _viterbi(unary, pairwise, offsets, by_columns=None):
    """Kernel call on validated arrays (:func:`viterbi`'s checks passed:
    C-contiguous float64 potentials within the path limit, int64 offsets).
    ``by_columns`` True or False runs that step of the kernel whatever the
    labels (for the tests; the same labels and scores to the bit)."""
    n_tokens, n_labels = unary.shape
    longest = int(np.max(np.diff(offsets), initial=0))
    labels = np.zeros(n_tokens, dtype=np.int64)
    scores = np.zeros(offsets.shape[0] - 1)
    backpointers = np.empty((max(1, longest - 1), n_labels), dtype=np.int32)
    _viterbi_kernels(n_labels).viterbi(
        unary, pairwise, offsets, labels, scores, backpointers, by_columns
    )
    return labels, scores


def log_likelihood(unary, pairwise, offsets, labels, *, return_gradient=False):
    """Log-likelihood of labelled sequences, optionally with its gradient.

    Parameters
    ----------
    unary : ndarray of shape (S, n_tokens, V)
        Unary log potentials, as in :func:`forward_backward`.
    pairwise : ndarray of shape (S, V, V)
        Transition log potentials, as in :func:`forward_backward`.
    offsets : ndarray of int of shape (n_seq + 1,)
        Sequence boundaries, as in :func:`forward_backward`.
    labels : ndarray of int of shape (n_tokens,)
        Observed label of every token, in ``[0, V)``.
    return_gradient : bool, default=False
        Whether to also return the gradients with respect to the potentials.

    Returns
    -------
    loglik : ndarray of shape (S, n_seq)
        ``log p(labels of sequence n)`` under sample ``s`` (0 for empty
        sequences).
    grad_unary : ndarray of shape (S, n_tokens, V)
        Only with ``return_gradient=True``: ``onehot(labels) - marginals``,
        the gradient of ``loglik[s, n]`` with respect to the unary potentials
        of the tokens of sequence ``n``.
    grad_pairwise : ndarray of shape (S, n_seq, V, V)
        Only with ``return_gradient=True``: observed transition counts minus
        expected pair marginals, the gradient of ``loglik[s, n]`` with
        respect to ``pairwise[s]``.

    Raises
    ------
    ValueError
        If an argument has the wrong shape or dtype, holds non-finite
        values, ``offsets`` is not a valid partition of the tokens, or a
        label lies outside ``[0, V)``.

    Examples
    --------
    >>> import numpy as np
    >>> from skgpstruct.chain import forward_backward, log_likelihood
    >>> rng = np.random.default_rng(0)
    >>> unary = rng.standard_normal((2, 4, 3))  # 2 samples, 4 tokens, 3 labels
    >>> pairwise = rng.standard_normal((2, 3, 3))
    >>> offsets, labels = np.array([0, 3, 4]), np.array([0, 2, 2, 1])
    >>> loglik = log_likelihood(unary, pairwise, offsets, labels)
    >>> loglik.shape
    (2, 2)
    >>> log_z = forward_backward(unary, pairwise, offsets)[0]
    >>> score = unary[:, 3, 1]  # the one-token sequence: its unary only
    >>> bool(np.allclose(loglik[:, 1], score - log_z[:, 1]))
    True
    >>> loglik, grad_unary, grad_pairwise = log_likelihood(
    ...     unary, pairwise, offsets, labels, return_gradient=True)
    >>> grad_unary.shape, grad_pairwise.shape
    ((2, 4, 3), (2, 2, 3, 3))
    """
    return_gradient = check_flag(return_gradient, "return_gradient")
    unary, pairwise, offsets = _check_chain(
        unary, pairwise, offsets, with_samples=True
    )
    labels = _check_labels(labels, unary.shape[1], unary.shape[2])
    return _log_likelihood_unchecked(
        unary, pairwise, offsets, labels, return_gradient
    )
