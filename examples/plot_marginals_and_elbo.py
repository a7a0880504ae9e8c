"""
==========================================================
ELBO trace, per-token marginals and a reliability diagram
==========================================================

Fit a GP tagger on the CRF++ chunking data and look at three things a
Bayesian tagger gives you:

1. the evidence lower bound (ELBO) after every L-BFGS iteration, which is
   the objective the fit maximises (it also sets the kernel
   hyperparameters, so no cross-validation is needed);
2. the per-token label probabilities (``predict_marginals``) of one test
   sentence, as a heat map;
3. a reliability (calibration) diagram of those probabilities over all test
   tokens and labels, beside a per-token logistic regression and, when
   ``sklearn-crfsuite`` is installed, a CRF.

The data are the ``chunking`` set shipped with CRF++ (``train.data``,
``test.data`` and ``template``); by default they are read from
``../shared/data/crfpp/chunking`` next to the repository, or pass
``--data DIR``. Run it as a script; the figures are written as PNG files
next to it (or to ``--out DIR``)::

    python examples/plot_marginals_and_elbo.py

Needs the ``plot`` extra (matplotlib). About a minute on one core.
"""

# %%
# Imports and data
# ----------------
import argparse
import sys
import warnings
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline

from skgpstruct import CRFppTemplateVectorizer, GPStructClassifier
from skgpstruct.io import read_conll
from skgpstruct.metrics import token_accuracy

DEFAULT_DATA = (
    Path(__file__).resolve().parents[2] / "shared" / "data" / "crfpp" / "chunking"
)
N_TEST = 200  # test sentences used (of 823), to keep the run short


def load(data_dir):
    data_dir = Path(data_dir)
    if not (data_dir / "train.data").is_file():
        sys.exit(
            f"CRF++ chunking data not found in {data_dir}: pass --data DIR, a "
            "folder with train.data, test.data and template (CRF++'s "
            "example/chunking)"
        )
    train_tokens, train_labels = read_conll(data_dir / "train.data")
    test_tokens, test_labels = read_conll(data_dir / "test.data")
    return (train_tokens, train_labels, test_tokens[:N_TEST],
            test_labels[:N_TEST], data_dir / "template")


# %%
# The GP tagger and two peers
# ---------------------------
# The pipeline turns every sentence into a sparse matrix of CRF++ template
# indicators, then fits the GP (linear kernel: a Bayesian linear-chain CRF
# whose prior variance is learned from the ELBO). The peers see exactly the
# same features.


def fit_models(train_tokens, train_labels, template):
    gp = make_pipeline(
        CRFppTemplateVectorizer(template),
        GPStructClassifier(max_iter=100, random_state=0),
    )
    with warnings.catch_warnings():
        # The fit usually converges before max_iter; if not, 100 iterations
        # are enough for this demonstration.
        warnings.simplefilter("ignore", ConvergenceWarning)
        gp.fit(train_tokens, train_labels)
    vectorizer = gp[0]
    X_train = sp.vstack(vectorizer.transform(train_tokens)).tocsr()
    logreg = LogisticRegression(C=1.0, max_iter=2000)
    logreg.fit(X_train, np.concatenate(train_labels))
    return gp, logreg


def crfsuite_marginals(train_tokens, train_labels, test_tokens, template, classes):
    """Marginals of sklearn-crfsuite on the same features, or None."""
    try:
        import sklearn_crfsuite
    except ImportError:
        return None
    vectorizer = CRFppTemplateVectorizer(template).fit(train_tokens)
    names = vectorizer.get_feature_names_out()

    def dicts(tokens):
        return [
            [{names[j]: 1.0 for j in row.indices} for row in matrix]
            for matrix in vectorizer.transform(tokens)
        ]

    crf = sklearn_crfsuite.CRF(
        algorithm="lbfgs", c2=0.1, max_iterations=200,
        all_possible_transitions=True,
    )
    crf.fit(dicts(train_tokens), train_labels)
    out = []
    for sentence in crf.predict_marginals(dicts(test_tokens)):
        out.append(np.array([[token.get(c, 0.0) for c in classes]
                             for token in sentence]))
    return out


