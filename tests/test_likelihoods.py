"""Likelihoods: piecewise pseudo-likelihood, the callable adapter, the registry.

The pseudo-likelihood is checked against a brute-force evaluation of its
definition written here (every factor of the chain, every variable of the
factor, its values enumerated), its gradients against central finite
differences, and, where the chain factorises, against the exact chain. The
adapter is checked with an exact chain log-likelihood written here in NumPy
(itself checked against brute-force enumeration), and both are fitted
through the estimator on easy synthetic data.
"""

import itertools
import pickle
import warnings

import _chain_reference as ref
import numpy as np
import pytest
from scipy.special import logsumexp
from sklearn.base import clone
from sklearn.exceptions import ConvergenceWarning

from skgpstruct import GPStructClassifier
from skgpstruct.datasets import make_sequences
from skgpstruct.likelihoods import (
    CallableLikelihood,
    ChainCRF,
    Likelihood,
    PiecewisePseudoLikelihood,
    get_likelihood,
)
from skgpstruct.likelihoods.base import MalformedLikelihood

LENGTHS = [
    [5],
    [0, 3, 1, 4],  # empty and single-token sequences among others
    [1, 1, 0],
    [7, 2, 0, 6, 3],
]


def _offsets(lengths):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


def _problem(seed, lengths, n_samples=2, n_labels=3, scale=1.0):
    rng = np.random.default_rng(seed)
    offsets = _offsets(lengths)
    n_tokens = int(offsets[-1])
    unary = scale * rng.standard_normal((n_samples, n_tokens, n_labels))
    pairwise = scale * rng.standard_normal((n_samples, n_labels, n_labels))
    labels = rng.integers(0, n_labels, n_tokens)
    return unary, pairwise, offsets, labels


def chain_factors(unary_s, pairwise_s, start, stop):
    """The factors of one sequence of one sample: (variables, potential).

    The chain as the model defines it: a unary factor on every token and a
    transition factor on every pair of neighbours. ``potential`` maps the
    labels of the factor's variables to its log-potential.
    """
    factors = [
        ((t,), lambda y, t=t: unary_s[t, y[0]]) for t in range(start, stop)
    ]
    factors += [
        ((t, t + 1), lambda y: pairwise_s[y[0], y[1]])
        for t in range(start, stop - 1)
    ]
    return factors


def pseudo_loglik_bruteforce(unary, pairwise, offsets, labels):
    """Sutton and McCallum's piecewise pseudo-likelihood from its definition.

    For every factor and every variable of it: the log-probability of the
    variable's label given the labels of the factor's other variables under
    that factor alone, its values enumerated one by one.
    """
    n_samples, _, n_labels = unary.shape
    n_seq = len(offsets) - 1
    out = np.zeros((n_samples, n_seq))
    for s in range(n_samples):
        for n in range(n_seq):
            factors = chain_factors(unary[s], pairwise[s], offsets[n], offsets[n + 1])
            for variables, potential in factors:
                observed = [labels[v] for v in variables]
                for i in range(len(variables)):
                    scores = [
                        potential(observed[:i] + [value] + observed[i + 1 :])
                        for value in range(n_labels)
                    ]
                    out[s, n] += potential(observed) - logsumexp(scores)
    return out


def chain_loglik_numpy(unary, pairwise, y):
    """Exact chain log p(y | f) of one sequence, all samples: (S,).

    A user's likelihood written without the library: forward recursion in
    log space, vectorised over samples.
    """
    n_tokens = unary.shape[1]
    score = unary[:, np.arange(n_tokens), y].sum(axis=1)
    score += pairwise[:, y[:-1], y[1:]].sum(axis=1)
    log_alpha = unary[:, 0]
    for t in range(1, n_tokens):
        log_alpha = unary[:, t] + logsumexp(
            log_alpha[:, :, None] + pairwise, axis=1
        )
    return score - logsumexp(log_alpha, axis=1)


# --------------------------------------------------------------------------- #
# piecewise pseudo-likelihood: values


@pytest.mark.parametrize("lengths", LENGTHS)
@pytest.mark.parametrize("n_labels", [1, 2, 4])
@pytest.mark.parametrize("scale", [1e-2, 1.0, 1e2, 1e3])
def test_pseudo_matches_its_definition(lengths, n_labels, scale):
    unary, pairwise, offsets, labels = _problem(
        0, lengths, n_labels=n_labels, scale=scale
    )
    pwpl = PiecewisePseudoLikelihood()
    expected = pseudo_loglik_bruteforce(unary, pairwise, offsets, labels)
    value = pwpl.log_prob(unary, pairwise, offsets, labels)
    assert value.shape == (unary.shape[0], len(lengths))
    np.testing.assert_allclose(value, expected, rtol=1e-12, atol=1e-9)
    value_2, _, _ = pwpl.log_prob_and_gradient(unary, pairwise, offsets, labels)
    np.testing.assert_array_equal(value_2, value)
    assert np.all(value[:, np.array(lengths) == 0] == 0.0)


def test_pseudo_is_piecewise_pl_not_piecewise_training():
    # Two tokens, labels (0, 1), no unary information: the transition
    # factor contributes log softmax down column 1 and along row 0, not
    # P[0, 1] - logsumexp(P) over all V^2 pairs.
    unary = np.zeros((1, 2, 2))
    pairwise = np.array([[[0.0, 1.0], [2.0, 3.0]]])
    value = PiecewisePseudoLikelihood().log_prob(
        unary, pairwise, np.array([0, 2]), np.array([0, 1])
    )
    expected = -2 * np.log(2) + (1 - np.log(np.exp(1) + np.exp(3))) + (
        1 - np.log(np.exp(0) + np.exp(1))
    )
    assert value[0, 0] == pytest.approx(expected, rel=1e-14)


