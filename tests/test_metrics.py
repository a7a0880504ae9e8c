import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GridSearchCV, KFold, cross_val_score, cross_validate
from sklearn.pipeline import Pipeline

from skgpstruct._sequences import (
    check_sequence_features,
    check_sequence_labels,
    split_by_offsets,
    stack_sequences,
)
from skgpstruct.features import CRFppTemplateVectorizer, SequenceDictVectorizer
from skgpstruct.io import read_conll
from skgpstruct.metrics import (
    SCORERS,
    chunk_f1_score,
    chunk_f1_scorer,
    chunk_precision_recall_fscore_support,
    chunk_precision_score,
    chunk_recall_score,
    classification_report,
    get_sequence_scorer,
    sequence_accuracy,
    token_accuracy,
    token_accuracy_scorer,
)


def counts(y_true, y_pred, scheme=None):
    """Overall chunk (precision, recall, F1, support)."""
    p, r, f, support = chunk_precision_recall_fscore_support(
        y_true, y_pred, scheme=scheme
    )
    return p, r, f, support


def test_token_and_sequence_accuracy():
    y_true = [["B-NP", "I-NP", "O"], ["O"]]
    y_pred = [np.array(["B-NP", "O", "O"]), ["O"]]
    assert token_accuracy(y_true, y_pred) == 3 / 4
    assert sequence_accuracy(y_true, y_pred) == 1 / 2
    assert token_accuracy([[1, 2], [3]], [[1, 2], [0]]) == 2 / 3


@pytest.mark.parametrize(
    "y_true, y_pred, message",
    [
        ([["O"]], [["O"], ["O"]], "different numbers of sequences: 1 and 2"),
        ([["O", "O"]], [["O"]], "sequence 0 has 2 labels in y_true but 1 in y_pred"),
        ("O", [["O"]], "y_true must be a list of per-sequence label lists"),
        ([["O"]], ["O"], r"y_pred\[0\] is a single string"),
        ([], [], "no sequences"),
        ([[0, 1]], [["0", "1"]], "mix label types"),  # was 0.0, silently
        # Were 0.0, 1.0 (NumPy made the 1 a "1") and 1.0 (the dict's keys).
        ([[b"O"]], [["O"]], r"bytes labels in y_true, string labels in y_pred"),
        ([["B-NP", 1]], [["B-NP", "1"]], r"y_true mixes label types \(number, "
         r"string\)"),
        ({0: ["O"]}, {0: ["O"]}, "y_true must be a list of per-sequence label"),
        ([["O"]], {"O"}, "y_pred must be a list of per-sequence label"),
    ],
)
def test_bad_label_sequences(y_true, y_pred, message):
    with pytest.raises(ValueError, match=message):
        token_accuracy(y_true, y_pred)


def test_object_arrays_of_strings_are_strings():
    # A model fitted on object-array labels (pandas) predicts object arrays;
    # they were refused as "mixing" with lists of str.
    y_true = [["B-NP", "O"], ["O"]]
    y_pred = [np.array(["B-NP", "B-NP"], dtype=object), np.array(["O"], dtype=object)]
    assert token_accuracy(y_true, y_pred) == 2 / 3
    assert sequence_accuracy(y_pred, y_true) == 1 / 2


