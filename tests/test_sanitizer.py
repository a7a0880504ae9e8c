"""The compiled modules under AddressSanitizer (``tests/_sanitizer.py``).

A wrong index in a compiled loop can write past the end of a buffer and
still return the right numbers, which no comparison of outputs sees. Each
test builds one ``.pyx`` of the repository with ``-fsanitize=address`` and
runs an exercise with it in place of the package's module. They build the
baseline flags' code; the AVX2 builds compile the same source
(``skgpstruct/_simd.py``).
"""

from _sanitizer import sanitized_run

# _chain.pyx under AddressSanitizer (tests/_sanitizer.py; about 10 s,
# skipped without Cython, gcc or libasan): four mutants of the h32a audit
# wrote past the end of a heap buffer and still returned the right numbers
# (forward messages at stride V in the 2 V roll buffer when the marginals
# are not wanted, the forward pass's exponentials one row short twice,
# Viterbi's backpointers one row short), which no comparison of outputs
# can see.
_CHAIN_ASAN_EXERCISE = """
import sys
import numpy as np
sys.path.insert(0, ".")
import _chain_asan
from skgpstruct import chain
# the wrappers call the kernels through these names
chain._chain = chain._baseline_chain = _chain_asan
rng = np.random.default_rng(0)
# 12 and 13 labels: the polynomial exponentials of the baseline build
# (VECTOR_EXP_MIN_LABELS), written row by row into the backward pass's
# buffer or, for log Z alone, into one row of scratch
for V in (1, 2, 3, 4, _chain_asan.VECTOR_EXP_MIN_LABELS,
          _chain_asan.VECTOR_EXP_MIN_LABELS + 1):
    for lengths in ([3, 0, 5, 1], [7], [2, 2, 9], [1], [0, 4]):
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        for pair_scale in (1.0, 400.0):  # scaled and log-space recursions
            u = rng.standard_normal((2, offsets[-1], V))
            p = rng.standard_normal((2, V, V)) * pair_scale
            labels = rng.integers(0, V, offsets[-1])
            chain.forward_backward(u, p, offsets)
            chain.log_likelihood(u, p, offsets, labels)
            chain.log_likelihood(u, p, offsets, labels, return_gradient=True)
            chain._forward_backward(u, p, offsets, True, with_pairs=False)
            chain.viterbi(u[0], p[0], offsets)
print("ok")
"""


def test_chain_kernels_stay_within_their_buffers_under_address_sanitizer(tmp_path):
    sanitized_run(tmp_path, "_chain", _CHAIN_ASAN_EXERCISE)