def test_pseudo_separates_the_unary_and_transition_pieces():
    # No factor holds both a unary and a transition potential, so the value
    # is a function of the unaries plus a function of the transitions: the
    # unaries are fitted as independent per-token softmax classifiers and the
    # transitions from the label bigrams alone.
    unary, pairwise, offsets, labels = _problem(9, [4, 1, 0, 3], n_labels=3)
    other_unary, other_pairwise, _, _ = _problem(10, [4, 1, 0, 3], n_labels=3)
    pwpl = PiecewisePseudoLikelihood()

    def evaluate(u, p):
        return pwpl.log_prob_and_gradient(u, p, offsets, labels)

    value, grad_unary, grad_pairwise = evaluate(unary, pairwise)
    value_p, grad_unary_p, _ = evaluate(unary, other_pairwise)
    value_u, _, grad_pairwise_u = evaluate(other_unary, pairwise)
    value_up = evaluate(other_unary, other_pairwise)[0]
    np.testing.assert_allclose(value - value_p, value_u - value_up, atol=1e-12)
    np.testing.assert_array_equal(grad_unary_p, grad_unary)
    np.testing.assert_array_equal(grad_pairwise_u, grad_pairwise)
    softmax = np.exp(unary - logsumexp(unary, axis=2, keepdims=True))
    expected = -softmax
    expected[:, np.arange(len(labels)), labels] += 1.0
    np.testing.assert_allclose(grad_unary, expected, atol=1e-14)


def test_pseudo_transitions_are_maximised_by_the_log_bigram_counts():
    # Both local conditionals of a transition factor are saturated
    # conditional models of the label bigrams: P[a, b] = log N[a, b] + c
    # makes them the empirical p(a | b) and p(b | a), so the gradient of
    # the whole batch with respect to P vanishes there.
    labels = np.array([0, 0, 1, 2, 2, 0, 2, 2, 1, 1, 0, 1, 0, 2])
    offsets = np.array([0, 6, 6, 7, 14])
    counts = np.zeros((3, 3))
    for start, stop in zip(offsets[:-1], offsets[1:], strict=True):
        np.add.at(counts, (labels[start : stop - 1], labels[start + 1 : stop]), 1)
    assert np.all(counts > 0)
    pairwise = np.stack([np.log(counts), np.log(counts) + 5.0])
    unary = np.random.default_rng(12).standard_normal((2, len(labels), 3))
    _, _, grad_pairwise = PiecewisePseudoLikelihood().log_prob_and_gradient(
        unary, pairwise, offsets, labels
    )
    np.testing.assert_allclose(grad_pairwise.sum(axis=1), 0.0, atol=1e-12)


@pytest.mark.parametrize("scale", [1e3, 1e6])
def test_pseudo_is_finite_for_large_potentials(scale):
    unary, pairwise, offsets, labels = _problem(11, [5, 1, 0, 3], n_labels=4)
    unary *= scale
    pairwise *= scale
    value, grad_unary, grad_pairwise = (
        PiecewisePseudoLikelihood().log_prob_and_gradient(
            unary, pairwise, offsets, labels
        )
    )
    for array in (value, grad_unary, grad_pairwise):
        assert np.all(np.isfinite(array))
    # a sum of log-probabilities; softmax gradients sum to zero
    assert np.all(value <= 0.0)
    np.testing.assert_allclose(grad_unary.sum(axis=2), 0.0, atol=1e-12)
    np.testing.assert_allclose(grad_pairwise.sum(axis=(2, 3)), 0.0, atol=1e-9)
    np.testing.assert_allclose(
        value,
        pseudo_loglik_bruteforce(unary, pairwise, offsets, labels),
        rtol=1e-12,
        atol=1e-6,
    )


@pytest.mark.parametrize("lengths", LENGTHS)
def test_pseudo_equals_exact_chain_up_to_a_constant_when_it_factorises(lengths):
    # With zero transition potentials the chain factorises into per-token
    # softmaxes. The pseudo-likelihood's unary part is then exactly the
    # chain's log-likelihood, and each transition factor adds two uniform
    # conditionals, -2 log V: PWPL = exact - 2 (T - 1) log V, and the
    # gradients with respect to the unaries coincide.
    unary, pairwise, offsets, labels = _problem(1, lengths, n_labels=4, scale=2.0)
    pairwise = np.zeros_like(pairwise)
    n_transitions = np.maximum(np.diff(offsets) - 1, 0)
    exact, exact_gu, _ = ChainCRF().log_prob_and_gradient(
        unary, pairwise, offsets, labels
    )
    pwpl, gu, gp = PiecewisePseudoLikelihood().log_prob_and_gradient(
        unary, pairwise, offsets, labels
    )
    np.testing.assert_allclose(
        pwpl, exact - 2 * n_transitions * np.log(4), rtol=1e-12, atol=1e-12
    )
    np.testing.assert_allclose(gu, exact_gu, rtol=0, atol=1e-12)
    # at P = 0 each transition moves mass 2/V from every cell to its own
    np.testing.assert_allclose(gp.sum(axis=(-2, -1)), 0.0, atol=1e-12)