# Hand-computed cases; each gives (true chunks, predicted chunks, correct).
CONLLEVAL_CASES = [
    # Perfect IOB2.
    ([["B-NP", "I-NP", "O", "B-VP"]], [["B-NP", "I-NP", "O", "B-VP"]], 2, 2, 2),
    # Chunks that start with I- (IOB1) equal the B- started ones.
    ([["I-NP", "I-NP", "O", "B-VP"]], [["B-NP", "I-NP", "O", "I-VP"]], 2, 2, 2),
    # IOB1: B- after I- of the same type starts a second chunk.
    ([["I-NP", "I-NP", "B-NP"]], [["I-NP", "I-NP", "I-NP"]], 2, 1, 0),
    # A type change without B- ends one chunk and starts another.
    ([["B-NP", "I-NP", "I-VP"]], [["B-NP", "I-NP", "I-NP"]], 2, 1, 0),
    ([["B-NP", "I-NP", "I-VP"]], [["B-NP", "I-NP", "B-VP"]], 2, 2, 2),
    # O between chunks: two chunks, the I- after O starts the second.
    ([["B-NP", "O", "I-NP"]], [["B-NP", "I-NP", "I-NP"]], 2, 1, 0),
    ([["B-NP", "O", "I-NP"]], [["B-NP", "O", "B-NP"]], 2, 2, 2),
    # Right span, wrong type of its last token: no match (and 2 predicted).
    ([["B-NP", "I-NP"]], [["B-NP", "I-VP"]], 1, 2, 0),
    # Right type and start, wrong end.
    ([["B-PER", "I-PER", "O", "B-LOC"]], [["B-PER", "O", "O", "B-LOC"]], 2, 2, 1),
    # Chunks never cross sequence boundaries.
    ([["B-NP", "I-NP"], ["I-NP"]], [["B-NP", "I-NP"], ["I-NP"]], 2, 2, 2),
    # Untyped tags (CRF++ basenp): chunks of the empty type.
    ([["B", "I", "O", "B"]], [["B", "I", "O", "I"]], 2, 2, 2),
    ([["B", "B", "I"]], [["B", "I", "I"]], 2, 1, 0),
    # IOE: E- ends a chunk, the next I- starts one.
    ([["I-NP", "E-NP", "I-NP"]], [["I-NP", "I-NP", "I-NP"]], 2, 1, 0),
    ([["I-NP", "E-NP", "I-NP"]], [["E-NP", "E-NP", "E-NP"]], 2, 3, 1),
    # Empty: no chunks at all gives 0, as conlleval.
    ([["O", "O"]], [["O", "O"]], 0, 0, 0),
    # Chunks that neither a "." nor the virtual "O" after a sequence ends
    # (conlleval's rules have no end after "." or an unknown tag such as
    # "S"): conlleval counts them when they end later, or at the end of the
    # corpus. They were dropped: identical sequences scored 0. (These and
    # random corpora of such tags agree with conlleval.pl run under perl.)
    ([["B", "."]], [["B", "."]], 1, 1, 1),
    ([["B", "S"]], [["B", "S"]], 1, 1, 1),
    ([["B-X", "I-X"], ["B", "S"]], [["B-X", "I-X"], ["B", "S"]], 2, 2, 2),
    ([["B", "."], ["B"]], [["B", "."], ["O"]], 2, 1, 0),
    ([["B", "."], ["I", "O"]], [["B", "."], ["I", "O"]], 2, 2, 1),
    # A typed "." neither ends the chunk before it nor starts one of its
    # type (conlleval.pl: 1 true, 1 and 2 found, none correct).
    ([["B-A", "I-A"]], [["B-A", ".-A"]], 1, 1, 0),
    ([["B-A", "I-A", "I-A"]], [["B-A", ".-A", "B-B"]], 1, 2, 0),
]


@pytest.mark.parametrize("y_true, y_pred, n_true, n_pred, n_correct", CONLLEVAL_CASES)
def test_conlleval_corner_cases(y_true, y_pred, n_true, n_pred, n_correct):
    p, r, f, support = counts(y_true, y_pred)
    precision = n_correct / n_pred if n_pred else 0.0
    recall = n_correct / n_true if n_true else 0.0
    f1 = 2 * precision * recall / (precision + recall) if n_correct else 0.0
    assert support == n_true
    assert p == pytest.approx(precision)
    assert r == pytest.approx(recall)
    assert f == pytest.approx(f1)
    assert chunk_f1_score(y_true, y_pred) == pytest.approx(f1)
    assert chunk_precision_score(y_true, y_pred) == pytest.approx(precision)
    assert chunk_recall_score(y_true, y_pred) == pytest.approx(recall)


