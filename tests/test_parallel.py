"""The per-sequence terms under other joblib backends give the same model.

Chunks have a fixed token budget and are reduced in chunk order, so a fit is
bit-identical whatever the backend (see DESIGN.md, "Scale").
"""

import warnings

import numpy as np
import pytest
from joblib import parallel_config
from sklearn.exceptions import ConvergenceWarning

import skgpstruct._estimator as estimator_module
from skgpstruct import GPStructClassifier
from skgpstruct.datasets import make_sequences


@pytest.fixture
def small_chunks(monkeypatch):
    # Several chunks even on a small data set, so that work is really spread.
    monkeypatch.setattr(estimator_module, "CHUNK_TOKENS", 40)


def _fit(**params):
    X, y = make_sequences(24, length_range=(3, 9), random_state=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return GPStructClassifier(
            kernel="rbf", n_inducing=15, max_iter=8, random_state=0, **params
        ).fit(X, y)


def test_dask_backend_gives_the_same_model(small_chunks):
    distributed = pytest.importorskip(
        "distributed", reason="dask.distributed is not installed (extra 'dask')"
    )
    local = _fit(n_jobs=1)
    with (
        distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            scheduler_port=0,
            dashboard_address="127.0.0.1:0",
        ) as cluster,
        distributed.Client(cluster),
        parallel_config(backend="dask"),
    ):
        remote = _fit(n_jobs=2)
    np.testing.assert_array_equal(local.q_mu_, remote.q_mu_)
    np.testing.assert_array_equal(local.q_sqrt_, remote.q_sqrt_)
    assert local.elbo_history_ == remote.elbo_history_


def test_threading_backend_gives_the_same_model(small_chunks):
    local = _fit(n_jobs=1)
    with parallel_config(backend="threading"):
        threaded = _fit(n_jobs=2)
    np.testing.assert_array_equal(local.q_mu_, threaded.q_mu_)
