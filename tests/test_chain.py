"""Compiled chain kernels against a NumPy reference and brute-force enumeration."""

import _chain_reference as ref
import numpy as np
import pytest
from _builds import compiled_builds
from hypothesis import given, settings
from hypothesis import strategies as st

from skgpstruct import chain

SCALES = [1e-2, 1.0, 10.0, 1e2, 1e3, 1e4]


@pytest.fixture(autouse=True, params=compiled_builds("_chain"))
def chain_build(request, monkeypatch):
    """Every test here runs on each build of the compiled kernels (the
    baseline, and the AVX2 one where it can run): each against the
    references, not only against each other."""
    monkeypatch.setattr(chain, "_chain", request.param)
    monkeypatch.setattr(chain, "_baseline_chain", request.param)
    return request.param


def _offsets(lengths):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


def _problem(
    seed, n_samples, n_labels, lengths, unary_scale, pair_scale, integer=False
):
    rng = np.random.default_rng(seed)
    offsets = _offsets(lengths)
    n_tokens = int(offsets[-1])
    if integer:
        # small integers make ties common and path sums exact in float64
        unary = rng.integers(-2, 3, (n_samples, n_tokens, n_labels)).astype(float)
        pairwise = rng.integers(-2, 3, (n_samples, n_labels, n_labels)).astype(float)
    else:
        unary = rng.standard_normal((n_samples, n_tokens, n_labels)) * unary_scale
        pairwise = rng.standard_normal((n_samples, n_labels, n_labels)) * pair_scale
    labels = rng.integers(0, n_labels, n_tokens)
    return unary, pairwise, offsets, labels


small_chains = st.fixed_dictionaries(
    {
        "seed": st.integers(0, 2**32 - 1),
        "n_samples": st.integers(1, 3),
        "n_labels": st.integers(1, 5),
        "lengths": st.lists(st.integers(0, 6), min_size=1, max_size=4),
        "unary_scale": st.sampled_from(SCALES),
        "pair_scale": st.sampled_from(SCALES),
        "integer": st.booleans(),
    }
).filter(lambda p: p["n_labels"] ** max(p["lengths"]) <= 5**5)


def _assert_log_z_close(actual, expected):
    np.testing.assert_allclose(actual, expected, rtol=1e-10, atol=1e-10)


@settings(max_examples=60, deadline=None)
@given(small_chains)
def test_forward_backward_matches_reference_and_enumeration(params):
    unary, pairwise, offsets, _ = _problem(**params)
    log_z, marginals, pair = chain.forward_backward(unary, pairwise, offsets)
    n_seq = len(offsets) - 1
    assert log_z.shape == (unary.shape[0], n_seq)
    assert marginals.shape == unary.shape
    assert pair.shape == (unary.shape[0], n_seq) + pairwise.shape[1:]
    for expected in (
        ref.forward_backward(unary, pairwise, offsets),
        ref.brute_force(unary, pairwise, offsets)[:3],
    ):
        _assert_log_z_close(log_z, expected[0])
        np.testing.assert_allclose(marginals, expected[1], rtol=0, atol=1e-9)
        np.testing.assert_allclose(pair, expected[2], rtol=0, atol=1e-9)
    np.testing.assert_allclose(marginals.sum(axis=-1), 1.0, rtol=0, atol=1e-12)
    lengths = np.diff(offsets)
    n_transitions = np.broadcast_to(np.maximum(lengths - 1, 0), log_z.shape)
    np.testing.assert_allclose(pair.sum(axis=(-2, -1)), n_transitions, atol=1e-9)


@settings(max_examples=60, deadline=None)
@given(small_chains)
def test_viterbi_matches_reference_and_enumeration(params):
    unary, pairwise, offsets, _ = _problem(**params)
    _, _, _, best_labels, best_scores = ref.brute_force(unary, pairwise, offsets)
    for s in range(unary.shape[0]):
        labels, scores = chain.viterbi(unary[s], pairwise[s], offsets)
        assert labels.dtype == np.int64
        ref_labels, ref_scores = ref.viterbi(unary[s], pairwise[s], offsets)
        np.testing.assert_array_equal(labels, ref_labels)
        np.testing.assert_array_equal(labels, best_labels[s])
        np.testing.assert_allclose(scores, best_scores[s], rtol=1e-12, atol=1e-9)
        np.testing.assert_allclose(scores, ref_scores, rtol=1e-12, atol=1e-9)
        # The kernel's two steps (chosen by the number of labels), each
        # forced on these small chains: the same bits.
        for by_columns in (False, True):
            forced = chain._viterbi(
                np.ascontiguousarray(unary[s]), np.ascontiguousarray(pairwise[s]),
                offsets, by_columns=by_columns,
            )
            np.testing.assert_array_equal(forced[0], labels)
            np.testing.assert_array_equal(forced[1], scores)