def test_per_type_scores():
    y_true = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG"]]
    y_pred = [["B-PER", "O", "O", "B-LOC"], ["B-LOC"]]
    p, r, f, support, types = chunk_precision_recall_fscore_support(
        y_true, y_pred, average=None
    )
    assert types.tolist() == ["LOC", "ORG", "PER"]
    np.testing.assert_allclose(p, [0.5, 0.0, 0.0])
    np.testing.assert_allclose(r, [1.0, 0.0, 0.0])
    np.testing.assert_allclose(f, [2 / 3, 0.0, 0.0])
    np.testing.assert_array_equal(support, [1, 1, 1])
    # Overall: 3 true, 3 predicted, 1 correct.
    assert chunk_f1_score(y_true, y_pred) == pytest.approx(1 / 3)


@pytest.mark.parametrize("scheme", [None, "iob2"])
def test_bytes_labels_are_split_as_their_text(scheme):
    # str(b"B-NP") is "b'B-NP'": the tag "b'B" and the type "NP'" scored 0.5
    # where the text's labels score 0.
    y_true = [["B-NP", "I-NP", "B-NP", "O"], ["B-VP"]]
    y_pred = [["B-NP", "I-NP", "I-NP", "O"], ["B-VP"]]
    expected = chunk_precision_recall_fscore_support(
        y_true, y_pred, average=None, scheme=scheme
    )
    for encode in (
        lambda y: [[label.encode() for label in s] for s in y],
        lambda y: [np.array(s, dtype="S") for s in y],
    ):
        got = chunk_precision_recall_fscore_support(
            encode(y_true), encode(y_pred), average=None, scheme=scheme
        )
        for a, b in zip(got, expected, strict=True):
            np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match=r"y_true\[0\] has the bytes label "
                       r"b'\\xff-NP', which is not UTF-8"):
        chunk_f1_score([[b"\xff-NP"]], [[b"O"]], scheme=scheme)


def test_iobes_needs_its_scheme():
    y = [["S-PER", "B-PER", "E-PER", "B-PER", "E-PER"]]
    # conlleval does not know S- and merges E-X followed by B-X.
    assert counts(y, y)[3] == 1
    assert counts(y, y, scheme="iobes")[3] == 3
    pred = [["S-PER", "B-PER", "I-PER", "E-PER", "S-PER"]]
    p, r, f, support = counts(y, pred, scheme="iobes")
    assert (p, r, support) == (pytest.approx(1 / 3), pytest.approx(1 / 3), 3)


@pytest.mark.parametrize("scheme", ["iob1", "iob2", "ioe1", "ioe2", "iobes"])
def test_schemes_reject_foreign_tags(scheme):
    foreign = {"iob1": "E-NP", "iob2": "S-NP", "ioe1": "B-NP", "ioe2": "B-NP",
               "iobes": "X-NP"}[scheme]
    with pytest.raises(ValueError, match=f"y_pred\\[1\\] has the label '{foreign}'"):
        chunk_f1_score([["O"], ["O"]], [["O"], [foreign]], scheme=scheme)


@pytest.mark.parametrize(
    ("scheme", "y"),
    [
        (None, [["B-A", "I-A", "O", "I-A", "O", "B-A"]]),
        ("iob1", [["I-A", "I-A", "O", "B-A", "O", "I-A"]]),
        ("iob2", [["B-A", "I-A", "O", "B-A", "O", "B-A"]]),
        ("ioe1", [["I-A", "O", "I-A", "E-A", "I-A", "O"]]),
        ("ioe2", [["I-A", "E-A", "O", "E-A", "O", "E-A"]]),
        ("iobes", [["B-A", "E-A", "O", "S-A", "O", "S-A"]]),
    ],
)
def test_a_typed_outside_tag_is_outside(scheme, y):
    # "O-A" is an outside tag as "O" is, before and after a chunk.
    typed = [["O-A" if tag == "O" else tag for tag in s] for s in y]
    expected = counts(y, y, scheme=scheme)
    assert expected[0] == 1.0 and expected[3] >= 3
    assert counts(y, typed, scheme=scheme) == expected
    assert counts(typed, y, scheme=scheme) == expected

