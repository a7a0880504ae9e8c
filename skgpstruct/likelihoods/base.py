"""The likelihood interface seen by the inference engine ("gray box").

A likelihood receives Monte Carlo samples of the potentials of a ragged
batch of sequences and returns ``log p(y | f)`` per sample and sequence, and,
when it can, the gradient with respect to the potentials. The engine never
asks which likelihood it runs: it only reads :attr:`Likelihood.has_gradient`
to decide whether the pathwise estimator is available.
"""

from abc import ABC, abstractmethod

import numpy as np

from .. import chain

__all__ = ["Likelihood"]


def _checked_inputs(unary, pairwise, offsets, labels):
    """The arguments of :meth:`Likelihood.log_prob` as validated arrays: the
    checks of :func:`skgpstruct.chain.log_likelihood` (shapes, real and
    finite potentials, offsets partitioning the tokens, labels in range)."""
    unary, pairwise, offsets = chain._check_chain(
        unary, pairwise, offsets, with_samples=True
    )
    labels = chain._check_labels(labels, unary.shape[1], unary.shape[2])
    return unary, pairwise, offsets, labels


def _checked(likelihood, what, value, shape, sequence=None, where=""):
    """``value`` as a real array of ``shape``, or a MalformedLikelihood (a
    ValueError) that names the likelihood (a subclass's own
    :meth:`Likelihood._log_prob`, or a user's function, may return
    anything). ``likelihood`` is the likelihood or the name to report;
    ``sequence``, when given, the sequence the value is for; ``where`` is
    added to the description of the value (e.g. the method that returned
    it)."""
    who = likelihood if isinstance(likelihood, str) else repr(likelihood)
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as exc:  # e.g. a ragged list
        raise MalformedLikelihood(
            who, f"a {what} that is not an array{where}", str(exc), sequence
        ) from None
    if array.dtype.kind not in "fiu" or array.shape != shape:
        raise MalformedLikelihood(
            who, f"a {what} of dtype {array.dtype} and shape {array.shape}{where}",
            f"expected real numbers of shape {shape}", sequence,
        )
    return array


class LikelihoodOutputError(ValueError):
    """A likelihood returned something the engine cannot use.

    ``sequence`` is the number of the sequence it concerns in the batch the
    likelihood was called on, or None. The engine calls a likelihood on
    batches of sequences (chunks of the training set): ``renumbered``
    gives the same error with the sequence's number in the training set.
    """

    sequence = None

    def renumbered(self, sequence, sample=None):
        """The same error for sequence number ``sequence`` (and, where the
        error names one, sample ``sample``, e.g. ``"3 of component 1"``)."""
        raise NotImplementedError


class MalformedLikelihood(LikelihoodOutputError):
    """A likelihood returned a value that is not an array of real numbers
    of the expected shape; the message names the likelihood, what it
    returned (for which sequence, when it was for one) and what was
    expected."""

    def __init__(self, who, returned, expected, sequence=None):
        self.who, self.returned, self.expected = who, returned, expected
        self.sequence = sequence
        where = "" if sequence is None else f" for sequence {sequence}"
        super().__init__(f"{who} returned {returned}{where}; {expected}")

    def renumbered(self, sequence, sample=None):
        return type(self)(self.who, self.returned, self.expected, sequence)

    def __reduce__(self):
        # Raised in a worker process, it travels back pickled (loky, dask).
        return type(self), (self.who, self.returned, self.expected, self.sequence)


class NonFiniteLikelihood(LikelihoodOutputError):
    """A likelihood returned a value that is not finite; the message names
    the likelihood, the sequence (and token), the sample and the value.
    """

    def __init__(self, who, what, value, sequence, sample, token=None, n_bad=1):
        self.who, self.what, self.value = who, what, value
        self.sequence, self.sample, self.token, self.n_bad = (
            sequence, sample, token, n_bad
        )
        super().__init__(self._message())

    def _message(self):
        if self.what == "log-likelihood":
            return (
                f"{self.who} returned {self.value} for sequence {self.sequence} "
                f"(sample {self.sample}); log-likelihoods must be finite (NaN or "
                "+inf is a bug in the likelihood; -inf makes the ELBO -inf: "
                "give every labelling a positive probability)"
            )
        where = f"sequence {self.sequence}"
        if self.token is not None:
            where += f", token {self.token}"
        return (
            f"{self.who} returned a {self.what} with {self.value} at {where} "
            f"(sample {self.sample}; {self.n_bad} entries not finite); "
            "gradients must be finite"
        )

    def renumbered(self, sequence, sample=None):
        return type(self)(
            self.who, self.what, self.value, sequence,
            self.sample if sample is None else sample, self.token, self.n_bad,
        )

    def __reduce__(self):
        # Raised in a worker process, it travels back pickled (loky, dask).
        return type(self), (
            self.who, self.what, self.value, self.sequence, self.sample,
            self.token, self.n_bad,
        )


