"""skgpstruct: Bayesian sequence labelling with Gaussian-process priors.

The public estimator is :class:`GPStructClassifier`; the compiled chain
kernels are in :mod:`skgpstruct.chain`; file readers, template features and
sequence metrics are in :mod:`skgpstruct.io`, :mod:`skgpstruct.features` and
:mod:`skgpstruct.metrics`; kernels in :mod:`skgpstruct.kernels`;
likelihoods in :mod:`skgpstruct.likelihoods`.
"""

__version__ = "0.1.0.dev0"

from ._estimator import GPStructClassifier  # noqa: E402
from .features import CRFppTemplateVectorizer, SequenceDictVectorizer  # noqa: E402

__all__ = [
    "__version__",
    "GPStructClassifier",
    "CRFppTemplateVectorizer",
    "SequenceDictVectorizer",
]