# %%
# The three figures
# -----------------


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[1])
    parser.add_argument("--data", default=DEFAULT_DATA, help="CRF++ chunking folder")
    parser.add_argument("--out", default=Path(__file__).resolve().parent,
                        help="folder for the PNG files (default: next to "
                        "this script)")
    args = parser.parse_args(argv)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from skgpstruct.plotting import (
        ELBOTraceDisplay,
        MarginalsDisplay,
        ReliabilityDisplay,
    )

    train_tokens, train_labels, test_tokens, test_labels, template = load(args.data)
    gp, logreg = fit_models(train_tokens, train_labels, template)
    classes = gp[-1].classes_
    gp_accuracy = token_accuracy(test_labels, gp.predict(test_tokens))
    print(f"GP token accuracy:     {gp_accuracy:.4f}")
    X_test = gp[0].transform(test_tokens)
    lr_pred = [logreg.predict(X) for X in X_test]
    print(f"LogReg token accuracy: {token_accuracy(test_labels, lr_pred):.4f}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    # 1. ELBO trace: steep at first, then flat as L-BFGS converges.
    display = ELBOTraceDisplay.from_estimator(gp)
    display.figure_.tight_layout()
    display.figure_.savefig(out / "plot_marginals_and_elbo_1_elbo.png", dpi=110)

    # 2. Marginals of one test sentence: each column sums to one; pale
    #    cells where the tagger hesitates, e.g. between B-NP and I-NP.
    lengths = np.array([len(s) for s in test_tokens])
    shown = int(np.flatnonzero((lengths >= 12) & (lengths <= 18))[0])
    words = [row[0] for row in test_tokens[shown]]
    display = MarginalsDisplay.from_estimator(
        gp, test_tokens[shown], tokens=words, y_true=test_labels[shown],
    )
    display.ax_.set_title(f"p(label | sentence), test sentence {shown}")
    display.figure_.tight_layout()
    display.figure_.savefig(out / "plot_marginals_and_elbo_2_marginals.png",
                            dpi=110)

    # 3. Reliability diagram over every (token, label) pair of the test set.
    #    A test token whose label the training file never shows (chunking's
    #    test sentences hold a few B-CONJP / I-CONJP) has probability 0
    #    under every model: the diagram counts it as an outcome of 0 in every
    #    column, and says so once.
    unseen = sorted({label for seq in test_labels for label in seq} - set(classes))
    if unseen:
        print(f"test labels never seen in training (probability 0): {unseen}")
    gp_marginals = gp[-1].predict_marginals(X_test)
    lr_columns = [list(logreg.classes_).index(c) for c in classes]
    lr_marginals = [logreg.predict_proba(X)[:, lr_columns] for X in X_test]
    fig, ax = plt.subplots(figsize=(6, 6))
    with warnings.catch_warnings():
        # (the unseen labels, reported above, are warned of by each display)
        warnings.filterwarnings("ignore", "y_true has .* labels not in classes")
        gp_display = ReliabilityDisplay.from_predictions(
            test_labels, gp_marginals, classes, ax=ax, name="GPStructClassifier")
        ReliabilityDisplay.from_predictions(
            test_labels, lr_marginals, classes, ax=ax,
            name="per-token LogisticRegression")
        crf_marginals = crfsuite_marginals(
            train_tokens, train_labels, test_tokens, template, classes)
        if crf_marginals is not None:
            ReliabilityDisplay.from_predictions(
                test_labels, crf_marginals, classes, ax=ax,
                name="sklearn-crfsuite CRF (c2=0.1)")
    print(f"GP expected calibration error: {gp_display.ece:.4f}")
    fig.tight_layout()
    fig.savefig(out / "plot_marginals_and_elbo_3_reliability.png", dpi=110)
    print(f"figures written to {out}")


if __name__ == "__main__":
    main()