@settings(max_examples=40, deadline=None)
@given(small_chains)
def test_log_likelihood_matches_reference(params):
    unary, pairwise, offsets, labels = _problem(**params)
    loglik = chain.log_likelihood(unary, pairwise, offsets, labels)
    expected = ref.log_likelihood(unary, pairwise, offsets, labels)
    scale = 1.0 + np.abs(ref.forward_backward(unary, pairwise, offsets)[0])
    np.testing.assert_array_less(np.abs(loglik - expected), 1e-10 * scale)
    assert np.all(loglik <= 1e-9 * scale)
    with_grad = chain.log_likelihood(
        unary, pairwise, offsets, labels, return_gradient=True
    )
    np.testing.assert_array_equal(with_grad[0], loglik)


def test_viterbi_breaks_ties_towards_lowest_labels():
    offsets = np.array([0, 4, 5])
    labels, scores = chain.viterbi(np.zeros((5, 3)), np.zeros((3, 3)), offsets)
    np.testing.assert_array_equal(labels, np.zeros(5))
    np.testing.assert_array_equal(scores, [0.0, 0.0])
    pairwise = np.zeros((2, 2))
    pairwise[0, 0] = -1.0
    labels, _ = chain.viterbi(np.zeros((4, 2)), pairwise, np.array([0, 4]))
    np.testing.assert_array_equal(labels, [0, 1, 0, 1])


def test_empty_and_single_token_sequences():
    rng = np.random.default_rng(0)
    offsets = np.array([0, 0, 1, 1, 1])
    unary = rng.standard_normal((2, 1, 4))
    pairwise = rng.standard_normal((2, 4, 4))
    log_z, marginals, pair = chain.forward_backward(unary, pairwise, offsets)
    np.testing.assert_allclose(log_z[:, [0, 2, 3]], 0.0)
    np.testing.assert_allclose(
        log_z[:, 1], np.log(np.exp(unary[:, 0]).sum(axis=-1)), rtol=1e-14
    )
    np.testing.assert_allclose(
        marginals[:, 0], np.exp(unary[:, 0] - log_z[:, 1:2]), rtol=1e-13
    )
    np.testing.assert_array_equal(pair, 0.0)
    loglik = chain.log_likelihood(unary, pairwise, offsets, np.array([2]))
    np.testing.assert_allclose(loglik[:, [0, 2, 3]], 0.0)

    log_z, marginals, pair = chain.forward_backward(
        np.zeros((3, 0, 2)), np.zeros((3, 2, 2)), [0, 0, 0]
    )
    assert log_z.shape == (3, 2) and marginals.shape == (3, 0, 2)
    assert pair.shape == (3, 2, 2, 2)
    np.testing.assert_array_equal(log_z, 0.0)
    labels, scores = chain.viterbi(np.zeros((0, 2)), np.zeros((2, 2)), [0])
    assert labels.shape == (0,) and scores.shape == (0,)


def test_log_likelihood_gradient_matches_finite_differences():
    rng = np.random.default_rng(1)
    lengths = [3, 0, 4, 1]
    unary, pairwise, offsets, labels = _problem(2, 2, 3, lengths, 1.0, 1.0)
    _, grad_unary, grad_pairwise = chain.log_likelihood(
        unary, pairwise, offsets, labels, return_gradient=True
    )
    assert grad_unary.shape == unary.shape
    assert grad_pairwise.shape == (2, len(lengths), 3, 3)
    step = 1e-6
    sequence_of = np.repeat(np.arange(len(lengths)), lengths)
    for s, t, v in zip(*(rng.integers(0, n, 12) for n in unary.shape), strict=True):
        bumped = [unary.copy(), unary.copy()]
        bumped[0][s, t, v] += step
        bumped[1][s, t, v] -= step
        up, down = (chain.log_likelihood(b, pairwise, offsets, labels) for b in bumped)
        numeric = (up - down) / (2 * step)
        expected = np.zeros_like(numeric)
        expected[s, sequence_of[t]] = grad_unary[s, t, v]
        np.testing.assert_allclose(numeric, expected, atol=1e-7)
    for s in range(2):
        for i in range(3):
            for j in range(3):
                bumped = [pairwise.copy(), pairwise.copy()]
                bumped[0][s, i, j] += step
                bumped[1][s, i, j] -= step
                up, down = (
                    chain.log_likelihood(unary, b, offsets, labels) for b in bumped
                )
                numeric = (up - down) / (2 * step)
                np.testing.assert_allclose(numeric[1 - s], 0.0, atol=1e-7)
                np.testing.assert_allclose(
                    numeric[s], grad_pairwise[s, :, i, j], atol=1e-7
                )


