"""Choice of inducing inputs among the training tokens."""

import numpy as np
import scipy.sparse as sp

__all__ = ["distinct_rows", "select_inducing_points"]


def distinct_rows(X):
    """Indices of the first occurrence of every distinct row of X.

    Parameters
    ----------
    X : ndarray or CSR matrix of shape (n_tokens, n_features)

    Returns
    -------
    indices : ndarray of int64, sorted
    """
    if sp.issparse(X):
        seen = {}
        indptr, indices, data = X.indptr, X.indices, X.data
        for row in range(X.shape[0]):
            lo, hi = indptr[row], indptr[row + 1]
            order = np.argsort(indices[lo:hi], kind="stable")
            key = (indices[lo:hi][order].tobytes(), data[lo:hi][order].tobytes())
            seen.setdefault(key, row)
        return np.sort(np.fromiter(seen.values(), dtype=np.int64))
    _, first = np.unique(X, axis=0, return_index=True)
    return np.sort(first.astype(np.int64))


def select_inducing_points(X, kernel, n_inducing, method, rng):
    """Pick ``n_inducing`` distinct training tokens as inducing inputs.

    Parameters
    ----------
    X : ndarray or CSR matrix of shape (n_tokens, n_features)
    kernel : Kernel
    n_inducing : int
        Capped at the number of distinct rows.
    method : {"kmeans++", "random"}
        ``"kmeans++"`` draws each new point with probability proportional to
        its squared kernel distance to the nearest point already chosen (the
        k-means++ seeding rule in the kernel's feature space), which spreads
        the points over the data; ``"random"`` draws uniformly.
    rng : numpy.random.Generator

    Returns
    -------
    indices : ndarray of int64 of shape (n_chosen,)
        Row indices into X, sorted.
    """
    candidates = distinct_rows(X)
    m = min(int(n_inducing), candidates.shape[0])
    if m == candidates.shape[0]:
        return candidates
    if method == "random":
        return np.sort(rng.choice(candidates, size=m, replace=False))
    Xc = X[candidates]
    self_sim = kernel.diag(Xc)
    chosen = [int(rng.integers(candidates.shape[0]))]
    dist2 = np.full(candidates.shape[0], np.inf)
    for _ in range(m - 1):
        last = Xc[chosen[-1] : chosen[-1] + 1]
        k_last = kernel(Xc, last)[:, 0]
        d2 = np.maximum(self_sim + self_sim[chosen[-1]] - 2.0 * k_last, 0.0)
        np.minimum(dist2, d2, out=dist2)
        dist2[chosen] = 0.0
        total = dist2.sum()
        if total <= 0:
            remaining = np.setdiff1d(np.arange(candidates.shape[0]), chosen)
            chosen.extend(rng.choice(remaining, size=m - len(chosen), replace=False))
            break
        chosen.append(int(rng.choice(candidates.shape[0], p=dist2 / total)))
    return np.sort(candidates[np.asarray(chosen, dtype=np.int64)])
