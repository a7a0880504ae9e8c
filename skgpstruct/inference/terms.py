"""Per-chunk expected log-likelihood and its gradients (paper eq. 10-12, 18-20).

A chunk is a run of consecutive sequences. For sequence n, label j and
mixture component k, the unary potentials have the T_n-dimensional Gaussian
marginal (eq. 18-19, whitened)::

    b = B_n^T m_kj,    Sigma = B_n^T S_kj B_n + diag(r_n),
    B_n = L_zz^{-1} K(Z, X_n),    r_n = diag(K(X_n, X_n)) - colsum(B_n ** 2),

where the residual ``r_n`` of the conditional p(f | u) is kept on the
diagonal (its off-diagonal part inside a sequence is dropped; with inducing
points on the training tokens of a linear kernel it is zero anyway).

Two estimators of the gradient (``estimator``):

``"pathwise"``
    ``f = B_n^T (m_kj + R_kj eps) + sqrt(r_n) xi``, with eps an M-vector drawn
    per sequence, sample, component and label; the gradient is the exact
    derivative of this fixed-sample objective, using ``d log p / d f`` from
    the likelihood.
``"score"``
    the paper's black-box estimator: samples ``f = b + chol(Sigma) eta`` of
    the T_n-dimensional marginal, and the score of that Gaussian with respect
    to (b, Sigma) times ``log p(y | f) - a``; the control-variate coefficient
    ``a`` (section 5.1) is estimated per sequence on a second, independent set
    of samples so that the estimate stays unbiased. Needs only ``log p``.

Both return the same things: the chunk's ELL estimate and the gradients
with respect to ``q_mu``, ``q_sqrt``, the mixture weights, the pairwise
posterior, ``L_zz`` and the kernel hyperparameters (through the chunk's
cross and diagonal kernel matrices). Everything is a pure function, so a
chunk can run in any joblib worker.
"""

from dataclasses import dataclass

import numpy as np
from scipy import linalg

__all__ = ["Chunk", "SharedState", "chunk_terms", "project", "sample_unary"]


@dataclass
class Chunk:
    """Data of a run of consecutive sequences, sent to a worker once per fit.

    Attributes
    ----------
    X : ndarray or CSR matrix of shape (n_tokens, n_features)
    offsets : ndarray of int64 of shape (n_sequences + 1,)
    labels : ndarray of int64 of shape (n_tokens,)
    seed : numpy.random.SeedSequence
        Seed of the chunk's Monte Carlo base samples.
    """

    X: object
    offsets: np.ndarray
    labels: np.ndarray
    seed: np.random.SeedSequence

    @property
    def n_sequences(self):
        return len(self.offsets) - 1

    @property
    def n_tokens(self):
        return int(self.offsets[-1])


@dataclass
class SharedState:
    """What every chunk needs from the parent at one evaluation."""

    Z: object
    kernel: object
    L_zz: np.ndarray
    params: object  # VariationalParameters
    pairwise_noise: np.ndarray  # (S, V, V) base samples of q(f_bin)
    likelihood: object
    n_samples: int
    estimator: str
    need_kernel_gradient: bool
    residual_floor: float
    iteration_key: int = 0  # 0 in batch mode (fixed base samples)
    control_variate: bool = True  # score estimator only


def chunk_terms(chunk, shared):
    """ELL of one chunk and its gradients; see the module docstring.

    Returns
    -------
    result : dict
        ``ell`` (float), ``q_mu`` (K, V, M), ``q_sqrt`` (shape of q_sqrt),
        ``weights`` (K,), ``pairwise_mean`` (V, V), ``pairwise_std`` (V, V),
        ``L_zz`` (M, M) or None, ``theta`` (n_theta,) or None.
    """
    kernel, L_zz = shared.kernel, shared.L_zz
    B, residual = project(kernel, shared.Z, L_zz, chunk.X)
    residual_sd = np.sqrt(residual + shared.residual_floor)

    rng = np.random.default_rng(
        np.random.SeedSequence(
            entropy=chunk.seed.entropy,
            spawn_key=(*chunk.seed.spawn_key, shared.iteration_key),
        )
    )
    if shared.estimator == "pathwise":
        out, d_B, d_residual_sd = _pathwise(chunk, shared, B, residual_sd, rng)
    elif shared.estimator == "score":
        out, d_B, d_residual_sd = _score(chunk, shared, B, residual_sd, rng)
    else:  # validated by the estimator; kept as a guard for direct callers
        raise ValueError(f"unknown estimator {shared.estimator!r}")

    if shared.need_kernel_gradient:
        # residual_sd = sqrt(max(k_diag - colsum(B^2), 0) + floor)
        d_residual = np.where(residual > 0, d_residual_sd / (2.0 * residual_sd), 0.0)
        d_B = d_B - 2.0 * B * d_residual[None, :]
        # B = L^{-1} K_zx  =>  dK_zx = L^{-T} dB,  dL = -L^{-T} dB B^T
        d_K_zx = linalg.solve_triangular(
            L_zz, d_B, lower=True, trans="T", check_finite=False
        )
        out["L_zz"] = -np.tril(d_K_zx @ B.T)
        out["theta"] = kernel.gradient_vjp(
            shared.Z, chunk.X, d_K_zx
        ) + kernel.diag_gradient_vjp(chunk.X, d_residual)
    else:
        out["L_zz"] = None
        out["theta"] = None
    return out