def test_unknown_scheme():
    with pytest.raises(ValueError, match="scheme must be None .* got 'bio'"):
        chunk_f1_score([["O"]], [["O"]], scheme="bio")
    with pytest.raises(ValueError, match="average must be"):
        chunk_precision_recall_fscore_support([["O"]], [["O"]], average="macro")


# Plain reference: chunk spans as sets, for IOB and IOBES labels (lenient:
# a chunk may start with I-).


def reference_spans(seq, scheme):
    spans, start = set(), None
    parsed = [(lab.partition("-")[0], lab.partition("-")[2]) for lab in seq]
    for t, (tag, type_) in enumerate(parsed):
        prev_tag, prev_type = parsed[t - 1] if t else ("O", "")
        if tag == "O":
            continue
        if scheme == "iob":
            begins = tag == "B" or prev_tag == "O" or prev_type != type_
        else:
            begins = tag in "BS" or prev_tag in "OES" or prev_type != type_
        if begins:
            start = t
        nxt_tag, nxt_type = parsed[t + 1] if t + 1 < len(seq) else ("O", "")
        if scheme == "iob":
            continues = nxt_tag == "I" and nxt_type == type_
        else:
            continues = tag in "BI" and nxt_tag in "IE" and nxt_type == type_
        if not continues:
            spans.add((start, t, type_))
    return spans


def reference_counts(y_true, y_pred, scheme):
    n_true = n_pred = n_correct = 0
    for a, b in zip(y_true, y_pred, strict=True):
        sa, sb = reference_spans(a, scheme), reference_spans(b, scheme)
        n_true, n_pred, n_correct = n_true + len(sa), n_pred + len(sb), n_correct + len(
            sa & sb)
    return n_true, n_pred, n_correct


def label_pairs(labels):
    seq = st.lists(st.sampled_from(labels), min_size=1, max_size=8)
    return st.lists(seq, min_size=1, max_size=4).flatmap(
        lambda ys: st.tuples(
            st.just(ys),
            st.tuples(*[st.lists(st.sampled_from(labels), min_size=len(s),
                                 max_size=len(s)) for s in ys]).map(list),
        )
    )


def check_against_reference(y_true, y_pred, scheme, reference_scheme):
    n_true, n_pred, n_correct = reference_counts(y_true, y_pred, reference_scheme)
    p, r, f, support = counts(y_true, y_pred, scheme=scheme)
    assert support == n_true
    assert p == pytest.approx(n_correct / n_pred if n_pred else 0.0)
    assert r == pytest.approx(n_correct / n_true if n_true else 0.0)


@settings(max_examples=150, deadline=None)
@given(label_pairs(["O", "B-X", "I-X", "B-Y", "I-Y", "B", "I"]))
def test_conlleval_and_iob_match_span_reference(pair):
    y_true, y_pred = pair
    check_against_reference(y_true, y_pred, None, "iob")
    check_against_reference(y_true, y_pred, "iob2", "iob")


@settings(max_examples=150, deadline=None)
@given(label_pairs(["O", "B-X", "I-X", "E-X", "S-X", "B-Y", "E-Y", "S-Y"]))
def test_iobes_matches_span_reference(pair):
    y_true, y_pred = pair
    check_against_reference(y_true, y_pred, "iobes", "iobes")


def test_chunk_scores_refuse_numbers():
    # Integer-coded labels have no chunk tag: every score was 0, even of a
    # perfect prediction (a search with chunk_f1 compared zeros).
    y = [[1, 2, 0, 3, 4]]
    for score in (chunk_f1_score, chunk_precision_score, chunk_recall_score):
        with pytest.raises(ValueError, match=r"chunk scores need text labels with "
                           r"chunk tags .* the labels are numbers \(e.g. 1\)"):
            score(y, y)
    assert chunk_f1_score([["B-X", "O"]], [["B-X", "O"]]) == 1.0