def test_pseudo_of_a_single_label_is_zero():
    unary, pairwise, offsets, labels = _problem(2, [3, 0, 2], n_labels=1)
    value, gu, gp = PiecewisePseudoLikelihood().log_prob_and_gradient(
        unary, pairwise, offsets, labels
    )
    for array in (value, gu, gp):
        np.testing.assert_allclose(array, 0.0, rtol=0, atol=1e-14)


def test_pseudo_without_tokens():
    unary, pairwise = np.zeros((3, 0, 2)), np.zeros((3, 2, 2))
    offsets, labels = np.zeros(3, dtype=np.int64), np.zeros(0, dtype=np.int64)
    value, gu, gp = PiecewisePseudoLikelihood().log_prob_and_gradient(
        unary, pairwise, offsets, labels
    )
    assert value.shape == (3, 2) and np.all(value == 0.0)
    assert gu.shape == (3, 0, 2) and gp.shape == (3, 2, 2, 2)
    assert np.all(gp == 0.0)


def test_pseudo_without_samples_has_the_chain_shapes():
    args = (np.zeros((0, 3, 2)), np.zeros((0, 2, 2)), np.array([0, 3]),
            np.array([0, 1, 1]))
    shapes = [x.shape for x in ChainCRF().log_prob_and_gradient(*args)]
    pseudo = PiecewisePseudoLikelihood().log_prob_and_gradient(*args)
    assert [x.shape for x in pseudo] == shapes


class _Returns(Likelihood):
    """A subclass whose outputs are whatever the test sets."""

    has_gradient = True

    def __init__(self, value=None, out=None):
        self.value, self.out = value, out

    def _log_prob(self, unary, pairwise, offsets, labels):
        return self.value

    def _log_prob_and_gradient(self, unary, pairwise, offsets, labels):
        return self.out


_CHECKING = [
    ChainCRF(), PiecewisePseudoLikelihood(), CallableLikelihood(chain_loglik_numpy),
    # a subclass that checks nothing itself: the base class checks
    _Returns(value=np.zeros((1, 1)), out=(np.zeros((1, 1)),) * 3),
]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"labels": np.array([0, 1, 5])}, r"labels must lie in \[0, 3\)"),
        ({"offsets": np.array([0, 2])}, r"offsets\[-1\] must equal"),
        ({"pairwise": np.zeros((1, 2, 2))}, r"pairwise must have shape"),
        ({"unary": np.full((1, 3, 3), np.nan)}, r"unary contains NaN"),
    ],
)
@pytest.mark.parametrize(
    ("likelihood", "method"),
    [(lik, "log_prob") for lik in _CHECKING]
    + [(lik, "log_prob_and_gradient") for lik in _CHECKING if lik.has_gradient],
    ids=lambda value: value if isinstance(value, str) else type(value).__name__,
)
def test_inputs_are_validated(likelihood, method, change, message):
    args = {
        "unary": np.zeros((1, 3, 3)),
        "pairwise": np.zeros((1, 3, 3)),
        "offsets": np.array([0, 3]),
        "labels": np.array([0, 1, 2]),
    } | change
    with pytest.raises(ValueError, match=message):
        getattr(likelihood, method)(**args)


@pytest.mark.parametrize(
    "likelihood",
    [ChainCRF(), PiecewisePseudoLikelihood(), CallableLikelihood(chain_loglik_numpy)],
    ids=repr,
)
def test_nested_lists_are_read_as_arrays(likelihood):
    # lists gave an AttributeError ('list' object has no attribute 'shape')
    unary, pairwise, offsets, labels = _problem(0, [2, 3])
    expected = likelihood.log_prob(unary, pairwise, offsets, labels)
    as_lists = [a.tolist() for a in (unary, pairwise, offsets, labels)]
    np.testing.assert_array_equal(likelihood.log_prob(*as_lists), expected)
    if likelihood.has_gradient:
        got = likelihood.log_prob_and_gradient(*as_lists)
        for a, b in zip(got, likelihood.log_prob_and_gradient(
            unary, pairwise, offsets, labels
        ), strict=True):
            np.testing.assert_array_equal(a, b)


# --------------------------------------------------------------------------- #
# piecewise pseudo-likelihood: gradients


@pytest.mark.parametrize("lengths", LENGTHS[1:])
@pytest.mark.parametrize("seed", [0, 1])
def test_pseudo_gradient_matches_central_differences(lengths, seed):
    unary, pairwise, offsets, labels = _problem(seed, lengths, n_labels=3)
    pwpl = PiecewisePseudoLikelihood()
    _, grad_unary, grad_pairwise = pwpl.log_prob_and_gradient(
        unary, pairwise, offsets, labels
    )
    n_samples, n_tokens, n_labels = unary.shape
    n_seq = len(lengths)
    assert grad_unary.shape == unary.shape
    assert grad_pairwise.shape == (n_samples, n_seq, n_labels, n_labels)
    sequence_of = np.repeat(np.arange(n_seq), lengths)
    h = 1e-5

    def derivative(u, p):
        return (pwpl.log_prob(u[0], p[0], offsets, labels)
                - pwpl.log_prob(u[1], p[1], offsets, labels)) / (2 * h)

    # Perturbing one entry changes every sequence's value of its sample:
    # the finite differences give a whole column of the Jacobian.
    for index in np.ndindex(unary.shape):
        step = np.zeros_like(unary)
        step[index] = h
        fd = derivative((unary + step, unary - step), (pairwise, pairwise))
        s, t, _ = index
        expected = np.zeros((n_samples, n_seq))
        expected[s, sequence_of[t]] = grad_unary[index]
        np.testing.assert_allclose(fd, expected, rtol=0, atol=1e-8)
    for index in np.ndindex(pairwise.shape):
        step = np.zeros_like(pairwise)
        step[index] = h
        fd = derivative((unary, unary), (pairwise + step, pairwise - step))
        s, i, j = index
        expected = np.zeros((n_samples, n_seq))
        expected[s] = grad_pairwise[s, :, i, j]
        np.testing.assert_allclose(fd, expected, rtol=0, atol=1e-8)