def project(kernel, Z, L_zz, X):
    """Whitened projection of tokens on the inducing points.

    Parameters
    ----------
    kernel : Kernel
    Z : ndarray or CSR matrix of shape (M, n_features)
    L_zz : ndarray of shape (M, M)
        Lower Cholesky factor of ``kernel(Z)``.
    X : ndarray or CSR matrix of shape (n_tokens, n_features)

    Returns
    -------
    B : ndarray of shape (M, n_tokens)
        ``L_zz^{-1} K(Z, X)``: the whitened posterior mean of token t for
        label j is ``q_mu[k, j] @ B[:, t]``.
    residual : ndarray of shape (n_tokens,)
        Conditional prior variance ``k(x, x) - |B[:, t]|^2``, clipped at 0.
    """
    K_zx = kernel(Z, X)
    B = linalg.solve_triangular(L_zz, K_zx, lower=True, check_finite=False)
    residual = np.maximum(kernel.diag(X) - np.einsum("mt,mt->t", B, B), 0.0)
    return B, residual


def sample_unary(params, B, residual_sd, offsets, eps, xi):
    """Pathwise samples of the unary potentials of a ragged batch.

    ``f = B_n^T (q_mu[k, j] + q_sqrt[k, j] eps) + residual_sd * xi`` with an
    independent inducing draw per sequence.

    Parameters
    ----------
    params : VariationalParameters
    B : ndarray of shape (M, n_tokens)
    residual_sd : ndarray of shape (n_tokens,)
    offsets : ndarray of int64 of shape (n_sequences + 1,)
    eps : ndarray of shape (K, V, M, n_sequences * S)
    xi : ndarray of shape (K, S, n_tokens, V)

    Returns
    -------
    unary : ndarray of shape (K, S, n_tokens, V)
    v : ndarray of shape (K, V, M, n_sequences, S)
        The inducing draws (kept for the backward pass).
    """
    K, V, M = params.q_mu.shape
    n_seq = len(offsets) - 1
    S = xi.shape[1]
    if params.full_covariance:
        v = params.q_mu[..., None] + params.q_sqrt @ eps
    else:
        v = params.q_mu[..., None] + params.q_sqrt[..., None] * eps
    v = v.reshape(K, V, M, n_seq, S)
    unary = np.empty((K, S, B.shape[1], V))
    for n in range(n_seq):
        t0, t1 = offsets[n], offsets[n + 1]
        if t1 == t0:
            continue
        v_n = v[:, :, :, n, :].transpose(2, 0, 3, 1).reshape(M, K * S * V)
        f_n = (B[:, t0:t1].T @ v_n).reshape(t1 - t0, K, S, V)
        unary[:, :, t0:t1, :] = f_n.transpose(1, 2, 0, 3)
    unary += residual_sd[None, None, :, None] * xi
    return unary, v


def _tile_pairwise(params, noise, K):
    """Pairwise samples (K * S, V, V): the same S draws for every component."""
    samples = params.pairwise_mean[None] + params.pairwise_std[None] * noise
    return np.tile(samples, (K, 1, 1))


