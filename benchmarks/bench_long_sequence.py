"""predict_marginals on one long sequence: peak memory and time, beside crfsuite.

``predict_marginals`` averages forward-backward over ``n_predict_samples``
(S, 16 by default) posterior samples of the potentials. Drawn at once for
one sequence of T tokens and V labels they take S x T x V doubles, and
forward-backward keeps a few more arrays of that size: at 100,000 tokens
and 200 labels, gigabytes. A sequence whose samples exceed
``PREDICT_SAMPLE_BYTES`` (64 MiB) is therefore sampled and decoded a block
of samples at a time. This script measures, for one sequence of each
length and label count:

- the GP with the library's blocks ("GP, blocks");
- the GP with every sample at once (``PREDICT_SAMPLE_BYTES`` raised: the
  behaviour before blocks), only where its samples fit ``--max-gib``;
- crfsuite's marginals of the same features (``_common.crf_marginals``,
  as for every benchmark: one forward-backward, the marginals read from
  its tagger into an array; its item sequence built beforehand, as the
  GP's features are).

Every measurement runs in a fresh process (``multiprocessing`` spawn): a GP
(linear kernel on sparse binary features, ``max_iter=10``: the fit's
quality is not the point) and a CRF (``c2=0.1``) are fitted on 200
synthetic sequences of ``make_sequences`` with V labels, then one sequence
of T tokens of the same distribution is predicted. Printed: seconds of the
call, its peak RSS increment (the kernel's high-water mark of the
resident set, reset before the call, minus the resident size then:
``_common.PeakMemory``; the input features and the fitted models are
already resident), the memory the samples would take at once, and the
ratios to the CRF's.

Run from the repository root (sklearn-crfsuite from the ``bench`` extra)::

    OPENBLAS_NUM_THREADS=1 python benchmarks/bench_long_sequence.py \\
        [--tokens 20000 100000] [--labels 50 200] [--max-gib 4] [--out FILE]
"""

import argparse
import math
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np
from _common import (
    CRF_MISSING,
    PeakMemory,
    _fit_crf,
    command_line,
    crf_items,
    crf_marginals,
    crfsuite_available,
    environment,
    markdown_table,
    to_crfsuite,
    write_json,
)

N_TRAIN = 200
N_FEATURES = 10
LENGTH_RANGE = (20, 30)

COLUMNS = [
    "tokens", "labels", "samples at once", "GP, blocks: s / peak MiB",
    "GP, at once: s / peak MiB", "CRF: s / peak MiB",
    "GP blocks / CRF: time, memory",
]


def _data(n_tokens, n_labels):
    """Training sequences and one long sequence (CSR) of the same labels."""
    import scipy.sparse as sp

    from skgpstruct.datasets import make_sequences

    n_long = math.ceil(n_tokens / LENGTH_RANGE[0])
    X, y = make_sequences(
        N_TRAIN + n_long, n_classes=n_labels, n_features=N_FEATURES,
        length_range=LENGTH_RANGE, sparse=True, random_state=0,
    )
    long_x = sp.vstack(X[N_TRAIN:], format="csr")[:n_tokens]
    return X[:N_TRAIN], y[:N_TRAIN], long_x


def measure(config):
    """One measurement (in a fresh process): seconds and peak increment."""
    import warnings

    from sklearn.exceptions import ConvergenceWarning

    import skgpstruct._estimator as estimator_module
    from skgpstruct import GPStructClassifier

    X, y, long_x = _data(config["tokens"], config["labels"])
    if config["model"] == "crf":
        names = np.array([f"f{j}" for j in range(long_x.shape[1])], dtype=object)
        crf = _fit_crf(to_crfsuite(X, names), y, 0.1)
        test = crf_items(to_crfsuite([long_x], names))

        def call():
            return crf_marginals(crf, test)[0][0]
    else:
        gp = GPStructClassifier(max_iter=10, random_state=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            gp.fit(X, y)
        if config["model"] == "gp-at-once":
            estimator_module.PREDICT_SAMPLE_BYTES = float("inf")

        def call():
            return gp.predict_marginals([long_x])[0]

    memory = PeakMemory()
    start = time.perf_counter()
    marginals = call()
    seconds = time.perf_counter() - start
    increment = memory.increment_mib()
    if not np.allclose(marginals.sum(axis=1), 1.0):
        raise RuntimeError("marginals do not sum to one")
    return {"seconds": seconds, "peak_increment_mib": increment,
            "peak_reset": memory.reset}


def run_isolated(config):
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(measure, config).result()


def _cell(result):
    if result is None:
        return "not run"
    return f"{result['seconds']:.2f} / {result['peak_increment_mib']:.0f}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[20000, 100000])
    parser.add_argument("--labels", type=int, nargs="+", default=[50, 200])
    parser.add_argument(
        "--max-gib", type=float, default=4.0,
        help="run 'at once' only where its samples take at most this "
        "(forward-backward needs about four times as much)",
    )
    parser.add_argument("--out", metavar="FILE", help="also write the rows as JSON")
    args = parser.parse_args(argv)
    with_crf = crfsuite_available()
    if not with_crf:
        print(CRF_MISSING, file=sys.stderr)
    from skgpstruct import GPStructClassifier

    n_samples = GPStructClassifier().n_predict_samples  # the default
    rows, records = [], []
    for n_tokens in args.tokens:
        for n_labels in args.labels:
            at_once_gib = 8 * n_samples * n_tokens * n_labels / 2**30
            record = {"tokens": n_tokens, "labels": n_labels,
                      "samples_at_once_gib": at_once_gib}
            base = {"tokens": n_tokens, "labels": n_labels}
            record["gp_blocks"] = run_isolated(base | {"model": "gp-blocks"})
            record["gp_at_once"] = (
                run_isolated(base | {"model": "gp-at-once"})
                if at_once_gib <= args.max_gib else None
            )
            record["crf"] = run_isolated(base | {"model": "crf"}) if with_crf else None
            ratio = "n/a"
            if record["crf"] is not None:
                gp, crf = record["gp_blocks"], record["crf"]
                ratio = (
                    f"{gp['seconds'] / crf['seconds']:.1f}x, "
                    f"{gp['peak_increment_mib'] / crf['peak_increment_mib']:.1f}x"
                )
            rows.append([
                n_tokens, n_labels, f"{at_once_gib:.2f} GiB",
                _cell(record["gp_blocks"]), _cell(record["gp_at_once"]),
                _cell(record["crf"]), ratio,
            ])
            records.append(record)
            print(markdown_table(COLUMNS, rows[-1:]).splitlines()[-1], flush=True)
    print()
    print(markdown_table(COLUMNS, rows))
    if args.out:
        write_json(args.out, {"command": command_line(), "environment": environment(),
                              "rows": records})


if __name__ == "__main__":
    main()