@pytest.mark.parametrize(
    "unary_scale, pair_scale",
    [(1.0, 1.0), (1e4, 1.0), (1e4, 1e4)],
    ids=["unit-scaled", "large-unary-scaled", "large-both-log-space"],
)
def test_long_sequence_with_large_potentials(unary_scale, pair_scale):
    n_tokens = 100_000
    rng = np.random.default_rng(2)
    unary = rng.uniform(-1, 1, (1, n_tokens, 3)) * unary_scale
    pairwise = rng.uniform(-1, 1, (1, 3, 3)) * pair_scale
    offsets = np.array([0, n_tokens])
    log_z, marginals, pair = chain.forward_backward(unary, pairwise, offsets)
    for out in (log_z, marginals, pair):
        assert np.all(np.isfinite(out))
    np.testing.assert_allclose(marginals.sum(axis=-1), 1.0, rtol=0, atol=1e-12)
    np.testing.assert_allclose(pair.sum(), n_tokens - 1, rtol=1e-12)
    expected = ref.forward_backward(unary, pairwise, offsets)
    np.testing.assert_allclose(log_z, expected[0], rtol=1e-10)
    np.testing.assert_allclose(marginals, expected[1], rtol=0, atol=1e-9)
    np.testing.assert_allclose(pair, expected[2], rtol=1e-10, atol=1e-6)
    labels, scores = chain.viterbi(unary[0], pairwise[0], offsets)
    ref_labels, ref_scores = ref.viterbi(unary[0], pairwise[0], offsets)
    np.testing.assert_array_equal(labels, ref_labels)
    np.testing.assert_allclose(scores, ref_scores, rtol=1e-12)
    assert scores[0] <= log_z[0, 0] * (1 + 1e-12)


@pytest.mark.parametrize("scale", [1e17, 1e19, 1e21])
def test_huge_potentials_give_the_best_path_as_marginals(scale):
    # At 1e19 one rounding of a sum of potentials is 2048: the log-space
    # backward pass took exp of such sums and 10 to 30 % of short chains had
    # NaN marginals (and NaN gradients). The distribution is then a point
    # mass on the best path (the next one is ~scale behind).
    rng = np.random.default_rng(11)
    for _ in range(60):
        V, T = rng.integers(2, 5), rng.integers(2, 7)
        unary = rng.uniform(-1, 1, (1, T, V)) * scale
        pairwise = rng.uniform(-2, 2, (1, V, V)) * scale
        offsets = np.array([0, T])
        _, marginals, pair = chain.forward_backward(unary, pairwise, offsets)
        best, _ = ref.viterbi(unary[0], pairwise[0], offsets)
        np.testing.assert_array_equal(marginals[0], np.eye(V)[best])
        expected_pair = np.zeros((V, V))
        np.add.at(expected_pair, (best[:-1], best[1:]), 1.0)
        np.testing.assert_array_equal(pair[0, 0], expected_pair)
        _, grad_unary, grad_pairwise = chain.log_likelihood(
            unary, pairwise, offsets, best, return_gradient=True
        )
        assert np.all(grad_unary == 0.0) and np.all(grad_pairwise == 0.0)


def test_marginals_never_exceed_one():
    # The scaled recursion's normalisation gave 1 + 1 ulp here.
    unary = np.array([[[-5.1, 54.1, 64.9], [23.2, -30.5, -27.7], [-30.2, 47.6, -45.3]]])
    pairwise = np.array([[[43.2, -1.6, 8.6], [75.6, -23.8, 83.1],
                          [-70.5, -41.2, -78.9]]])
    marginals = chain.forward_backward(unary, pairwise, np.array([0, 3]))[1]
    assert marginals.max() <= 1.0
    rng = np.random.default_rng(12)
    unary = rng.uniform(-60, 60, (2, 100_000, 3))
    pairwise = rng.uniform(-80, 80, (2, 3, 3))
    pairwise[1] *= 10  # the log-space recursion
    marginals = chain.forward_backward(unary, pairwise, np.array([0, 100_000]))[1]
    assert 0.0 <= marginals.min() and marginals.max() <= 1.0


