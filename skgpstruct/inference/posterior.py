"""The variational posterior: its parameters, their packing, and the KL terms.

Notation (GPflow style inside the maths): ``K`` mixture components, ``V``
labels (one latent function each), ``M`` inducing points. The inducing
variables are whitened, ``u_j = chol(K_zz) v_j`` with prior ``v_j ~ N(0, I)``,
and ``q(v) = sum_k pi_k prod_j N(v_j; q_mu[k, j], q_sqrt[k, j] q_sqrt[k, j]^T)``.
The pairwise potentials have ``q(f_bin) = N(pairwise_mean, diag(pairwise_std^2))``
and prior ``N(0, pairwise_prior_variance I)``.

Everything here is a pure function of arrays and knows nothing of data,
kernels or likelihoods.
"""

from dataclasses import dataclass

import numpy as np
from scipy import linalg
from scipy.special import logsumexp, softmax

from .._linalg import jitter_cholesky

__all__ = [
    "VariationalParameters",
    "ParameterLayout",
    "kl_unary",
    "kl_unary_diagonal_packed",
    "kl_pairwise",
]

_LOG_2PI = np.log(2.0 * np.pi)


@dataclass
class VariationalParameters:
    """Arrays of the variational posterior (natural, constrained form).

    Attributes
    ----------
    q_mu : ndarray of shape (K, V, M)
        Means of the whitened inducing variables.
    q_sqrt : ndarray of shape (K, V, M, M) or (K, V, M)
        Lower-triangular factors of the covariances (``covariance="full"``)
        or positive standard deviations (``covariance="diag"``).
    weights : ndarray of shape (K,)
        Mixture weights, summing to one.
    pairwise_mean : ndarray of shape (V, V)
    pairwise_std : ndarray of shape (V, V)
    """

    q_mu: np.ndarray
    q_sqrt: np.ndarray
    weights: np.ndarray
    pairwise_mean: np.ndarray
    pairwise_std: np.ndarray

    @property
    def full_covariance(self):
        return self.q_sqrt.ndim == 4

    def q_cov(self):
        """Covariance matrices ``S`` (full) or variances (diag) of q(v)."""
        if self.full_covariance:
            return self.q_sqrt @ np.swapaxes(self.q_sqrt, -1, -2)
        return self.q_sqrt**2

    def restricted(self, support):
        """The parameters of the inducing variables ``support`` alone (a
        compact chunk layout's), diagonal covariances only."""
        if self.full_covariance:
            raise ValueError("compact chunk layouts need diagonal covariances")
        return VariationalParameters(
            self.q_mu[:, :, support], self.q_sqrt[:, :, support],
            self.weights, self.pairwise_mean, self.pairwise_std,
        )

    def copy(self):
        return VariationalParameters(
            *(np.array(a, copy=True) for a in self.astuple())
        )

    def astuple(self):
        return (
            self.q_mu,
            self.q_sqrt,
            self.weights,
            self.pairwise_mean,
            self.pairwise_std,
        )


