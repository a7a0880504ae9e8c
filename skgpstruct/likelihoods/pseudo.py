"""Piecewise pseudo-likelihood of the linear chain (paper section 6.1.1)."""

import numpy as np

from .. import chain
from .base import Likelihood

__all__ = ["PiecewisePseudoLikelihood"]


def _segment_sum(values, offsets):
    """Sum ``values`` (S, n_tokens) over each sequence: (S, n_seq), 0 if empty."""
    lengths = np.diff(offsets)
    out = np.zeros((values.shape[0], lengths.shape[0]))
    nonempty = lengths > 0
    if np.any(nonempty):
        # Starts of the non-empty sequences only: each reduction then runs up
        # to the next non-empty start, i.e. exactly over its own tokens.
        out[:, nonempty] = np.add.reduceat(values, offsets[:-1][nonempty], axis=1)
    return out


def _log_softmax(x, axis):
    """``x - logsumexp(x, axis)`` and the softmax, stable for any scale."""
    shifted = x - np.max(x, axis=axis, keepdims=True)
    exp = np.exp(shifted)
    total = np.sum(exp, axis=axis, keepdims=True)
    exp /= total
    shifted -= np.log(total)
    return shifted, exp


class PiecewisePseudoLikelihood(Likelihood):
    """Piecewise pseudo-likelihood of a linear-chain CRF.

    The piecewise pseudo-likelihood (PWPL) of Sutton and McCallum (2007),
    the drop-in replacement of the exact likelihood in section 6.1.1 of the
    paper. Every factor of the chain is taken on its own, and within a
    factor every variable is conditioned on the other variables of *that
    factor only*. For a sequence with labels ``y_0 .. y_{T-1}``, unary
    potentials ``u`` and transition potentials ``P``::

        log PWPL(y) = sum_{t=0}^{T-1} [ u[t, y_t] - logsumexp_v u[t, v] ]
                    + sum_{t=0}^{T-2} [ P[y_t, y_{t+1}] - logsumexp_i P[i, y_{t+1}]
                                      + P[y_t, y_{t+1}] - logsumexp_j P[y_t, j] ]

    The first sum is the unary factors (one variable each: a softmax over
    the labels). Each transition factor ``(t, t+1)`` contributes two local
    conditionals: ``y_t`` given ``y_{t+1}`` (a softmax down the column
    ``P[:, y_{t+1}]``) and ``y_{t+1}`` given ``y_t`` (along the row
    ``P[y_t, :]``). This is *not* piecewise training, which normalises a
    transition factor over both of its variables
    (``P[y_t, y_{t+1}] - logsumexp_{i, j} P[i, j]``): PWPL keeps the cost
    of every token linear in the number of labels V (the ``V x V`` column
    and row normalisers depend only on the sample, not on the token),
    where forward-backward is quadratic.

    The PWPL is not a normalised distribution over labellings: even when
    the exact chain factorises (``P = 0``) it equals the exact
    log-likelihood minus ``2 (T - 1) log V``, a constant. A zero-length
    sequence gives 0.

    Its gradient is exact (``has_gradient = True``), so both the pathwise
    and the score estimators apply::

        d/du[t, v]  = [v == y_t] - softmax(u[t])[v]
        d/dP[a, b]  = 2 N[a, b] - n_in[b] Pcol[a, b] - n_out[a] Prow[a, b]

    with ``N`` the sequence's transition counts, ``n_in = N.sum(0)``,
    ``n_out = N.sum(1)``, ``Pcol = softmax(P, axis=0)`` and
    ``Prow = softmax(P, axis=1)``.

    References
    ----------
    C. Sutton and A. McCallum. Piecewise pseudolikelihood for efficient
    training of conditional random fields. ICML, 2007.

    Examples
    --------
    >>> import numpy as np
    >>> from skgpstruct.likelihoods import PiecewisePseudoLikelihood
    >>> unary = np.zeros((1, 3, 2))  # one sample, 3 tokens, 2 labels
    >>> pairwise = np.zeros((1, 2, 2))
    >>> offsets, labels = np.array([0, 3]), np.array([0, 1, 1])
    >>> pwpl = PiecewisePseudoLikelihood()
    >>> bool(np.isclose(pwpl.log_prob(unary, pairwise, offsets, labels)[0, 0],
    ...                 -7 * np.log(2)))
    True
    """

    has_gradient = True

    def _log_prob(self, unary, pairwise, offsets, labels):
        return self._compute(unary, pairwise, offsets, labels, False)[0]

    def _log_prob_and_gradient(self, unary, pairwise, offsets, labels):
        return self._compute(unary, pairwise, offsets, labels, True)

    @staticmethod
    def _compute(unary, pairwise, offsets, labels, with_gradient):
        unary, pairwise, offsets = chain._check_chain(
            unary, pairwise, offsets, with_samples=True
        )
        n_samples, n_tokens, n_labels = unary.shape
        labels = chain._check_labels(labels, n_tokens, n_labels)
        n_seq = offsets.shape[0] - 1
        tokens = np.arange(n_tokens)

        # Unary factors: log softmax at the observed label, per token.
        log_soft, soft = _log_softmax(unary, axis=2)
        per_token = log_soft[:, tokens, labels]  # (S, n_tokens)

        # Transition factors, indexed by their first token t (t, t+1 in the
        # same sequence). Column / row normalisers are per sample only.
        log_col, col = _log_softmax(pairwise, axis=1)  # y_t given y_{t+1}
        log_row, row = _log_softmax(pairwise, axis=2)  # y_{t+1} given y_t
        sequence = np.repeat(np.arange(n_seq), np.diff(offsets))
        first = np.flatnonzero(sequence[:-1] == sequence[1:])
        a, b = labels[first], labels[first + 1]
        per_token[:, first] += log_col[:, a, b] + log_row[:, a, b]
        log_prob = _segment_sum(per_token, offsets)
        if not with_gradient:
            return (log_prob,)

        grad_unary = np.negative(soft, out=soft)
        grad_unary[:, tokens, labels] += 1.0

        flat = (sequence[first] * n_labels + a) * n_labels + b
        counts = np.bincount(flat, minlength=n_seq * n_labels * n_labels)
        counts = counts.reshape(n_seq, n_labels, n_labels).astype(np.float64)
        n_in = counts.sum(axis=1)  # (n_seq, V): transitions into label b
        n_out = counts.sum(axis=2)  # (n_seq, V): transitions out of label a
        grad_pairwise = np.empty((n_samples, n_seq, n_labels, n_labels))
        np.multiply(n_in[None, :, None, :], col[:, None], out=grad_pairwise)
        grad_pairwise += n_out[None, :, :, None] * row[:, None]
        np.subtract(2.0 * counts[None], grad_pairwise, out=grad_pairwise)
        return log_prob, grad_unary, grad_pairwise
