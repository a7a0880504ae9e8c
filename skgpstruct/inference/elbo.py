"""The evidence lower bound (eq. 17) of the sparse structured GP, with gradient.

:class:`SparseELBO` holds the chunks of training data, the inducing inputs,
the kernel and the likelihood, and evaluates the ELBO and its gradient at a
packed parameter vector (see :class:`~skgpstruct.inference.posterior.ParameterLayout`).
The per-sequence terms run chunk by chunk through a joblib ``Parallel``
object supplied by the caller; partial sums are reduced in chunk order, so
the result is bit-identical for any ``n_jobs`` and any joblib backend.

The training data do not change during a fit, so each worker process keeps
the chunks it has received (:func:`_cached_chunk_terms`): after the first
evaluation only the small per-evaluation state is sent, and a chunk goes
out again (to whichever worker joblib picks) when the worker that ran its
task did not hold it. A single chunk is evaluated in the calling process.
"""

import dataclasses
import threading
import uuid
from dataclasses import dataclass

import numpy as np
from joblib import delayed

from .._block_cache import reuse_blocks
from .._linalg import same_vector, single_blas_thread
from ..optim.saga import SparseGradient
from .posterior import (
    VariationalParameters,
    kl_pairwise,
    kl_unary,
    kl_unary_diagonal_packed,
)
from .terms import ReferencePosterior, SharedState, chunk_terms, expand_local

__all__ = ["SparseELBO", "ELBOEvaluation", "LocalGradient"]

# In every process that runs chunk terms: {fit token: {chunk index: Chunk}},
# holding the chunks of the latest fit only.
_CHUNK_CACHE = {}
_CHUNK_CACHE_LOCK = threading.Lock()

# Memory a loky worker may grow by beyond what it keeps in _CHUNK_CACHE
# before loky takes it for a leak and restarts it (loky's own default).
_LOKY_LEAK_ALLOWANCE = int(3e8)


def _allow_cached_memory(store):
    """Keep loky from restarting this worker for the chunks it holds.

    loky replaces a worker whose memory grew by more than 300 MB since it
    started, taking it for a leak; a worker that keeps a large fit's chunks
    (and their base samples) would then be restarted and sent every chunk
    again. The allowance is raised by what the cache holds, in this
    process's copy of loky's module (only loky's worker loop reads it).
    """
    try:
        from joblib.externals.loky import process_executor
    except ImportError:  # pragma: no cover - joblib always vendors loky
        return
    if not hasattr(process_executor, "_MAX_MEMORY_LEAK_SIZE"):
        return  # pragma: no cover - a loky without the leak check
    # tuple(): a snapshot, as other threads of this process may add chunks.
    held = sum(chunk.nbytes for chunk in tuple(store.values()))
    process_executor._MAX_MEMORY_LEAK_SIZE = _LOKY_LEAK_ALLOWANCE + 2 * held


def _add_at(total, support, part, axis=2):
    """``total += part``, or on the support's indices along ``axis``."""
    if support is None:
        total += part
    else:
        index = [slice(None)] * total.ndim
        index[axis] = support
        total[tuple(index)] += part


def _cached_chunk_terms(token, index, chunk, shared):
    """``chunk_terms`` of chunk ``index`` of fit ``token``, from this process's cache.

    ``chunk`` is the chunk itself (then cached, replacing the chunks of any
    other fit) or None; returns None when this process does not hold it, and
    the caller sends it again.
    """
    with _CHUNK_CACHE_LOCK:  # threads of one process share the cache
        store = _CHUNK_CACHE.get(token)
        if chunk is not None:
            if store is None:
                _CHUNK_CACHE.clear()
                store = _CHUNK_CACHE.setdefault(token, {})
            store[index] = chunk
        elif store is None or index not in store:
            return None
        held = store[index]
    n_cached = len(held.noise_cache)
    with single_blas_thread(), reuse_blocks():
        result = chunk_terms(held, shared)
    if chunk is not None or len(held.noise_cache) != n_cached:
        _allow_cached_memory(store)  # the cache grew
    return result