def test_marginals_without_the_pair_marginals_are_the_same():
    # predict_marginals discards the pair marginals: the kernel skips them
    # (an outer product per token) and the rest is untouched, in both
    # recursions (the second sample's transitions span more than 300).
    _chain = chain._chain

    rng = np.random.default_rng(5)
    offsets = _offsets([6, 0, 17, 1, 30])
    V = 7
    unary = rng.standard_normal((2, offsets[-1], V)) * 3
    pairwise = rng.standard_normal((2, V, V)) * np.array([1.0, 400.0])[:, None, None]
    log_z = np.zeros((2, 5))
    marginals = np.empty((2, offsets[-1], V))
    n_log_space = _chain.forward_backward(
        unary, pairwise, offsets, log_z, marginals, np.empty((0, 0, 0, 0)),
        True, False,
    )
    assert n_log_space == 1
    expected = chain.forward_backward(unary, pairwise, offsets)
    np.testing.assert_array_equal(log_z, expected[0])
    np.testing.assert_array_equal(marginals, expected[1])
    got = chain._forward_backward(unary, pairwise, offsets, True, with_pairs=False)
    assert got[2] is None
    np.testing.assert_array_equal(got[1], expected[1])


@pytest.mark.parametrize("n_labels", [12, 17])
def test_many_labels_and_sequences_match_reference(n_labels):
    # V and layouts beyond the brute-force range, both recursions; an even
    # and an odd V (the scaled recursion takes the rows of E two at a time)
    rng = np.random.default_rng(3)
    lengths = rng.integers(0, 40, 25)
    offsets = _offsets(lengths)
    V = n_labels
    unary = rng.standard_normal((2, offsets[-1], V)) * 3
    pairwise = rng.standard_normal((2, V, V)) * np.array([1.0, 400.0])[:, None, None]
    got = chain.forward_backward(unary, pairwise, offsets)
    expected = ref.forward_backward(unary, pairwise, offsets)
    _assert_log_z_close(got[0], expected[0])
    for a, b in zip(got[1:], expected[1:], strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-10)


@pytest.mark.parametrize("n_labels", [6, 7, 8, 9, 13, 17, 45])
@pytest.mark.parametrize("kind", ["ties", "normal", "forbidden"])
def test_viterbi_on_many_labels_matches_reference(n_labels, kind):
    # Beyond the brute-force range: label counts around the kernel's switch
    # from its row-wise to its column-wise step (VITERBI_COLUMNS_FROM) and
    # past the vector widths of the latter (2 or 4 doubles), remainders
    # included. Small integers make ties common and every sum exact,
    # so the labellings must be the reference's lowest optimal ones;
    # "forbidden" transitions (-1e8: the public function refuses infinite
    # potentials) must never be taken.
    rng = np.random.default_rng(n_labels)
    offsets = _offsets(rng.integers(0, 30, 12))
    shape = (int(offsets[-1]), n_labels)
    if kind == "ties":
        unary = rng.integers(-2, 3, shape).astype(float)
        pairwise = rng.integers(-2, 3, (n_labels, n_labels)).astype(float)
    else:
        unary = rng.standard_normal(shape) * 3
        pairwise = rng.standard_normal((n_labels, n_labels))
    if kind == "forbidden":
        forbidden = rng.random(pairwise.shape) < 0.4
        forbidden[np.arange(n_labels), np.arange(n_labels)] = False  # a way on
        pairwise[forbidden] = -1e8
    labels, scores = chain.viterbi(unary, pairwise, offsets)
    ref_labels, ref_scores = ref.viterbi(unary, pairwise, offsets)
    np.testing.assert_array_equal(labels, ref_labels)
    np.testing.assert_allclose(scores, ref_scores, rtol=1e-12, atol=1e-9)
    for by_columns in (False, True):  # each step of the kernel, forced
        forced = chain._viterbi(unary, pairwise, offsets, by_columns=by_columns)
        np.testing.assert_array_equal(forced[0], labels)
        np.testing.assert_array_equal(forced[1], scores)
    for n in range(len(offsets) - 1):
        path = labels[offsets[n]:offsets[n + 1]]
        got = ref.path_score(unary[offsets[n]:offsets[n + 1]], pairwise, path)
        np.testing.assert_allclose(got, scores[n], rtol=1e-12, atol=1e-9)
        if kind == "forbidden":
            assert not forbidden[path[:-1], path[1:]].any()