def _finite_log_prob(who, log_p, sequence=None):
    """``log_p`` of shape (S, n_sequences), or (S,) for sequence number
    ``sequence``, if every value is finite; otherwise a NonFiniteLikelihood
    (a ValueError) naming ``who`` (the likelihood, or its name), the
    sequence and the sample."""
    # A finite sum (one pass, no temporary) means finite values; only a
    # sum that is not finite (or overflowed) needs the search.
    bad = () if np.isfinite(np.sum(log_p)) else np.argwhere(~np.isfinite(log_p))
    if len(bad):
        index = tuple(int(i) for i in bad[0])
        sample, sequence = index if sequence is None else (index[0], sequence)
        raise NonFiniteLikelihood(
            who, "log-likelihood", log_p[index], sequence, sample
        )
    return log_p


def _checked_log_prob(likelihood, value, shape):
    """:func:`_checked` for the log-likelihood, which must be finite."""
    return _finite_log_prob(
        repr(likelihood), _checked(likelihood, "log-likelihood", value, shape)
    )


def _checked_gradient(likelihood, what, value, shape, offsets=None):
    """:func:`_checked` for a gradient, which must be finite: the unary one
    (S, n_tokens, V), whose token is located in its sequence by
    ``offsets``, or the pairwise one (S, n_sequences, V, V), without."""
    gradient = _checked(likelihood, what, value, shape)
    # As in _finite_log_prob: the search only when the sum is not finite.
    bad = () if np.isfinite(np.sum(gradient)) else np.argwhere(~np.isfinite(gradient))
    if len(bad):
        sample, position = (int(i) for i in bad[0][:2])
        index = tuple(bad[0])
        if offsets is None:
            sequence, token = position, None
        else:
            sequence = int(np.searchsorted(offsets, position, side="right")) - 1
            token = position - int(offsets[sequence])
        raise NonFiniteLikelihood(
            repr(likelihood), what, gradient[index], sequence, sample, token,
            n_bad=bad.shape[0],
        )
    return gradient


