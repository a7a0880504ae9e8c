"""
=====================================================
A CRF++ template pipeline tuned with GridSearchCV
=====================================================

The classic CRF++ workflow (a column file, a feature template, a tagger) as
a scikit-learn pipeline: :class:`~skgpstruct.CRFppTemplateVectorizer`
expands the template into sparse binary features, and
:class:`~skgpstruct.GPStructClassifier` tags.

A CRF needs its L2 strength chosen by cross-validation; the GP learns the
equivalent (the prior variance of the weights) from the evidence lower
bound during ``fit``. What is left to tune are choices the ELBO cannot
make, such as which template to use and how rare a feature may be. This
example searches over those with :class:`~sklearn.model_selection.GridSearchCV`
and the CoNLL chunk F1 scorer.

``X`` is a list of sentences, so the folds must split whole sentences: an
integer ``cv`` does that (the estimator is not tagged as a classifier, so
scikit-learn uses ``KFold``, not stratified folds); here a shuffled
:class:`~sklearn.model_selection.KFold` is passed explicitly.

The data are CRF++'s ``chunking`` example, read from
``../shared/data/crfpp/chunking`` next to the repository or from
``--data DIR``. A small subset keeps the run under a minute or so::

    python examples/plot_crfpp_gridsearch.py

The bar chart of the cross-validated scores is written next to the script
(or to ``--out DIR``) when matplotlib is installed.
"""

# %%
# Imports and data
# ----------------
import argparse
import sys
import warnings
from pathlib import Path

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import GridSearchCV, KFold
from sklearn.pipeline import Pipeline

from skgpstruct import CRFppTemplateVectorizer, GPStructClassifier
from skgpstruct.io import read_conll
from skgpstruct.metrics import chunk_f1_scorer, classification_report

DEFAULT_DATA = (
    Path(__file__).resolve().parents[2] / "shared" / "data" / "crfpp" / "chunking"
)
N_TRAIN = 45  # training sentences (of 77), to keep the search short
N_TEST = 200  # test sentences (of 823)

# %%
# Two templates to choose between
# -------------------------------
# The full chunking template of CRF++ uses words (column 0) and POS tags
# (column 1) in a window of five tokens; the smaller one uses POS tags only.
# A template is just a string (or the path of a file).

POS_ONLY = """\
U10:%x[-2,1]
U11:%x[-1,1]
U12:%x[0,1]
U13:%x[1,1]
U14:%x[2,1]
U15:%x[-1,1]/%x[0,1]
U16:%x[0,1]/%x[1,1]
B
"""


def main(argv=None):
    parser = argparse.ArgumentParser(description="CRF++ template grid search")
    parser.add_argument("--data", default=DEFAULT_DATA, help="CRF++ chunking folder")
    parser.add_argument("--out", default=Path(__file__).resolve().parent,
                        help="folder for the PNG file (default: next to this "
                        "script)")
    args = parser.parse_args(argv)
    data = Path(args.data)
    if not (data / "train.data").is_file():
        sys.exit(f"CRF++ chunking data not found in {data}: pass --data DIR")

    tokens, labels = read_conll(data / "train.data")
    test_tokens, test_labels = read_conll(data / "test.data")
    tokens, labels = tokens[:N_TRAIN], labels[:N_TRAIN]
    test_tokens, test_labels = test_tokens[:N_TEST], test_labels[:N_TEST]
    full_template = (data / "template").read_text()

    # %%
    # The pipeline and the grid
    # -------------------------
    # ``max_iter`` is kept small so that the twelve fits of the search run
    # quickly; the vectorizer is refitted on the training part of every
    # fold, so no test-fold feature leaks into training.
    pipeline = Pipeline([
        ("features", CRFppTemplateVectorizer(full_template)),
        ("tagger", GPStructClassifier(max_iter=40, random_state=0)),
    ])
    grid = {
        "features__template": [full_template, POS_ONLY],
        "features__min_count": [1, 2],
    }
    search = GridSearchCV(
        pipeline, grid, scoring=chunk_f1_scorer,
        cv=KFold(n_splits=3, shuffle=True, random_state=0),
    )
    with warnings.catch_warnings():
        # 40 iterations do not reach the convergence rule; that is fine for
        # comparing candidates.
        warnings.simplefilter("ignore", ConvergenceWarning)
        search.fit(tokens, labels)

    names = {full_template: "words + POS", POS_ONLY: "POS only"}
    results = search.cv_results_
    print("cross-validated chunk F1 (mean +- std over 3 folds):")
    candidates = []
    for params, mean, std in zip(results["params"], results["mean_test_score"],
                                 results["std_test_score"], strict=True):
        name = (f"{names[params['features__template']]}, "
                f"min_count={params['features__min_count']}")
        candidates.append((name, mean, std))
        print(f"  {name:28s} {mean:.4f} +- {std:.4f}")
    best = search.best_params_
    print(f"best: {names[best['features__template']]}, "
          f"min_count={best['features__min_count']}")
    tagger = search.best_estimator_[-1]
    print(f"learned kernel of the refitted model: {tagger.kernel_}")

    # %%
    # Held-out evaluation of the refitted best pipeline
    # -------------------------------------------------
    print(classification_report(test_labels, search.predict(test_tokens)))

    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed: no figure (pip install "
              "'skgpstruct[plot]')")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.2))
    y = np.arange(len(candidates))
    ax.barh(y, [c[1] for c in candidates], xerr=[c[2] for c in candidates],
            color="tab:blue", alpha=0.8, capsize=4)
    ax.set_yticks(y, [c[0] for c in candidates])
    ax.invert_yaxis()
    ax.set_xlabel("chunk F1, 3-fold cross-validation")
    ax.set_xlim(0, 1)
    ax.set_title("GridSearchCV over CRF++ templates")
    fig.tight_layout()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "plot_crfpp_gridsearch.png", dpi=110)
    print(f"figure written to {out / 'plot_crfpp_gridsearch.png'}")


if __name__ == "__main__":
    main()
