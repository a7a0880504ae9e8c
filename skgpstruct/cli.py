"""The ``skgpstruct`` command line.

``skgpstruct <command> [options]``; ``skgpstruct --help`` lists the
commands and ``skgpstruct <command> --help`` their options. Each command is
one ``_add_<command>`` function that declares its sub-parser and one
``_run_<command>`` function that takes the parsed arguments and returns the
exit code; :func:`main` dispatches.

Commands
--------
train
    ``skgpstruct train --template TEMPLATE [options] TRAIN_FILE MODEL_FILE``
    reads a CoNLL / CRF++ file, expands the CRF++ template into features
    (:class:`~skgpstruct.features.CRFppTemplateVectorizer`), fits a
    :class:`~skgpstruct.GPStructClassifier` and saves both, as one
    :class:`~sklearn.pipeline.Pipeline`, to a model file (as CRF++'s
    ``crf_learn``).
predict
    ``skgpstruct predict MODEL_FILE FILE`` writes ``FILE`` back with a
    predicted label column appended (as ``crf_test``).
evaluate
    ``skgpstruct evaluate MODEL_FILE FILE`` prints the token accuracy and
    the chunk precision, recall and F1 per type and overall, in the layout
    of the CoNLL ``conlleval`` script.
demo
    Fit a :class:`~skgpstruct.GPStructClassifier` to synthetic sequences
    (:func:`skgpstruct.datasets.make_sequences`) and compare it with a
    per-token logistic regression on the same features.

Files
-----
Data files are read with :func:`skgpstruct.io.read_conll`: one token per
line, columns separated by spaces or tabs, the label last, a blank line
between sequences; ``-`` reads standard input. The template and the data
are decoded with ``--encoding`` (``train``; ``predict`` and ``evaluate``
default to the encoding the model was trained with).

A model file is a pickle (:func:`joblib.dump`) of the dict
``{"format": "skgpstruct-model", "skgpstruct_version": ..., "pipeline":
Pipeline, "template": text, "encoding": ..., "n_token_columns": ...}``.
Loading a pickle can run arbitrary code: only load model files you trust.
A model file is refused unless the installed skgpstruct wrote it (same
version).

The gold label column of ``predict`` / ``evaluate`` input is detected by
counting columns: the model stores the number of token columns (without the
label) of its training file; a file with one more column has the gold label
last, a file with as many has none (``evaluate`` needs it). ``predict``
writes the token columns, the gold label (when the input has one), the
predicted label and, with ``--marginals``, one more column: the posterior
marginal probability of the predicted label. Columns are separated as in
the input (a tab if its first token line has one, else a space); sequences
stay separated by blank lines, so the output is read back by
:func:`~skgpstruct.io.read_conll`, and without ``--marginals`` it is the
input ``conlleval`` expects (``conlleval`` splits columns at spaces: give it
``-d '\t'`` for a tab-separated file, or run ``skgpstruct evaluate``).

Progress (reading, features, the ELBO of every fit iteration, writing) goes
to standard error, ``-q`` silences it; results go to standard output.
Errors are printed as ``skgpstruct: error: ...``; the exit status is 0 on
success, 2 for a usage error or bad input (missing or unreadable file, bad
template line, unknown option value, a model file that is not one or comes
from another version, an output file that is one of the inputs), 141 when
the reader of standard output stopped reading (``| head``: 128 + SIGPIPE,
as shell tools give) and 1 for an unexpected error (a bug; a traceback is
printed).
"""

import argparse
import contextlib
import errno
import os
import pickletools
import re
import sys
import tempfile
import time
import traceback
import warnings

import numpy as np

from . import __version__
from ._checks import check_n_jobs
from .chain import KERNEL_BUILD

__all__ = ["main"]

# The synthetic task of ``skgpstruct demo``: noisy enough that a token's own
# features leave many labels ambiguous, so the chain (sticky labels) matters.
_DEMO_NOISE = 2.0
_DEMO_N_CLASSES = 3
_DEMO_N_FEATURES = 8
_DEMO_N_TEST = 100
_DEMO_SHOWN_TOKENS = 8

#: The ``"format"`` entry of a model file's dict.
MODEL_FORMAT = "skgpstruct-model"
_EXIT_UNEXPECTED = 1
_EXIT_BAD_INPUT = 2
_EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE
_PICKLE_WARNING = (
    "Model files are pickles: loading one can run arbitrary code, so only "
    "load model files you trust."
)


class CommandError(Exception):
    """Bad input the user can fix: printed without a traceback, exit code 2."""


# The demo stops once the ELBO changes by less than this (relative).
DEMO_TOL = 1e-4

def _positive_int(text):
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an integer >= 1, got {text!r}"
        ) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def _nonnegative_int(text):
    """argparse type: an integer >= 0 (a seed)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an integer >= 0, got {text!r}"
        ) from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def _n_jobs(text):
    """argparse type: a joblib ``n_jobs`` (an integer other than 0)."""
    try:
        return check_n_jobs(int(text))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a non-zero integer (-1 for all cores), got {text!r}"
        ) from None


def _positive_float(text):
    """argparse type: a number > 0."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def _scale_or_none(text):
    """argparse type: a number > 0, or ``none`` (returned as None)."""
    if text.lower() == "none":
        return None
    try:
        return _positive_float(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expected a number > 0 or 'none', got {text!r}"
        ) from None


