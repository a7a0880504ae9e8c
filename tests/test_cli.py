"""The command line, run as a user runs it: ``python -m skgpstruct``."""

import contextlib
import errno
import io
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import joblib
import numpy as np
import pytest
from sklearn.pipeline import Pipeline

import skgpstruct
import skgpstruct._estimator as estimator_module
from skgpstruct import GPStructClassifier, cli
from skgpstruct.cli import main
from skgpstruct.io import parse_conll, read_conll, write_conll
from skgpstruct.metrics import (
    chunk_precision_recall_fscore_support,
    classification_report,
    token_accuracy,
)

_ACCURACY_LINE = re.compile(
    r"^\s*(GPStructClassifier|LogisticRegression)\s+accuracy\s+([0-9.]+)\s+"
    r"fit\s+([0-9.]+) s",
    re.MULTILINE,
)
# A small fold of CRF++'s basenp data: the first sequences of its files.
N_TRAIN = 40
N_TEST = 20
MAX_ITER = "30"

needs_shared_data = pytest.mark.shared_data


def _run(*args, input=None, text=True, timeout=120, stdout=None):
    """Run ``python -m skgpstruct *args``; return the CompletedProcess
    (standard output captured, or written to the file object ``stdout``).

    The child must import the package the tests import: prepend the
    directory holding it to PYTHONPATH and run from there (a source checkout
    with the extension built in place, or site-packages when installed).
    """
    env = dict(os.environ)
    package_root = str(Path(skgpstruct.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in [package_root, env.get("PYTHONPATH")] if p
    )
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    # ``python -m`` puts the working directory first on sys.path: run from
    # the package's own root, so that a source checkout in the current
    # directory cannot shadow an installed (compiled) package.
    return subprocess.run(
        [sys.executable, "-m", "skgpstruct", *map(str, args)],
        stdout=subprocess.PIPE if stdout is None else stdout,
        stderr=subprocess.PIPE,
        text=text,
        env=env,
        input=input,
        timeout=timeout,
        check=False,
        cwd=package_root,
    )


def _accuracies(stdout):
    return {name: (float(acc), float(t)) for name, acc, t in
            _ACCURACY_LINE.findall(stdout)}


def test_demo_runs_and_reports_accuracies():
    result = _run("demo", "--n-sequences", "20", "--n-inducing", "30",
                  "--max-iter", "15", "--random-state", "1")
    assert result.returncode == 0, result.stderr
    scores = _accuracies(result.stdout)
    assert set(scores) == {"GPStructClassifier", "LogisticRegression"}, (
        result.stdout
    )
    for accuracy, fit_time in scores.values():
        assert 0.0 <= accuracy <= 1.0
        assert fit_time >= 0.0
    # progress on standard error (it was on standard output), results on
    # standard output
    assert re.search(r"^iteration\s+1\s+ELBO", result.stderr, re.MULTILINE)
    assert not re.search(r"^iteration\s", result.stdout, re.MULTILINE)
    assert "marginals" in result.stdout


def test_demo_quiet_hides_progress():
    result = _run("demo", "-q", "--n-sequences", "10", "--n-inducing", "10",
                  "--max-iter", "3")
    assert result.returncode == 0, result.stderr
    assert not re.search(r"^iteration\s", result.stdout, re.MULTILINE)
    assert len(_accuracies(result.stdout)) == 2


def test_unknown_command_prints_usage():
    result = _run("no-such-command")
    assert result.returncode != 0
    assert "usage:" in result.stderr
    assert "no-such-command" in result.stderr


def test_missing_command_prints_usage():
    result = _run()
    assert result.returncode != 0
    assert "usage:" in result.stderr


@pytest.mark.parametrize(
    "args", [["demo", "--n-sequences", "0"], ["demo", "--n-sequences", "many"],
             ["demo", "--no-such-option"],
             ["demo", "--n-jobs", "0"]],  # was joblib's traceback
)
def test_bad_demo_options_exit_with_usage(args, capsys):
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "usage: skgpstruct demo" in err


def test_version_names_the_release_and_the_kernels_build(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    build = skgpstruct.chain.KERNEL_BUILD
    assert capsys.readouterr().out.split() == [
        "skgpstruct", skgpstruct.__version__, f"({build}", "build", "of", "the",
        "compiled", "kernels)"]


def test_help_lists_the_commands(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for command in ("train", "predict", "evaluate", "demo"):
        assert re.search(rf"^\s+{command}\s", out, re.MULTILINE), out


def test_train_help_exposes_the_estimator_options(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["train", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for option in ("--template", "--kernel", "--n-inducing", "--optimizer",
                   "--covariance", "--n-samples", "--decode", "--gradient",
                   "--tol", "--max-iter", "--n-jobs", "--random-state",
                   "--hyperprior-scale", "--verbose", "--encoding", "-q"):
        assert option in out, option
    # --inference exists exactly when the estimator has the parameter.
    has_inference = "inference" in GPStructClassifier().get_params()
    assert ("--inference" in out) == has_inference
    assert "lbfgs" in out  # the accepted optimisers, read from the estimator
    assert "pickle" in out and "trust" in out


@pytest.mark.parametrize(
    ("given", "expected"), [(None, 3.0), ("none", None), ("NONE", None), ("1.5", 1.5)]
)
def test_train_passes_the_hyperprior_scale(monkeypatch, tmp_path, given, expected):
    # The estimator train builds is recorded when it checks its parameters;
    # the command then stops, before reading any data.
    seen = {}

    class Recording(estimator_module.GPStructClassifier):
        def _check_params(self):
            seen["hyperprior_scale"] = self.hyperprior_scale
            return super()._check_params()

    def stop(path, what, inputs=()):
        raise cli.CommandError("stopped by the test")

    monkeypatch.setattr(estimator_module, "GPStructClassifier", Recording)
    monkeypatch.setattr(cli, "_read_template", lambda path, encoding: "U00:%x[0,0]\n")
    monkeypatch.setattr(cli, "_check_output_path", stop)
    argv = ["train", "-t", "template", "train.data", str(tmp_path / "model.pkl")]
    if given is not None:
        argv[1:1] = ["--hyperprior-scale", given]
    assert main(argv) == 2
    assert seen["hyperprior_scale"] == expected


@pytest.mark.parametrize("given", ["0", "-1", "wide"])
def test_train_refuses_a_bad_hyperprior_scale(capsys, tmp_path, given):
    with pytest.raises(SystemExit) as exc:
        main(["train", "--hyperprior-scale", given, "-t", "template",
              "train.data", str(tmp_path / "model.pkl")])
    assert exc.value.code == 2
    assert "expected a number > 0 or 'none'" in capsys.readouterr().err


def test_unexpected_error_exits_1_with_traceback(monkeypatch, capsys, tmp_path):
    def broken(path, encoding):
        raise RuntimeError("boom")

    monkeypatch.setattr(cli, "_read_template", broken)
    code = main(["train", "-t", "template", "train.data",
                 str(tmp_path / "model.pkl")])
    assert code == 1
    err = capsys.readouterr().err
    assert "Traceback" in err
    assert "skgpstruct: error: unexpected RuntimeError: boom" in err


# --------------------------------------------------------------------------- #
# train, predict, evaluate on a small fold of CRF++'s basenp data


@pytest.fixture(scope="module")
def fold(shared_data_dir, tmp_path_factory):
    """The first 40 training and 20 test sequences of basenp, as files."""
    source = shared_data_dir / "crfpp" / "basenp"
    directory = tmp_path_factory.mktemp("basenp_fold")
    train_tokens, train_labels = read_conll(source / "train.data")
    test_tokens, test_labels = read_conll(source / "test.data")
    train_tokens, train_labels = train_tokens[:N_TRAIN], train_labels[:N_TRAIN]
    test_tokens, test_labels = test_tokens[:N_TEST], test_labels[:N_TEST]
    write_conll(directory / "train.data", train_tokens, train_labels)
    write_conll(directory / "test.data", test_tokens, test_labels)
    return SimpleNamespace(
        dir=directory,
        template=source / "template",
        train=directory / "train.data",
        test=directory / "test.data",
        model=directory / "model.pkl",
        n_train_tokens=sum(len(s) for s in train_labels),
        test_tokens=test_tokens,
        test_labels=test_labels,
    )


@pytest.fixture(scope="module")
def trained(fold):
    """``skgpstruct train`` on the fold's training file."""
    result = _run("train", "--template", fold.template, "--max-iter", MAX_ITER,
                  fold.train, fold.model)
    assert result.returncode == 0, result.stderr
    return result


@pytest.fixture(scope="module")
def predicted(fold, trained):
    """``skgpstruct predict -o`` on the fold's test file, read back."""
    out = fold.dir / "predicted.data"
    result = _run("predict", fold.model, fold.test, "-o", out)
    assert result.returncode == 0, result.stderr
    tokens, labels = read_conll(out)
    return SimpleNamespace(result=result, path=out, tokens=tokens, labels=labels)


def _in_process_model(fold):
    model = joblib.load(fold.model)
    pipeline = model["pipeline"]
    return pipeline[-1], pipeline[:-1].transform(fold.test_tokens)


@needs_shared_data
def test_train_reports_progress_and_saves_the_pipeline(fold, trained):
    err = trained.stderr
    assert f"{N_TRAIN} sequences, {fold.n_train_tokens} tokens, 3 columns" in err
    assert re.search(r"^features: [1-9][0-9]* from 20 template lines", err,
                     re.MULTILINE), err
    assert re.search(r"^iteration\s+1\s+ELBO", err, re.MULTILINE), err
    assert trained.stdout == ""  # progress goes to standard error

    model = joblib.load(fold.model)
    assert model["format"] == "skgpstruct-model"
    assert model["skgpstruct_version"] == skgpstruct.__version__
    assert model["encoding"] == "utf-8"
    assert model["n_token_columns"] == 2
    assert model["template"] == fold.template.read_text()
    pipeline = model["pipeline"]
    assert isinstance(pipeline, Pipeline)
    assert [name for name, _ in pipeline.steps] == ["features", "gp"]
    gp = pipeline[-1]
    assert list(gp.classes_) == ["B", "I", "O"]
    assert gp.max_iter == int(MAX_ITER) and gp.random_state == 0


@needs_shared_data
def test_predict_appends_the_predicted_column(fold, predicted):
    assert predicted.result.stdout == ""
    assert f"wrote {predicted.path}" in predicted.result.stderr
    # token columns, gold label, predicted label; one block per sequence
    assert len(predicted.tokens) == N_TEST
    for rows, source, gold in zip(predicted.tokens, fold.test_tokens,
                                  fold.test_labels, strict=True):
        assert rows == [[*row, label] for row, label in
                        zip(source, gold, strict=True)]
    text = predicted.path.read_text()
    assert text.count("\n\n") == N_TEST and text.endswith("\n\n")
    assert all(len(line.split(" ")) == 4 for line in text.splitlines() if line)
    assert {label for seq in predicted.labels for label in seq} <= {"B", "I", "O"}
    # The labels are the model's, and far better than chance.
    gp, X = _in_process_model(fold)
    assert predicted.labels == [list(p) for p in gp.predict(X)]
    assert token_accuracy(fold.test_labels, predicted.labels) > 0.8


@needs_shared_data
def test_predict_without_gold_reads_stdin_and_keeps_tabs(fold, predicted):
    no_gold = "".join(
        "".join(f"{word}\t{tag}\n" for word, tag in rows) + "\n"
        for rows in fold.test_tokens
    )
    result = _run("predict", "-q", fold.model, "-", input=no_gold)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # -q
    lines = [line for line in result.stdout.splitlines() if line]
    assert all(line.count("\t") == 2 and " " not in line for line in lines)
    tokens, labels = parse_conll(result.stdout)
    assert tokens == fold.test_tokens  # no gold column: tokens, then prediction
    assert labels == predicted.labels


@needs_shared_data
@pytest.mark.parametrize(
    ("data", "encoding"),
    [
        # U+0109 is the bytes 09 01 in UTF-16: the separator was taken from
        # the undecoded bytes, and the output had tabs.
        ("\u0109u NN\nword NN\n\n", "utf-16"),
        # lone CRs end lines: the first line was the whole file, with a tab
        ("one NN\rtwo\tNN\r\r", "utf-8"),
    ],
    ids=["utf-16", "lone CR"],
)
def test_output_separator_is_read_from_the_decoded_first_line(
    fold, trained, data, encoding
):
    result = _run("predict", "-q", "--encoding", encoding, fold.model, "-",
                  input=data.encode(encoding), text=False)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.decode(encoding).splitlines()
    assert lines[0].count(" ") == 2 and "\t" not in result.stdout.decode(encoding)


@needs_shared_data
def test_a_reader_that_stops_gives_the_status_of_sigpipe(fold, trained, tmp_path):
    # A reader of standard output that stopped: exit status 141 (128 +
    # SIGPIPE), as shell tools give, and no message; it was 1, the status
    # of a bug.
    big = tmp_path / "big.data"
    write_conll(big, fold.test_tokens * 10, fold.test_labels * 10)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    package_root = str(Path(skgpstruct.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in [package_root, env.get("PYTHONPATH")] if p
    )
    child = subprocess.Popen(
        [sys.executable, "-m", "skgpstruct", "predict", "-q", str(fold.model),
         str(big)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=package_root,
    )
    # The reader is gone before the child writes (it loads the model and
    # predicts first), as in `skgpstruct predict ... | true`.
    child.stdout.close()
    stderr = child.stderr.read()
    child.stderr.close()
    assert child.wait(timeout=120) == 141
    assert stderr == b""


@needs_shared_data
def test_predict_marginals_appends_probabilities(fold, predicted, tmp_path):
    out = tmp_path / "marginals.data"
    result = _run("predict", "--marginals", "-q", fold.model, fold.test, "-o", out)
    assert result.returncode == 0, result.stderr
    tokens, probabilities = read_conll(out)
    assert [[row[:-1] for row in seq] for seq in tokens] == predicted.tokens
    assert [[row[-1] for row in seq] for seq in tokens] == predicted.labels
    values = [np.array(seq, dtype=float) for seq in probabilities]
    assert all(np.all((v > 0) & (v <= 1)) for v in values)
    gp, X = _in_process_model(fold)
    for v, marginals, labels in zip(values, gp.predict_marginals(X),
                                    predicted.labels, strict=True):
        columns = np.searchsorted(gp.classes_, labels)
        expected = marginals[np.arange(len(labels)), columns]
        np.testing.assert_allclose(v, expected, rtol=1e-5)


_REPORT = re.compile(
    r"^token accuracy: (?P<token>[0-9.]+)% \((?P<correct_tokens>\d+) of "
    r"(?P<tokens>\d+) tokens\)\n"
    r"processed (?P=tokens) tokens with (?P<phrases>\d+) phrases; found: "
    r"(?P<found>\d+) phrases; correct: (?P<correct>\d+)\.\n"
    r"accuracy: +(?P<accuracy>[0-9.]+)%; precision: +(?P<precision>[0-9.]+)%; "
    r"recall: +(?P<recall>[0-9.]+)%; FB1: +(?P<f1>[0-9.]+)\n"
    r"(?P<types>(?: *\S+: precision: .*\n)+)$"
)
_TYPE_LINE = re.compile(
    r"^ *(\S+): precision: +([0-9.]+)%; recall: +([0-9.]+)%; FB1: +([0-9.]+)"
    r"  (\d+)$", re.MULTILINE,
)


@needs_shared_data
def test_evaluate_prints_conlleval_figures_that_match_metrics(fold, predicted):
    result = _run("evaluate", fold.model, fold.test)
    assert result.returncode == 0, result.stderr
    match = _REPORT.match(result.stdout)
    assert match, result.stdout
    figures = match.groupdict()

    gold = [[row[-1] for row in seq] for seq in predicted.tokens]
    guess = predicted.labels
    n_tokens = sum(len(s) for s in gold)
    accuracy = token_accuracy(gold, guess)
    precision, recall, f1, support = chunk_precision_recall_fscore_support(
        gold, guess)
    found = classification_report(gold, guess, output_dict=True)["micro avg"][
        "predicted"]
    assert int(figures["tokens"]) == n_tokens
    assert int(figures["correct_tokens"]) == round(accuracy * n_tokens)
    assert int(figures["phrases"]) == support
    assert int(figures["found"]) == found
    assert int(figures["correct"]) == round(precision * found)
    for name, value in [("token", accuracy), ("accuracy", accuracy),
                        ("precision", precision), ("recall", recall),
                        ("f1", f1)]:
        assert float(figures[name]) == pytest.approx(100 * value, abs=0.005), name

    # basenp's chunks are untyped ("B", "I"): one type line.
    p, r, f, _, types = chunk_precision_recall_fscore_support(
        gold, guess, average=None)
    lines = _TYPE_LINE.findall(figures["types"])
    assert [name for name, *_ in lines] == [
        "(untyped)" if t == "" else t for t in types]
    for (_, *values, n_found), expected in zip(lines, zip(p, r, f, strict=True),
                                               strict=True):
        np.testing.assert_allclose([float(v) for v in values],
                                   100 * np.array(expected), atol=0.005)
        assert int(n_found) == found


@needs_shared_data
def test_model_keeps_the_training_encoding(shared_data_dir, tmp_path):
    source = shared_data_dir / "crfpp" / "JapaneseNE"
    # The first 10 sequences of the EUC-JP encoded file, bytes untouched.
    data = tmp_path / "ne.data"
    data.write_bytes(b"\n\n".join(
        (source / "train.data").read_bytes().split(b"\n\n")[:10]) + b"\n\n")
    model = tmp_path / "ne.pkl"

    utf8 = _run("train", "-q", "-t", source / "template", data, model)
    assert utf8.returncode == 2
    assert "cannot decode" in utf8.stderr and "euc-jp" in utf8.stderr

    result = _run("train", "-q", "-t", source / "template", "--encoding",
                  "euc-jp", "--max-iter", "2", data, model)
    assert result.returncode == 0, result.stderr
    # predict reads and writes EUC-JP without being told.
    result = _run("predict", "-q", model, data, text=False)
    assert result.returncode == 0, result.stderr
    tokens, labels = read_conll(data, encoding="euc-jp")
    out_tokens, _ = parse_conll(result.stdout.decode("euc-jp"))
    assert out_tokens == [[[*row, label] for row, label in
                           zip(seq, seq_labels, strict=True)]
                          for seq, seq_labels in zip(tokens, labels, strict=True)]


@needs_shared_data
def test_quiet_train_prints_nothing(fold, tmp_path):
    model = tmp_path / "model.pkl"
    result = _run("train", "-q", "-t", fold.template, "--max-iter", "2",
                  fold.train, model)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "" and result.stderr == ""
    assert joblib.load(model)["pipeline"][-1].verbose == 0


# --------------------------------------------------------------------------- #
# errors: a message naming what is wrong, exit code 2


def _other_version_model(fold, directory):
    model = joblib.load(fold.model)
    model["skgpstruct_version"] = "0.0.1"
    path = directory / "old.pkl"
    joblib.dump(model, path)
    return path


def _moved_class_model(fold, directory):
    """A model of another version whose pipeline no longer unpickles."""
    data = _other_version_model(fold, directory).read_bytes()
    path = directory / "moved.pkl"
    path.write_bytes(data.replace(b"sklearn.pipeline", b"sklearn.pipelinX"))
    return path


def _pickled(value, directory):
    path = directory / "other.pkl"
    path.write_bytes(pickle.dumps(value))
    return path


def _without_encoding(fold, directory):
    model = joblib.load(fold.model)
    del model["encoding"]
    path = directory / "no_encoding.pkl"
    joblib.dump(model, path)
    return path


def _bad_template(directory):
    path = directory / "bad.template"
    path.write_text("# comment\nU00:%x[0,0]\nX01:%x[0,1]\n")
    return path


def _bigrams_only(directory):
    path = directory / "b.template"
    path.write_text("# no unigram line\nB\n")
    return path


def _undecodable(directory):
    path = directory / "latin1.data"
    path.write_bytes("Caf\xe9 NN B\n".encode("latin-1"))
    return path


def _one_column(directory):
    path = directory / "one.data"
    path.write_text("word\nother\n")
    return path


def _copy(path, directory, name):
    copy = directory / name
    copy.write_bytes(Path(path).read_bytes())
    return copy


_ERRORS = {
    "missing train file": (
        lambda f, d: ["train", "-t", f.template, d / "nope.data", d / "m.pkl"],
        ["cannot read data file", "nope.data", "No such file"],
    ),
    "missing template": (
        lambda f, d: ["train", "-t", d / "nope.tpl", f.train, d / "m.pkl"],
        ["cannot read template file", "nope.tpl"],
    ),
    "bad template line": (
        lambda f, d: ["train", "-t", _bad_template(d), f.train, d / "m.pkl"],
        ["bad.template", "template line 3", "X01:%x[0,1]"],
    ),
    "unknown encoding": (
        lambda f, d: ["train", "-t", f.template, "--encoding", "no-such-codec",
                      f.train, d / "m.pkl"],
        ["encoding 'no-such-codec' is not a known codec"],
    ),
    "undecodable file": (
        lambda f, d: ["train", "-t", f.template, _undecodable(d), d / "m.pkl"],
        ["latin1.data, line 1", "cannot decode", "'utf-8'"],
    ),
    "unknown optimizer": (
        lambda f, d: ["train", "-t", f.template, "--optimizer", "adam", f.train,
                      d / "m.pkl"],
        ["optimizer must be one of", "lbfgs", "'adam'"],
    ),
    "missing model directory": (
        lambda f, d: ["train", "-t", f.template, f.train, d / "no" / "m.pkl"],
        ["cannot write model file", "does not exist"],
    ),
    # These two were refused only when saving, after the fit.
    "empty model path": (
        lambda f, d: ["train", "-t", f.template, f.train, ""],
        ["cannot write model file to an empty path"],
    ),
    "model path ending in a separator": (
        lambda f, d: ["train", "-t", f.template, f.train, f"{d / 'no'}/"],
        ["cannot write model file", "it names a directory"],
    ),
    # Refused with the template, before the training file is read (it was
    # refused after reading and expanding it; this one does not exist).
    "template without a U line": (
        lambda f, d: ["train", "-t", _bigrams_only(d), d / "nope.data", d / "m.pkl"],
        ["b.template: the template has no U (unigram) line"],
    ),
    "missing model file": (
        lambda f, d: ["predict", d / "nope.pkl", f.test],
        ["cannot read model file", "nope.pkl"],
    ),
    "data file as model": (
        lambda f, d: ["predict", f.train, f.test],
        ["is not a skgpstruct model file"],
    ),
    "pickle of another object": (
        lambda f, d: ["predict", _pickled({"a": 1}, d), f.test],
        ["is not a skgpstruct model file", "'format'"],
    ),
    "model of another version": (
        lambda f, d: ["evaluate", _other_version_model(f, d), f.test],
        ["skgpstruct 0.0.1", f"installed version is {skgpstruct.__version__}"],
    ),
    "unloadable model of another version": (
        lambda f, d: ["predict", _moved_class_model(f, d), f.test],
        ["skgpstruct 0.0.1", f"installed version is {skgpstruct.__version__}"],
    ),
    "model without its encoding": (  # was a KeyError traceback
        lambda f, d: ["predict", _without_encoding(f, d), f.test],
        ["is damaged", "the encoding"],
    ),
    "model written to standard output": (  # was written to a file named '-'
        lambda f, d: ["train", "-t", f.template, f.train, "-"],
        ["MODEL_FILE cannot be '-'"],
    ),
    "template and data both from standard input": (
        lambda f, d: ["train", "-t", "-", "-", d / "m.pkl"],
        ["cannot both be read from standard input"],
    ),
    "wrong number of columns": (
        lambda f, d: ["predict", f.model, _one_column(d)],
        ["one.data has 1 columns per token", "give 2 columns", "or 3"],
    ),
    # Outputs over inputs (a slip in the order of the arguments) replaced
    # the data file, the template or the model, with exit status 0.
    "model file over the training file": (
        lambda f, d: ["train", "-t", f.template, *[_copy(f.train, d, "t.data")] * 2],
        ["cannot write model file", "it is the training file"],
    ),
    "model file over the template": (
        lambda f, d: ["train", "-t", _copy(f.template, d, "tpl"), f.train, d / "tpl"],
        ["cannot write model file", "it is the template file"],
    ),
    "model file over a data file": (
        lambda f, d: ["train", "-t", f.template, f.train, _copy(f.test, d, "x.data")],
        ["x.data' exists and is not a skgpstruct model file"],
    ),
    "predictions over the model file": (
        lambda f, d: ["predict", "-o", _copy(f.model, d, "c.pkl"), d / "c.pkl", f.test],
        ["cannot write output file", "it is the model file"],
    ),
    "predictions over the input file": (
        lambda f, d: ["predict", "-o", _copy(f.test, d, "in.data"), f.model,
                      d / "in.data"],
        ["cannot write output file", "it is the input file"],
    ),
    # 'rot13' is a codec but not a text encoding: a LookupError traceback
    "codec that is not a text encoding": (
        lambda f, d: ["train", "-t", f.template, "--encoding", "rot13", f.train,
                      d / "m.pkl"],
        ["'rot13' is not a text encoding"],
    ),
    # basenp's untyped B / I under the IOE1 scheme: the message said y_true[0]
    "labels foreign to the scheme": (
        lambda f, d: ["evaluate", "--scheme", "ioe1", f.model, f.test],
        ["test.data: sequence 1 of the gold labels has the label 'B'", "ioe1"],
    ),
    # one training sequence of one label: LogisticRegression's traceback
    "demo with a single label": (
        lambda f, d: ["demo", "--n-sequences", "1", "--random-state", "16",
                      "--max-iter", "3", "-q"],
        ["--n-sequences 1 with --random-state 16", "single label"],
    ),
}


@needs_shared_data
@pytest.mark.parametrize("case", list(_ERRORS))
def test_bad_input_exits_2_with_a_message(case, fold, trained, tmp_path):
    make_args, fragments = _ERRORS[case]
    result = _run(*make_args(fold, tmp_path))
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    assert "error: " in result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, (fragment, result.stderr)
    assert not (tmp_path / "m.pkl").exists()
    for copy, source in [("t.data", fold.train), ("tpl", fold.template),
                         ("x.data", fold.test), ("c.pkl", fold.model),
                         ("in.data", fold.test)]:
        if (tmp_path / copy).exists():  # an input the command refused to replace
            assert (tmp_path / copy).read_bytes() == Path(source).read_bytes()


@needs_shared_data
def test_train_prints_the_template_warning_as_its_own(fold, tmp_path):
    # A B line with macros: the vectorizer's UserWarning was printed with
    # its source file and line.
    template = tmp_path / "template"
    template.write_text("U00:%x[0,0]\nB01:%x[0,1]\n", encoding="utf-8")
    result = _run("train", "-t", template, "--max-iter", "3", "-q", fold.train,
                  tmp_path / "m.pkl")
    assert result.returncode == 0, result.stderr
    assert f"skgpstruct: warning: {template}: the template's B lines" in (
        result.stderr
    )
    assert "UserWarning" not in result.stderr


@pytest.mark.parametrize(
    ("gold", "predicted", "n_right", "found", "correct"),
    [
        # 29 of 100 tokens and chunks right: 0.29 * 100 is 28.999... in
        # floating point.
        (["B-A"] * 100, ["B-A"] * 29 + ["O"] * 71, 29, 29, 29),
        # 22 chunks found, 15 correct: 15 / 22 * 22 is 14.999...
        (["B-A", "O"] * 15 + ["O", "O"] * 7, ["B-A", "O"] * 22, 37, 22, 15),
    ],
)
def test_conlleval_report_counts_are_the_labels_counts(
    gold, predicted, n_right, found, correct
):
    # The report's counts are recovered from rates: they must be the counts
    # themselves, taken here from the labels.
    assert sum(g == p for g, p in zip(gold, predicted, strict=True)) == n_right
    report = classification_report([gold], [predicted], output_dict=True)
    lines = cli._conlleval_report(report, len(gold)).splitlines()
    assert f"({n_right} of {len(gold)} tokens)" in lines[0]
    assert f"found: {found} phrases; correct: {correct}." in lines[1]


def _train_exit(arguments, tmp_path):
    """main(["train", ...]) on three tiny sequences: (exit code, stderr)."""
    template = tmp_path / "template"
    template.write_text("U0:%x[0,0]\n")
    data = tmp_path / "train.data"
    # token a three times, b twice, c once
    data.write_text("a X\nb Y\n\na X\nc Y\n\na X\nb Y\n")
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(["train", "-q", "--max-iter", "5", "--n-inducing", "2",
                         "-t", str(template), *arguments, str(data),
                         str(tmp_path / "model.skgp")])
        except SystemExit as exc:
            code = exc.code
    return code, err.getvalue()


def test_train_min_count_reaches_the_template_features(tmp_path):
    # --min-count 2 keeps the features of a (3 times) and b (2), not c (1);
    # --min-count 4 keeps none, which is refused.
    code, _ = _train_exit(["--min-count", "2"], tmp_path)
    assert code == 0
    vocabulary = cli._load_model(tmp_path / "model.skgp")["pipeline"][0].vocabulary_
    assert sorted(vocabulary) == ["U0:a", "U0:b"]
    code, err = _train_exit(["--min-count", "4"], tmp_path)
    assert code == 2 and err


def test_train_refuses_a_negative_random_state(tmp_path):
    code, err = _train_exit(["--random-state", "-1"], tmp_path)
    assert code == 2 and "expected an integer >= 0" in err


@needs_shared_data
def test_evaluate_needs_a_gold_column(fold, trained, tmp_path):
    no_gold = tmp_path / "no_gold.data"
    write_conll(no_gold, [[row[:1] for row in seq] for seq in fold.test_tokens],
                [[row[1] for row in seq] for seq in fold.test_tokens])
    result = _run("evaluate", "-q", fold.model, no_gold)
    assert result.returncode == 2
    assert result.stderr.startswith("skgpstruct: error: ")
    assert "no gold label column" in result.stderr


@needs_shared_data
@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_standard_output_on_a_full_disk_is_a_command_error(fold, trained, tmp_path):
    # A traceback, "a bug in skgpstruct" and status 1; -o gave status 2.
    for command in ("predict", "evaluate"):
        with open("/dev/full", "w") as full:
            result = _run(command, fold.model, fold.test, stdout=full)
        assert result.returncode == 2, result.stderr
        assert "Traceback" not in result.stderr
        assert "cannot write to standard output: No space left" in result.stderr


@needs_shared_data
def test_evaluate_writes_its_report_for_the_console(fold, trained, tmp_path,
                                                    monkeypatch):
    # A chunk type the console could not show (here an ASCII one) was a
    # UnicodeEncodeError traceback: now escaped. The report is text for the
    # console whatever the data's encoding (latin-1 here).
    tokens, labels = read_conll(fold.test)
    typed = [[{"B": "B-Café", "I": "I-Café"}.get(t, t) for t in seq] for seq in labels]
    gold = tmp_path / "typed.data"
    write_conll(gold, tokens, typed, encoding="latin-1")
    for console, shown in (("ascii", rb"Caf\xe9"), ("utf-8", "Café".encode())):
        monkeypatch.setenv("PYTHONIOENCODING", console)
        result = _run("evaluate", "--encoding", "latin-1", fold.model, gold,
                      text=False)
        assert result.returncode == 0, result.stderr
        assert shown in result.stdout


def test_closed_standard_input_is_a_command_error(monkeypatch, capsys):
    # An AttributeError traceback (sys.stdin is None).
    monkeypatch.setattr(sys, "stdin", None)
    assert main(["train", "-t", "-", "x.data", "m.pkl"]) == 2
    assert "cannot read template file from standard input: it is closed" in (
        capsys.readouterr().err
    )


def test_output_that_its_encoding_cannot_hold_is_a_command_error(tmp_path):
    # The same check as write_conll's (skgpstruct.io), before the file opens.
    from skgpstruct.cli import CommandError, _write_text

    path = tmp_path / "out.data"
    path.write_text("KEPT\n", encoding="utf-8")
    with pytest.raises(CommandError, match=r"cannot encode '日本' \(line 2 of the "
                       r"output\) with encoding='latin-1'.*\(with --encoding\)"):
        _write_text("a O\n日本 O\n", str(path), "latin-1")
    assert path.read_text(encoding="utf-8") == "KEPT\n"


def test_outputs_are_checked_for_writing_where_they_are_written(monkeypatch, tmp_path):
    # The tests run as root, who may write anywhere: os.access is replaced
    # by a table of what is writable. An existing file is written in place
    # (its folder may be read-only: /dev/null); a new one needs its folder.
    existing = tmp_path / "existing.out"
    existing.write_text("")
    writable = {str(existing)}
    monkeypatch.setattr(cli.os, "access", lambda path, mode: str(path) in writable)
    cli._check_output_path(str(existing), "output file")  # its folder read-only
    with pytest.raises(cli.CommandError, match="directory .* is not writable"):
        cli._check_output_path(str(tmp_path / "new.out"), "output file")
    writable.clear()
    with pytest.raises(cli.CommandError, match="existing.out': it is not writable"):
        cli._check_output_path(str(existing), "output file")
    writable.add(str(tmp_path))
    cli._check_output_path(str(tmp_path / "new.out"), "output file")


def test_a_failed_model_write_leaves_the_earlier_model_file(tmp_path, monkeypatch):
    # joblib wrote onto MODEL_FILE itself: a full disk truncated the earlier
    # model (which predict then could not load) and left a partial file.
    path = tmp_path / "model.skgp"
    cli._save_model({"model": 1}, str(path))
    path.chmod(0o640)
    before = path.read_bytes()

    def full_disk(value, filename, *args, **kwargs):
        with open(filename, "wb") as handle:
            handle.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(joblib, "dump", full_disk)
    with pytest.raises(cli.CommandError,
                       match="cannot write model file .*No space left on device"):
        cli._save_model({"model": 2}, str(path))
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["model.skgp"]  # no leftover
    monkeypatch.undo()
    # A write that succeeds replaces it, with the permissions it had; a new
    # file gets the umask's.
    cli._save_model({"model": 3}, str(path))
    assert joblib.load(path) == {"model": 3}
    assert path.stat().st_mode & 0o777 == 0o640
    umask = os.umask(0o022)
    try:
        cli._save_model({"model": 4}, str(tmp_path / "new.skgp"))
    finally:
        os.umask(umask)
    assert (tmp_path / "new.skgp").stat().st_mode & 0o777 == 0o644


def test_a_model_file_path_that_is_not_a_plain_file(tmp_path):
    # The atomic save replaced what the path named: /dev/null became a
    # regular file (the tests run as root), a symbolic link a file of its
    # own (its target keeping the old model). Now a link's target is
    # replaced and the link kept, a FIFO or device written to as it is.
    target = tmp_path / "models" / "model.skgp"
    target.parent.mkdir()
    cli._save_model({"model": 1}, str(target))
    link = tmp_path / "link.skgp"
    link.symlink_to(target)
    cli._save_model({"model": 2}, str(link))
    assert link.is_symlink() and joblib.load(target) == {"model": 2}
    dangling = tmp_path / "dangling.skgp"
    dangling.symlink_to(tmp_path / "models" / "new.skgp")
    cli._save_model({"model": 3}, str(dangling))
    assert dangling.is_symlink() and joblib.load(dangling) == {"model": 3}
    # a FIFO: written to as it is, by a reader at the other end
    import threading

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    cli._save_model({"model": 4}, str(fifo))
    reader.join(timeout=30)
    assert received and received[0].startswith(b"\x80")  # a pickle
    assert fifo.is_fifo()
    # a name whose long "extension" is not a compression one saves (the
    # temporary name carried it, beyond the file system's name limit)
    long_name = tmp_path / ("model." + "x" * 240)
    cli._save_model({"model": 6}, str(long_name))
    assert joblib.load(long_name) == {"model": 6}
    long_name.unlink()
    # the name's extension still picks joblib's compression
    cli._save_model({"model": 5}, str(tmp_path / "packed.gz"))
    assert (tmp_path / "packed.gz").read_bytes()[:2] == b"\x1f\x8b"
    assert cli._written_version(str(tmp_path / "packed.gz")) is None  # no version
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "dangling.skgp", "link.skgp", "models", "packed.gz", "pipe",
    ]
    assert sorted(p.name for p in target.parent.iterdir()) == ["model.skgp", "new.skgp"]


def test_a_model_file_in_a_directory_that_takes_no_new_file(tmp_path, monkeypatch):
    # Written in place, as before, where no temporary file can be made
    # beside a writable model file (a directory without write permission;
    # simulated: the tests may run as root, who writes anywhere); refused
    # with the reason where the model file is new.
    path = tmp_path / "model.skgp"
    cli._save_model({"model": 1}, str(path))

    def no_new_file(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(cli.tempfile, "mkstemp", no_new_file)
    cli._save_model({"model": 2}, str(path))
    assert joblib.load(path) == {"model": 2}
    with pytest.raises(cli.CommandError, match="cannot write model file .*Permission"):
        cli._save_model({"model": 3}, str(tmp_path / "new.skgp"))


@pytest.mark.parametrize("compress", [0, 3, "gzip", "bz2", "xz", "lzma"])
def test_a_recompressed_model_file_is_recognised(tmp_path, compress):
    # predict loads a model file the user recompressed with joblib; train's
    # guard against overwriting a file that is not a model, and the
    # other-version message, read its header through the decompressor (they
    # read uncompressed files only: train refused to overwrite it).
    path = tmp_path / "model.skgp"
    joblib.dump({"format": cli.MODEL_FORMAT, "skgpstruct_version": "0.0.1",
                 "pipeline": None}, path, compress=compress)
    assert cli._written_version(str(path)) == "0.0.1"
    # a compressed file that is not a model, and a damaged one, are not
    joblib.dump({"format": "other"}, tmp_path / "other.pkl", compress=compress)
    assert cli._written_version(str(tmp_path / "other.pkl")) is None
    (tmp_path / "damaged.skgp").write_bytes(path.read_bytes()[:12])
    assert cli._written_version(str(tmp_path / "damaged.skgp")) is None