# --------------------------------------------------------------------------- #
# the callable adapter


def test_numpy_chain_loglik_matches_enumeration():
    unary, pairwise, offsets, labels = _problem(3, [4], n_samples=3, n_labels=3)
    y = labels
    for s in range(unary.shape[0]):
        log_z = ref.enumerate_one(unary[s], pairwise[s])[0]
        expected = ref.path_score(unary[s], pairwise[s], y) - log_z
        assert chain_loglik_numpy(unary, pairwise, y)[s] == pytest.approx(
            expected, rel=1e-12
        )


@pytest.mark.parametrize("lengths", LENGTHS)
def test_callable_exact_chain_equals_chain_crf(lengths):
    unary, pairwise, offsets, labels = _problem(4, lengths, n_labels=4, scale=3.0)
    likelihood = CallableLikelihood(chain_loglik_numpy)
    assert likelihood.has_gradient is False
    value = likelihood.log_prob(unary, pairwise, offsets, labels)
    expected = ChainCRF().log_prob(unary, pairwise, offsets, labels)
    np.testing.assert_allclose(value, expected, rtol=1e-12, atol=1e-12)


def test_callable_receives_one_sequence_at_a_time_read_only():
    unary, pairwise, offsets, labels = _problem(5, [2, 0, 3], n_samples=2)
    calls = []

    def spy(u, p, y):
        calls.append((u.copy(), p.copy(), y.copy()))
        assert not (u.flags.writeable or p.flags.writeable or y.flags.writeable)
        return np.full(u.shape[0], float(len(calls)))

    value = CallableLikelihood(spy).log_prob(unary, pairwise, offsets, labels)
    # the empty sequence is not passed and scores 0
    np.testing.assert_array_equal(value, [[1.0, 0.0, 2.0]] * 2)
    assert len(calls) == 2
    for (u, p, y), (t0, t1) in zip(calls, [(0, 2), (2, 5)], strict=True):
        np.testing.assert_array_equal(u, unary[:, t0:t1])
        np.testing.assert_array_equal(p, pairwise)
        np.testing.assert_array_equal(y, labels[t0:t1])
        assert y.dtype == np.int64


def test_callable_cannot_modify_the_potentials():
    def vandal(u, p, y):
        u[...] = 0.0
        return np.zeros(u.shape[0])

    unary, pairwise, offsets, labels = _problem(6, [3])
    with pytest.raises(ValueError, match="read-only"):
        CallableLikelihood(vandal).log_prob(unary, pairwise, offsets, labels)


@pytest.mark.parametrize(
    ("output", "message"),
    [
        (lambda S: np.array([0.0, np.nan][:S]), r"nan for sequence 1 \(sample 1\)"),
        (lambda S: np.array([-np.inf, 0.0][:S]), r"-inf for sequence 1 \(sample 0\)"),
        (lambda S: np.array([np.inf, 0.0][:S]), r"inf for sequence 1"),
        (lambda S: np.zeros(S + 1), r"shape \(3,\) for sequence 1; expected .*\(2,\)"),
        (lambda S: 0.0, r"shape \(\) for sequence 1"),
        (lambda S: np.zeros((S, 1)), r"shape \(2, 1\) for sequence 1"),
        (lambda S: ["a"] * S, r"dtype <U1"),
        (lambda S: [[0.0], [0.0, 1.0]], r"not an array for sequence 1"),
    ],
)
def test_callable_output_is_validated(output, message):
    def bad_on_second(u, p, y):
        return np.zeros(u.shape[0]) if y.shape[0] == 2 else output(u.shape[0])

    unary, pairwise, offsets, labels = _problem(7, [2, 3], n_samples=2)
    with pytest.raises(ValueError, match=message):
        CallableLikelihood(bad_on_second).log_prob(unary, pairwise, offsets, labels)


def test_callable_has_no_gradient_and_a_readable_repr():
    likelihood = CallableLikelihood(chain_loglik_numpy)
    assert repr(likelihood) == "CallableLikelihood(func=chain_loglik_numpy)"
    unary, pairwise, offsets, labels = _problem(8, [2])
    with pytest.raises(NotImplementedError, match="gradient='score'"):
        likelihood.log_prob_and_gradient(unary, pairwise, offsets, labels)


@pytest.mark.parametrize("func", [None, "crf", 3.0])
def test_callable_refuses_non_callables(func):
    with pytest.raises(TypeError, match="func must be a callable"):
        CallableLikelihood(func)


def test_callable_refuses_a_likelihood_class():
    with pytest.raises(TypeError, match=r"use an instance of it, ChainCRF\(\)"):
        CallableLikelihood(ChainCRF)