def test_yes_no_arguments_refuse_other_values():
    # A truthy string did the opposite of what it said: "no" meant yes.
    import skgpstruct.chain as chain
    from skgpstruct.kernels import check_kernel

    y = [["B-NP", "O"]]
    with pytest.raises(ValueError, match="output_dict must be True or False"):
        classification_report(y, y, output_dict="no")
    potentials = np.zeros((1, 2, 2))
    args = (potentials, potentials, np.array([0, 2]), np.zeros(2, int))
    with pytest.raises(ValueError, match="return_gradient must be True or False"):
        chain.log_likelihood(*args, return_gradient="no")
    with pytest.raises(ValueError, match="sparse must be True or False"):
        check_kernel("rbf", sparse="no")
    assert len(chain.log_likelihood(*args, return_gradient=np.True_)) == 3


def test_report_counts_predicted_chunks_right_or_wrong():
    # Counted by hand: PER 1 true, 2 predicted, 0 correct; LOC 0 true, 1
    # predicted; 3 predicted in all.
    report = classification_report(
        [["B-PER", "O", "O"]], [["B-LOC", "B-PER", "B-PER"]], output_dict=True
    )
    assert (report["PER"]["support"], report["PER"]["predicted"]) == (1, 2)
    assert (report["LOC"]["support"], report["LOC"]["predicted"]) == (0, 1)
    assert report["micro avg"]["predicted"] == 3
    assert report["micro avg"]["precision"] == 0.0


@pytest.mark.parametrize("metric", [token_accuracy, classification_report])
def test_token_metrics_refuse_labels_without_tokens(metric):
    # (A ValueError that says so, not a division by zero.)
    with pytest.raises(ValueError, match="no tokens"):
        metric([[]], [[]])


def test_classification_report_text_and_dict():
    y_true = [["B-PER", "I-PER", "O", "B-LOC"], ["B", "O"]]
    y_pred = [["B-PER", "I-PER", "O", "O"], ["B", "O"]]
    report = classification_report(y_true, y_pred, output_dict=True)
    assert set(report) == {"", "LOC", "PER", "micro avg", "token accuracy"}
    assert report["PER"] == {"precision": 1.0, "recall": 1.0, "f1-score": 1.0,
                             "support": 1, "predicted": 1}
    assert report["LOC"]["recall"] == 0.0 and report["LOC"]["predicted"] == 0
    assert report["micro avg"]["support"] == 3
    assert report["micro avg"]["precision"] == 1.0
    assert report["micro avg"]["recall"] == pytest.approx(2 / 3)
    assert report["token accuracy"] == pytest.approx(5 / 6)
    text = classification_report(y_true, y_pred, digits=2)
    lines = text.splitlines()
    assert lines[0].split() == [
        "precision", "recall", "f1-score", "support", "predicted"
    ]
    assert lines[2].split() == ["(untyped)", "1.00", "1.00", "1.00", "1", "1"]
    assert lines[3].split() == ["LOC", "0.00", "0.00", "0.00", "1", "0"]
    assert lines[-2].split() == ["micro", "avg", "1.00", "0.67", "0.80", "3", "2"]
    assert lines[-1].split() == ["token", "accuracy", "0.83"]
    # A format error ("Format specifier missing precision") before.
    for digits in (-1, "a", True):
        with pytest.raises(ValueError, match="digits must be an integer >= 0"):
            classification_report(y_true, y_pred, digits=digits)