@dataclass
class LocalGradient:
    """One chunk's ELL gradient kept in the chunk's own token space.

    What :meth:`SparseELBO.evaluate_local` returns and
    :meth:`SparseELBO.expand_local` maps back to the packed vector: the
    gradient with respect to the chunk's sampled unary potentials, the key
    of its Monte Carlo noise, and the small dense parts (mixture weights,
    pairwise posterior, hyperparameters). Its size grows with the chunk's
    tokens, not with the number of inducing variables. ``noise`` may hold
    the Monte Carlo base samples it was computed with (stacked form only),
    so that reading it back needs no new draw; on the CRF++ sets they take
    1.7 to 5 times the memory of ``unary`` (Table 1's fold 0).
    """

    chunk_index: int
    iteration_key: int
    unary: np.ndarray  # (K, S, n_tokens, V), float32
    weights: np.ndarray  # (K,)
    pairwise_mean: np.ndarray  # (V, V)
    pairwise_std: np.ndarray  # (V, V)
    theta: np.ndarray = None  # (n_theta,) or None
    noise: tuple = None  # (eps, xi) of the stacked form, or None

    @property
    def noise_nbytes(self):
        """Bytes of the kept base samples (0 without)."""
        return 0 if self.noise is None else sum(a.nbytes for a in self.noise)

    @property
    def nbytes(self):
        arrays = (self.unary, self.weights, self.pairwise_mean, self.pairwise_std)
        extra = 0 if self.theta is None else self.theta.nbytes
        return sum(a.nbytes for a in arrays) + extra + self.noise_nbytes


class ELBOEvaluation:
    """Value and gradient of the fit's objective, and its parts, at one point.

    ``objective`` (what the fit maximises, with ``gradient``) is ``elbo``
    plus ``log_hyperprior``, the hyperprior's log density (0 without one).
    """

    def __init__(self, elbo, gradient, ell, kl_u, kl_bin, log_hyperprior=0.0):
        self.elbo = elbo
        self.objective = elbo + log_hyperprior
        self.gradient = gradient
        self.ell = ell
        self.kl_unary = kl_u
        self.kl_pairwise = kl_bin
        self.log_hyperprior = log_hyperprior