# --------------------------------------------------------------------------- #
# the registry


def test_get_likelihood_names_instances_and_callables():
    assert type(get_likelihood("crf")) is ChainCRF
    pseudo = get_likelihood("pseudo")
    assert type(pseudo) is PiecewisePseudoLikelihood and pseudo.has_gradient
    instance = PiecewisePseudoLikelihood()
    assert get_likelihood(instance) is instance
    wrapped = get_likelihood(chain_loglik_numpy)
    assert isinstance(wrapped, CallableLikelihood) and isinstance(wrapped, Likelihood)
    assert wrapped.func is chain_loglik_numpy and not wrapped.has_gradient


@pytest.mark.parametrize("spec", ["foo", "CRF", "", None, 3, ["crf"]])
def test_get_likelihood_refuses_unknown_specs(spec):
    with pytest.raises(
        ValueError,
        match=r"likelihood must be one of \['crf', 'pseudo'\], a Likelihood "
        r"instance, or a callable",
    ):
        get_likelihood(spec)


def test_get_likelihood_refuses_a_class():
    with pytest.raises(ValueError, match=r"got the class ChainCRF; pass ChainCRF\(\)"):
        get_likelihood(ChainCRF)


# --------------------------------------------------------------------------- #
# decoding


def test_pseudo_decodes_with_the_pointwise_mutual_information():
    # P = log N + c: the transitions become log(N[a, b] N / (N[a.] N[.b])),
    # whatever c, on every leading axis.
    counts = np.array([[6.0, 1.0, 3.0], [2.0, 8.0, 1.0], [1.0, 4.0, 9.0]])
    total = counts.sum()
    expected = np.log(
        counts * total / counts.sum(axis=1, keepdims=True) / counts.sum(axis=0)
    )
    pwpl = PiecewisePseudoLikelihood()
    stacked = np.stack([np.log(counts) + 2.5, np.log(counts) - 7.0])
    np.testing.assert_allclose(pwpl.decoding_pairwise(stacked), [expected] * 2)
    # The exact chain decodes with its own transitions.
    P = np.random.default_rng(0).normal(size=(3, 3))
    assert ChainCRF().decoding_pairwise(P) is P


def test_pseudo_decoding_recovers_the_posterior_of_a_stationary_hmm():
    # A textbook HMM with a stationary start: p(y) = pi_{y_1} prod A, tokens
    # emitted independently given their labels. Its exact posterior, by
    # enumeration, is the chain with the per-token posteriors
    # p(y_t | x_t) as unaries and the PMI of p(y_t, y_{t+1}) = pi_a A_ab as
    # transitions: what the pseudo-likelihood's pieces estimate.
    rng = np.random.default_rng(3)
    V, T = 3, 5
    A = rng.dirichlet(np.ones(V), size=V)
    eigenvalues, eigenvectors = np.linalg.eig(A.T)
    pi = np.real(eigenvectors[:, np.argmin(np.abs(eigenvalues - 1))])
    pi /= pi.sum()
    emission = rng.dirichlet(np.ones(4), size=V)  # p(x | y), 4 symbols
    x = rng.integers(4, size=T)
    paths = np.array(list(itertools.product(range(V), repeat=T)))
    log_joint = np.log(pi[paths[:, 0]]) + np.log(
        A[paths[:, :-1], paths[:, 1:]]
    ).sum(axis=1) + np.log(emission[paths, x]).sum(axis=1)
    posterior = np.exp(log_joint - logsumexp(log_joint))
    exact_marginals = np.stack(
        [np.bincount(paths[:, t], posterior, V) for t in range(T)]
    )
    unary = np.log(pi[None, :] * emission[:, x].T)  # log p(y_t | x_t) + const
    unary -= logsumexp(unary, axis=1, keepdims=True)
    pairwise = PiecewisePseudoLikelihood().decoding_pairwise(
        np.log(pi[:, None] * A) + 1.3
    )
    _, marginals, _, best, _ = ref.enumerate_one(unary, pairwise)
    np.testing.assert_allclose(marginals, exact_marginals, atol=1e-12)
    np.testing.assert_array_equal(best, paths[np.argmax(log_joint)])
    # Adding the fitted transitions as they are counts the labels again.
    _, doubled, _, _, _ = ref.enumerate_one(unary, np.log(pi[:, None] * A))
    assert np.max(np.abs(doubled - exact_marginals)) > 1e-3


# --------------------------------------------------------------------------- #
# fits through the estimator

FAST = {"n_inducing": 20, "max_iter": 50, "tol": 1e-2, "random_state": 0}


@pytest.fixture(scope="module")
def data():
    """(X_train, y_train, X_test, y_test): easy sequences, 30 train, 50 test."""
    X, y = make_sequences(
        n_sequences=80, n_classes=3, n_features=8, length_range=(2, 8),
        noise=1.0, random_state=0,
    )
    return X[:30], y[:30], X[30:], y[30:]


def token_accuracy(y_true, y_pred):
    return float(np.mean(np.concatenate(y_true) == np.concatenate(y_pred)))


def majority_rate(y):
    _, counts = np.unique(np.concatenate(y), return_counts=True)
    return counts.max() / counts.sum()