@pytest.mark.shared_data
def test_shared_data_label_sets(shared_data_dir):
    """Chunk counts on the shared labels (710 B- plus 2 I- starts in JapaneseNE)."""
    crfpp = shared_data_dir / "crfpp"
    for folder, encoding, n_chunks in [("basenp", "utf-8", 5051),
                                       ("chunking", "utf-8", 9715),
                                       ("JapaneseNE", "euc-jp", 712)]:
        _, y = read_conll(crfpp / folder / "test.data", encoding=encoding)
        p, r, f, support = counts(y, y)
        assert (p, r, f) == (1.0, 1.0, 1.0)
        assert support == n_chunks
        assert counts(y, y, scheme="iob2")[3] == n_chunks
        outside = [["O"] * len(s) for s in y]
        assert chunk_f1_score(y, outside) == 0.0


class PerTokenLogistic(ClassifierMixin, BaseEstimator):
    """A tiny sequence labeller: one logistic regression over all tokens."""

    def __init__(self, C=1.0):
        self.C = C

    def fit(self, X, y):
        sequences, _ = check_sequence_features(X)
        stacked, offsets = stack_sequences(sequences)
        labels = check_sequence_labels(y, np.diff(offsets))
        self.model_ = LogisticRegression(C=self.C, max_iter=200)
        self.model_.fit(stacked, np.concatenate(labels))
        self.classes_ = self.model_.classes_
        return self

    def predict(self, X):
        sequences, _ = check_sequence_features(
            X, n_features=self.model_.coef_.shape[1]
        )
        stacked, offsets = stack_sequences(sequences)
        return split_by_offsets(self.model_.predict(stacked), offsets)


TOY_SENTENCES = [
    ("the/DT cat/NN sat/VBD on/IN the/DT mat/NN", "B-NP I-NP B-VP B-PP B-NP I-NP"),
    ("a/DT dog/NN ran/VBD", "B-NP I-NP B-VP"),
    ("the/DT dog/NN sat/VBD", "B-NP I-NP B-VP"),
    ("a/DT cat/NN ran/VBD to/IN a/DT dog/NN", "B-NP I-NP B-VP B-PP B-NP I-NP"),
    ("dogs/NNS ran/VBD", "B-NP B-VP"),
    ("cats/NNS sat/VBD on/IN mats/NNS", "B-NP B-VP B-PP B-NP"),
]
TOY_X = [[w.split("/") for w in s.split()] for s, _ in TOY_SENTENCES]
TOY_Y = [labels.split() for _, labels in TOY_SENTENCES]


def test_scorers_on_fitted_estimator():
    vec = CRFppTemplateVectorizer("U0:%x[0,0]\nU1:%x[0,1]\nU2:%x[-1,1]")
    model = Pipeline([("vec", vec), ("clf", PerTokenLogistic(C=10.0))])
    model.fit(TOY_X, TOY_Y)
    predicted = model.predict(TOY_X)
    accuracy = token_accuracy(TOY_Y, predicted)
    assert token_accuracy_scorer(model, TOY_X, TOY_Y) == accuracy
    assert chunk_f1_scorer(model, TOY_X, TOY_Y) == chunk_f1_score(TOY_Y, predicted)
    assert set(SCORERS) == {"token_accuracy", "sequence_accuracy", "chunk_f1",
                            "chunk_precision", "chunk_recall"}
    assert get_sequence_scorer("chunk_f1") is chunk_f1_scorer
    iob2 = get_sequence_scorer("chunk_f1", scheme="iob2")
    assert iob2(model, TOY_X, TOY_Y) == chunk_f1_score(TOY_Y, predicted)
    with pytest.raises(ValueError, match="unknown sequence scorer 'f1'"):
        get_sequence_scorer("f1")
    # Refused when the scorer is made, not at its first call (a list name
    # gave "unhashable type").
    with pytest.raises(ValueError, match=r"unknown sequence scorer \['f1'\]"):
        get_sequence_scorer(["f1"])
    with pytest.raises(ValueError, match=r"'token_accuracy' scorer takes the "
                       r"keyword arguments \[\], got \['scheme'\]"):
        get_sequence_scorer("token_accuracy", scheme="iob2")
    with pytest.raises(ValueError, match=r"takes the keyword arguments \['scheme'\]"):
        get_sequence_scorer("chunk_f1", foo=1)
    # Their values too: an unknown scheme made every GridSearchCV score NaN,
    # a list one gave "unhashable type".
    for scheme in ("bogus", ["iob2"]):
        with pytest.raises(ValueError, match=r"'chunk_f1' scorer refuses .*scheme "
                           "must be None"):
            get_sequence_scorer("chunk_f1", scheme=scheme)
    with pytest.raises(ValueError, match=r"scheme must be None .* got \['iob2'\]"):
        chunk_f1_score([["O"]], [["O"]], scheme=["iob2"])