class Likelihood(ABC):
    """Base class of sequence likelihoods ``p(y | f_unary, f_pairwise)``.

    Subclasses implement :meth:`_log_prob` and, if they can, set
    ``has_gradient = True`` and implement :meth:`_log_prob_and_gradient`.

    All methods take a ragged batch: the sequences are concatenated along
    the token axis and ``offsets`` (int64 of shape (n_sequences + 1,))
    delimits them, as in :mod:`skgpstruct.chain`. ``unary`` has shape
    ``(n_samples, n_tokens, n_classes)``, ``pairwise`` shape
    ``(n_samples, n_classes, n_classes)``, ``labels`` shape ``(n_tokens,)``;
    :meth:`log_prob` returns shape ``(n_samples, n_sequences)``.

    Attributes
    ----------
    has_gradient : bool, default=False
        Whether :meth:`log_prob_and_gradient` is available, hence whether
        the estimator may use ``gradient="pathwise"``.

    Examples
    --------
    Independent tokens (a softmax per token, transitions ignored), for a
    whole ragged batch at once:

    >>> import numpy as np
    >>> from scipy.special import log_softmax
    >>> from skgpstruct.likelihoods import Likelihood
    >>> class IndependentTokens(Likelihood):
    ...     def _log_prob(self, unary, pairwise, offsets, labels):
    ...         per_token = log_softmax(unary, axis=2)[:, np.arange(len(labels)),
    ...                                                labels]
    ...         sequence = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    ...         out = np.zeros((unary.shape[0], len(offsets) - 1))
    ...         for n in range(len(offsets) - 1):
    ...             out[:, n] = per_token[:, sequence == n].sum(axis=1)
    ...         return out
    >>> lik = IndependentTokens()
    >>> log_p = lik.log_prob(np.zeros((2, 3, 4)), np.zeros((2, 4, 4)),
    ...                      np.array([0, 2, 3]), np.array([0, 1, 3]))
    >>> bool(np.allclose(log_p, [[2 * np.log(0.25), np.log(0.25)]] * 2))
    True
    >>> lik.has_gradient  # so GPStructClassifier needs gradient="score"
    False
    """

    #: Whether :meth:`log_prob_and_gradient` is available.
    has_gradient = False

    def log_prob(self, unary, pairwise, offsets, labels):
        """Log-likelihood of every sequence under every sample.

        Parameters
        ----------
        unary : ndarray of shape (n_samples, n_tokens, n_classes)
            Samples of the unary potentials.
        pairwise : ndarray of shape (n_samples, n_classes, n_classes)
            Samples of the pairwise (transition) potentials.
        offsets : ndarray of int64 of shape (n_sequences + 1,)
            Sequence boundaries.
        labels : ndarray of int64 of shape (n_tokens,)
            Label indices in ``[0, n_classes)``.

        Returns
        -------
        log_prob : ndarray of shape (n_samples, n_sequences)

        Raises
        ------
        ValueError
            If an argument has the wrong shape or dtype, holds non-finite
            potentials, ``offsets`` does not partition the tokens or a
            label lies outside ``[0, n_classes)`` (the checks of
            :func:`skgpstruct.chain.log_likelihood`); or if
            :meth:`_log_prob` returns something else than real numbers of
            that shape, or a value that is not finite (NaN and ``+inf`` are
            bugs; ``-inf``, a labelling of probability zero, would make the
            ELBO ``-inf``).
        """
        unary, pairwise, offsets, labels = _checked_inputs(
            unary, pairwise, offsets, labels
        )
        return _checked_log_prob(
            self, self._log_prob(unary, pairwise, offsets, labels),
            (unary.shape[0], len(offsets) - 1),
        )

    def log_prob_and_gradient(self, unary, pairwise, offsets, labels):
        """Log-likelihood and its gradient with respect to the potentials.

        Parameters (and their checks) are those of :meth:`log_prob`.

        Returns
        -------
        log_prob : ndarray of shape (n_samples, n_sequences)
        grad_unary : ndarray of shape (n_samples, n_tokens, n_classes)
        grad_pairwise : ndarray of shape (n_samples, n_sequences, n_classes, n_classes)
            Gradient of each sequence's log-likelihood with respect to the
            shared pairwise potentials.

        Raises
        ------
        NotImplementedError
            If the likelihood provides no gradient (``has_gradient`` is
            False).
        ValueError
            As :meth:`log_prob`; also if :meth:`_log_prob_and_gradient`
            does not return three arrays of these shapes, or a gradient
            holds a value that is not finite.
        """
        if not self.has_gradient:
            raise NotImplementedError(
                f"{type(self).__name__} provides no gradient; use the score "
                "estimator (gradient='score')"
            )
        unary, pairwise, offsets, labels = _checked_inputs(
            unary, pairwise, offsets, labels
        )
        out = self._log_prob_and_gradient(unary, pairwise, offsets, labels)
        if not isinstance(out, tuple | list) or len(out) != 3:
            returned = (
                f"{len(out)} values" if isinstance(out, tuple | list)
                else f"an object of type {type(out).__name__}"
            )
            raise MalformedLikelihood(
                f"{self!r}._log_prob_and_gradient", returned,
                "expected three: (log_prob, grad_unary, grad_pairwise)",
            )
        S, n_seq, V = unary.shape[0], len(offsets) - 1, unary.shape[2]
        return (
            _checked_log_prob(self, out[0], (S, n_seq)),
            _checked_gradient(self, "unary gradient", out[1], unary.shape, offsets),
            _checked_gradient(self, "pairwise gradient", out[2], (S, n_seq, V, V)),
        )

    def decoding_pairwise(self, pairwise):
        """Transition potentials of the linear chain that predictions use.

        ``predict`` and ``predict_marginals`` decode with the linear chain
        (Viterbi, forward-backward) on the unary potentials and these
        transitions. The exact chain decodes with the fitted ones; a
        likelihood that fits the transitions to something else (a
        pseudo-likelihood) says here how they enter the chain.

        Parameters
        ----------
        pairwise : ndarray of shape (..., n_classes, n_classes)
            Fitted pairwise potentials (any leading axes, such as samples).

        Returns
        -------
        ndarray of the same shape
            ``pairwise`` itself unless overridden.
        """
        return pairwise

    @abstractmethod
    def _log_prob(self, unary, pairwise, offsets, labels):
        """Compute :meth:`log_prob` (override in subclasses).

        The arguments arrive checked: ``unary`` and ``pairwise`` finite
        C-contiguous float64 arrays of the documented shapes, ``offsets``
        and ``labels`` int64, partitioning the tokens and in range.
        """

    def _log_prob_and_gradient(self, unary, pairwise, offsets, labels):
        """Compute :meth:`log_prob_and_gradient` (override when available;
        the arguments arrive checked, as for :meth:`_log_prob`)."""
        raise NotImplementedError(
            f"{type(self).__name__} sets has_gradient = True but does not "
            "implement _log_prob_and_gradient; implement it, or set "
            "has_gradient = False and fit with gradient='score'"
        )

    def __repr__(self):
        return f"{type(self).__name__}()"