@pytest.mark.parametrize("gradient", ["pathwise", "score"])
def test_pseudo_likelihood_fits(data, gradient):
    X, y, X_test, y_test = data
    n_samples = 16 if gradient == "score" else 8
    with warnings.catch_warnings():
        # L-BFGS may stop on the noisy score-function gradient.
        warnings.simplefilter("ignore", ConvergenceWarning)
        model = GPStructClassifier(
            likelihood="pseudo", gradient=gradient, n_samples=n_samples, **FAST
        ).fit(X, y)
    accuracy = token_accuracy(y_test, model.predict(X_test))
    assert accuracy > 0.8, accuracy
    assert accuracy > majority_rate(y_test) + 0.3


def test_pseudo_fit_predicts_with_its_decoding_transitions(data, monkeypatch):
    # predict is Viterbi on the posterior mean unaries and the PMI
    # transitions, and both predict and predict_marginals go through the
    # likelihood's decoding_pairwise (here replaced by transitions that
    # force label 0 after the first token).
    from skgpstruct import chain
    from skgpstruct._sequences import stack_sequences

    X, y, X_test, _ = data
    model = GPStructClassifier(likelihood="pseudo", **FAST).fit(X, y)
    X_c, offsets = stack_sequences(X_test)
    # (The kernel "linear" acts on dense features centred on the training
    # mean.)
    unary = model._mean_potentials(X_c - model.feature_mean_)
    pmi = PiecewisePseudoLikelihood().decoding_pairwise(model.pairwise_mean_)
    expected, _ = chain.viterbi(unary, pmi, offsets)
    predicted = np.concatenate(model.predict(X_test))
    np.testing.assert_array_equal(predicted, model.classes_[expected])

    def to_label_zero(self, pairwise):
        forced = np.zeros_like(pairwise)
        forced[..., 0] = 1e3
        return forced

    monkeypatch.setattr(PiecewisePseudoLikelihood, "decoding_pairwise", to_label_zero)
    for labels, marginals in zip(
        model.predict(X_test), model.predict_marginals(X_test), strict=True
    ):
        assert np.all(labels[1:] == model.classes_[0])
        np.testing.assert_allclose(marginals[1:, 0], 1.0)


def test_callable_exact_chain_reaches_the_built_in_accuracy(data):
    # The requirement: a callable computing the exact chain
    # log-likelihood in NumPy reaches the built-in likelihood's accuracy.
    X, y, X_test, y_test = data
    accuracies = {}
    for name, likelihood in (("crf", "crf"), ("callable", chain_loglik_numpy)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            model = GPStructClassifier(
                likelihood=likelihood, gradient="score", n_samples=16, **FAST
            ).fit(X, y)
        accuracies[name] = token_accuracy(y_test, model.predict(X_test))
    assert accuracies["crf"] > majority_rate(y_test) + 0.3, accuracies
    assert accuracies["callable"] >= accuracies["crf"] - 0.02, accuracies


def test_estimator_with_a_callable_clones_and_pickles():
    model = GPStructClassifier(likelihood=chain_loglik_numpy, gradient="score")
    assert clone(model).likelihood is chain_loglik_numpy
    assert pickle.loads(pickle.dumps(model)).likelihood is chain_loglik_numpy


def test_callable_with_pathwise_gradient_is_refused(data):
    X, y, _, _ = data
    model = GPStructClassifier(likelihood=chain_loglik_numpy, gradient="pathwise")
    with pytest.raises(
        ValueError,
        match=r"gradient='pathwise' needs a likelihood with a gradient; "
        r"CallableLikelihood\(func=chain_loglik_numpy\) .*use gradient='score'",
    ):
        model.fit(X, y)


@pytest.mark.parametrize(
    "params, method, message",
    [
        ({"optimizer": "stochastic"}, "fit",
         r"optimizer='stochastic' runs SAGA with the pathwise estimator.*"
         r"gradient='score'\) is available with fit and optimizer='lbfgs' only"),
        ({"optimizer": "stochastic", "gradient": "score"}, "fit",
         r"optimizer='stochastic' runs SAGA"),
        ({}, "partial_fit",
         r"partial_fit runs SAGA with the pathwise estimator.*optimizer='lbfgs' only"),
        ({"inference": "ess"}, "fit",
         r"inference='ess' samples with the exact chain likelihood only"),
    ],
    ids=["stochastic", "stochastic-score", "partial_fit", "ess"],
)
def test_callable_refused_where_no_estimator_serves_it(data, params, method, message):
    # The first error names the restriction that applies: it advised
    # gradient='score' where the score estimator is not available either.
    X, y, _, _ = data
    model = GPStructClassifier(likelihood=chain_loglik_numpy, **params)
    with pytest.raises(ValueError, match=message):
        if method == "fit":
            model.fit(X, y)
        else:
            model.partial_fit(X, y, classes=np.unique(np.concatenate(y)))


def _batch(S=2, T=5, V=3):
    offsets = np.array([0, 2, 5])
    return np.zeros((S, T, V)), np.zeros((S, V, V)), offsets, np.zeros(T, dtype=int)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (np.zeros((2, 1)), r"log-likelihood of dtype float64 and shape \(2, 1\); "
         r"expected real numbers of shape \(2, 2\)"),
        (0, r"shape \(\); expected"),
        # A comparison, not log-probabilities.
        (np.zeros((2, 2)) > 1, r"log-likelihood of dtype bool and shape \(2, 2\); "
         r"expected real numbers"),
        ([[0.0, 0.0], [0.0]], "not an array"),
        (np.full((2, 2), np.nan), r"returned nan for sequence 0 \(sample 0\)"),
        # Were accepted: +inf is never a log-probability, -inf makes the
        # ELBO -inf (a CallableLikelihood's function was refused both).
        (np.array([[0.0, 0.0], [0.0, np.inf]]),
         r"returned inf for sequence 1 \(sample 1\); log-likelihoods must be "
         r"finite"),
        (np.array([[0.0, -np.inf], [0.0, 0.0]]),
         r"returned -inf for sequence 1 \(sample 0\)"),
        (np.zeros((2, 2), dtype=complex), "dtype complex128"),
    ],
    ids=["shape", "scalar", "bool", "ragged", "NaN", "+inf", "-inf", "complex"],
)
def test_subclass_log_prob_output_is_checked(value, message):
    # It failed later with a reshape or attribute error from the engine.
    with pytest.raises(ValueError, match=message):
        _Returns(value=value).log_prob(*_batch())