class _Predicts(BaseEstimator):
    """An estimator whose predictions are given."""

    def __init__(self, y_pred):
        self.y_pred = y_pred

    def fit(self, X, y):
        return self

    def predict(self, X):
        return self.y_pred


def test_every_scorer_is_its_metric_with_its_sign():
    # Predictions where every metric differs from the others: each scorer
    # gives its own metric's value (greater is better for all of them).
    y_true = [["B-A", "I-A", "O", "B-B"], ["O", "B-A"], ["B-A", "O"]]
    y_pred = [["B-A", "O", "B-B", "B-B"], ["O", "B-A"], ["B-A", "I-A"]]
    expected = {
        "token_accuracy": token_accuracy(y_true, y_pred),
        "sequence_accuracy": sequence_accuracy(y_true, y_pred),
        "chunk_f1": chunk_f1_score(y_true, y_pred),
        "chunk_precision": chunk_precision_score(y_true, y_pred),
        "chunk_recall": chunk_recall_score(y_true, y_pred),
    }
    assert len(set(expected.values())) == len(expected)
    model = _Predicts(y_pred)
    for name, value in expected.items():
        assert SCORERS[name](model, None, y_true) == value, name
        assert get_sequence_scorer(name)(model, None, y_true) == value, name
    # Keyword arguments reach the metric: IOBES chunks differ from conlleval's.
    y = [["S-PER", "B-PER", "E-PER", "B-PER", "E-PER"]]
    pred = [["S-PER", "B-PER", "I-PER", "E-PER", "S-PER"]]
    iobes = get_sequence_scorer("chunk_f1", scheme="iobes")(_Predicts(pred), None, y)
    assert iobes == chunk_f1_score(y, pred, scheme="iobes")
    assert iobes != chunk_f1_score(y, pred)


def test_grid_search_over_template_pipeline():
    # cv must be a splitter: with an int, scikit-learn calls type_of_target
    # on y, which rejects lists of sequences for classifiers.
    model = Pipeline([
        ("vec", CRFppTemplateVectorizer("U0:%x[0,0]\nU1:%x[0,1]\nB")),
        ("clf", PerTokenLogistic()),
    ])
    search = GridSearchCV(
        model,
        {"vec__min_count": [1, 2], "clf__C": [0.1, 10.0]},
        scoring=chunk_f1_scorer,
        cv=KFold(3),
    )
    search.fit(TOY_X, TOY_Y)
    assert set(search.best_params_) == {"vec__min_count", "clf__C"}
    assert 0.0 <= search.best_score_ <= 1.0
    assert len(search.predict(TOY_X)) == len(TOY_X)


def test_cross_validation_with_dict_features_and_several_scorers():
    dicts = [[{"w": row[0], "pos": row[1]} for row in seq] for seq in TOY_X]
    model = Pipeline([("vec", SequenceDictVectorizer()), ("clf", PerTokenLogistic())])
    scores = cross_val_score(model, dicts, TOY_Y, cv=KFold(2),
                             scoring=SCORERS["token_accuracy"])
    assert scores.shape == (2,) and np.all((scores >= 0) & (scores <= 1))
    results = cross_validate(model, dicts, TOY_Y, cv=KFold(2), scoring=SCORERS)
    for name in SCORERS:
        assert results[f"test_{name}"].shape == (2,)