def test_inputs_are_not_modified_and_layouts_are_accepted():
    rng = np.random.default_rng(4)
    unary = rng.standard_normal((2, 7, 3))
    pairwise = rng.standard_normal((2, 3, 3))
    offsets = np.array([0, 3, 7])
    expected = chain.forward_backward(unary, pairwise, offsets)
    fortran = np.asfortranarray(unary)
    strided = np.repeat(pairwise, 2, axis=2)[:, :, ::2]
    unary_copy = unary.copy()
    for u, p, o in [
        (fortran, strided, offsets.astype(np.int32)),
        (unary, pairwise, list(offsets)),
        (unary.tolist(), pairwise.tolist(), offsets.astype(np.uint8)),
    ]:
        got = chain.forward_backward(u, p, o)
        for a, b in zip(got, expected, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-15)
    np.testing.assert_array_equal(unary, unary_copy)
    readonly = unary.copy()
    readonly.flags.writeable = False
    chain.forward_backward(readonly, pairwise, offsets)
    got = chain.forward_backward(unary.astype(np.float32), pairwise, offsets)
    assert got[1].dtype == np.float64
    labels = chain.viterbi(unary[0].astype(np.float32), pairwise[0], offsets)[0]
    assert labels.dtype == np.int64


@pytest.mark.parametrize("n_labels", [3, 12])  # either step of Viterbi
def test_read_only_inputs_are_accepted(n_labels):
    rng = np.random.default_rng(n_labels)
    unary = rng.standard_normal((2, 7, n_labels))
    pairwise = rng.standard_normal((2, n_labels, n_labels))
    offsets = np.array([0, 3, 7])
    expected = (
        chain.forward_backward(unary, pairwise, offsets),
        chain.viterbi(unary[0], pairwise[0], offsets),
        chain.log_likelihood(unary, pairwise, offsets, np.zeros(7, np.int64)),
    )
    for array in (unary, pairwise, offsets):
        array.flags.writeable = False
    got = (
        chain.forward_backward(unary, pairwise, offsets),
        chain.viterbi(unary[0], pairwise[0], offsets),
        chain.log_likelihood(unary, pairwise, offsets, np.zeros(7, np.int64)),
    )
    for a, b in zip(got[:2], expected[:2], strict=True):
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(got[2], expected[2])


def _good():
    unary = np.zeros((2, 5, 3))
    pairwise = np.zeros((2, 3, 3))
    return unary, pairwise, np.array([0, 2, 5]), np.array([0, 1, 2, 0, 1])


def _with(**changes):
    unary, pairwise, offsets, labels = _good()
    args = {"unary": unary, "pairwise": pairwise, "offsets": offsets, "labels": labels}
    args.update(changes)
    return args


_nan_unary = np.zeros((2, 5, 3))
_nan_unary[1, 2, 0] = np.nan
_inf_pairwise = np.zeros((2, 3, 3))
_inf_pairwise[0, 1, 1] = -np.inf