def test_fit_names_the_training_sequence_of_a_non_finite_value(monkeypatch):
    # The engine calls the likelihood on chunks of the training set: the
    # error named the sequence's number within its chunk.
    import skgpstruct._estimator as estimator_module
    from skgpstruct.datasets import make_sequences

    monkeypatch.setattr(estimator_module, "CHUNK_TOKENS", 30)
    X, y = make_sequences(n_sequences=12, length_range=(4, 6), random_state=0)
    target = 9

    class InfiniteAtOne(Likelihood):
        def _log_prob(self, unary, pairwise, offsets, labels):
            out = np.zeros((unary.shape[0], len(offsets) - 1))
            for n in range(len(offsets) - 1):
                if np.array_equal(labels[offsets[n]:offsets[n + 1]], y[target]):
                    out[:, n] = np.inf
            return out

    assert sum(np.array_equal(s, y[target]) for s in y) == 1
    with pytest.raises(ValueError, match=f"returned inf for sequence {target} "):
        GPStructClassifier(likelihood=InfiniteAtOne(), gradient="score",
                           n_samples=2, max_iter=1, random_state=0).fit(X, y)
    # Two mixture components: the likelihood saw their samples one after
    # the other (sample 2 was sample 0 of component 1).
    with pytest.raises(ValueError, match=r"\(sample 0 of component 0\)"):
        GPStructClassifier(likelihood=InfiniteAtOne(), gradient="score",
                           n_components=2, covariance="diag", n_samples=2,
                           max_iter=1, random_state=0).fit(X, y)
    # From a worker process the error travels back pickled: it could not be
    # unpickled, and the fit ended in a BrokenProcessPool.
    from joblib import parallel_config

    with parallel_config(backend="loky"), pytest.raises(
        ValueError, match=f"returned inf for sequence {target} "
    ):
        GPStructClassifier(likelihood=InfiniteAtOne(), gradient="score",
                           n_samples=2, max_iter=1, n_jobs=2,
                           random_state=0).fit(X, y)


def test_score_estimator_refuses_sequences_too_long_for_its_dense_arrays(
    monkeypatch,
):
    # One sequence of 10,000 tokens raised a MemoryError (2.24 GiB for one
    # of its (K, V, T, T) arrays); the limit is checked before the fit.
    import skgpstruct._estimator as estimator_module

    X, y = make_sequences(n_sequences=3, length_range=(40, 60), random_state=0)
    monkeypatch.setattr(estimator_module, "SCORE_MEMORY_BYTES", 500_000)
    longest = max(len(s) for s in y)
    with pytest.raises(ValueError, match=rf"gradient='score' .* the longest "
                       rf"sequence, {longest} tokens, would need about .* GiB, "
                       r"over its limit .* use gradient='pathwise'"):
        GPStructClassifier(gradient="score", n_components=2,
                           covariance="diag").fit(X, y)
    # (5 arrays of 2 x 3 x T x T doubles: 864,000 bytes at T = 60; of
    # 1 x 3 x T x T, 432,000 bytes, within the limit.)
    with pytest.warns(ConvergenceWarning):
        GPStructClassifier(gradient="score", max_iter=1, n_samples=2).fit(X, y)


def test_fit_names_the_training_sequence_of_a_malformed_value(monkeypatch):
    # As for a non-finite value: a callable's output of the wrong shape named
    # the sequence's number within its chunk.
    import skgpstruct._estimator as estimator_module
    from skgpstruct.datasets import make_sequences

    monkeypatch.setattr(estimator_module, "CHUNK_TOKENS", 30)
    X, y = make_sequences(n_sequences=12, length_range=(4, 6), random_state=0)
    target = 9

    def wrong_shape_at_one(unary, pairwise, labels):
        S = unary.shape[0]
        return np.zeros(S + 1 if np.array_equal(labels, y[target]) else S)

    assert sum(np.array_equal(s, y[target]) for s in y) == 1
    # (S + 1 values where S, or K * S with two components, were expected)
    message = rf"shape \((3|5),\) for sequence {target}; expected real numbers"
    for settings in ({}, {"n_components": 2, "covariance": "diag"}):
        with pytest.raises(MalformedLikelihood, match=message):
            GPStructClassifier(
                likelihood=CallableLikelihood(wrong_shape_at_one), gradient="score",
                n_samples=2, max_iter=1, random_state=0, **settings,
            ).fit(X, y)
    from joblib import parallel_config

    with parallel_config(backend="loky"), pytest.raises(
        MalformedLikelihood, match=message
    ):
        GPStructClassifier(
            likelihood=CallableLikelihood(wrong_shape_at_one), gradient="score",
            n_samples=2, max_iter=1, n_jobs=2, random_state=0,
        ).fit(X, y)