class SparseELBO:
    """ELBO = E_q[log p(y | f)] - KL(q(u) || p(u)) - KL(q(f_bin) || p(f_bin)).

    Parameters
    ----------
    chunks : list of Chunk
        Training data cut into runs of consecutive sequences.
    inducing : InducingPoints or InducingFeatures
        The inducing variables.
    kernel : Kernel
        Kernel at its initial hyperparameters.
    likelihood : Likelihood
    layout : ParameterLayout
    n_samples : int
        Monte Carlo samples per sequence and mixture component.
    estimator : {"pathwise", "score"}
    pairwise_prior_variance : float
        Prior variance of the pairwise potentials (its initial value when
        the layout learns it).
    pairwise_noise : ndarray of shape (S, V, V)
        Base samples of the pairwise posterior (fixed in batch mode).
    residual_floor : float
        Added to the conditional variance of every token before the square
        root, so that its derivative stays finite.
    hyperprior_scale : float or None, default=None
        Standard deviation of a Gaussian prior on each learned entry of the
        kernel's ``theta`` (the log hyperparameters), centred at
        ``hyperprior_center``; its log density, without the normalising
        constant, is added to the objective (MAP-II). None: no prior.
    hyperprior_center : ndarray of shape (layout.n_theta,) or None
        The prior's centre (the initial ``theta``); the kernel's ``theta``
        when None.
    sample_dtype : {numpy.float32, numpy.float64}, default=numpy.float32
        Precision of the unary samples of the compiled stacked form
        (``skgpstruct._stacked``); the objective and gradients are summed
        in double precision either way. Double precision is for checking
        the gradients by finite differences, which single precision's
        rounding would swamp.
    """

    def __init__(
        self,
        chunks,
        inducing,
        kernel,
        likelihood,
        layout,
        *,
        n_samples,
        estimator,
        pairwise_prior_variance,
        pairwise_noise,
        residual_floor,
        hyperprior_scale=None,
        hyperprior_center=None,
        sample_dtype=np.float32,
    ):
        if estimator == "score" and n_samples < 2:
            raise ValueError(
                "the score estimator needs n_samples >= 2 (each sample's "
                f"baseline is the mean of the others), got {n_samples}"
            )
        self.chunks = chunks
        self.inducing = inducing
        self.kernel = kernel
        self.likelihood = likelihood
        self.layout = layout
        self.n_samples = n_samples
        self.estimator = estimator
        self.pairwise_prior_variance = pairwise_prior_variance
        self.pairwise_noise = pairwise_noise
        self.residual_floor = residual_floor
        self.hyperprior_scale = hyperprior_scale
        self.sample_dtype = np.dtype(sample_dtype).type
        self.hyperprior_center = (
            np.array(kernel.theta if hyperprior_center is None else hyperprior_center)
            if hyperprior_scale is not None and layout.n_theta else None
        )

    def _reference(self, vector):
        if vector is None or self.estimator != "score":
            return None
        params, theta = self.layout.unpack(vector)
        kernel = self.kernel_at(theta)
        return ReferencePosterior(params, kernel, self.inducing.prepare(kernel))

    def kernel_at(self, theta):
        """The kernel with hyperparameters ``theta`` (or the initial one)."""
        return self.kernel if theta is None else self.kernel.clone_with_theta(theta)

    def evaluate(
        self,
        vector,
        parallel,
        *,
        chunks=None,
        iteration_key=0,
        reference=None,
        include_kl=True,
    ):
        """ELBO and its gradient with respect to the packed vector.

        Parameters
        ----------
        vector : ndarray of shape (layout.size,)
        parallel : joblib.Parallel
            An open Parallel object; chunks are dispatched through it.
        chunks : list of Chunk, default=None
            A subset of the chunks, whose expected log-likelihood alone is
            evaluated (the KL terms whole); all chunks when None. (The
            stochastic optimiser evaluates one chunk with
            :meth:`evaluate_local`.)
        iteration_key : int, default=0
            Selects the Monte Carlo base samples; 0 reuses the same samples
            at every call (batch mode).
        reference : ndarray of shape (layout.size,) or None, default=None
            Score estimator only: the packed posterior the samples are drawn
            from (importance-weighted objective); None draws them from the
            posterior at ``vector``.
        include_kl : bool, default=True
            False leaves the KL terms out of the value and the gradient (the
            stochastic optimiser adds their exact gradient itself).

        Returns
        -------
        ELBOEvaluation
        """
        layout = self.layout
        shared = self._shared_state(vector, iteration_key, reference)
        params, kernel, state = shared.params, shared.kernel, shared.inducing_state
        if chunks is None:
            chunks = self.chunks
            results = self._map_chunks(parallel, shared)
        else:
            results = parallel(
                delayed(chunk_terms)(chunk, self._restricted(shared, chunk)[0])
                for chunk in chunks
            )

        # Reduce in chunk order (deterministic whatever the backend).
        ell = 0.0
        grads = VariationalParameters(
            np.zeros_like(params.q_mu),
            np.zeros_like(params.q_sqrt),
            np.zeros_like(params.weights),
            np.zeros_like(params.pairwise_mean),
            np.zeros_like(params.pairwise_std),
        )
        d_state = None
        d_theta = np.zeros(layout.n_theta) if shared.need_kernel_gradient else None
        for chunk, res in zip(chunks, results, strict=True):
            support = self.inducing.support(chunk.layout)
            ell += res["ell"]
            _add_at(grads.q_mu, support, res["q_mu"])
            _add_at(grads.q_sqrt, support, res["q_sqrt"])
            grads.weights += res["weights"]
            grads.pairwise_mean += res["pairwise_mean"]
            grads.pairwise_std += res["pairwise_std"]
            if d_theta is not None:
                d_theta += res["theta"]
                if res["inducing_state"] is not None:
                    if d_state is None:
                        d_state = np.zeros_like(state)
                    _add_at(d_state, support, res["inducing_state"], axis=0)
        if d_state is not None:
            d_theta += self.inducing.finish_gradient(kernel, state, d_state)

        if not include_kl:
            gradient = layout.pack_gradient(params, grads, d_theta, 0.0)
            return ELBOEvaluation(ell, gradient, ell, 0.0, 0.0)
        kl_u, kl_bin, kl_gradient = self.kl_terms(vector)
        gradient = layout.pack_gradient(params, grads, d_theta, 0.0)
        gradient += kl_gradient
        log_prior = self.add_log_hyperprior(vector, gradient)
        return ELBOEvaluation(
            ell - kl_u - kl_bin, gradient, ell, kl_u, kl_bin, log_prior
        )

    def add_log_hyperprior(self, vector, gradient):
        """The hyperprior's log density at ``vector``; its gradient is added
        into ``gradient`` (packed). 0 (and nothing added) without one."""
        if self.hyperprior_center is None:
            return 0.0
        sl = self.layout.slices["theta"]
        z = (vector[sl] - self.hyperprior_center) / self.hyperprior_scale
        gradient[sl] -= z / self.hyperprior_scale
        return -0.5 * float(z @ z)

    def _map_chunks(self, parallel, shared):
        """``chunk_terms`` of every chunk, in chunk order.

        The first call sends every chunk with its task; later calls send only
        the chunk's index, and a chunk that the worker running its task does
        not hold goes out again in a second task, which joblib gives to
        whichever worker is free (not necessarily the one that missed).
        A single chunk is evaluated in this process: there is nothing to
        share out, and two workers taking turns missed it at every call.
        """
        if not hasattr(self, "_token"):
            self._token = uuid.uuid4().hex
        if len(self.chunks) == 1:
            chunk = self.chunks[0]
            restricted = self._restricted(shared, chunk)[0]
            # Cached here as in a worker (kept from the first call on, unless
            # another fit in this process took the cache since).
            answer = _cached_chunk_terms(self._token, 0, None, restricted)
            if answer is None:
                answer = _cached_chunk_terms(self._token, 0, chunk, restricted)
            self._dispatched = True
            return [answer]
        results = [None] * len(self.chunks)
        pending = list(range(len(self.chunks)))
        with_data = not getattr(self, "_dispatched", False)
        while pending:
            answers = parallel(
                delayed(_cached_chunk_terms)(
                    self._token, i, self.chunks[i] if with_data else None,
                    self._restricted(shared, self.chunks[i])[0],
                )
                for i in pending
            )
            for i, answer in zip(pending, answers, strict=True):
                results[i] = answer
            pending = [i for i in pending if results[i] is None]
            with_data = True
        self._dispatched = True
        return results

    def _restricted(self, shared, chunk):
        """The state restricted to the chunk's support, and the support.

        A chunk laid out compactly (inducing features, diagonal covariances)
        only sees the parameters and feature scales of its own features.
        """
        support = self.inducing.support(chunk.layout)
        if support is None:
            return shared, None
        reference = shared.reference
        if reference is not None:
            reference = ReferencePosterior(
                reference.params.restricted(support), reference.kernel,
                self.inducing.restrict_state(reference.inducing_state, support),
            )
        restricted = dataclasses.replace(
            shared,
            params=shared.params.restricted(support),
            inducing_state=self.inducing.restrict_state(
                shared.inducing_state, support
            ),
            reference=reference,
        )
        return restricted, support

    def release(self):
        """Drop the chunks this process cached for the fit (call when done).

        Worker processes drop theirs when they receive the chunks of another
        fit, or when joblib shuts them down.
        """
        token = getattr(self, "_token", None)
        if token is not None:
            with _CHUNK_CACHE_LOCK:  # (another fit's threads may be caching)
                _CHUNK_CACHE.pop(token, None)
        self._dispatched = False

    def _shared_state(self, vector, iteration_key=0, reference=None):
        """What every chunk needs at the packed point ``vector``.

        The unpacked parameters, kernel and inducing state of the last point
        are reused when called again at the same point (the stochastic
        optimiser reads several stored gradients at each step).
        """
        params, kernel, inducing_state = self._unpacked(vector)
        return SharedState(
            inducing=self.inducing,
            inducing_state=inducing_state,
            kernel=kernel,
            params=params,
            pairwise_noise=self.pairwise_noise,
            likelihood=self.likelihood,
            n_samples=self.n_samples,
            estimator=self.estimator,
            need_kernel_gradient=self.layout.n_theta > 0,
            residual_floor=self.residual_floor,
            iteration_key=iteration_key,
            reference=self._reference(reference),
            sample_dtype=self.sample_dtype,
        )

    def _unpacked(self, vector):
        """Parameters, kernel and inducing state at the packed point ``vector``.

        Those of the last point are reused when called again at the same
        point (the stochastic optimiser evaluates a mini-batch, reads a
        stored gradient and the KL terms at each step).
        """
        last = getattr(self, "_last_point", None)
        if last is not None and same_vector(last[0], vector):
            return last[1]
        params, theta = self.layout.unpack(vector)
        kernel = self.kernel_at(theta)
        unpacked = (params, kernel, self.inducing.prepare(kernel))
        if last is not None and last[0].shape == vector.shape:
            kept = last[0]  # its buffer reused: no fresh pages at every point
            kept[...] = vector
        else:
            kept = np.array(vector, dtype=np.float64, copy=True)
        self._last_point = (kept, unpacked)
        return unpacked

    def __getstate__(self):
        state = self.__dict__.copy()
        state.pop("_last_point", None)  # a cache, not shipped to workers
        return state

    def evaluate_local(self, vector, chunk_index, iteration_key, keep_noise=False):
        """ELL of one chunk and its gradient in local form (pathwise only).

        Runs in this process. Returns the packed gradient, and the same
        gradient with its ``q_mu`` and ``q_sqrt`` parts kept in the chunk's
        token space (see :func:`~skgpstruct.inference.terms.chunk_terms`),
        for storage.

        Parameters
        ----------
        vector : ndarray of shape (layout.size,)
        chunk_index : int
        iteration_key : int
            Selects fresh Monte Carlo samples (must be positive).
        keep_noise : bool, default=False
            Keep the Monte Carlo base samples in the record, where the chunk
            has the stacked form (:attr:`LocalGradient.noise`):
            :meth:`expand_local` then reads them instead of drawing them
            again, with the same result.

        Returns
        -------
        ell : float
        local : LocalGradient
        gradient : ndarray of shape (layout.size,) or SparseGradient
            Sparse (on the chunk's own coordinates) when the chunk's layout
            is compact.
        """
        shared = self._shared_state(vector, iteration_key)
        chunk = self.chunks[chunk_index]
        restricted, support = self._restricted(shared, chunk)
        res = chunk_terms(chunk, restricted, local=True)
        theta = None
        if shared.need_kernel_gradient:
            theta = res["theta"]
            if res["inducing_state"] is not None:
                d_state = np.zeros_like(shared.inducing_state)
                _add_at(d_state, support, res["inducing_state"], axis=0)
                theta = theta + self.inducing.finish_gradient(
                    shared.kernel, shared.inducing_state, d_state
                )
        local = LocalGradient(
            chunk_index=chunk_index,
            iteration_key=iteration_key,
            # Single precision halves the store; a stored gradient only serves
            # as SAGA's control variate, far noisier than its rounding.
            unary=res["local"].astype(np.float32),
            weights=res["weights"],
            pairwise_mean=res["pairwise_mean"],
            pairwise_std=res["pairwise_std"],
            theta=theta,
            noise=res.get("noise") if keep_noise else None,
        )
        packed = self._pack_chunk_gradient(
            shared.params, support, res["q_mu"], res["q_sqrt"], local
        )
        return res["ell"], local, packed

    def expand_local(self, vector, gradient):
        """The packed gradient of a :class:`LocalGradient` at ``vector``.

        The token-space gradient is mapped through the projection of the
        current kernel (and the chain rule to the packed coordinates taken at
        the current point); the other parts are used as stored.

        Parameters
        ----------
        vector : ndarray of shape (layout.size,)
        gradient : LocalGradient

        Returns
        -------
        ndarray of shape (layout.size,) or SparseGradient
            As the gradient of :meth:`evaluate_local`.

        Raises
        ------
        ValueError
            If the record's arrays do not have the shapes of the chunk it
            names (a record of other data).
        """
        shared = self._shared_state(vector)
        chunk = self.chunks[gradient.chunk_index]
        restricted, support = self._restricted(shared, chunk)
        grad_mu, grad_sqrt = expand_local(
            chunk, restricted, gradient.unary, gradient.iteration_key,
            noise=gradient.noise,
        )
        return self._pack_chunk_gradient(
            shared.params, support, grad_mu, grad_sqrt, gradient
        )

    def _pack_chunk_gradient(self, params, support, grad_mu, grad_sqrt, local):
        """Packed gradient of one chunk, the other parts taken from ``local``.

        A :class:`~skgpstruct.optim.saga.SparseGradient` on the chunk's own
        coordinates when its layout is compact (its ``q_mu`` and ``q_sqrt``
        gradients are then on its support), else a dense vector.
        """
        grads = VariationalParameters(
            grad_mu, grad_sqrt, local.weights, local.pairwise_mean,
            local.pairwise_std,
        )
        if support is not None:
            # The indices are rebuilt at each call, not kept per chunk: kept,
            # they would hold 2 K V int64 per stacked row of the data.
            values = self.layout.pack_support_gradient(
                params, support, grad_mu, grad_sqrt, grads, local.theta, 0.0
            )
            return SparseGradient(self.layout.support_indices(support), values)
        return self.layout.pack_gradient(params, grads, local.theta, 0.0)

    def kl_terms(self, vector):
        """The two KL terms and the packed gradient of ``-(KL_u + KL_bin)``.

        Returns
        -------
        kl_unary : float
        kl_pairwise : float
        gradient : ndarray of shape (layout.size,)
        """
        layout = self.layout
        params = self._unpacked(vector)[0]
        prior_variance = layout.pairwise_prior_variance(
            vector, self.pairwise_prior_variance
        )
        kl_bin, kl_bin_mean, kl_bin_std, kl_bin_prior = kl_pairwise(
            params.pairwise_mean, params.pairwise_std, prior_variance
        )
        theta_grad = np.zeros(layout.n_theta) if layout.n_theta else None
        if params.weights.size == 1 and not params.full_covariance:
            # One diagonal Gaussian: the KL's gradient in the packed
            # coordinates directly, a few passes over q_mu and q_sqrt.
            gradient = np.empty(layout.size)
            kl_u = kl_unary_diagonal_packed(
                params.q_mu, params.q_sqrt, vector[layout.slices["q_sqrt"]],
                out_mu=gradient[layout.slices["q_mu"]],
                out_log_sqrt=gradient[layout.slices["q_sqrt"]],
            )
            tail = VariationalParameters(
                None, None, np.zeros(1), -kl_bin_mean, -kl_bin_std
            )
            gradient[layout.tail_start :] = layout.pack_tail_gradient(
                params, tail, theta_grad, -kl_bin_prior
            )
            return kl_u, kl_bin, gradient
        kl_u, kl_u_grads = kl_unary(params)
        grads = VariationalParameters(
            -kl_u_grads.q_mu,
            -kl_u_grads.q_sqrt,
            -kl_u_grads.weights,
            -kl_bin_mean,
            -kl_bin_std,
        )
        gradient = layout.pack_gradient(params, grads, theta_grad, -kl_bin_prior)
        return kl_u, kl_bin, gradient