def _encoding(text):
    """argparse type: the name of a Python text encoding."""
    from .io import _check_encoding

    try:
        _check_encoding(text, "give one such as 'utf-8' or 'euc-jp'")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _fit(estimator, X, y):
    """Fit ``estimator``; return (seconds, converged).

    A ConvergenceWarning becomes ``converged=False`` (the commands print
    their own note); other warnings are re-emitted.
    """
    from sklearn.exceptions import ConvergenceWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        start = time.perf_counter()
        estimator.fit(X, y)
        seconds = time.perf_counter() - start
    converged = True
    for warning in caught:
        if issubclass(warning.category, ConvergenceWarning):
            converged = False
        else:
            warnings.warn_explicit(
                warning.message, warning.category, warning.filename,
                warning.lineno,
            )
    return seconds, converged


def _progress(args, message):
    """Print a progress line to standard error unless ``-q``."""
    if not args.quiet:
        print(message, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------- #
# demo
def _add_demo(subparsers):
    parser = subparsers.add_parser(
        "demo",
        help="fit the GP to synthetic sequences and compare it with a "
        "per-token logistic regression",
        description=(
            "Generate synthetic labelled sequences (labels follow a sticky "
            "Markov chain, token features are noisy non-linear functions of "
            "the label), fit GPStructClassifier on a training set, and print "
            "its token accuracy on a held-out set beside a per-token "
            "LogisticRegression on the same features, the fit times, and "
            "the GP's per-token marginal probabilities on one test sequence."
        ),
    )
    parser.add_argument(
        "--n-sequences", type=_positive_int, default=150, metavar="N",
        help="number of training sequences (default: %(default)s); "
        f"{_DEMO_N_TEST} more are generated for testing",
    )
    parser.add_argument(
        "--random-state", type=_nonnegative_int, default=0, metavar="SEED",
        help="seed of the data and of the fit (default: %(default)s)",
    )
    parser.add_argument(
        "--n-inducing", type=_positive_int, default=150, metavar="M",
        help="inducing points of the GP (default: %(default)s)",
    )
    parser.add_argument(
        "--max-iter", type=_positive_int, default=200, metavar="N",
        help="L-BFGS iterations of the GP fit at most (default: %(default)s)",
    )
    parser.add_argument(
        "--n-jobs", type=_n_jobs, default=None, metavar="N",
        help="joblib workers for the fit (default: 1; -1 for all cores)",
    )
    parser.add_argument(
        "-q", "--quiet", action="store_true",
        help="do not print the ELBO progress lines",
    )
    parser.set_defaults(run=_run_demo, parser=parser)


def _run_demo(args):
    # Imported here so that `skgpstruct --help` stays fast.
    from sklearn.linear_model import LogisticRegression

    from ._estimator import GPStructClassifier
    from .datasets import make_sequences
    from .metrics import token_accuracy

    n_train = args.n_sequences
    X, y = make_sequences(
        n_train + _DEMO_N_TEST,
        n_classes=_DEMO_N_CLASSES,
        n_features=_DEMO_N_FEATURES,
        noise=_DEMO_NOISE,
        random_state=args.random_state,
    )
    X_train, y_train = X[:n_train], y[:n_train]
    X_test, y_test = X[n_train:], y[n_train:]
    if np.unique(np.concatenate(y_train)).size < 2:
        raise CommandError(
            f"--n-sequences {n_train} with --random-state {args.random_state} "
            "gives training sequences of a single label; give more sequences "
            "(the default is 150)"
        )
    n_train_tokens = sum(len(s) for s in y_train)
    n_test_tokens = sum(len(s) for s in y_test)
    print(
        f"synthetic data: {_DEMO_N_CLASSES} labels, {_DEMO_N_FEATURES} features, "
        f"noise {_DEMO_NOISE}; {n_train} training sequences ({n_train_tokens} "
        f"tokens), {_DEMO_N_TEST} test sequences ({n_test_tokens} tokens)"
    )

    gp = GPStructClassifier(
        kernel="rbf",
        n_inducing=args.n_inducing,
        max_iter=args.max_iter,
        tol=DEMO_TOL,
        n_jobs=args.n_jobs,
        random_state=args.random_state,
        verbose=0 if args.quiet else 1,
    )
    print(
        f"fitting GPStructClassifier(kernel='rbf', n_inducing={args.n_inducing}, "
        f"max_iter={args.max_iter}, tol={DEMO_TOL})",
        flush=True,
    )
    with contextlib.redirect_stdout(sys.stderr):  # the ELBO lines: progress
        gp_time, converged = _fit(gp, X_train, y_train)
    if not converged:
        print(f"note: the GP stopped at max_iter={args.max_iter} before "
              "the ELBO settled (use --max-iter to run longer)")
    gp_accuracy = token_accuracy(y_test, gp.predict(X_test))

    logreg = LogisticRegression(max_iter=1000)
    start = time.perf_counter()
    logreg.fit(np.vstack(X_train), np.concatenate(y_train))
    lr_time = time.perf_counter() - start
    lr_pred = logreg.predict(np.vstack(X_test))
    lr_accuracy = float(np.mean(lr_pred == np.concatenate(y_test)))

    print()
    print(f"test token accuracy ({n_test_tokens} tokens):")
    print(f"  GPStructClassifier       accuracy {gp_accuracy:.4f}   "
          f"fit {gp_time:7.2f} s   ({gp.n_iter_} iterations)")
    print(f"  LogisticRegression       accuracy {lr_accuracy:.4f}   "
          f"fit {lr_time:7.2f} s   (per token, no chain)")

    # The test sequence with the most label changes shows the chain at work.
    shown = int(np.argmax([np.count_nonzero(np.diff(s)) for s in y_test]))
    marginals = gp.predict_marginals([X_test[shown]])[0]
    predicted = gp.predict([X_test[shown]])[0]
    lr_shown = logreg.predict(X_test[shown])
    n_shown = min(_DEMO_SHOWN_TOKENS, len(predicted))
    print()
    print(
        f"GP marginals p(label | x) of test sequence {shown} (first {n_shown} "
        f"of {len(predicted)} tokens):"
    )
    names = [f"p({c})" for c in gp.classes_]
    widths = [max(len(n), 5) for n in names]
    header = "  ".join(f"{n:>{w}}" for n, w in zip(names, widths, strict=True))
    print(f"  token  true  GP  LR  {header}")
    for t in range(n_shown):
        probs = "  ".join(
            f"{p:{w}.3f}" for p, w in zip(marginals[t], widths, strict=True)
        )
        print(
            f"  {t:5d}  {y_test[shown][t]!s:>4}  {predicted[t]!s:>2}  "
            f"{lr_shown[t]!s:>2}  {probs}"
        )
    return 0


# ---------------------------------------------------------------------- #
# files
class _Corpus:
    """A data file as read: its sequences and how its columns look."""

    def __init__(self, name, tokens, labels, separator):
        self.name = name
        self.tokens = tokens
        self.labels = labels
        self.n_columns = len(tokens[0][0]) + 1  # read_conll checks they agree
        self.separator = separator


def _read_bytes(path, what):
    """Bytes of ``path`` (``-``: standard input) and the name to report."""
    if path == "-":
        if sys.stdin is None:
            raise CommandError(f"cannot read {what} from standard input: it is closed")
        return sys.stdin.buffer.read(), "<stdin>"
    try:
        with open(path, "rb") as handle:
            return handle.read(), path
    except OSError as exc:
        raise CommandError(
            f"cannot read {what} {path!r}: {exc.strerror or exc}"
        ) from None


def _separator(lines):
    """Tab if the first token line of the decoded ``lines`` has one, else
    a space."""
    for line in lines:
        line = line.strip(" \t")
        if line:
            return "\t" if "\t" in line else " "
    return " "


#: The CLI's wording of :func:`skgpstruct.io._decode`'s advice.
_ENCODING_HINT = (
    "give the file's encoding with --encoding, e.g. --encoding euc-jp for "
    "CRF++'s JapaneseNE data"
)


def _read_corpus(path, encoding, args):
    """Read a CoNLL / CRF++ file as :func:`skgpstruct.io.read_conll` does."""
    from .io import _decode, _text_lines, parse_conll

    _progress(args, f"reading {'<stdin>' if path == '-' else path}")
    start = time.perf_counter()
    data, name = _read_bytes(path, "data file")
    try:
        text = _decode(data, encoding, name, hint=_ENCODING_HINT)
        tokens, labels = parse_conll(text, source=name)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    corpus = _Corpus(name, tokens, labels, _separator(_text_lines(text)))
    _progress(
        args,
        f"{name}: {len(labels)} sequences, {sum(len(s) for s in labels)} "
        f"tokens, {corpus.n_columns} columns per token "
        f"({len(data) / 1e6:.2f} MB read in {time.perf_counter() - start:.2f} s)",
    )
    return corpus


def _read_template(path, encoding):
    """Text of a CRF++ template file, checked line by line."""
    from .features import _parse_template
    from .io import _decode

    data, name = _read_bytes(path, "template file")
    try:
        text = _decode(data, encoding, name, hint=_ENCODING_HINT)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    # A one-line text without a newline would be taken for a file name.
    text = text if text.endswith("\n") else text + "\n"
    try:
        unigrams, _ = _parse_template(text)  # every line checked
    except ValueError as exc:
        raise CommandError(f"{name}: {exc}") from None
    if not unigrams:  # (before the training file is read)
        raise CommandError(
            f"{name}: the template has no U (unigram) line, so tokens get no "
            "features; add lines such as U00:%x[0,0]"
        )
    return text


def _check_output_path(path, what, inputs=()):
    """Fail before long work if ``path`` cannot be a file to write.

    ``inputs``: ``(path, what)`` of the command's input files; writing over
    one of them is refused (a slip in the order of the arguments would
    otherwise replace a data file with a model, silently).
    """
    if not path:
        raise CommandError(f"cannot write {what} to an empty path")
    if os.path.isdir(path):
        raise CommandError(f"cannot write {what} {path!r}: it is a directory")
    if path.endswith(("/", os.sep)):
        raise CommandError(
            f"cannot write {what} {path!r}: it names a directory (ends in a "
            "separator); give a file name"
        )
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise CommandError(
            f"cannot write {what} {path!r}: directory {directory!r} does not "
            "exist"
        )
    # Written in place: an existing file must be writable (/dev/null, or a
    # file in a read-only folder), a new one needs a writable folder.
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise CommandError(f"cannot write {what} {path!r}: it is not writable")
    if not os.path.exists(path) and not os.access(directory, os.W_OK):
        raise CommandError(
            f"cannot write {what} {path!r}: directory {directory!r} is not "
            "writable"
        )
    for input_path, input_what in inputs:
        if input_path == "-" or not os.path.exists(path):
            continue
        if os.path.exists(input_path) and os.path.samefile(path, input_path):
            raise CommandError(
                f"cannot write {what} {path!r}: it is the {input_what}; give "
                "another path"
            )


def _write_text(text, path, encoding):
    """Write ``text`` encoded with ``encoding`` to ``path`` or standard output."""
    from .io import _encode

    try:
        data = _encode(text, encoding)
    except ValueError as exc:
        raise CommandError(f"{exc} (with --encoding)") from None
    if path is None or path == "-":
        if sys.stdout is None:
            raise CommandError("cannot write to standard output: it is closed")
        try:
            sys.stdout.flush()
            buffer = getattr(sys.stdout, "buffer", None)
            if buffer is None:  # a text-only stream (redirected in Python)
                sys.stdout.write(text)
                return
            buffer.write(data)
            buffer.flush()
        except BrokenPipeError:
            raise  # (main: the reader stopped)
        except OSError as exc:
            raise CommandError(
                f"cannot write to standard output: {exc.strerror or exc}"
            ) from None
        return
    try:
        with open(path, "wb") as handle:
            handle.write(data)
    except OSError as exc:
        raise CommandError(
            f"cannot write output file {path!r}: {exc.strerror or exc}"
        ) from None


# ---------------------------------------------------------------------- #
# model files
#: The file name extensions by which joblib.dump compresses.
_COMPRESSION_EXTENSIONS = (".z", ".gz", ".bz2", ".xz", ".lzma", ".lz4")


def _save_model(model, path):
    """Write ``model`` to ``path`` whole or not at all.

    Written to a temporary file beside the file ``path`` names (a symbolic
    link's target: the link is kept), then renamed over it: a write that
    fails (a full disk, a quota, an interrupt) leaves an earlier model file
    as it was, and no partial file. The new file has the permissions of the
    one it replaces (a hard link to that one keeps the old model). Written
    in place, as before, where no file can be made beside it (a writable
    file in a directory that is not) and where ``path`` is not a regular
    file (``/dev/null``, a FIFO).
    """
    import joblib

    target = os.path.realpath(path)
    temporary = None
    try:
        if os.path.exists(target) and not os.path.isfile(target):
            joblib.dump(model, path)
            return
        try:
            # (a compression extension kept: joblib compresses by it)
            extension = os.path.splitext(target)[1]
            if extension not in _COMPRESSION_EXTENSIONS:
                extension = ""
            fd, temporary = tempfile.mkstemp(
                prefix=".skgpstruct-", dir=os.path.dirname(target),
                suffix=".tmp" + extension,
            )
        except PermissionError:
            if not (os.path.isfile(target) and os.access(target, os.W_OK)):
                raise
            joblib.dump(model, path)
            return
        os.close(fd)
        joblib.dump(model, temporary)
        # The permissions of the file it replaces, or a new file's (mkstemp
        # makes it private).
        try:
            mode = os.stat(target).st_mode & 0o777
        except OSError:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(temporary, mode)
        os.replace(temporary, target)
        temporary = None
    except OSError as exc:
        raise CommandError(
            f"cannot write model file {path!r}: {exc.strerror or exc}"
        ) from None
    finally:
        if temporary is not None:
            with contextlib.suppress(OSError):
                os.remove(temporary)


def _decompressed(handle):
    """``handle`` read through the decompressor its first bytes name, as
    ``joblib.dump(..., compress=...)`` writes (zlib, gzip, bz2, xz, lzma):
    a model file recompressed by its user is still recognised."""
    import bz2
    import gzip
    import lzma

    from joblib.compressor import BinaryZlibFile

    magic = handle.read(6)
    handle.seek(0)
    if magic.startswith(b"\x1f\x8b"):
        return gzip.GzipFile(fileobj=handle, mode="rb")
    if magic.startswith(b"BZh"):
        return bz2.BZ2File(handle, mode="rb")
    if magic.startswith(b"\xfd7zXZ\x00") or magic.startswith(b"\x5d\x00\x00"):
        return lzma.LZMAFile(handle, mode="rb")
    if magic[:1] == b"\x78":  # zlib, joblib's compress=True / int
        return BinaryZlibFile(handle, mode="rb")
    return contextlib.nullcontext(handle)


def _written_version(path):
    """The skgpstruct version at the start of a model file, or None.

    Read from the pickle's first opcodes without unpickling anything, so
    that a model whose pipeline no longer unpickles (a class moved in
    another version) is still reported with the version that wrote it.
    """
    strings = []
    try:
        with open(path, "rb") as raw, _decompressed(raw) as handle:
            for k, (_, arg, _) in enumerate(pickletools.genops(handle)):
                if k > 64:
                    break
                if isinstance(arg, str):
                    strings.append(arg)
    except Exception:  # any malformed stream: there is no version to report
        pass
    if MODEL_FORMAT not in strings:
        return None
    for key, value in zip(strings, strings[1:], strict=False):
        if key == "skgpstruct_version":
            return value
    return None


def _version_error(path, written):
    return CommandError(
        f"model file {path!r} was written by skgpstruct {written}, but the "
        f"installed version is {__version__}; a model file is tied to the "
        "version that wrote it: train the model again with 'skgpstruct train'"
    )


def _load_model(path):
    """Load and check a model file written by ``skgpstruct train``."""
    import joblib
    from sklearn.pipeline import Pipeline

    not_a_model = (
        f"{path!r} is not a skgpstruct model file (model files are written "
        "by 'skgpstruct train')"
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            model = joblib.load(path)
        except OSError as exc:
            raise CommandError(
                f"cannot read model file {path!r}: {exc.strerror or exc}"
            ) from None
        except Exception as exc:  # unpickling fails in many ways, all fatal
            written = _written_version(path)
            if written is not None and written != __version__:
                raise _version_error(path, written) from None
            raise CommandError(
                f"{not_a_model}, or it is damaged: unpickling it failed "
                f"({type(exc).__name__}: {exc})"
            ) from None
    if not isinstance(model, dict) or model.get("format") != MODEL_FORMAT:
        held = (
            f"a dict without the entry 'format': {MODEL_FORMAT!r}"
            if isinstance(model, dict) else f"a {type(model).__name__}"
        )
        raise CommandError(f"{not_a_model}: it holds {held}")
    if model.get("skgpstruct_version") != __version__:
        raise _version_error(path, model.get("skgpstruct_version"))
    if (
        not isinstance(model.get("pipeline"), Pipeline)
        or not isinstance(model.get("n_token_columns"), int)
        or not isinstance(model.get("encoding"), str)
    ):
        raise CommandError(
            f"model file {path!r} is damaged: it lacks the fitted pipeline, "
            "the number of token columns or the encoding"
        )
    for warning in caught:  # e.g. scikit-learn's InconsistentVersionWarning
        print(f"skgpstruct: warning: {path}: {warning.message}", file=sys.stderr)
    return model


def _split_gold(corpus, model):
    """Token rows and gold labels (None if the file has no gold column)."""
    n_token = model["n_token_columns"]
    if corpus.n_columns == n_token + 1:
        return corpus.tokens, corpus.labels
    if corpus.n_columns == n_token:
        # read_conll took the last token column for a label: give it back.
        tokens = [
            [[*row, label] for row, label in zip(seq, labels, strict=True)]
            for seq, labels in zip(corpus.tokens, corpus.labels, strict=True)
        ]
        return tokens, None
    raise CommandError(
        f"{corpus.name} has {corpus.n_columns} columns per token, but the model "
        f"was trained on {n_token} token column(s) and a label: give "
        f"{n_token} columns (tokens only) or {n_token + 1} (tokens, then the "
        "gold label)"
    )


def _predict(model, tokens, args, *, marginals=False):
    """Predicted labels, and the marginal probability of each if asked."""
    pipeline = model["pipeline"]
    start = time.perf_counter()
    X = pipeline[:-1].transform(tokens)
    estimator = pipeline[-1]
    predicted = estimator.predict(X)
    probabilities = None
    if marginals:
        probabilities = [
            m[np.arange(len(labels)), np.searchsorted(estimator.classes_, labels)]
            for m, labels in zip(estimator.predict_marginals(X), predicted,
                                 strict=True)
        ]
    _progress(
        args,
        f"predicted {len(predicted)} sequences ({sum(map(len, predicted))} "
        f"tokens) in {time.perf_counter() - start:.2f} s",
    )
    return predicted, probabilities


def _add_model_input_arguments(parser):
    """MODEL_FILE FILE --encoding -q, shared by predict and evaluate."""
    parser.add_argument(
        "model_file", metavar="MODEL_FILE",
        help="a model file written by 'skgpstruct train' (a pickle: only "
        "load files you trust)",
    )
    parser.add_argument(
        "file", metavar="FILE",
        help="CoNLL / CRF++ file to label: the model's token columns, "
        "optionally followed by the gold label; - reads standard input",
    )
    parser.add_argument(
        "--encoding", type=_encoding, default=None, metavar="CODEC",
        help="encoding of FILE and of the output (default: the encoding the "
        "model was trained with)",
    )
    parser.add_argument(
        "-q", "--quiet", action="store_true",
        help="do not print progress to standard error",
    )


# ---------------------------------------------------------------------- #
# train
# GPStructClassifier parameters set by `train` options of the same name.
_TRAIN_PARAMETERS = (
    "kernel", "n_inducing", "inducing", "inference", "covariance", "gradient",
    "optimizer", "n_samples", "max_iter", "tol", "hyperprior_scale", "decode",
    "n_jobs", "random_state",
)


def _accepted_values(name):
    """Values of a string parameter the estimator accepts, for help texts."""
    from . import _estimator

    if name == "kernel":
        from .kernels import KERNELS

        return sorted(KERNELS)
    # Help text only: the estimator validates the value itself.
    return _estimator._OPTIONS.get(name)


def _add_train(subparsers):
    from ._estimator import GPStructClassifier

    defaults = GPStructClassifier().get_params()
    parser = subparsers.add_parser(
        "train",
        help="fit a tagger to a CoNLL / CRF++ file and save it (as crf_learn)",
        description=(
            "Read a CoNLL / CRF++ file (one token per line, columns separated "
            "by spaces or tabs, the label last, a blank line between "
            "sequences), expand the CRF++ template into binary token "
            "features, fit GPStructClassifier and save the features and the "
            "estimator (one scikit-learn Pipeline) to MODEL_FILE. Progress "
            "(counts, the ELBO of every iteration) goes to standard error."
        ),
        epilog=_PICKLE_WARNING,
    )
    parser.add_argument(
        "train_file", metavar="TRAIN_FILE",
        help="CoNLL / CRF++ training file; - reads standard input",
    )
    parser.add_argument(
        "model_file", metavar="MODEL_FILE",
        help="where to write the model (a pickle)",
    )
    features = parser.add_argument_group("features")
    features.add_argument(
        "-t", "--template", required=True, metavar="TEMPLATE",
        help="CRF++ template file: U lines (%%x[row,col] macros) give token "
        "features; B lines are accepted (the model always has label "
        "transitions)",
    )
    features.add_argument(
        "--encoding", type=_encoding, default="utf-8", metavar="CODEC",
        help="encoding of TEMPLATE and TRAIN_FILE, stored in the model for "
        "predict and evaluate (default: %(default)s; CRF++'s JapaneseNE data "
        "needs euc-jp)",
    )
    features.add_argument(
        "--min-count", type=_positive_int, default=1, metavar="N",
        help="keep the features seen at least N times, as crf_learn -f "
        "(default: %(default)s)",
    )

    model = parser.add_argument_group(
        "model", "Parameters of GPStructClassifier (see its documentation); "
        "the estimator checks their values."
    )

    def choice(flag, name, text):
        accepted = _accepted_values(name)
        listed = f": {', '.join(accepted)}" if accepted else ""
        model.add_argument(
            flag, default=defaults[name], metavar="NAME",
            help=f"{text}{listed} (default: {defaults[name]})",
        )

    choice("--kernel", "kernel", "covariance of the latent functions")
    model.add_argument(
        "--n-inducing", type=_positive_int, default=defaults["n_inducing"],
        metavar="M",
        help="inducing inputs, unused with '--inducing features' (default: "
        "%(default)s)",
    )
    choice("--inducing", "inducing", "inducing variables")
    choice("--inference", "inference", "posterior inference")
    choice("--covariance", "covariance", "posterior covariances")
    choice("--gradient", "gradient", "Monte Carlo gradient estimator")
    choice("--optimizer", "optimizer", "optimiser of the ELBO")
    model.add_argument(
        "--n-samples", type=_positive_int, default=defaults["n_samples"],
        metavar="S",
        help="Monte Carlo samples per sequence in the ELBO (default: "
        "%(default)s)",
    )
    model.add_argument(
        "--max-iter", type=_positive_int, default=defaults["max_iter"],
        metavar="N", help="maximum iterations (default: %(default)s)",
    )
    model.add_argument(
        "--tol", type=_positive_float, default=defaults["tol"], metavar="TOL",
        help="relative ELBO change that stops the fit (default: %(default)s)",
    )
    model.add_argument(
        "--hyperprior-scale", type=_scale_or_none,
        default=defaults["hyperprior_scale"], metavar="S",
        help="sd of the log-normal hyperprior on the kernel hyperparameters, "
        "or 'none' to learn them by the ELBO alone (default: %(default)s)",
    )
    choice("--decode", "decode", "decoding of predict")
    model.add_argument(
        "--n-jobs", type=_n_jobs, default=defaults["n_jobs"], metavar="N",
        help="joblib workers for the fit (default: 1; -1 for all cores)",
    )
    model.add_argument(
        "--random-state", type=_nonnegative_int, default=0, metavar="SEED",
        help="seed of the inducing inputs and Monte Carlo samples (default: "
        "%(default)s, so that a command gives the same model every time)",
    )
    model.add_argument(
        "--verbose", type=_nonnegative_int, default=1, metavar="LEVEL",
        help="estimator verbosity: 1 prints the ELBO at every iteration, 0 "
        "nothing (default: %(default)s; -q sets 0)",
    )
    parser.add_argument(
        "-q", "--quiet", action="store_true",
        help="do not print progress to standard error",
    )
    parser.set_defaults(run=_run_train, parser=parser)


def _run_train(args):
    from sklearn.pipeline import Pipeline

    from ._estimator import GPStructClassifier
    from .features import CRFppTemplateVectorizer
    from .kernels import get_kernel

    start = time.perf_counter()
    if args.model_file == "-":
        raise CommandError(
            "MODEL_FILE cannot be '-': a model is a binary file, written to a "
            "path"
        )
    if args.template == "-" and args.train_file == "-":
        raise CommandError(
            "the template and TRAIN_FILE cannot both be read from standard "
            "input ('-'); give one of them as a file"
        )
    template = _read_template(args.template, args.encoding)
    params = {name: getattr(args, name) for name in _TRAIN_PARAMETERS}
    gp = GPStructClassifier(verbose=0 if args.quiet else args.verbose, **params)
    # The estimator's own checks, before the long reading and fitting.
    try:
        get_kernel(gp.kernel)
        gp._check_params()
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    _check_output_path(
        args.model_file, "model file",
        [(args.train_file, "training file"), (args.template, "template file")],
    )
    if (
        os.path.isfile(args.model_file)
        and os.path.getsize(args.model_file) > 0
        and _written_version(args.model_file) is None
    ):
        raise CommandError(
            f"MODEL_FILE {args.model_file!r} exists and is not a skgpstruct "
            "model file: remove it or give another path (is it a data file? "
            "the arguments are TRAIN_FILE MODEL_FILE)"
        )
    corpus = _read_corpus(args.train_file, args.encoding, args)

    vectorizer = CRFppTemplateVectorizer(template, min_count=args.min_count)
    features_start = time.perf_counter()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            X = vectorizer.fit_transform(corpus.tokens)
    except ValueError as exc:
        raise CommandError(f"{args.template} on {corpus.name}: {exc}") from None
    for warning in caught:  # e.g. B lines with macros
        print(f"skgpstruct: warning: {args.template}: {warning.message}",
              file=sys.stderr)
    if not vectorizer.vocabulary_:
        raise CommandError(
            f"no template feature occurs {args.min_count} times in "
            f"{corpus.name}; lower --min-count"
        )
    _progress(
        args,
        f"features: {len(vectorizer.vocabulary_)} from "
        f"{len(vectorizer.unigram_templates_)} template lines in "
        f"{time.perf_counter() - features_start:.2f} s",
    )
    label_set = sorted({label for seq in corpus.labels for label in seq})
    _progress(
        args,
        f"fitting {gp!r} to {len(corpus.labels)} sequences, "
        f"{len(label_set)} labels ({' '.join(label_set[:20])}"
        f"{' ...' if len(label_set) > 20 else ''})",
    )
    try:
        with contextlib.redirect_stdout(sys.stderr):  # the ELBO lines
            seconds, converged = _fit(gp, X, corpus.labels)
    except ValueError as exc:
        raise CommandError(f"cannot fit the model: {exc}") from None
    iterations = getattr(gp, "n_iter_", None)
    done = "" if iterations is None else f" ({iterations} iterations)"
    _progress(args, f"fitted in {seconds:.2f} s{done}")
    if not converged:
        _progress(
            args,
            f"note: the fit stopped at --max-iter {args.max_iter} before the "
            "ELBO settled (raise --max-iter to run longer)",
        )

    _save_model(
        {
            "format": MODEL_FORMAT,
            "skgpstruct_version": __version__,
            "pipeline": Pipeline([("features", vectorizer), ("gp", gp)]),
            "template": template,
            "encoding": args.encoding,
            "n_token_columns": corpus.n_columns - 1,
        },
        args.model_file,
    )
    _progress(
        args,
        f"wrote {args.model_file} in {time.perf_counter() - start:.2f} s in all",
    )
    return 0


# ---------------------------------------------------------------------- #
# predict
def _add_predict(subparsers):
    parser = subparsers.add_parser(
        "predict",
        help="label a CoNLL / CRF++ file with a trained model (as crf_test)",
        description=(
            "Write FILE back with the predicted label appended to every token "
            "line: the token columns, the gold label if FILE has one (it has "
            "one column more than the model's training tokens), the "
            "predicted label and, with --marginals, the probability of the "
            "predicted label. Columns are separated as in FILE (a tab if its "
            "first token line has one, else a space) and sequences by blank "
            "lines, so skgpstruct.io.read_conll reads the output back, and "
            "without --marginals conlleval reads it too (conlleval splits "
            "columns at spaces: give it -d '\\t' for a tab-separated FILE, "
            "or run skgpstruct evaluate)."
        ),
        epilog=_PICKLE_WARNING,
    )
    _add_model_input_arguments(parser)
    parser.add_argument(
        "-o", "--output", default=None, metavar="OUT",
        help="write to OUT instead of standard output",
    )
    parser.add_argument(
        "--marginals", action="store_true",
        help="append a column with the posterior marginal probability, in "
        "(0, 1] and with 6 significant digits, of each predicted label",
    )
    parser.set_defaults(run=_run_predict, parser=parser)


def _run_predict(args):
    from .io import format_conll

    model = _load_model(args.model_file)
    encoding = args.encoding or model["encoding"]
    if args.output is not None and args.output != "-":
        _check_output_path(
            args.output, "output file",
            [(args.model_file, "model file"), (args.file, "input file")],
        )
    corpus = _read_corpus(args.file, encoding, args)
    tokens, gold = _split_gold(corpus, model)
    predicted, probabilities = _predict(model, tokens, args,
                                        marginals=args.marginals)
    columns = [] if gold is None else [gold]
    columns.append(predicted)
    if probabilities is not None:
        columns.append([[f"{p:.6g}" for p in seq] for seq in probabilities])
    text = format_conll(tokens, *columns, sep=corpus.separator)
    _write_text(text, args.output, encoding)
    if args.output is not None and args.output != "-":
        _progress(args, f"wrote {args.output}")
    return 0


# ---------------------------------------------------------------------- #
# evaluate
def _add_evaluate(subparsers):
    parser = subparsers.add_parser(
        "evaluate",
        help="score a trained model on a labelled file (as conlleval)",
        description=(
            "Predict the labels of FILE (whose last column is the gold "
            "label) and print the token accuracy, then the chunk scores in "
            "the layout of the CoNLL conlleval script: an overall line and "
            "one line per chunk type (precision, recall, FB1 and the number "
            "of predicted chunks); untyped chunks (labels B, I as in CRF++'s "
            "basenp data) are shown as (untyped)."
        ),
        epilog=_PICKLE_WARNING,
    )
    _add_model_input_arguments(parser)
    parser.add_argument(
        "--scheme", default=None, metavar="SCHEME",
        help="chunk scheme of skgpstruct.metrics: iob1, iob2, ioe1, ioe2 or "
        "iobes (default: conlleval's own rules, right for IOB and IOE labels)",
    )
    parser.set_defaults(run=_run_evaluate, parser=parser)


def _conlleval_report(report, n_tokens):
    """Text of :func:`~skgpstruct.metrics.classification_report`'s dict."""

    def n_correct(row):
        return round(row["precision"] * row["predicted"])

    def scores(row):
        return (
            f"precision: {100 * row['precision']:6.2f}%; "
            f"recall: {100 * row['recall']:6.2f}%; "
            f"FB1: {100 * row['f1-score']:6.2f}"
        )

    accuracy = report["token accuracy"]
    overall = report["micro avg"]
    lines = [
        f"token accuracy: {100 * accuracy:.2f}% ({round(accuracy * n_tokens)} "
        f"of {n_tokens} tokens)",
        f"processed {n_tokens} tokens with {overall['support']} phrases; "
        f"found: {overall['predicted']} phrases; correct: "
        f"{n_correct(overall)}.",
        f"accuracy: {100 * accuracy:6.2f}%; {scores(overall)}",
    ]
    for type_, row in report.items():
        if type_ in ("micro avg", "token accuracy"):
            continue
        name = type_ if type_ else "(untyped)"
        lines.append(f"{name:>17}: {scores(row)}  {row['predicted']}")
    return "\n".join(lines) + "\n"


def _run_evaluate(args):
    from .metrics import classification_report

    try:  # the scheme's name, checked before the long work
        classification_report([["O"]], [["O"]], scheme=args.scheme)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    model = _load_model(args.model_file)
    corpus = _read_corpus(args.file, args.encoding or model["encoding"], args)
    tokens, gold = _split_gold(corpus, model)
    if gold is None:
        raise CommandError(
            f"{corpus.name} has no gold label column: its {corpus.n_columns} "
            "columns per token are the model's token columns; evaluate needs "
            f"the gold label last ({corpus.n_columns + 1} columns)"
        )
    predicted, _ = _predict(model, tokens, args)
    try:
        report = classification_report(gold, predicted, scheme=args.scheme,
                                       output_dict=True)
    except ValueError as exc:
        # The metrics name their arguments (y_true[i]); the file has
        # sequences of gold and predicted labels, counted from 1.
        message = re.sub(
            r"y_(true|pred)\[(\d+)\]",
            lambda m: (f"sequence {int(m[2]) + 1} of the "
                       f"{'gold' if m[1] == 'true' else 'predicted'} labels"),
            str(exc),
        )
        raise CommandError(f"{corpus.name}: {message}") from None
    # Text for the console, in its encoding; chunk types (from the labels)
    # it cannot show are escaped (print() failed on them).
    console = getattr(sys.stdout, "encoding", None) or "utf-8"
    text = _conlleval_report(report, sum(len(s) for s in gold))
    _write_text(
        text.encode(console, "backslashreplace").decode(console), None, console
    )
    return 0


# ---------------------------------------------------------------------- #
def _build_parser():
    parser = argparse.ArgumentParser(
        prog="skgpstruct",
        description="Bayesian sequence labelling with Gaussian-process priors.",
        epilog=(
            "Exit status: 0 on success, 2 for a usage error or bad input, 141 "
            "when the reader of the output stopped reading, 1 for an "
            "unexpected error. " + _PICKLE_WARNING
        ),
    )
    parser.add_argument(
        "--version", action="version",
        version=(
            f"%(prog)s {__version__} ({KERNEL_BUILD} build of the compiled kernels)"
        ),
    )
    subparsers = parser.add_subparsers(
        title="commands", dest="command", metavar="<command>", required=True
    )
    _add_train(subparsers)
    _add_predict(subparsers)
    _add_evaluate(subparsers)
    _add_demo(subparsers)
    return parser


def main(argv=None):
    """Run the ``skgpstruct`` command line.

    Parameters
    ----------
    argv : list of str or None, default=None
        The arguments after the program name; None reads ``sys.argv[1:]``.

    Returns
    -------
    exit_code : int
        0 on success; 2 for bad input (printed as ``skgpstruct: error:
        ...``); 1 for an unexpected error (printed with its traceback).
        Invalid options make argparse print a usage message and exit with
        status 2.

    Examples
    --------
    The commands as a shell runs them (``skgpstruct train ...``), here on a
    made-up chunking file written to a temporary folder:

    >>> import os
    >>> import tempfile
    >>> from skgpstruct.cli import main
    >>> from skgpstruct.io import write_conll
    >>> tokens = [[["He", "PRP"], ["reckons", "VBZ"], ["the", "DT"], ["deficit", "NN"]],
    ...           [["Yes", "UH"], ["the", "DT"], ["deficit", "NN"], ["grows", "VBZ"]]]
    >>> labels = [["B-NP", "B-VP", "B-NP", "I-NP"], ["O", "B-NP", "I-NP", "B-VP"]]
    >>> folder = tempfile.TemporaryDirectory()
    >>> train, model = (os.path.join(folder.name, name)
    ...                 for name in ("train.data", "model.pkl"))
    >>> template = os.path.join(folder.name, "template")
    >>> write_conll(train, tokens * 5, labels * 5)
    >>> with open(template, "w") as handle:
    ...     _ = handle.write("U00:%x[0,0]\\nU01:%x[0,1]\\nU02:%x[-1,1]\\nB\\n")
    >>> main(["train", "-q", "--template", template, train, model])
    0
    >>> main(["evaluate", "-q", model, train])
    token accuracy: 100.00% (40 of 40 tokens)
    processed 40 tokens with 25 phrases; found: 25 phrases; correct: 25.
    accuracy: 100.00%; precision: 100.00%; recall: 100.00%; FB1: 100.00
                   NP: precision: 100.00%; recall: 100.00%; FB1: 100.00  15
                   VP: precision: 100.00%; recall: 100.00%; FB1: 100.00  10
    0
    >>> test = os.path.join(folder.name, "test.data")
    >>> write_conll(test, tokens[1:], labels[1:])
    >>> output = os.path.join(folder.name, "test.out")
    >>> main(["predict", "-q", "-o", output, model, test])
    0
    >>> with open(output) as handle:  # the gold column, then the predicted one
    ...     print(handle.read(), end="")
    Yes UH O O
    the DT B-NP B-NP
    deficit NN I-NP I-NP
    grows VBZ B-VP B-VP
    <BLANKLINE>
    >>> folder.cleanup()
    """
    parser = _build_parser()
    args, extra = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    if extra:
        # Report unknown options with the sub-command's usage, not the
        # top-level one argparse would show.
        args.parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return args.run(args)
    except CommandError as exc:
        print(f"skgpstruct: error: {exc}", file=sys.stderr)
        return _EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("skgpstruct: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader of standard output (e.g. `head`) stopped: not a bug;
        # the status of a program a SIGPIPE stopped, as shell tools give.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return _EXIT_BROKEN_PIPE
    except OSError as exc:
        if exc.errno not in _IO_ERRNOS:
            return _report_unexpected(exc)
        # Files are read and written with their own messages; this is the
        # terminal or a redirection (standard output on a full disk).
        where = f" ({exc.filename})" if exc.filename else ""
        print(f"skgpstruct: error: input/output error{where}: "
              f"{exc.strerror or exc}", file=sys.stderr)
        return _EXIT_BAD_INPUT
    except Exception as exc:
        return _report_unexpected(exc)


#: Errors of the medium, not of the program: a full disk or quota, a file
#: too large, a device error, a closed descriptor.
_IO_ERRNOS = frozenset(
    getattr(errno, name) for name in ("ENOSPC", "EDQUOT", "EFBIG", "EIO", "EBADF")
    if hasattr(errno, name)
)


def _report_unexpected(exc):
    """Print the traceback and a request to report it; the exit status."""
    traceback.print_exc()
    print(
        f"skgpstruct: error: unexpected {type(exc).__name__}: {exc} (a bug "
        "in skgpstruct: please report it with the traceback above)",
        file=sys.stderr,
    )
    return _EXIT_UNEXPECTED
