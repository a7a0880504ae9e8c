"""
=================================================
sklearn-crfsuite style token features
=================================================

Users of sklearn-crfsuite describe every token by a dict of features
(``{"word.lower()": "the", "postag": "DT", "BOS": True, ...}``) and a
sentence by a list of such dicts. The same input works here:
:class:`~skgpstruct.SequenceDictVectorizer` turns the dicts into one sparse
matrix per sentence (strings become one-hot ``name=value`` columns, numbers
and booleans are kept), and :class:`~skgpstruct.GPStructClassifier` tags.
The vectorizer also groups the columns by the key they come from
(``feature_groups_``), and the estimator learns one prior variance per key.

The ``word2features`` function below is the one of the sklearn-crfsuite
tutorial, adapted to the two columns (word, POS tag) of CRF++'s chunking
data. When sklearn-crfsuite is installed, a CRF is fitted on the same dicts
for comparison.

The data are read from ``../shared/data/crfpp/chunking`` next to the
repository, or from ``--data DIR``::

    python examples/plot_token_dicts.py

A bar chart of the per-type chunk F1 is written next to the script (or to
``--out DIR``) when matplotlib is installed.
"""

# %%
# Imports and data
# ----------------
import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.pipeline import make_pipeline

from skgpstruct import GPStructClassifier, SequenceDictVectorizer
from skgpstruct.io import read_conll
from skgpstruct.metrics import chunk_precision_recall_fscore_support, token_accuracy

DEFAULT_DATA = (
    Path(__file__).resolve().parents[2] / "shared" / "data" / "crfpp" / "chunking"
)
N_TEST = 300  # test sentences (of 823)

# %%
# Token features as dicts
# -----------------------


def word2features(sentence, t):
    """Feature dict of token ``t``; ``sentence[t]`` is ``[word, postag]``."""
    word, postag = sentence[t]
    features = {
        "bias": 1.0,
        "word.lower()": word.lower(),
        "word[-3:]": word[-3:],
        "word[-2:]": word[-2:],
        "word.isupper()": word.isupper(),
        "word.istitle()": word.istitle(),
        "word.isdigit()": word.isdigit(),
        "postag": postag,
        "postag[:2]": postag[:2],
    }
    if t > 0:
        word1, postag1 = sentence[t - 1]
        features.update({
            "-1:word.lower()": word1.lower(),
            "-1:word.istitle()": word1.istitle(),
            "-1:postag": postag1,
            "-1:postag[:2]": postag1[:2],
        })
    else:
        features["BOS"] = True
    if t < len(sentence) - 1:
        word1, postag1 = sentence[t + 1]
        features.update({
            "+1:word.lower()": word1.lower(),
            "+1:word.istitle()": word1.istitle(),
            "+1:postag": postag1,
            "+1:postag[:2]": postag1[:2],
        })
    else:
        features["EOS"] = True
    return features


def sent2features(sentence):
    return [word2features(sentence, t) for t in range(len(sentence))]


def main(argv=None):
    parser = argparse.ArgumentParser(description="token-dict features")
    parser.add_argument("--data", default=DEFAULT_DATA, help="CRF++ chunking folder")
    parser.add_argument("--out", default=Path(__file__).resolve().parent,
                        help="folder for the PNG file (default: next to this "
                        "script)")
    args = parser.parse_args(argv)
    data = Path(args.data)
    if not (data / "train.data").is_file():
        sys.exit(f"CRF++ chunking data not found in {data}: pass --data DIR")
    train_tokens, y_train = read_conll(data / "train.data")
    test_tokens, y_test = read_conll(data / "test.data")
    test_tokens, y_test = test_tokens[:N_TEST], y_test[:N_TEST]
    X_train = [sent2features(s) for s in train_tokens]
    X_test = [sent2features(s) for s in test_tokens]
    print(X_train[0][1])

    # %%
    # The GP tagger
    # -------------
    tagger = make_pipeline(
        SequenceDictVectorizer(),
        GPStructClassifier(max_iter=100, random_state=0),
    )
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        tagger.fit(X_train, y_train)
    gp_time = time.perf_counter() - start
    y_gp = tagger.predict(X_test)
    scores = {"GPStructClassifier": chunk_precision_recall_fscore_support(
        y_test, y_gp, average=None)}
    print(f"GP:  token accuracy {token_accuracy(y_test, y_gp):.4f}, "
          f"fit {gp_time:.1f} s")

    # %%
    # The same dicts in sklearn-crfsuite, if installed
    # ------------------------------------------------
    try:
        import sklearn_crfsuite
    except ImportError:
        print("sklearn-crfsuite is not installed: no CRF column")
    else:
        crf = sklearn_crfsuite.CRF(algorithm="lbfgs", c1=0.1, c2=0.1,
                                   max_iterations=100,
                                   all_possible_transitions=True)
        start = time.perf_counter()
        crf.fit(X_train, y_train)
        crf_time = time.perf_counter() - start
        y_crf = crf.predict(X_test)
        scores["sklearn-crfsuite (c1=c2=0.1)"] = (
            chunk_precision_recall_fscore_support(y_test, y_crf, average=None))
        print(f"CRF: token accuracy {token_accuracy(y_test, y_crf):.4f}, "
              f"fit {crf_time:.1f} s")

    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed: no figure (pip install "
              "'skgpstruct[plot]')")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # %%
    # Per-type chunk F1
    # -----------------
    # Frequent chunk types (NP, VP, PP) are learned well from 77 training
    # sentences; rare ones are where the taggers differ.
    types = sorted(set().union(*(s[4] for s in scores.values())))
    support = dict(zip(*(next(iter(scores.values()))[i] for i in (4, 3)),
                       strict=True))
    types = [t for t in types if support.get(t, 0) >= 5]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    width = 0.8 / len(scores)
    for k, (name, (_, _, f1, _, names)) in enumerate(scores.items()):
        by_type = dict(zip(names, f1, strict=True))
        ax.bar(np.arange(len(types)) + k * width, [by_type.get(t, 0.0) for t in types],
               width=width, label=name)
    ax.set_xticks(np.arange(len(types)) + 0.4 - width / 2,
                  [f"{t}\n({support[t]})" for t in types])
    ax.set_ylabel("chunk F1 on the test sentences")
    ax.set_xlabel("chunk type (number of true chunks)")
    ax.set_ylim(0, 1.15)
    ax.legend(fontsize=8, loc="upper left", ncol=2)
    fig.tight_layout()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "plot_token_dicts.png", dpi=110)
    print(f"figure written to {out / 'plot_token_dicts.png'}")


if __name__ == "__main__":
    main()
