"""Piecewise pseudo-likelihood of the linear chain (paper section 6.1.1)."""

import numpy as np
from scipy.special import logsumexp

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


# Below this magnitude exp() of a potential neither overflows nor underflows
# (exp(300) ~ 2e130), so a log-sum-exp needs no shift.
_UNSHIFTED_MAGNITUDE = 300.0


def _exp_and_log_normaliser(x):
    """``exp(x - shift)``, its row sums and ``logsumexp(x, axis=-1)``.

    NumPy reduces a short last axis slowly (a max over it costs more than
    ``exp`` of the whole array), so the usual per-row max shift is taken
    only when some potential is too large for ``exp``; otherwise the row
    sums are one matrix-vector product. ``shift`` is 0 or the row max, and
    ``exp / sums[..., None]`` is the softmax either way.
    """
    ones = np.ones(x.shape[-1])
    if x.size == 0 or max(x.max(), -x.min()) <= _UNSHIFTED_MAGNITUDE:
        exp = np.exp(x)
        sums = exp @ ones
        return exp, sums, np.log(sums)
    shift = np.max(x, axis=-1, keepdims=True)
    exp = np.exp(x - shift)
    sums = exp @ ones
    return exp, sums, np.log(sums) + shift[..., 0]


class PiecewisePseudoLikelihood(Likelihood):
    """Piecewise pseudo-likelihood of a linear-chain CRF.

    The piecewise pseudo-likelihood (PWPL) of Sutton and McCallum (2007),
    the drop-in replacement of the exact likelihood in section 6.1.1 of the
    paper: for every factor of the model and every variable of that factor,
    the log-probability of the variable's label given the labels of the
    factor's other variables, under *that factor alone*. The factors are
    the cliques of the model as the paper writes it (eq. 1 and 4: unary
    nodes ``f_u`` and pairwise nodes ``f_bin``): a unary factor
    ``exp(u[t, y_t])`` on every token and a transition factor
    ``exp(P[y_t, y_{t+1}])`` on every pair of neighbours, the unaries
    ``u`` and the transitions ``P`` in separate factors. For a sequence
    with labels ``y_0 .. y_{T-1}``::

        log PWPL(y) = sum_{t=0}^{T-1} [ u[t, y_t] - logsumexp_v u[t, v] ]
                    + sum_{t=0}^{T-2} [ P[y_t, y_{t+1}] - logsumexp_i P[i, y_{t+1}]
                                      + P[y_t, y_{t+1}] - logsumexp_j P[y_t, j] ]

    The first sum is the unary factors (one variable each: a softmax over
    the labels). Each transition factor ``(t, t+1)`` contributes two local
    conditionals: ``y_t`` given ``y_{t+1}`` (a softmax down the column
    ``P[:, y_{t+1}]``) and ``y_{t+1}`` given ``y_t`` (along the row
    ``P[y_t, :]``). This is *not* piecewise training, which normalises a
    transition factor over both of its variables
    (``P[y_t, y_{t+1}] - logsumexp_{i, j} P[i, j]``). Every token costs
    O(V) for V labels (its unary softmax; the column and row normalisers
    of ``P`` depend on the sample only), where forward-backward costs
    O(V^2).

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

    Notes
    -----
    No factor holds both a unary and a transition potential, so the PWPL is
    a function of ``u`` plus a function of ``P``: the unaries are fitted as
    independent per-token softmax classifiers, ``softmax(u[t]) ~ p(y_t |
    x_t)``, and the transitions to the label bigrams of the training
    sequences alone (without the prior, the transition part is maximised by
    ``P[a, b] = log N[a, b] + const``, the log bigram counts:
    ``softmax(P) ~ p(y_t, y_{t+1})``), whatever the unaries already explain.
    Adding both in the chain would count the label frequencies, already in
    the unaries, again in every transition (with a dominant label, ``O`` in
    named-entity data, Viterbi then tends to that label). So predictions
    combine the pieces as the chain they describe:
    ``p(y | x) proportional to prod_t p(y_t | x_t) prod_t p(y_t, y_{t+1}) /
    (p(y_t) p(y_{t+1}))``, i.e. the chain with the unaries and the pointwise
    mutual information of the label pairs as transitions
    (:meth:`decoding_pairwise`; exact when the tokens' features are
    independent given their labels). On the dev splits (before 757c9b3,
    when basenp's and chunking's overlapped section 2's data) this decoding
    was better than adding the fitted transitions on every set (user
    guide, "Choosing the likelihood").

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

    def decoding_pairwise(self, pairwise):
        """The pointwise mutual information of the label pairs under ``P``.

        With ``p(a, b) = softmax(P)[a, b]`` over all label pairs and its
        margins ``p(a)`` (rows) and ``p(b)`` (columns),
        ``log p(a, b) - log p(a) - log p(b)``: the transitions of the chain
        the piecewise factors describe (see the class notes).

        Parameters
        ----------
        pairwise : ndarray of shape (..., n_classes, n_classes)

        Returns
        -------
        ndarray of the same shape
        """
        pairwise = np.asarray(pairwise, dtype=np.float64)
        return (
            pairwise
            - logsumexp(pairwise, axis=-1, keepdims=True)
            - logsumexp(pairwise, axis=-2, keepdims=True)
            + logsumexp(pairwise, axis=(-2, -1), keepdims=True)
        )

    def _log_prob(self, unary, pairwise, offsets, labels):
        return self._compute(unary, pairwise, offsets, labels, False)[0]

    def _log_prob_and_gradient(self, unary, pairwise, offsets, labels):
        return self._compute(unary, pairwise, offsets, labels, True)

    @staticmethod
    def _compute(unary, pairwise, offsets, labels, with_gradient):
        # The arguments arrive checked (Likelihood.log_prob).
        n_samples, n_tokens, n_labels = unary.shape
        n_seq = offsets.shape[0] - 1
        tokens = np.arange(n_tokens)

        # Unary factors: log softmax at the observed label, per token.
        # (np.take on a flat axis gathers much faster than unary[:, t, y].)
        exp_unary, sum_unary, log_norm = _exp_and_log_normaliser(unary)
        observed = tokens * n_labels + labels
        flat_unary = unary.reshape(n_samples, n_tokens * n_labels)
        per_token = np.take(flat_unary, observed, axis=1)
        per_token -= log_norm

        # Transition factors (t, t+1), both tokens in one sequence, indexed
        # by t. Their two local conditionals, y_t given y_{t+1} (down column
        # b) and y_{t+1} given y_t (along row a), depend on the sample and
        # the label pair only: a (S, V * V) table, gathered per token; the
        # last token of a sequence points to an extra column of zeros.
        exp_col, sum_col, log_col = _exp_and_log_normaliser(
            np.swapaxes(pairwise, 1, 2)
        )  # exp_col[s, b, a] = exp(P[s, a, b] - shift); log_col over columns b
        exp_row, sum_row, log_row = _exp_and_log_normaliser(pairwise)
        table = np.zeros((n_samples, n_labels * n_labels + 1))
        table[:, :-1] = (
            2.0 * pairwise - log_col[:, None, :] - log_row[:, :, None]
        ).reshape(n_samples, n_labels * n_labels)
        sequence = np.repeat(np.arange(n_seq), np.diff(offsets))
        first = np.flatnonzero(sequence[:-1] == sequence[1:])
        a, b = labels[first], labels[first + 1]
        pair_index = np.full(n_tokens, n_labels * n_labels)
        pair_index[first] = a * n_labels + b
        per_token += np.take(table, pair_index, axis=1)
        log_prob = _segment_sum(per_token, offsets)
        if not with_gradient:
            return (log_prob,)

        # d/du = onehot(y) - softmax(u)
        grad_unary = np.multiply(
            exp_unary, (-1.0 / sum_unary)[..., None], out=exp_unary
        )
        grad_unary.reshape(n_samples, n_tokens * n_labels)[:, observed] += 1.0

        flat = sequence[first] * (n_labels * n_labels) + pair_index[first]
        counts = np.bincount(flat, minlength=n_seq * n_labels * n_labels)
        counts = counts.reshape(n_seq, n_labels, n_labels).astype(np.float64)
        n_in = counts.sum(axis=1)  # (n_seq, V): transitions into label b
        n_out = counts.sum(axis=2)  # (n_seq, V): transitions out of label a
        col = np.swapaxes(exp_col / sum_col[..., None], 1, 2)  # softmax, axis 1
        row = exp_row / sum_row[..., None]  # softmax along axis 2
        grad_pairwise = np.empty((n_samples, n_seq, n_labels, n_labels))
        np.multiply(n_in[None, :, None, :], col[:, None], out=grad_pairwise)
        grad_pairwise += n_out[None, :, :, None] * row[:, None]
        np.subtract(2.0 * counts[None], grad_pairwise, out=grad_pairwise)
        return log_prob, grad_unary, grad_pairwise