def _pathwise(chunk, shared, B, residual_sd, rng):
    params = shared.params
    K, V, M = params.q_mu.shape
    S = shared.n_samples
    offsets, n_seq, T = chunk.offsets, chunk.n_sequences, chunk.n_tokens
    full = params.full_covariance

    eps = rng.standard_normal((K, V, M, n_seq * S))
    xi = rng.standard_normal((K, S, T, V))
    unary, v = sample_unary(params, B, residual_sd, offsets, eps, xi)

    pairwise = _tile_pairwise(params, shared.pairwise_noise, K)
    log_p, g_unary, g_pair = shared.likelihood.log_prob_and_gradient(
        unary.reshape(K * S, T, V), pairwise, offsets, chunk.labels
    )
    log_p = log_p.reshape(K, S, n_seq)
    w = params.weights
    scale = (w / S)[:, None, None, None]
    g_unary = g_unary.reshape(K, S, T, V) * scale  # dELL / d unary

    d_v = np.zeros((K, V, M, n_seq, S))
    d_B = np.zeros_like(B)
    for n in range(n_seq):
        t0, t1 = offsets[n], offsets[n + 1]
        if t1 == t0:
            continue
        g_n = g_unary[:, :, t0:t1, :].transpose(2, 0, 1, 3).reshape(t1 - t0, -1)
        dv_n = (B[:, t0:t1] @ g_n).reshape(M, K, S, V)
        d_v[:, :, :, n, :] = dv_n.transpose(1, 3, 0, 2)
        v_n = v[:, :, :, n, :].transpose(2, 0, 1, 3).reshape(M, -1)
        # v_n columns ordered (k, j, s); reorder g_n columns the same way.
        g_n_kjs = g_unary[:, :, t0:t1, :].transpose(2, 0, 3, 1).reshape(t1 - t0, -1)
        d_B[:, t0:t1] = v_n @ g_n_kjs.T
    d_residual_sd = np.einsum("kstv,kstv->t", g_unary, xi)

    d_v = d_v.reshape(K, V, M, n_seq * S)
    grad_mu = d_v.sum(axis=-1)
    if full:
        grad_sqrt = np.tril(d_v @ np.swapaxes(eps, -1, -2))
    else:
        grad_sqrt = np.einsum("kvmn,kvmn->kvm", d_v, eps)

    g_pair_s = np.einsum("k,ksnij->sij", w / S, g_pair.reshape(K, S, n_seq, V, V))
    out = {
        "ell": float(np.einsum("k,ksn->", w / S, log_p)),
        "q_mu": grad_mu,
        "q_sqrt": grad_sqrt,
        "weights": log_p.sum(axis=(1, 2)) / S,
        "pairwise_mean": g_pair_s.sum(axis=0),
        "pairwise_std": np.einsum("sij,sij->ij", g_pair_s, shared.pairwise_noise),
    }
    return out, d_B, d_residual_sd


def _sequence_marginals(params, B_n, residual_n, full):
    """Mean (K, V, T) and Cholesky factor (K, V, T, T) of q(f_n) per label."""
    mean = params.q_mu @ B_n  # (K, V, T)
    if full:
        W = np.swapaxes(params.q_sqrt, -1, -2) @ B_n  # (K, V, M, T)
    else:
        W = params.q_sqrt[..., None] * B_n  # (K, V, M, T)
    cov = np.swapaxes(W, -1, -2) @ W
    T = B_n.shape[1]
    idx = np.arange(T)
    cov[..., idx, idx] += residual_n**2
    # A small relative jitter keeps the factor defined when tokens repeat
    # inside a sequence and the residual vanishes.
    mean_var = np.mean(cov[..., idx, idx], axis=-1)[..., None]
    cov[..., idx, idx] += 1e-8 * (mean_var + 1e-12)
    return mean, np.linalg.cholesky(cov)