BAD_INPUTS = [
    ("unary", _with(unary=np.zeros((5, 3)))),
    ("unary", _with(unary=np.zeros((2, 5, 3, 1)))),
    ("unary", _with(unary=np.zeros((2, 5, 3), dtype=complex))),
    ("unary", _with(unary=np.full((2, 5, 3), "a"))),
    ("unary", _with(unary=np.zeros((2, 5, 3), dtype=bool))),
    ("unary", _with(unary=np.zeros((2, 5, 3), dtype=object))),
    ("unary", _with(unary=_nan_unary)),
    ("unary", _with(unary=np.zeros((2, 5, 0)), pairwise=np.zeros((2, 0, 0)))),
    ("pairwise", _with(pairwise=np.zeros((2, 3, 4)))),
    ("pairwise", _with(pairwise=np.zeros((1, 3, 3)))),
    ("pairwise", _with(pairwise=np.zeros((3, 3)))),
    ("pairwise", _with(pairwise=_inf_pairwise)),
    ("pairwise", _with(pairwise=np.zeros((2, 3, 3), dtype=np.complex64))),
    ("unary and pairwise", _with(unary=np.full((2, 5, 3), 1e306))),
    ("offsets", _with(offsets=np.array([0.0, 2.0, 5.0]))),
    ("offsets", _with(offsets=np.array([0, 2.5, 5]))),
    ("offsets", _with(offsets=np.array([[0, 2, 5]]))),
    ("offsets", _with(offsets=np.array([], dtype=np.int64))),
    ("offsets", _with(offsets=np.array([1, 2, 5]))),
    ("offsets", _with(offsets=np.array([0, 2, 4]))),
    ("offsets", _with(offsets=np.array([0, 2, 6]))),
    ("offsets", _with(offsets=np.array([0, 4, 2, 5]))),
    ("offsets", _with(offsets=np.array([0, -1, 5]))),
    ("offsets", _with(offsets=np.array([0, 2**64 - 1, 5], dtype=np.uint64))),
    ("offsets", _with(offsets=np.array([False, True]))),
    ("offsets", _with(offsets="0, 5")),
]
BAD_LABELS = [
    _with(labels=np.array([0, 1, 2, 0, 3])),
    _with(labels=np.array([0, 1, -1, 0, 1])),
    _with(labels=np.array([0, 1, 2, 0])),
    _with(labels=np.zeros((5, 1), dtype=int)),
    _with(labels=np.zeros(5)),
    _with(labels=np.zeros(5, dtype=bool)),
]


@pytest.mark.parametrize("name, args", BAD_INPUTS)
def test_forward_backward_and_log_likelihood_refuse_bad_input(name, args):
    args = dict(args)  # the parameter's dict is shared by every build's run
    labels = args.pop("labels")
    with pytest.raises(ValueError, match=rf"^{name}\b"):
        chain.forward_backward(**args)
    with pytest.raises(ValueError, match=rf"^{name}\b"):
        chain.log_likelihood(**args, labels=labels)


_nan_unary_2d = np.zeros((5, 3))
_nan_unary_2d[0, 0] = np.nan
BAD_VITERBI_INPUTS = [
    ("unary", np.zeros((2, 5, 3)), np.zeros((3, 3)), [0, 5]),
    ("unary", np.zeros(5), np.zeros((3, 3)), [0, 5]),
    ("unary", np.zeros((5, 3), dtype=complex), np.zeros((3, 3)), [0, 5]),
    ("unary", _nan_unary_2d, np.zeros((3, 3)), [0, 5]),
    ("unary", np.zeros((5, 0)), np.zeros((0, 0)), [0, 5]),
    ("pairwise", np.zeros((5, 3)), np.zeros((2, 3, 3)), [0, 5]),
    ("pairwise", np.zeros((5, 3)), np.zeros((3, 2)), [0, 5]),
    ("pairwise", np.zeros((5, 3)), np.full((3, 3), np.inf), [0, 5]),
    ("offsets", np.zeros((5, 3)), np.zeros((3, 3)), [0, 4]),
    ("offsets", np.zeros((5, 3)), np.zeros((3, 3)), [0, 3, 2, 5]),
    ("offsets", np.zeros((5, 3)), np.zeros((3, 3)), [0.0, 5.0]),
]


@pytest.mark.parametrize("name, unary, pairwise, offsets", BAD_VITERBI_INPUTS)
def test_viterbi_refuses_bad_input(name, unary, pairwise, offsets):
    with pytest.raises(ValueError, match=rf"^{name}\b"):
        chain.viterbi(unary, pairwise, offsets)


@pytest.mark.parametrize("args", BAD_LABELS)
def test_log_likelihood_refuses_bad_labels(args):
    with pytest.raises(ValueError, match=r"^labels\b"):
        chain.log_likelihood(**args)
    with pytest.raises(ValueError, match=r"^labels\b"):
        chain.log_likelihood(**args, return_gradient=True)


