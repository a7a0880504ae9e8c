"""Plain NumPy reference implementations of the chain kernels.

Two independent references for :mod:`skgpstruct.chain`:

* log-space forward-backward / Viterbi, one sequence at a time, written for
  clarity rather than speed (used on long chains and in the benchmarks);
* brute-force enumeration of all ``V**T`` labellings (tiny chains only).

Both take the same arguments as the public functions and return the same
shapes. Forward messages are normalised at every token (their log-sum-exp
is subtracted and added to log Z) so that long chains with large potentials
lose no precision.
"""

import itertools

import numpy as np
from scipy.special import logsumexp


def _sequences(offsets):
    return [(int(a), int(b)) for a, b in zip(offsets[:-1], offsets[1:], strict=True)]


def _log_sum_exp(x, axis):
    # np.logaddexp.reduce instead of scipy.special.logsumexp inside the
    # per-token recursions: same result, but scipy's costs ~150 us per call,
    # which makes a 100,000-token reference take minutes.
    return np.logaddexp.reduce(x, axis=axis)


def forward_backward_one(unary, pairwise):
    """Forward-backward of one sequence (T >= 1): unary (T, V), pairwise (V, V).

    Returns log_z, marginals (T, V) and pair marginals summed over t (V, V).
    """
    n_tokens, n_labels = unary.shape
    log_alpha = np.empty((n_tokens, n_labels))
    log_z = 0.0
    log_alpha[0] = unary[0]
    for t in range(1, n_tokens):
        log_alpha[t] = unary[t] + _log_sum_exp(
            log_alpha[t - 1][:, None] + pairwise, axis=0
        )
        shift = log_alpha[t].max()
        log_alpha[t] -= shift
        log_z += shift
    log_z += logsumexp(log_alpha[-1])
    log_beta = np.zeros((n_tokens, n_labels))
    for t in range(n_tokens - 2, -1, -1):
        message = _log_sum_exp(pairwise + unary[t + 1] + log_beta[t + 1], axis=1)
        log_beta[t] = message - message.max()
    log_gamma = log_alpha + log_beta
    marginals = np.exp(log_gamma - logsumexp(log_gamma, axis=1, keepdims=True))
    if n_tokens == 1:
        return log_z, marginals, np.zeros((n_labels, n_labels))
    # xi_t[i, j] ~ alpha_t[i] psi[i, j] phi_{t+1}[j] beta_{t+1}[j], all t at once
    log_xi = (
        log_alpha[:-1, :, None]
        + pairwise[None, :, :]
        + (unary[1:] + log_beta[1:])[:, None, :]
    )
    log_xi -= logsumexp(log_xi, axis=(1, 2), keepdims=True)
    pair = np.exp(log_xi).sum(axis=0)
    return log_z, marginals, pair


def forward_backward(unary, pairwise, offsets):
    """Reference of :func:`skgpstruct.chain.forward_backward`."""
    n_samples, n_tokens, n_labels = unary.shape
    n_seq = len(offsets) - 1
    log_z = np.zeros((n_samples, n_seq))
    marginals = np.zeros((n_samples, n_tokens, n_labels))
    pair = np.zeros((n_samples, n_seq, n_labels, n_labels))
    for s in range(n_samples):
        for n, (start, stop) in enumerate(_sequences(offsets)):
            if stop == start:
                continue
            log_z[s, n], marginals[s, start:stop], pair[s, n] = forward_backward_one(
                unary[s, start:stop], pairwise[s]
            )
    return log_z, marginals, pair


def viterbi(unary, pairwise, offsets):
    """Reference of :func:`skgpstruct.chain.viterbi` (max-plus over suffixes).

    ``np.argmax`` returns the first maximum, so picking labels front to back
    gives the lexicographically smallest optimal labelling.
    """
    labels = np.zeros(unary.shape[0], dtype=np.int64)
    scores = np.zeros(len(offsets) - 1)
    for n, (start, stop) in enumerate(_sequences(offsets)):
        if stop == start:
            continue
        u = unary[start:stop]
        best_suffix = np.empty_like(u)
        best_suffix[-1] = u[-1]
        for t in range(len(u) - 2, -1, -1):
            best_next = np.max(pairwise + best_suffix[t + 1][None, :], axis=1)
            best_suffix[t] = u[t] + best_next
        label = int(np.argmax(best_suffix[0]))
        scores[n] = best_suffix[0, label]
        labels[start] = label
        for t in range(1, len(u)):
            label = int(np.argmax(pairwise[label] + best_suffix[t]))
            labels[start + t] = label
    return labels, scores


def path_score(unary, pairwise, labels):
    """Unnormalised log potential of one labelling of one sequence."""
    labels = np.asarray(labels)
    if labels.size == 0:
        return 0.0
    return float(
        unary[np.arange(len(labels)), labels].sum()
        + pairwise[labels[:-1], labels[1:]].sum()
    )


def log_likelihood(unary, pairwise, offsets, labels):
    """Reference of :func:`skgpstruct.chain.log_likelihood` (no gradient)."""
    log_z = forward_backward(unary, pairwise, offsets)[0]
    scores = np.zeros_like(log_z)
    for s in range(unary.shape[0]):
        for n, (start, stop) in enumerate(_sequences(offsets)):
            scores[s, n] = path_score(
                unary[s, start:stop], pairwise[s], labels[start:stop]
            )
    return scores - log_z


def enumerate_one(unary, pairwise):
    """Exact quantities of one sequence (T >= 1) by listing all labellings.

    Returns log_z, marginals (T, V), pair marginals (V, V), the first best
    labelling in lexicographic order and its score.
    """
    n_tokens, n_labels = unary.shape
    paths = np.array(
        list(itertools.product(range(n_labels), repeat=n_tokens)), dtype=np.int64
    )
    scores = unary[np.arange(n_tokens), paths].sum(axis=1)
    scores += pairwise[paths[:, :-1], paths[:, 1:]].sum(axis=1)
    log_z = logsumexp(scores)
    prob = np.exp(scores - log_z)
    marginals = np.stack(
        [np.bincount(paths[:, t], prob, n_labels) for t in range(n_tokens)]
    )
    pair = np.zeros(n_labels * n_labels)
    for t in range(n_tokens - 1):
        pair += np.bincount(
            paths[:, t] * n_labels + paths[:, t + 1], prob, n_labels * n_labels
        )
    best = int(np.argmax(scores))
    return log_z, marginals, pair.reshape(n_labels, n_labels), paths[best], scores[best]


def brute_force(unary, pairwise, offsets):
    """All outputs of the chain functions by enumeration (tiny chains only).

    Returns log_z (S, n_seq), marginals (S, n_tokens, V), pair marginals
    (S, n_seq, V, V), and per sample the best labels (S, n_tokens) and best
    scores (S, n_seq).
    """
    n_samples, n_tokens, n_labels = unary.shape
    n_seq = len(offsets) - 1
    log_z = np.zeros((n_samples, n_seq))
    marginals = np.zeros((n_samples, n_tokens, n_labels))
    pair = np.zeros((n_samples, n_seq, n_labels, n_labels))
    labels = np.zeros((n_samples, n_tokens), dtype=np.int64)
    best = np.zeros((n_samples, n_seq))
    for s in range(n_samples):
        for n, (start, stop) in enumerate(_sequences(offsets)):
            if stop == start:
                continue
            (
                log_z[s, n],
                marginals[s, start:stop],
                pair[s, n],
                labels[s, start:stop],
                best[s, n],
            ) = enumerate_one(unary[s, start:stop], pairwise[s])
    return log_z, marginals, pair, labels, best