def _score(chunk, shared, B, residual_sd, rng):
    params = shared.params
    K, V, M = params.q_mu.shape
    S = shared.n_samples
    offsets, n_seq, T = chunk.offsets, chunk.n_sequences, chunk.n_tokens
    full = params.full_covariance
    w = params.weights

    means, chols = [], []
    eta = rng.standard_normal((2, K, V, T, S))  # estimate set, baseline set
    unary = np.empty((2, K, S, T, V))
    for n in range(n_seq):
        t0, t1 = offsets[n], offsets[n + 1]
        mean, chol = _sequence_marginals(params, B[:, t0:t1], residual_sd[t0:t1], full)
        means.append(mean)
        chols.append(chol)
        f = mean[None, ..., None] + chol[None] @ eta[:, :, :, t0:t1, :]
        unary[:, :, :, t0:t1, :] = f.transpose(0, 1, 4, 3, 2)

    pairwise = _tile_pairwise(params, shared.pairwise_noise, K)
    log_p = shared.likelihood.log_prob(
        unary[0].reshape(K * S, T, V), pairwise, offsets, chunk.labels
    ).reshape(K, S, n_seq)
    log_p_base = shared.likelihood.log_prob(
        unary[1].reshape(K * S, T, V), pairwise, offsets, chunk.labels
    ).reshape(K, S, n_seq)

    zeta = shared.pairwise_noise
    std = params.pairwise_std
    score_pair_mean = zeta / std  # (S, V, V)
    score_pair_std = (zeta**2 - 1.0) / std

    grad_mu = np.zeros_like(params.q_mu)
    grad_sqrt = np.zeros_like(params.q_sqrt)
    grad_pair_mean = np.zeros((V, V))
    grad_pair_std = np.zeros((V, V))
    d_B = np.zeros_like(B)
    d_residual_sd = np.zeros(T)
    cov_all = params.q_cov()
    eye_cache = {}
    for n in range(n_seq):
        t0, t1 = offsets[n], offsets[n + 1]
        if t1 == t0:
            continue
        Tn = t1 - t0
        chol = chols[n]
        if Tn not in eye_cache:
            eye_cache[Tn] = np.eye(Tn)
        chol_inv = np.linalg.solve(chol, eye_cache[Tn])  # (K, V, T, T)
        sigma_inv = np.swapaxes(chol_inv, -1, -2) @ chol_inv  # (K, V, T, T)
        # z = Sigma^{-1} (f - b) = L^{-T} eta, for both sample sets.
        z = np.swapaxes(chol_inv, -1, -2)[None] @ eta[:, :, :, t0:t1, :]
        # Control-variate coefficient from the baseline set (section 5.1):
        # a = sum_s |h_s|^2 log p_s / sum_s |h_s|^2 with h the score.
        zb = z[1]  # (K, V, T, S)
        h_norm = np.einsum("kvts,kvts->ks", zb, zb)
        outer_b = np.einsum("kvts,kvus->kvstu", zb, zb) - sigma_inv[:, :, None]
        h_norm = h_norm + 0.25 * np.einsum("kvstu,kvstu->ks", outer_b, outer_b)
        a = np.sum(h_norm * log_p_base[:, :, n], axis=1) / np.sum(h_norm, axis=1)
        if not shared.control_variate:
            a = np.zeros_like(a)

        centred = (log_p[:, :, n] - a[:, None]) * (w / S)[:, None]  # (K, S)
        ze = z[0]
        g_b = np.einsum("kvts,ks->kvt", ze, centred)
        g_sigma = 0.5 * (
            np.einsum("kvts,kvus,ks->kvtu", ze, ze, centred)
            - sigma_inv * centred.sum(axis=1)[:, None, None, None]
        )
        B_n = B[:, t0:t1]
        grad_mu += g_b @ B_n.T
        BgB = B_n @ g_sigma @ B_n.T  # (K, V, M, M), d/dS
        if full:
            grad_sqrt += np.tril(2.0 * BgB @ params.q_sqrt)
            S_B = cov_all @ B_n  # (K, V, M, T)
        else:
            diag = np.diagonal(BgB, axis1=-2, axis2=-1)
            grad_sqrt += 2.0 * diag * params.q_sqrt
            S_B = cov_all[..., None] * B_n
        d_B[:, t0:t1] += np.einsum("kvm,kvt->mt", params.q_mu, g_b) + 2.0 * np.einsum(
            "kvmt,kvtu->mu", S_B, g_sigma
        )
        d_residual_sd[t0:t1] += 2.0 * residual_sd[t0:t1] * np.einsum(
            "kvtt->t", g_sigma
        )
        pair_weight = np.einsum("ks->s", centred)
        grad_pair_mean += np.einsum("s,sij->ij", pair_weight, score_pair_mean)
        grad_pair_std += np.einsum("s,sij->ij", pair_weight, score_pair_std)

    out = {
        "ell": float(np.einsum("k,ksn->", w / S, log_p)),
        "q_mu": grad_mu,
        "q_sqrt": grad_sqrt,
        "weights": log_p.sum(axis=(1, 2)) / S,
        "pairwise_mean": grad_pair_mean,
        "pairwise_std": grad_pair_std,
    }
    return out, d_B, d_residual_sd