@pytest.mark.parametrize("pair_range", [3.0, 1000.0], ids=["scaled", "log-space"])
def test_marginals_sum_to_one_under_a_large_constant_unary_offset(pair_range):
    # Catches C08 (_normalise in _chain.pyx returns its input unnormalised),
    # C41 (the last token's _normalise in _backward_log removed) and C52
    # (the per-token _normalise in _backward_log removed): the log-space
    # marginals then leave every row off 1 by ~eps * |offset|, 4e-11 at
    # 1e6, 8e-7 at 1e10 (pristine: 2e-16) -- the random tests keep
    # |potentials| <= ~1e4 where the drift stays below their atol 1e-12.
    # Adding a constant to every label of a token leaves the distribution
    # unchanged, and (u + c) - c is exact here: the brute-force reference
    # is computed on the offset removed.
    rng = np.random.default_rng(7)
    for T, V in [(6, 3), (4, 4), (5, 2)]:
        unary = rng.standard_normal((1, T, V))
        pairwise = rng.standard_normal((1, V, V))
        pairwise[0, 0, V - 1] = -pair_range  # 1000 > 300: log space
        for offset in (1e6, 1e8, 1e10):
            shifted = unary + offset
            log_z, marginals, pair = chain.forward_backward(shifted, pairwise, [0, T])
            np.testing.assert_allclose(marginals.sum(axis=-1), 1.0, rtol=0, atol=1e-14)
            assert marginals.max() <= 1.0 and marginals.min() >= 0.0
            expected = ref.brute_force(shifted - offset, pairwise, np.array([0, T]))
            # the inputs carry eps * offset of rounding: so do the outputs
            tol = 1e-14 * offset
            np.testing.assert_allclose(marginals, expected[1], rtol=0, atol=tol)
            np.testing.assert_allclose(pair, expected[2], rtol=0, atol=tol)
            np.testing.assert_allclose(
                log_z, expected[0] + T * offset, rtol=1e-14, atol=0
            )


def test_pairwise_maximum_outside_the_first_row_gives_the_exact_result():
    # Catches C56 (_chain.forward_backward takes p_max over the first row
    # of P only): the range test then sees ~2 instead of ~800, runs the
    # scaled recursion with E = exp(P - p_max) up to e^800 = inf, and
    # returns NaN log_z and marginals. The random tests rarely have a first
    # row that is both narrow and ~700 below the maximum.
    rng = np.random.default_rng(3)
    for V, T, top in [(3, 4, 500.0), (3, 4, 700.0), (2, 5, 2000.0), (4, 3, 900.0)]:
        unary = rng.standard_normal((1, T, V))
        pairwise = rng.uniform(-1, 1, (1, V, V))
        pairwise[0, 0] -= 100.0  # a narrow first row, far below...
        pairwise[0, V - 1, 1] = top  # ...the maximum, in another row
        offsets = np.array([0, T])
        log_z, marginals, pair = chain.forward_backward(unary, pairwise, offsets)
        expected = ref.brute_force(unary, pairwise, offsets)
        np.testing.assert_allclose(log_z, expected[0], rtol=1e-12)
        np.testing.assert_allclose(marginals, expected[1], rtol=0, atol=1e-12)
        np.testing.assert_allclose(pair, expected[2], rtol=0, atol=1e-12)