@pytest.mark.parametrize(
    ("index", "bad", "message"),
    [
        (1, np.zeros((2, 5)), r"unary gradient .* shape \(2, 5\); expected .*"
         r"\(2, 5, 3\)"),
        (2, np.zeros((2, 3, 3)), r"pairwise gradient .* expected .*\(2, 2, 3, 3\)"),
        (0, np.full((2, 2), np.nan), "returned nan for sequence 0"),
        # Were accepted, and a fit stopped with "line search failed".
        (1, np.where(np.arange(30).reshape(2, 5, 3) == 7, np.nan, 0.0),
         r"unary gradient with nan at sequence 1, token 0 \(sample 0; 1 entries "
         r"not finite\); gradients must be finite"),
        (2, np.full((2, 2, 3, 3), np.inf), r"pairwise gradient with inf at "
         r"sequence 0 \(sample 0; 36 entries"),
    ],
)
def test_subclass_gradient_output_is_checked(index, bad, message):
    out = [np.zeros((2, 2)), np.zeros((2, 5, 3)), np.zeros((2, 2, 3, 3))]
    assert len(_Returns(out=tuple(out)).log_prob_and_gradient(*_batch())) == 3
    out[index] = bad
    with pytest.raises(ValueError, match=message):
        _Returns(out=tuple(out)).log_prob_and_gradient(*_batch())
    with pytest.raises(MalformedLikelihood, match=r"returned an object of type "
                       r"ndarray; expected three: .log_prob, grad_unary"):
        _Returns(out=np.zeros(3)).log_prob_and_gradient(*_batch())


def test_subclass_claiming_a_gradient_it_does_not_implement(data):
    # has_gradient = True without _log_prob_and_gradient: the fit says what
    # is missing (it raised an empty NotImplementedError).
    class Claims(Likelihood):
        has_gradient = True

        def _log_prob(self, unary, pairwise, offsets, labels):
            return np.zeros((unary.shape[0], len(offsets) - 1))

    X, y, _, _ = data
    with pytest.raises(NotImplementedError, match=r"Claims sets has_gradient = "
                       r"True but does not implement _log_prob_and_gradient"):
        GPStructClassifier(likelihood=Claims(), **FAST).fit(X, y)


@pytest.mark.parametrize(
    ("decode", "message"),
    [(lambda p: p * np.nan, "returned NaN or infinite transitions from "
      "decoding_pairwise"),
     (lambda p: p[..., :-1], r"returned a transition matrix of dtype float64 and "
      r"shape \((16, )?3, 2\) from decoding_pairwise; expected real numbers of "
      r"shape \((16, )?3, 3\)"),  # (16: predict_marginals' default samples)
     (lambda p: np.full(p.shape, "x"), "returned a transition matrix of dtype "
      "<U1")],
    ids=["NaN", "shape", "strings"],
)
def test_bad_decoding_transitions_name_the_likelihood(data, decode, message):
    # A user's decoding_pairwise that returns non-finite transitions was
    # reported as X's values being too large.
    class Decodes(ChainCRF):
        def decoding_pairwise(self, pairwise):
            return decode(pairwise)

    X, y, X_test, _ = data
    model = GPStructClassifier(likelihood=Decodes(), **FAST).fit(X, y)
    for method in (model.predict, model.predict_marginals):
        with pytest.raises(ValueError, match=rf"Decodes\(\) {message}"):
            method(X_test)


def test_a_likelihood_with_a_gradient_of_the_wrong_sign_does_not_converge():
    # The estimator's batch fit cannot climb a gradient inconsistent with the
    # objective: it warns that the line search failed, where it had taken a
    # step gaining nothing as convergence after one iteration, silently.
    class WrongSign(ChainCRF):
        def _log_prob_and_gradient(self, unary, pairwise, offsets, labels):
            value, d_unary, d_pairwise = super()._log_prob_and_gradient(
                unary, pairwise, offsets, labels
            )
            return value, -d_unary, -d_pairwise

    X, y = make_sequences(n_sequences=10, random_state=0)
    with pytest.warns(ConvergenceWarning, match="line search failed"):
        model = GPStructClassifier(likelihood=WrongSign(), learn_hyperparameters=False,
                                   random_state=0).fit(X, y)
    assert model.n_iter_ == 0


@pytest.mark.parametrize("returned, what", [
    (lambda out: out[:2], "2 values"),
    (lambda out: out[0], "an object of type ndarray"),
])
def test_a_gradient_of_the_wrong_arity_is_a_malformed_likelihood(returned, what):
    # As every other malformed output: the package's error type, naming
    # the likelihood's method, what it returned and what is expected.
    class WrongArity(ChainCRF):
        def _log_prob_and_gradient(self, unary, pairwise, offsets, labels):
            return returned(super()._log_prob_and_gradient(
                unary, pairwise, offsets, labels
            ))

    X, y = make_sequences(n_sequences=4, random_state=0)
    with pytest.raises(MalformedLikelihood,
                       match=rf"WrongArity\(\)._log_prob_and_gradient returned "
                             rf"{what}; expected three: \(log_prob, grad_unary"):
        GPStructClassifier(likelihood=WrongArity(), max_iter=2).fit(X, y)