class ParameterLayout:
    """Packs variational parameters and kernel log-hyperparameters in a vector.

    The vector is unconstrained: diagonals of ``q_sqrt`` and the pairwise
    standard deviations enter through their logarithms, mixture weights
    through logits (absent when K = 1), and kernel hyperparameters as the
    kernel's ``theta`` (absent when they are frozen).

    Parameters
    ----------
    n_components, n_classes, n_inducing : int
    full_covariance : bool
    n_theta : int
        Number of kernel hyperparameters optimised (0 when frozen).
    learn_pairwise_prior : bool, default=False
        Whether the log prior variance of the pairwise potentials is a
        free coordinate (the last one).
    """

    def __init__(
        self,
        n_components,
        n_classes,
        n_inducing,
        full_covariance,
        n_theta,
        learn_pairwise_prior=False,
    ):
        self.K, self.V, self.M = n_components, n_classes, n_inducing
        self.full_covariance = full_covariance
        self.n_theta = n_theta
        self.learn_pairwise_prior = learn_pairwise_prior
        K, V, M = self.K, self.V, self.M
        if full_covariance:
            self._tril = np.tril_indices(M)
            self._diag_in_tril = np.flatnonzero(self._tril[0] == self._tril[1])
        n_sqrt = K * V * (M * (M + 1) // 2 if full_covariance else M)
        sizes = {
            "q_mu": K * V * M,
            "q_sqrt": n_sqrt,
            "logits": K if K > 1 else 0,
            "pairwise_mean": V * V,
            "pairwise_log_std": V * V,
            "theta": n_theta,
            "pairwise_log_prior_variance": 1 if learn_pairwise_prior else 0,
        }
        self.slices = {}
        start = 0
        for name, size in sizes.items():
            self.slices[name] = slice(start, start + size)
            start += size
        self.size = start

    def pack(self, params, theta=None, pairwise_prior_variance=None):
        """Flatten parameters, ``theta`` and the pairwise prior into a vector."""
        K, V = self.K, self.V
        out = np.empty(self.size)
        out[self.slices["q_mu"]] = params.q_mu.ravel()
        if self.full_covariance:
            tri = params.q_sqrt[:, :, self._tril[0], self._tril[1]].copy()
            diag = tri[:, :, self._diag_in_tril]
            # Factors are kept with a positive diagonal, so the log is defined.
            tri[:, :, self._diag_in_tril] = np.log(np.abs(diag))
            out[self.slices["q_sqrt"]] = tri.ravel()
        else:
            out[self.slices["q_sqrt"]] = np.log(params.q_sqrt).ravel()
        if K > 1:
            logw = np.log(params.weights)
            out[self.slices["logits"]] = logw - logw.mean()
        out[self.slices["pairwise_mean"]] = params.pairwise_mean.reshape(V * V)
        out[self.slices["pairwise_log_std"]] = np.log(params.pairwise_std).reshape(
            V * V
        )
        if self.n_theta:
            out[self.slices["theta"]] = theta
        if self.learn_pairwise_prior:
            out[self.slices["pairwise_log_prior_variance"]] = np.log(
                pairwise_prior_variance
            )
        return out

    def pairwise_prior_variance(self, vector, default):
        """The pairwise prior variance coded in ``vector``, or ``default``."""
        if not self.learn_pairwise_prior:
            return default
        return float(np.exp(vector[self.slices["pairwise_log_prior_variance"]][0]))

    def unpack(self, vector):
        """Inverse of :meth:`pack`: returns ``(params, theta or None)``."""
        K, V, M = self.K, self.V, self.M
        q_mu = vector[self.slices["q_mu"]].reshape(K, V, M).copy()
        raw = vector[self.slices["q_sqrt"]]
        if self.full_covariance:
            tri = raw.reshape(K, V, -1).copy()
            tri[:, :, self._diag_in_tril] = np.exp(tri[:, :, self._diag_in_tril])
            q_sqrt = np.zeros((K, V, M, M))
            q_sqrt[:, :, self._tril[0], self._tril[1]] = tri
        else:
            q_sqrt = np.exp(raw.reshape(K, V, M))
        if K > 1:
            weights = softmax(vector[self.slices["logits"]])
        else:
            weights = np.ones(1)
        params = VariationalParameters(
            q_mu=q_mu,
            q_sqrt=q_sqrt,
            weights=weights,
            pairwise_mean=vector[self.slices["pairwise_mean"]].reshape(V, V).copy(),
            pairwise_std=np.exp(vector[self.slices["pairwise_log_std"]]).reshape(V, V),
        )
        theta = vector[self.slices["theta"]].copy() if self.n_theta else None
        return params, theta

    def pack_gradient(self, params, grads, theta_grad=None, prior_grad=None):
        """Chain gradients w.r.t. the natural arrays to the packed vector.

        Parameters
        ----------
        params : VariationalParameters
            The point at which the gradient was taken.
        grads : VariationalParameters
            Gradients with respect to each natural array (``weights`` as a
            gradient with respect to the weights themselves).
        theta_grad : ndarray of shape (n_theta,) or None
        prior_grad : float or None
            Gradient with respect to the log pairwise prior variance.
        """
        out = np.empty(self.size)
        out[self.slices["q_mu"]] = grads.q_mu.ravel()
        if self.full_covariance:
            tri = grads.q_sqrt[:, :, self._tril[0], self._tril[1]].copy()
            diag = params.q_sqrt[:, :, self._tril[0], self._tril[1]][
                :, :, self._diag_in_tril
            ]
            tri[:, :, self._diag_in_tril] *= diag
            out[self.slices["q_sqrt"]] = tri.ravel()
        else:
            np.multiply(
                grads.q_sqrt, params.q_sqrt,
                out=out[self.slices["q_sqrt"]].reshape(params.q_sqrt.shape),
            )
        out[self.tail_start :] = self.pack_tail_gradient(
            params, grads, theta_grad, prior_grad
        )
        return out

    @property
    def tail_start(self):
        """Where the small parameters after ``q_mu`` and ``q_sqrt`` begin."""
        return self.slices["q_sqrt"].stop

    def pack_tail_gradient(self, params, grads, theta_grad=None, prior_grad=None):
        """The packed gradient's entries from :attr:`tail_start` on.

        Those of the mixture logits, the pairwise posterior, the kernel
        hyperparameters and the pairwise prior variance (arguments as in
        :meth:`pack_gradient`, whose ``q_mu`` and ``q_sqrt`` parts are not
        read).
        """
        V = self.V
        out = np.empty(self.size - self.tail_start)
        start = self.tail_start

        def part(name):
            sl = self.slices[name]
            return out[sl.start - start : sl.stop - start]

        if self.K > 1:
            w, gw = params.weights, grads.weights
            part("logits")[:] = w * (gw - np.dot(w, gw))
        part("pairwise_mean")[:] = grads.pairwise_mean.reshape(V * V)
        part("pairwise_log_std")[:] = (
            grads.pairwise_std * params.pairwise_std
        ).reshape(V * V)
        if self.n_theta:
            part("theta")[:] = theta_grad
        if self.learn_pairwise_prior:
            part("pairwise_log_prior_variance")[:] = prior_grad
        return out

    def support_indices(self, support):
        """Packed coordinates of the parameters a compact chunk touches.

        With diagonal covariances: ``q_mu`` and ``q_sqrt`` of every
        component and label at the inducing variables ``support``, then
        every coordinate from :attr:`tail_start` on; the order of
        :meth:`pack_support_gradient`'s values.
        """
        if self.full_covariance:
            raise ValueError("support indices need diagonal covariances")
        support = np.asarray(support, dtype=np.int64)
        rows = (np.arange(self.K * self.V, dtype=np.int64) * self.M)[:, None]
        local = (rows + support[None, :]).ravel()
        return np.concatenate([
            self.slices["q_mu"].start + local,
            self.slices["q_sqrt"].start + local,
            np.arange(self.tail_start, self.size, dtype=np.int64),
        ])

    def pack_support_gradient(self, params, support, grad_mu, grad_sqrt, grads,
                              theta_grad=None, prior_grad=None):
        """The packed gradient on :meth:`support_indices` ``(support)``.

        Parameters
        ----------
        params : VariationalParameters
            The point at which the gradient was taken (all inducing
            variables).
        support : ndarray of int
        grad_mu, grad_sqrt : ndarray of shape (K, V, len(support))
            Gradients with respect to ``q_mu`` and the diagonal ``q_sqrt``
            at the support.
        grads : VariationalParameters
            Supplies the ``weights`` and pairwise gradients (its ``q_mu``
            and ``q_sqrt`` are not read).
        theta_grad, prior_grad
            As in :meth:`pack_gradient`.

        Returns
        -------
        ndarray of shape (2 * K * V * len(support) + size - tail_start,)
        """
        n_local = grad_mu.size
        out = np.empty(2 * n_local + self.size - self.tail_start)
        out[:n_local] = grad_mu.ravel()
        np.multiply(
            grad_sqrt, params.q_sqrt[:, :, support],
            out=out[n_local : 2 * n_local].reshape(grad_sqrt.shape),
        )
        out[2 * n_local :] = self.pack_tail_gradient(
            params, grads, theta_grad, prior_grad
        )
        return out


def kl_pairwise(mean, std, prior_variance):
    """KL(N(mean, diag(std^2)) || N(0, prior_variance I)) and its gradients.

    Supplement B, eq. 33, for a diagonal posterior and an isotropic prior.

    Returns
    -------
    kl : float
    grad_mean, grad_std : ndarray of the shape of ``mean``
    grad_log_prior_variance : float
        Gradient with respect to ``log(prior_variance)``.
    """
    # A line search's trial step may make std = exp(log std) 0 or inf: the
    # KL is then not finite, and the optimiser rejects the trial.
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        var = std**2
        second_moment = (var + mean**2) / prior_variance
        kl = 0.5 * np.sum(second_moment - 1.0 - np.log(var) + np.log(prior_variance))
        grad_log_prior = 0.5 * np.sum(1.0 - second_moment)
        grad_std = std / prior_variance - 1.0 / std
    return kl, mean / prior_variance, grad_std, grad_log_prior


def kl_unary_diagonal_packed(q_mu, q_sqrt, log_sqrt, out_mu, out_log_sqrt):
    """:func:`kl_unary` of one diagonal component, in packed coordinates.

    The KL of ``N(q_mu, diag(q_sqrt^2))`` from ``N(0, I)``,
    ``(|q_mu|^2 + |q_sqrt|^2 - n) / 2 - sum(log q_sqrt)``, with the
    gradient of ``-KL`` with respect to ``q_mu`` (``-q_mu``) and to
    ``log q_sqrt`` (``1 - q_sqrt^2``) written in place: the same figures as
    :func:`kl_unary` chained through :meth:`ParameterLayout.pack_gradient`,
    in a few passes.

    Parameters
    ----------
    q_mu, q_sqrt : ndarray of shape (1, V, M)
    log_sqrt : ndarray of shape (V * M,)
        ``log(q_sqrt)`` as packed.
    out_mu, out_log_sqrt : ndarray of shape (V * M,)
        Where the two gradients are written.

    Returns
    -------
    float
    """
    mu = q_mu.reshape(-1)
    np.negative(mu, out=out_mu)
    np.square(q_sqrt.reshape(-1), out=out_log_sqrt)
    kl = 0.5 * (np.dot(mu, mu) + out_log_sqrt.sum() - mu.size) - log_sqrt.sum()
    np.subtract(1.0, out_log_sqrt, out=out_log_sqrt)
    return float(kl)


def kl_unary(params):
    """KL(q(v) || p(v)) of the whitened inducing variables, with gradients.

    With one component the KL is exact. With ``K > 1`` the entropy of the
    mixture is replaced by the Jensen lower bound of eq. 35, so the value is
    an upper bound on the KL (and the ELBO stays a lower bound); the cross
    entropy (eq. 36, here with ``K_zz = I`` after whitening) is exact.

    Parameters
    ----------
    params : VariationalParameters

    Returns
    -------
    kl : float
    grads : VariationalParameters
        Gradients of ``kl`` with respect to ``q_mu``, ``q_sqrt`` and
        ``weights``; the pairwise fields are zero.
    """
    q_mu, q_sqrt, w = params.q_mu, params.q_sqrt, params.weights
    K, V, M = q_mu.shape
    full = params.full_covariance
    grad_mu = np.zeros_like(q_mu)
    grad_sqrt = np.zeros_like(q_sqrt)
    grad_w = np.zeros_like(w)

    # Negative cross entropy E_q[log p(v)] (eq. 36, whitened).
    trace_s = np.sum(q_sqrt**2, axis=(-2, -1) if full else -1)  # (K, V)
    sq_mu = np.sum(q_mu**2, axis=-1)  # (K, V)
    per_comp_cross = -0.5 * np.sum(M * _LOG_2PI + sq_mu + trace_s, axis=1)  # (K,)
    cross = np.dot(w, per_comp_cross)
    grad_w -= per_comp_cross  # d(-cross)/dw
    grad_mu += w[:, None, None] * q_mu
    grad_sqrt += w.reshape((K,) + (1,) * (q_sqrt.ndim - 1)) * q_sqrt

    if K == 1:
        diag = np.diagonal(q_sqrt, axis1=-2, axis2=-1) if full else q_sqrt
        entropy = 0.5 * V * M * (1.0 + _LOG_2PI) + np.sum(np.log(np.abs(diag)))
        inv_diag = 1.0 / diag
        if full:
            idx = np.arange(M)
            grad_sqrt[:, :, idx, idx] -= inv_diag
        else:
            grad_sqrt -= inv_diag
        return -(entropy + cross), VariationalParameters(
            grad_mu, grad_sqrt, grad_w, np.zeros((V, V)), np.zeros((V, V))
        )

    # Jensen bound on the mixture entropy (eq. 35):
    # H >= -sum_k w_k log sum_l w_l N(m_k; m_l, S_k + S_l).
    cov = params.q_cov()
    log_norm = np.zeros((K, K))
    # d log N / d m_k and d log N / d C, per pair, kept for the backward pass.
    d_delta = np.zeros((K, K, V, M))
    d_cov = np.zeros((K, K, V, M, M)) if full else np.zeros((K, K, V, M))
    for k in range(K):
        for other in range(k, K):
            delta = q_mu[k] - q_mu[other]  # (V, M)
            c = cov[k] + cov[other]
            if full:
                total = 0.0
                for j in range(V):
                    chol, _ = jitter_cholesky(c[j], name="mixture covariance")
                    alpha = linalg.cho_solve((chol, True), delta[j])
                    c_inv = linalg.cho_solve((chol, True), np.eye(M))
                    total += -0.5 * (
                        M * _LOG_2PI
                        + 2.0 * np.sum(np.log(np.diag(chol)))
                        + delta[j] @ alpha
                    )
                    d_delta[k, other, j] = -alpha
                    d_cov[k, other, j] = 0.5 * (np.outer(alpha, alpha) - c_inv)
            else:
                alpha = delta / c
                total = -0.5 * np.sum(_LOG_2PI + np.log(c) + delta * alpha)
                d_delta[k, other] = -alpha
                d_cov[k, other] = 0.5 * (alpha**2 - 1.0 / c)
            log_norm[k, other] = log_norm[other, k] = total
            d_delta[other, k] = -d_delta[k, other]
            d_cov[other, k] = d_cov[k, other]
    a = np.log(w)[None, :] + log_norm  # a[k, l]
    lse = logsumexp(a, axis=1)  # (K,)
    entropy = -np.dot(w, lse)
    resp = np.exp(a - lse[:, None])  # softmax over l
    # d entropy / d a[k, l] = -w_k resp[k, l]
    d_a = -w[:, None] * resp
    grad_w_ent = -lse + d_a.sum(axis=0) / w
    grad_w -= grad_w_ent
    for k in range(K):
        for other in range(K):
            if k == other:
                # delta is identically zero; C = 2 S_k.
                grad_cov_k = 2.0 * d_a[k, k] * d_cov[k, k]
            else:
                grad_mu[k] -= d_a[k, other] * d_delta[k, other]
                grad_mu[other] += d_a[k, other] * d_delta[k, other]
                grad_cov_k = d_a[k, other] * d_cov[k, other]
                _add_cov_grad(grad_sqrt, other, -grad_cov_k, q_sqrt, full)
            _add_cov_grad(grad_sqrt, k, -grad_cov_k, q_sqrt, full)
    return -(entropy + cross), VariationalParameters(
        grad_mu, grad_sqrt, grad_w, np.zeros((V, V)), np.zeros((V, V))
    )


def _add_cov_grad(grad_sqrt, k, grad_cov, q_sqrt, full):
    """Accumulate d/dq_sqrt[k] from d/dS[k] (S = R R^T, grad_cov symmetric)."""
    if full:
        grad_sqrt[k] += np.tril(2.0 * grad_cov @ q_sqrt[k])
    else:
        grad_sqrt[k] += 2.0 * grad_cov * q_sqrt[k]