def test_unsigned_integer_potentials_are_converted_like_signed_ones():
    # Catches P03 (dtype kinds "fiu" -> "fi" in chain._as_float_array): the
    # docstrings say the potentials are "converted to float64 if needed" and
    # the check accepts unsigned integers, but no test passes them.
    rng = np.random.default_rng(0)
    unary = rng.integers(0, 5, (2, 7, 3))
    pairwise = rng.integers(0, 5, (2, 3, 3))
    offsets = np.array([0, 3, 7])
    expected = ref.brute_force(unary.astype(float), pairwise.astype(float), offsets)
    got = chain.forward_backward(
        unary.astype(np.uint8), pairwise.astype(np.uint16), offsets
    )
    for a, b in zip(got, expected[:3], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    labels, scores = chain.viterbi(
        unary[0].astype(np.uint32), pairwise[0].astype(np.uint64), offsets
    )
    np.testing.assert_array_equal(labels, expected[3][0])
    np.testing.assert_allclose(scores, expected[4][0], rtol=1e-12)


def test_strided_int64_offsets_are_accepted():
    # Catches P21 (chain._check_offsets converts with np.asarray instead of
    # np.ascontiguousarray): the layouts test passes int32, uint8 and list
    # offsets, which are all copied anyway; a strided int64 view (e.g. every
    # other entry of a boundary array) then reaches the kernels' int64[::1]
    # argument and fails with "ndarray is not C-contiguous".
    rng = np.random.default_rng(4)
    unary = rng.standard_normal((2, 7, 3))
    pairwise = rng.standard_normal((2, 3, 3))
    labels = rng.integers(0, 3, 7)
    offsets = np.array([0, -1, 3, -1, 7], dtype=np.int64)[::2]
    assert not offsets.flags.c_contiguous
    expected = ref.brute_force(unary, pairwise, np.array([0, 3, 7]))
    got = chain.forward_backward(unary, pairwise, offsets)
    for a, b in zip(got, expected[:3], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    expected_loglik = -expected[0]
    for s in range(2):
        for n, (start, stop) in enumerate([(0, 3), (3, 7)]):
            for t in range(start, stop):
                expected_loglik[s, n] += unary[s, t, labels[t]]
                if t + 1 < stop:
                    expected_loglik[s, n] += pairwise[s, labels[t], labels[t + 1]]
    np.testing.assert_allclose(
        chain.log_likelihood(unary, pairwise, offsets, labels),
        expected_loglik,
        rtol=1e-12,
    )
    best, scores = chain.viterbi(unary[0], pairwise[0], offsets)
    np.testing.assert_array_equal(best, expected[3][0])
    np.testing.assert_allclose(scores, expected[4][0], rtol=1e-12)


def test_path_limit_check_refuses_long_chains_without_overflowing():
    # chain._fits_path_limit multiplies NumPy float64 scalars:
    # (1e306 + 0) * (1000 + 1) overflows, and NumPy's RuntimeWarning
    # ("overflow encountered in scalar multiply") is raised before the
    # ValueError -- as an exception under filterwarnings = error (this
    # project's pytest configuration, or python -W error), as a spurious
    # warning otherwise.
    T = 1000
    for unary, pairwise in [
        (np.full((1, T, 2), 1e306), np.zeros((1, 2, 2))),
        (np.zeros((1, T, 2)), np.full((1, 2, 2), 1e306)),
    ]:
        with pytest.raises(ValueError, match=r"^unary and pairwise\b"):
            chain.forward_backward(unary, pairwise, [0, T])
        with pytest.raises(ValueError, match=r"^unary and pairwise\b"):
            chain.viterbi(unary[0], pairwise[0], [0, T])


@pytest.mark.parametrize("polynomial", [False, True], ids=["libm", "polynomial"])
def test_scaled_recursion_exponential_is_numpy_s_to_two_ulp(chain_build, polynomial):
    # Both exponentials of the scaled recursion (libm's, and the branch-free
    # polynomial of VECTOR_EXP_MIN_LABELS labels and more) against NumPy's on
    # their whole domain (shifted potentials, x <= 0): within 2 units in the
    # last place, exp(0) = 1 exactly, 0 below the flush at -708 (no
    # subnormal messages), and a normal double just above it.
    rng = np.random.default_rng(3)
    x = np.concatenate([
        -rng.exponential(3.0, 200_000), -rng.uniform(0.0, 708.0, 200_000),
        -np.log(2) / 2 + np.array([-1e-16, 0.0, 1e-16]),  # reduction's edge
        [0.0, -5e-324, -1e-300, -707.9999, -708.0],
    ])
    out = np.empty_like(x)
    chain_build.flushed_exp(x, out, polynomial)
    expected = np.exp(x)
    assert np.all(np.abs(out - expected) <= 2 * np.spacing(expected))
    assert out[-5] == 1.0 and out[-4] == 1.0
    assert out[-1] > np.finfo(float).tiny  # exp(-708) is normal
    below = np.array([-708.0001, -745.0, -1e300, -np.inf])
    flushed = np.full_like(below, np.nan)
    chain_build.flushed_exp(below, flushed, polynomial)
    np.testing.assert_array_equal(flushed, 0.0)


def test_forward_backward_takes_both_exponentials_to_rounding(chain_build):
    # On both sides of VECTOR_EXP_MIN_LABELS the compiled marginals and log Z
    # match the log-space reference of the tests (a different exponential
    # and recursion) to rounding, on long sequences with large potentials.
    threshold = chain_build.VECTOR_EXP_MIN_LABELS
    for n_labels in (threshold - 1, threshold, threshold + 4):
        unary, pairwise, offsets, _ = _problem(
            7, 2, n_labels, [1, 60, 300], 30.0, 3.0
        )
        log_z, marginals, pair = chain._forward_backward(
            unary, pairwise, offsets, True
        )
        ref_log_z, ref_marginals, ref_pair = ref.forward_backward(
            unary, pairwise, offsets
        )
        np.testing.assert_allclose(log_z, ref_log_z, rtol=1e-12)
        np.testing.assert_allclose(marginals, ref_marginals, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(pair, ref_pair, rtol=1e-9, atol=1e-10)