# _stacked.pyx under AddressSanitizer (tests/_sanitizer.py; about 20 s):
# its loops index per-token, per-row and per-variable buffers with the
# layout's 32-bit indices, and an index one off would write past a buffer
# with no visible effect on the results. The exercise runs the three
# kernels in both precisions on random splits (lone, drawn and idle rows,
# tokens without entries) and batch, stochastic and prediction calls of
# small fits through the estimator; and the gradients' chain rule to the
# parameters (inducing_gradient) on its own.
_STACKED_ASAN_EXERCISE = """
import sys
import warnings
import numpy as np
import scipy.sparse as sp
sys.path.insert(0, ".")
import _stacked_asan
from skgpstruct import GPStructClassifier
from skgpstruct.datasets import make_sequences
from skgpstruct.inference import terms
from skgpstruct.inference.inducing import RowSplit
terms.stacked_kernels = _stacked_asan  # the terms call the kernels by this name
rng = np.random.default_rng(0)
for dtype in (np.float32, np.float64):
    for n_tokens, n_inducing, n_rows, K, V, S in [
        (7, 6, 12, 2, 3, 4), (1, 1, 1, 1, 1, 1), (30, 20, 60, 1, 5, 8),
        (5, 3, 4, 1, 2, 3),
    ]:
        U = rng.normal(size=(n_rows, n_tokens)) * (rng.random((n_rows, n_tokens)) < 0.3)
        U[:, -1] = 0.0  # a token without entries
        split = RowSplit.of(sp.csr_matrix(U), rng.integers(n_inducing, size=n_rows),
                            n_inducing)
        by_token, by_row = split.entries(dtype)
        KV = K * V
        c = rng.uniform(0.5, 2.0, n_inducing).astype(dtype)
        mean, sd = rng.normal(size=(2, n_inducing, KV)).astype(dtype)
        sd = np.abs(sd)
        eps = rng.normal(size=(split.drawn.size, KV, S)).astype(dtype)
        xi = rng.normal(size=(K, S, n_tokens, V)).astype(dtype)
        token_sd = np.empty((n_tokens, KV), dtype=dtype)
        _stacked_asan.token_sd(*by_token, split.entry_drawn, c, sd, 1e-6, token_sd)
        f = np.empty((K, S, n_tokens, V))
        _stacked_asan.unary(*by_token, *by_row, c, mean, sd, token_sd, eps, xi, f)
        d_cm, d_cs = np.zeros((2, n_inducing, KV))
        _stacked_asan.backward(*split.lone_entries(dtype), *by_row, c, sd, token_sd,
                               eps, xi, rng.normal(size=f.shape), d_cm, d_cs)
# the chain rule to the parameters, below, at and across its block of 128
for K, V, M in [(1, 1, 1), (2, 3, 128), (1, 5, 130)]:
    q_mu, q_sqrt = rng.normal(size=(2, K, V, M))
    grads = np.empty((2, K, V, M))
    _stacked_asan.inducing_gradient(
        rng.uniform(0.5, 2.0, M), q_mu, q_sqrt, *rng.normal(size=(2, M, K * V)),
        grads[0], grads[1], np.empty(M),
    )
warnings.simplefilter("ignore")
X, y = make_sequences(30, n_features=12, sparse=True, random_state=0)
for params in ({"max_iter": 5}, {"optimizer": "stochastic", "max_iter": 2}):
    model = GPStructClassifier(random_state=0, **params).fit(X, y)
    model.predict(X[:5])
    model.predict_marginals(X[:5])
print("ok")
"""


def test_stacked_kernels_stay_within_their_buffers_under_address_sanitizer(tmp_path):
    sanitized_run(tmp_path, "_stacked", _STACKED_ASAN_EXERCISE)


# _vectors.pyx under AddressSanitizer (tests/_sanitizer.py; about 10 s):
# the loops over whole vectors, the sums in blocks of eight partial sums
# with a remainder loop (L-BFGS's diagonal update and initial matrix), at
# lengths below, at and across the blocks, and inside minimize_lbfgs.
_VECTORS_ASAN_EXERCISE = """
import sys
import numpy as np
sys.path.insert(0, ".")
import _vectors_asan as v
from scipy.optimize import rosen, rosen_der
from skgpstruct.optim import lbfgs, minimize_lbfgs
rng = np.random.default_rng(0)
for n in (1, 7, 8, 9, 16, 17, 1001):
    b = np.exp(rng.standard_normal(n))
    s = rng.standard_normal(n)
    y = 3.0 * s + 0.1 * rng.standard_normal(n)  # s^T y > 0
    v.diagonal_bfgs_update(b, s, y, float(s @ y), 1e-12)
    out = np.empty(n)
    v.secant_inverse_sqrt(b, y, float(s @ y), out)
    x, m, w = rng.standard_normal(n), np.zeros(n), np.zeros(n)
    v.adam_ascent_step(x, m, w, s, np.full(n, 0.1), 0.9, 0.999, 1e-8, 1,
                       -np.ones(n), np.ones(n))
    assert v.same_bits(x, x.copy()) and not v.same_bits(x, x + 1.0)
# the L-BFGS memory with these kernels: its diagonal updated every iteration
lbfgs.diagonal_bfgs_update = v.diagonal_bfgs_update
lbfgs.secant_inverse_sqrt = v.secant_inverse_sqrt
result = minimize_lbfgs(lambda z: (-rosen(z), -rosen_der(z)), np.full(9, -1.2),
                        max_iter=300, tol=1e-12)
assert result.converged, result.message
print("ok")
"""


def test_vector_loops_stay_within_their_buffers_under_address_sanitizer(tmp_path):
    sanitized_run(tmp_path, "_vectors", _VECTORS_ASAN_EXERCISE)
