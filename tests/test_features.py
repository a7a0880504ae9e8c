import pickle
import re
import time
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.base import clone
from sklearn.exceptions import NotFittedError
from sklearn.feature_extraction import DictVectorizer, FeatureHasher
from sklearn.pipeline import Pipeline, make_pipeline

from skgpstruct import GPStructClassifier
from skgpstruct.features import (
    CRFppTemplateVectorizer,
    FeatureSequences,
    SequenceDictVectorizer,
    expand_crfpp_template,
)
from skgpstruct.io import read_conll
from skgpstruct.kernels import GroupedLinearKernel

# The input of the CRF++ documentation ("Preparing feature templates"); the
# current token there is "the" (index 2).
DOC_SEQUENCE = [
    ["He", "PRP"],
    ["reckons", "VBZ"],
    ["the", "DT"],
    ["current", "JJ"],
    ["account", "NN"],
]


@pytest.mark.parametrize(
    "line, expected",
    [
        ("U00:%x[0,0]", "U00:the"),
        ("U01:%x[0,1]", "U01:DT"),
        ("U02:%x[-1,0]", "U02:reckons"),
        ("U03:%x[-2,1]", "U03:PRP"),
        ("U04:%x[0,0]/%x[0,1]", "U04:the/DT"),
        ("UABC%x[0,1]123", "UABCDT123"),
        ("U05:%x[2,0]", "U05:account"),
    ],
)
def test_documentation_examples(line, expected):
    features = expand_crfpp_template(line, DOC_SEQUENCE)
    assert features[2] == [expected]


def test_positions_outside_the_sequence():
    template = "U0:%x[-1,0]\nU1:%x[-2,0]\nU2:%x[1,0]\nU3:%x[2,0]\nU4:%x[-8,1]/%x[8,1]"
    features = expand_crfpp_template(template, DOC_SEQUENCE)
    assert features[0] == ["U0:_B-1", "U1:_B-2", "U2:reckons", "U3:the",
                           "U4:_B-8/_B+4"]
    assert features[1] == ["U0:He", "U1:_B-1", "U2:the", "U3:current",
                           "U4:_B-7/_B+5"]
    assert features[4] == ["U0:current", "U1:the", "U2:_B+1", "U3:_B+2",
                           "U4:_B-4/_B+8"]
    assert expand_crfpp_template("U:%x[3,0]", [["x"]]) == [["U:_B+3"]]


def test_columns_of_several_digits():
    sequence = [[f"w{t}"] + [f"c{t}.{j}" for j in range(1, 12)] for t in range(3)]
    features = expand_crfpp_template("U0:%x[0,11]/%x[-1,10]", sequence)
    assert features == [["U0:c0.11/_B-1"], ["U0:c1.11/c0.10"], ["U0:c2.11/c1.10"]]


def test_lines_without_macros_comments_and_braces():
    template = "# comment\n\nU\nU9:{lit}%x[0,0]}\n  \nB\n"
    features = expand_crfpp_template(template, [["a"], ["b"]])
    assert features == [["U", "U9:{lit}a}"], ["U", "U9:{lit}b}"]]


@pytest.mark.parametrize(
    "template, message",
    [
        ("U00:%x[0,0]\nX01:%x[0,0]", r"template line 2: 'X01:%x\[0,0\]' must start"),
        ("U00:%x[0]", r"template line 1: .* '%' that does not start a macro"),
        ("U00:%y[0,0]", "does not start a macro"),
        ("U00:%x[+1,0]", "does not start a macro"),
        ("U00:%x[0,-1]", "does not start a macro"),
        ("# c\nU00:%x[9,0]", r"template line 2: .*row offset 9; CRF\+\+ accepts"),
        ("U00:%x[10,0]", r"row offset 10; CRF\+\+ accepts"),
        ("U00:%x[0,0]/%x[-12,0]", r"row offset -12; CRF\+\+ accepts"),
        ("B00:%x[a,0]", "template line 1"),
        ("X01:%x[0,0]", "if this is a file path, no such file"),
    ],
)
def test_bad_template_lines(template, message):
    with pytest.raises(ValueError, match=message):
        CRFppTemplateVectorizer(template).fit([DOC_SEQUENCE])


@pytest.mark.parametrize(
    "path",
    ["nonexistent_template_file", "Unigram.template", "BaseNP/template", "U", "B"],
)
def test_a_missing_template_file_is_not_read_as_template_text(path, tmp_path,
                                                              monkeypatch):
    # One line without a newline or a macro, naming no file: a path with a
    # typo, not a template. As text, "Unigram.template" would be a single
    # constant feature and "BaseNP/template" a transitions-only template.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=(
        rf"template '{path}' is not an existing file \(current directory .*"
        r"no %x\[row,col\] macro"
    )):
        CRFppTemplateVectorizer(path).fit([DOC_SEQUENCE])
    with pytest.raises(ValueError, match="is not an existing file"):
        expand_crfpp_template(path, DOC_SEQUENCE)
    # The same file, once it exists, is read; and one-line text ending with
    # a newline is template text.
    (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / path).write_text("U00:%x[0,0]\n")
    names = CRFppTemplateVectorizer(path).fit([DOC_SEQUENCE]).get_feature_names_out()
    assert "U00:He" in names.tolist()
    assert expand_crfpp_template("U\n", [["a"], ["b"]]) == [["U"], ["U"]]
    assert expand_crfpp_template("U:%x[0,0]", [["a"]]) == [["U:a"]]


def test_column_beyond_token_columns_names_line_sequence_and_token():
    vec = CRFppTemplateVectorizer("U00:%x[0,0]\n\nU10:%x[-1,1]")
    X = [DOC_SEQUENCE, [["a", "b"], ["c"]]]
    with pytest.raises(ValueError, match=r"template line 3 \('U10:%x\[-1,1\]'\) reads "
                       "column 1, but token 1 of sequence 1 has only 1 column"):
        vec.fit(X)
    vec.fit([DOC_SEQUENCE])
    with pytest.raises(ValueError, match="token 0 of sequence 0 has only 1"):
        vec.transform([[["a"]]])


def test_fit_transform_matches_hand_expansion():
    X = [[["He", "PRP"], ["reckons", "VBZ"]], [["He", "NN"]]]
    vec = CRFppTemplateVectorizer("U00:%x[-1,0]\nU01:%x[0,1]\nU01:%x[0,1]\nU")
    Xt = vec.fit_transform(X)
    names = vec.get_feature_names_out().tolist()
    assert names == ["U", "U00:He", "U00:_B-1", "U01:NN", "U01:PRP", "U01:VBZ"]
    assert vec.vocabulary_ == {name: k for k, name in enumerate(names)}
    assert vec.uses_transitions_ is False
    assert vec.unigram_templates_ == ["U00:%x[-1,0]", "U01:%x[0,1]", "U01:%x[0,1]", "U"]
    assert vec.transition_templates_ == []
    assert len(Xt) == 2
    for matrix in Xt:
        assert sp.issparse(matrix) and matrix.format == "csr"
        assert matrix.dtype == np.float64
    np.testing.assert_array_equal(
        Xt[0].toarray(), [[1, 0, 1, 0, 1, 0], [1, 1, 0, 0, 0, 1]]
    )
    np.testing.assert_array_equal(Xt[1].toarray(), [[1, 0, 1, 1, 0, 0]])
    for a, b in zip(Xt, vec.transform(X), strict=True):
        assert (a != b).nnz == 0


def test_matrices_are_the_canonical_indicators_of_the_expanded_strings():
    # Against the expansion read token by token: each token's columns are
    # the vocabulary entries of its strings (a string rendered by two lines
    # once), sorted, no duplicates, values one; strings unseen in fit are
    # left out. Lines with one, two and three macros, braces, a constant.
    rng = np.random.default_rng(0)
    words = np.array(["a", "b", "{c}", "d%", "e"], dtype=object)

    def sequences(n):
        return [[[str(w) for w in rng.choice(words, 3)]
                 for _ in range(rng.integers(0, 7))] for _ in range(n)]

    template = ("U00:%x[0,0]\nU01:%x[-1,1]/{%x[0,1]}\nU02:%x[1,0]/%x[0,1]/%x[2,2]\n"
                "U00:%x[0,0]\nU03:const\nU04:%x[0,0]}\nB")
    unigram_lines = [line for line in template.splitlines() if line[0] == "U"]

    def rendered(seq, t):
        # CRF++'s rule written out by regular expression, token by token
        # (not the vectorizer's expansion): a row beyond the ends is _B-k or
        # _B+k.
        def value(match):
            row, col = t + int(match[1]), int(match[2])
            if row < 0:
                return f"_B{row}"
            if row >= len(seq):
                return f"_B+{row - len(seq) + 1}"
            return seq[row][col]

        return [re.sub(r"%x\[(-?\d+),(\d+)\]", value, line) for line in unigram_lines]

    train, test = sequences(30), sequences(20)
    vec = CRFppTemplateVectorizer(template, min_count=2)
    for X, Xt in ((train, vec.fit_transform(train)), (test, vec.transform(test))):
        assert len(Xt) == len(X)
        for seq, matrix in zip(X, Xt, strict=True):
            assert matrix.shape == (len(seq), len(vec.vocabulary_))
            assert matrix.has_canonical_format and np.all(matrix.data == 1.0)
            expanded = [rendered(seq, t) for t in range(len(seq))]
            for t, strings in enumerate(expanded):
                row = matrix.indices[matrix.indptr[t] : matrix.indptr[t + 1]]
                expected = sorted({vec.vocabulary_[f] for f in strings
                                   if f in vec.vocabulary_})
                assert row.tolist() == expected


def test_unknown_features_are_ignored_and_empty_sequences_allowed():
    vec = CRFppTemplateVectorizer("U00:%x[0,0]\nB").fit([[["a"], ["b"]]])
    assert vec.uses_transitions_ is True
    assert vec.transition_templates_ == ["B"]
    Xt = vec.transform([[["zzz"], ["a"]], []])
    np.testing.assert_array_equal(Xt[0].toarray(), [[0, 0], [1, 0]])
    assert Xt[1].shape == (0, 2)
    assert vec.transform([]) == []


def test_min_count():
    X = [[["a"], ["a"], ["b"]], [["a"], ["c"], ["c"]]]
    vec = CRFppTemplateVectorizer("U:%x[0,0]", min_count=2).fit(X)
    assert vec.get_feature_names_out().tolist() == ["U:a", "U:c"]
    np.testing.assert_array_equal(
        vec.transform(X)[0].toarray(), [[1, 0], [1, 0], [0, 0]]
    )
    with pytest.raises(ValueError, match="'min_count' parameter"):
        CRFppTemplateVectorizer("U", min_count=0).fit(X)
    with pytest.raises(ValueError, match="min_count must be an integer >= 1, got True"):
        CRFppTemplateVectorizer("U", min_count=True).fit(X)  # was taken as 1


def test_bigram_macros_warn_and_their_columns_are_checked():
    # A B line with macros asks CRF++ for transitions conditioned on the
    # tokens; they were accepted in silence and never read.
    X = [[["a", "p"], ["b", "q"]]]
    with pytest.warns(
        UserWarning, match=r"B lines \['B01:%x\[0,1\]'\] have macros"
    ) as record:
        vec = CRFppTemplateVectorizer("U00:%x[0,0]\nB01:%x[0,1]").fit(X)
    assert {w.filename for w in record} == {__file__}  # the caller's line
    # (through fit_transform too)
    with pytest.warns(UserWarning, match="have macros") as record:
        CRFppTemplateVectorizer("U00:%x[0,0]\nB01:%x[0,1]").fit_transform(X)
    assert {w.filename for w in record} == {__file__}
    assert vec.uses_transitions_
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        CRFppTemplateVectorizer("U00:%x[0,0]\nB").fit(X)
    with (
        pytest.warns(UserWarning, match="have macros"),
        pytest.raises(ValueError, match=r"'B01:%x\[0,7\]'\) reads column 7"),
    ):
        CRFppTemplateVectorizer("U00:%x[0,0]\nB01:%x[0,7]").fit(X)
    with pytest.raises(ValueError, match=r"reads column 1, but token 0"):
        vec.transform([[["a"]]])


def test_template_dropped_by_min_count_gets_no_variance():
    # Line 0's features all occur once: min_count drops them, its group id
    # has no column, and the learned kernel has one variance per line kept
    # (it had a variance for line 0 too, which nothing could move).
    X = [[["a", "p"], ["a", "q"], ["b", "r"]], [["a", "s"], ["b", "t"], ["b", "u"]]]
    y = [[0, 0, 1], [0, 1, 1]]
    vec = CRFppTemplateVectorizer("U0:%x[0,1]\nU1:%x[0,0]", min_count=2).fit(X)
    assert vec.feature_groups_.tolist() == [1, 1]
    model = make_pipeline(vec, GPStructClassifier(random_state=0))
    model.fit(X, y)
    kernel = model[-1].kernel_
    assert kernel.group_ids.tolist() == [1]
    assert np.asarray(kernel.variance).shape == (1,)


def test_template_from_path(tmp_path):
    path = tmp_path / "template"
    path.write_text("# Unigram\nU00:%x[0,0]\n\n# Bigram\nB\n", encoding="utf-8")
    X = [DOC_SEQUENCE]
    by_path = CRFppTemplateVectorizer(path).fit(X)
    by_str = CRFppTemplateVectorizer(str(path)).fit(X)
    by_text = CRFppTemplateVectorizer(path.read_text()).fit(X)
    assert by_path.vocabulary_ == by_str.vocabulary_ == by_text.vocabulary_
    assert by_path.uses_transitions_


@pytest.mark.parametrize(
    "X, message",
    [
        ("abc", "X must be a list of sequences"),
        (DOC_SEQUENCE, r"X\[0\]\[0\] must be a token row .*wrap a single sequence"),
        (([DOC_SEQUENCE], [["O"] * 5]), r"X\[0\]\[0\]\[0\] must be a str .* \(tokens, "
         "labels\\) pair"),
        ([[["a", 1]]], r"X\[0\]\[0\]\[1\] must be a str"),
        # sklearn-crfsuite's token dicts: they crashed with KeyError: 0.
        ([[{"w": "a"}]], r"X\[0\]\[0\] must be a token row .*got a dict; "
         "per-token feature dicts go through SequenceDictVectorizer"),
        ([[{"a"}]], r"X\[0\]\[0\] must be a token row .*got a set"),
        ([{"w": "a"}], r"X\[0\] must be a sequence of token rows, got dict"),
    ],
)
def test_bad_X(X, message):
    with pytest.raises(ValueError, match=message):
        CRFppTemplateVectorizer("U:%x[0,0]").fit(X)


def test_not_fitted_clone_pickle_pipeline():
    vec = CRFppTemplateVectorizer("U00:%x[0,0]\nB", min_count=1)
    with pytest.raises(NotFittedError):
        vec.transform([DOC_SEQUENCE])
    assert clone(vec).get_params() == {"template": "U00:%x[0,0]\nB", "min_count": 1}
    pipe = Pipeline([("features", vec)]).fit([DOC_SEQUENCE])
    restored = pickle.loads(pickle.dumps(pipe))
    a = pipe.transform([DOC_SEQUENCE])[0]
    b = restored.transform([DOC_SEQUENCE])[0]
    assert (a != b).nnz == 0 and a.shape == (5, 5)


@pytest.mark.shared_data
def test_basenp_template_speed_and_content(shared_data_dir):
    folder = shared_data_dir / "crfpp" / "basenp"
    train, _ = read_conll(folder / "train.data")
    test, _ = read_conll(folder / "test.data")
    vec = CRFppTemplateVectorizer(folder / "template").fit(train)
    assert vec.uses_transitions_
    start = time.perf_counter()
    Xt = vec.transform(test)
    elapsed = time.perf_counter() - start
    # About 0.5 s on the development machine; generous for shared runners.
    assert elapsed < 5.0
    assert len(Xt) == 823
    assert sum(m.shape[0] for m in Xt) == 19172
    n_lines = len(vec.unigram_templates_)
    assert n_lines == 20
    # Every token fires one feature per line unless it is unseen in training.
    train_Xt = vec.transform(train)
    assert all((m.sum(axis=1) == n_lines).all() for m in train_Xt)
    assert all((m.sum(axis=1) <= n_lines).all() for m in Xt)
    first = expand_crfpp_template(folder / "template", test[0])[0]
    assert first[:3] == ["U00:_B-2", "U01:_B-1", "U02:Rockwell"]


TOKEN_DICTS = [
    [{"w": "the", "bos": True}, {"w": "cat", "len": 3.0}],
    [{"w": "cat"}],
]


def test_sequence_dict_vectorizer_default():
    vec = SequenceDictVectorizer()
    Xt = vec.fit_transform(TOKEN_DICTS)
    assert vec.get_feature_names_out().tolist() == ["bos", "len", "w=cat", "w=the"]
    assert isinstance(vec.vectorizer_, DictVectorizer)
    assert [m.shape for m in Xt] == [(2, 4), (1, 4)]
    assert all(sp.issparse(m) and m.format == "csr" for m in Xt)
    np.testing.assert_array_equal(Xt[0].toarray(), [[1, 0, 0, 1], [0, 3, 1, 0]])
    unseen = vec.transform([[{"w": "dog", "new": 1}], []])
    np.testing.assert_array_equal(unseen[0].toarray(), [[0, 0, 0, 0]])
    assert unseen[1].shape == (0, 4)
    for a, b in zip(Xt, vec.transform(TOKEN_DICTS), strict=True):
        assert (a != b).nnz == 0


def test_sequence_dict_vectorizer_refuses_a_nested_key_equal_to_a_flat_one():
    # {"w": {"lower": "a"}} flattens to "w:lower": beside a flat "w:lower",
    # whichever came later overwrote the other, and a feature was lost.
    for token in ({"w": {"lower": "a"}, "w:lower": "b"},
                  {"w:lower": "b", "w": {"lower": "a"}}):
        with pytest.raises(ValueError, match=r"X\[0\]\[1\] has the feature "
                           r"'w:lower' twice"):
            SequenceDictVectorizer().fit([[{"w": "x"}, token]])
    # Nested and flat keys that differ are both kept.
    vec = SequenceDictVectorizer().fit([[{"w": {"lower": "a"}, "w:upper": "B"}]])
    assert vec.get_feature_names_out().tolist() == ["w:lower=a", "w:upper=B"]


def test_sequence_dict_vectorizer_without_columns_has_no_groups():
    # Empty token dicts: no column, and no groups (None, as documented).
    vectorizer = SequenceDictVectorizer().fit([[{}, {}], [{}]])
    assert len(vectorizer.get_feature_names_out()) == 0
    assert vectorizer.feature_groups_ is None
    assert vectorizer.feature_group_names_ is None
    assert [m.shape for m in vectorizer.transform([[{}, {}]])] == [(2, 0)]


def test_sequence_dict_vectorizer_wraps_feature_hasher_and_clones():
    hasher = FeatureHasher(n_features=16)
    vec = SequenceDictVectorizer(hasher).fit(TOKEN_DICTS)
    assert vec.vectorizer_ is not hasher
    Xt = vec.transform(TOKEN_DICTS)
    assert [m.shape for m in Xt] == [(2, 16), (1, 16)]
    with pytest.raises(AttributeError, match="FeatureHasher has no feature names"):
        vec.get_feature_names_out()
    cloned = clone(SequenceDictVectorizer(DictVectorizer(sparse=False)))
    dense = cloned.fit_transform(TOKEN_DICTS)
    assert isinstance(dense[0], np.ndarray) and dense[0].shape == (2, 4)



def test_sequence_dict_vectorizer_groups_columns_by_key():
    # Written out by hand: every column's key, strings one-hot under their
    # key (lists of strings too, nested dicts as "outer:inner"), numbers and
    # booleans their own key, a key holding the separator read by the
    # shortest prefix that took string values.
    X = [
        [{"w": "the", "bos": True, "suffix": ["e", "he"], "tag": {"pos": "DT"}},
         {"w": "a=b", "len": 3, "x=y": "z"}],
        [{"w": "cat", "x": 2.0}],
    ]
    vec = SequenceDictVectorizer()
    Xt = vec.fit_transform(X)
    names = vec.get_feature_names_out().tolist()
    expected_key = {
        "bos": "bos", "len": "len", "suffix=e": "suffix", "suffix=he": "suffix",
        "tag:pos=DT": "tag:pos", "w=a=b": "w", "w=cat": "w", "w=the": "w",
        "x": "x", "x=y=z": "x=y",
    }
    assert sorted(names) == sorted(expected_key)
    keys = vec.feature_group_names_[vec.feature_groups_]
    assert dict(zip(names, keys, strict=True)) == expected_key
    assert vec.feature_group_names_.tolist() == sorted(set(expected_key.values()))
    # The output carries them, as CRFppTemplateVectorizer's does, and so
    # does transform's; fit alone sets the same.
    assert isinstance(Xt, FeatureSequences)
    np.testing.assert_array_equal(Xt.feature_groups, vec.feature_groups_)
    assert Xt[0].feature_groups is Xt.feature_groups
    np.testing.assert_array_equal(vec.transform(X).feature_groups, vec.feature_groups_)
    refit = SequenceDictVectorizer().fit(X)
    np.testing.assert_array_equal(refit.feature_groups_, vec.feature_groups_)
    # Tokens as lists of feature names (python-crfsuite's format): a name's
    # key precedes its first separator; the empty key is a key.
    vec = SequenceDictVectorizer().fit(
        [[["bias", "w=the", "pos=DT"], ["bias", "w=cat", "w=x=y"]],
         [{"": "a", "=w": "b"}]]
    )
    keys = vec.feature_group_names_[vec.feature_groups_]
    assert dict(zip(vec.get_feature_names_out().tolist(), keys, strict=True)) == {
        "bias": "bias", "w=the": "w", "pos=DT": "pos", "w=cat": "w", "w=x=y": "w",
        "=a": "", "=w=b": "",  # (ambiguous: the shortest key that took strings)
    }


class _DictLike(DictVectorizer):
    """A DictVectorizer without feature names."""

    def __getattribute__(self, name):
        if name == "get_feature_names_out":
            raise AttributeError(name)
        return super().__getattribute__(name)


def test_vectorizers_only_resembling_dict_vectorizer_give_no_groups():
    vec = SequenceDictVectorizer(_DictLike())
    Xt = vec.fit_transform(TOKEN_DICTS)
    assert vec.feature_groups_ is None and type(Xt) is list
    assert [m.shape for m in Xt] == [(2, 4), (1, 4)]


def test_hashed_columns_have_no_groups():
    vec = SequenceDictVectorizer(FeatureHasher(n_features=16))
    Xt = vec.fit_transform(TOKEN_DICTS)
    assert vec.feature_groups_ is None and vec.feature_group_names_ is None
    assert type(Xt) is list and type(vec.transform(TOKEN_DICTS)) is list


def test_the_estimator_learns_one_variance_per_key():
    # Through a Pipeline: one prior variance per token-dict key, and
    # feature_groups=None shares one.
    rng = np.random.default_rng(0)
    words = ["the", "cat", "sat", "on", "mat", "dog"]
    X, y = [], []
    for _ in range(20):
        n = int(rng.integers(2, 6))
        seq = [{"w": str(w), "len": len(w), "bos": t == 0}
               for t, w in enumerate(rng.choice(words, n))]
        X.append(seq)
        y.append(["short" if d["len"] == 3 else "long" for d in seq])
    pipe = make_pipeline(
        SequenceDictVectorizer(), GPStructClassifier(max_iter=30, random_state=0)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pipe.fit(X, y)
    vec, model = pipe[0], pipe[-1]
    assert vec.feature_group_names_.tolist() == ["bos", "len", "w"]
    assert isinstance(model.kernel_, GroupedLinearKernel)
    assert model.kernel_.n_groups == 3
    shared = make_pipeline(
        SequenceDictVectorizer(),
        GPStructClassifier(max_iter=30, random_state=0, feature_groups=None),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        shared.fit(X, y)
    assert not isinstance(shared[-1].kernel_, GroupedLinearKernel)

@pytest.mark.parametrize(
    "X, message",
    [
        ({"w": "a"}, "X must be a list of sequences"),
        ([{"w": "a"}], r"X\[0\] must be a sequence of token feature dicts"),
        ([[{"w": "a"}, "b"]], r"X\[0\]\[1\] must be a dict"),
        ([], "no sequences"),
    ],
)
def test_sequence_dict_vectorizer_bad_X(X, message):
    with pytest.raises(ValueError, match=message):
        SequenceDictVectorizer().fit(X)


def test_sequence_dict_vectorizer_bad_param_and_not_fitted():
    with pytest.raises(ValueError, match="'vectorizer' parameter"):
        SequenceDictVectorizer(vectorizer="dict").fit(TOKEN_DICTS)
    with pytest.raises(NotFittedError):
        SequenceDictVectorizer().transform(TOKEN_DICTS)


@pytest.mark.parametrize(
    "vectorizer", [None, FeatureHasher(n_features=16)], ids=["dict", "hasher"]
)
def test_dict_vectorizer_keeps_its_width_on_empty_sequences_only(vectorizer):
    # Only empty sequences: their matrices still have the fitted width (a
    # hasher's gave 0 columns, which a pipeline's classifier then refused).
    vec = SequenceDictVectorizer(vectorizer).fit(TOKEN_DICTS)
    width = vec.transform(TOKEN_DICTS)[0].shape[1]
    assert [m.shape for m in vec.transform([[], []])] == [(0, width), (0, width)]


@pytest.mark.parametrize(
    ("sequence", "message"),
    [
        (["He", "reckons"], r"sequence\[0\] must be a token row .*got str 'He'; "
         r"sequence must be the token rows of one sequence"),
        ([DOC_SEQUENCE], r"sequence\[0\]\[0\] must be a str .*not a list of "
         "sequences"),
        (None, "sequence must be a sequence of token rows, got NoneType"),
        ([{"w": "He"}], r"sequence\[0\] must be a token row .*got a dict"),
    ],
    ids=["words", "list of sequences", "None", "dicts"],
)
def test_expand_names_its_argument(sequence, message):
    # Its errors spoke of X and a list of sequences, for its one sequence.
    with pytest.raises(ValueError, match=message):
        expand_crfpp_template("U00:%x[0,0]", sequence)


def test_expand_checks_the_columns_of_b_lines():
    # As the vectorizer (and CRF++) do: a B line reading a missing column.
    with pytest.raises(ValueError, match=r"'B01:%x\[0,5\]'\) reads column 5"):
        expand_crfpp_template("U00:%x[0,0]\nB01:%x[0,5]", [["a", "b"]])


def test_token_formats_of_python_crfsuite():
    # sklearn-crfsuite's input may nest dicts or give a token as a list of
    # feature names: both were refused (TypeError / "must be a dict").
    nested = [[{"word": {"lower": "the", "title": True}, "pos": "DT"}, ["bos", "x"]]]
    flat = [[{"word:lower": "the", "word:title": True, "pos": "DT"},
             {"bos": 1.0, "x": 1.0}]]
    a, b = SequenceDictVectorizer().fit(nested), SequenceDictVectorizer().fit(flat)
    assert a.get_feature_names_out().tolist() == b.get_feature_names_out().tolist()
    assert "word:lower=the" in a.get_feature_names_out()
    assert (a.transform(nested)[0] != b.transform(flat)[0]).nnz == 0
    with pytest.raises(ValueError, match=r"X\[0\]\[1\] must be a dict of token "
                       r"features .* or a list or set of feature-name strings, "
                       r"got int"):
        SequenceDictVectorizer().fit([[{"w": "a"}, 3]])
    # A set of feature names (python-crfsuite takes them too) was refused, and
    # NumPy bools (np.char.isupper, pandas) were refused by the DictVectorizer
    # in a Pipeline, or left out of the vocabulary by fit alone.
    as_set = [[{"word": {"lower": "the", "title": np.True_}, "pos": "DT"},
               {"x", "bos"}]]
    c = SequenceDictVectorizer().fit(as_set)
    assert c.get_feature_names_out().tolist() == b.get_feature_names_out().tolist()
    assert (c.transform(as_set)[0] != b.transform(flat)[0]).nnz == 0
    flags = [[{"w": "the", "upper": np.False_, "n": np.float32(3.0)},
              {"w": "CAT", "upper": np.True_, "n": np.int64(3)}]]
    plain = [[{"w": "the", "upper": False, "n": 3.0}, {"w": "CAT", "upper": True,
                                                        "n": 3}]]
    class ItemSequenceLike:  # python-crfsuite's: a length, no iterator
        def __len__(self):
            return 1

    with pytest.raises(ValueError, match=r"X\[0\] must be a sequence of token "
                       r"feature dicts, got ItemSequenceLike"):
        SequenceDictVectorizer().fit([ItemSequenceLike()])
    d = SequenceDictVectorizer().fit(flags)
    assert "upper" in d.get_feature_names_out()
    np.testing.assert_array_equal(
        d.transform(flags)[0].toarray(),
        SequenceDictVectorizer().fit(plain).transform(plain)[0].toarray(),
    )
    # A hasher of strings hashed the dicts' keys only (values were lost).
    with pytest.raises(ValueError, match="vectorizer must take token dicts .* "
                       "input_type='string'"):
        SequenceDictVectorizer(FeatureHasher(input_type="string")).fit(flat)


def test_template_with_no_feature_column_gives_empty_groups():
    # Transitions only, or min_count above every count: (T, 0) matrices and
    # no group (the groups check refused them, naming feature_groups).
    tokens = [[["a"], ["b"]], [["c"]]]
    for params in ({"template": "B\n"}, {"template": "U00:%x[0,0]", "min_count": 5}):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            X = CRFppTemplateVectorizer(**params).fit_transform(tokens)
        assert [m.shape for m in X] == [(2, 0), (1, 0)]
        assert X.feature_groups.shape == (0,)


def test_feature_sequences_check_their_groups():
    # Any value was stored; a fit then blamed the estimator's feature_groups
    # (left at "auto") for X's.
    X = [sp.csr_matrix(np.eye(3))] * 2
    for bad in ([0.5, 1.0, 2.0], [0, 1], "ab"):
        with pytest.raises(ValueError, match=r"feature_groups must hold one "
                           r"non-negative integer group index per feature \(3\)"):
            FeatureSequences(X, feature_groups=bad)
    # A negative index is named (its message was about shape and dtype,
    # which were right).
    with pytest.raises(ValueError, match=r"feature_groups must hold non-negative "
                       r"group indices, got -1 at position 1"):
        FeatureSequences(X, feature_groups=[0, -1, 1])
    X = [sp.csr_matrix(np.eye(3)) for _ in range(2)]
    for matrix in X:  # groups set by hand on the matrices
        matrix.feature_groups = np.array([0.5, 1.0, 2.0])
    with pytest.raises(ValueError, match=r"X.feature_groups \(feature_groups="
                       r"'auto' reads them\) must hold one non-negative integer"):
        GPStructClassifier(max_iter=1).fit(X, [np.zeros(3, int), np.ones(3, int)])
    with pytest.raises(ValueError, match=r"^feature_groups must hold .* \(3\), "
                       r"got an array of shape \(2,\)"):
        GPStructClassifier(max_iter=1, feature_groups=[0, 1]).fit(
            X, [np.zeros(3, int), np.ones(3, int)]
        )


def test_feature_groups_follow_the_template_order_not_the_data_order():
    # Two lines sharing an id render the same string: its group is the first
    # line in template order, whichever sequence shows it first (it was the
    # line that rendered it in the first sequence: reversing X changed the
    # groups, and with feature_groups="auto" the fitted model).
    template = "U01:%x[0,0]\nU01:%x[0,1]"
    X = [[["a", "b"]], [["b", "c"]]]
    forward = CRFppTemplateVectorizer(template).fit(X)
    backward = CRFppTemplateVectorizer(template).fit(X[::-1])
    assert forward.vocabulary_ == backward.vocabulary_
    np.testing.assert_array_equal(forward.feature_groups_, [0, 0, 1])
    np.testing.assert_array_equal(backward.feature_groups_, [0, 0, 1])


def test_cross_validation_folds_of_template_features_keep_their_groups():
    # scikit-learn's splitters take plain lists of the matrices: the folds
    # lost the groups and fitted one shared variance (LinearKernel), while
    # fit and GridSearchCV's refit on the whole list fitted one per template.
    from sklearn.model_selection import cross_validate

    from skgpstruct.kernels import GroupedLinearKernel

    rng = np.random.default_rng(0)
    words = ["a", "b", "c", "d"]
    tokens = [[[w, w.upper()] for w in rng.choice(words, 5)] for _ in range(12)]
    y = [[int(w[0] in "ab") for w in seq] for seq in tokens]
    X = CRFppTemplateVectorizer("U00:%x[0,0]\nU01:%x[0,1]\nB").fit_transform(tokens)
    assert all(m.feature_groups is X.feature_groups for m in X)
    fold = X[:8]  # a plain list, as a splitter takes
    assert type(fold) is list
    model = GPStructClassifier(max_iter=3, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        whole = clone(model).fit(X, y)
        part = clone(model).fit(fold, y[:8])
        folds = cross_validate(model, X, y, cv=2, return_estimator=True)
    assert isinstance(whole.kernel_, GroupedLinearKernel)
    assert isinstance(part.kernel_, GroupedLinearKernel)
    np.testing.assert_array_equal(part.kernel_.groups, whole.kernel_.groups)
    for estimator in folds["estimator"]:
        assert isinstance(estimator.kernel_, GroupedLinearKernel)
    # The list sets its matrices' groups, and removes them with None.
    plain = [m.copy() for m in fold]
    wrapped = FeatureSequences(plain, feature_groups=X.feature_groups)
    assert all(m.feature_groups is wrapped.feature_groups for m in plain)
    wrapped.feature_groups = None
    assert not any(hasattr(m, "feature_groups") for m in plain)
    # Matrices from elsewhere (no groups) and mixed lists: one shared variance.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mixed = clone(model).fit([*fold[:4], fold[4].copy()], y[:5])
    assert not isinstance(mixed.kernel_, GroupedLinearKernel)


def test_template_file_errors_name_the_file(tmp_path):
    X = [[["a"], ["b"]]]
    latin = tmp_path / "template"
    latin.write_bytes("U00:\xe9%x[0,0]\nB\n".encode("latin-1"))
    for template in (latin, str(latin)):
        with pytest.raises(ValueError, match=r"template file '.*template' is not "
                           "UTF-8 text .* save it as UTF-8"):
            CRFppTemplateVectorizer(template).fit(X)
    for template in (tmp_path, str(tmp_path)):
        with pytest.raises(ValueError, match="is a directory, not a template file"):
            CRFppTemplateVectorizer(template).fit(X)


def test_sequence_dict_vectorizer_output_kind_without_tokens():
    # Dense output stays dense when no sequence has a token (it became CSR),
    # and fit_transform of no token behaves as fit then transform (it raised
    # scikit-learn's "Sample sequence X is empty.").
    vec = SequenceDictVectorizer(DictVectorizer(sparse=False)).fit(TOKEN_DICTS)
    width = len(vec.get_feature_names_out())
    for out in (vec.transform([[], []]), vec.transform([[], TOKEN_DICTS[0]])):
        assert all(isinstance(m, np.ndarray) for m in out)
    assert vec.transform([[], []])[0].shape == (0, width)
    fitted = SequenceDictVectorizer()
    out = fitted.fit_transform([[], []])
    assert [m.shape for m in out] == [(0, 0), (0, 0)]
    assert len(fitted.get_feature_names_out()) == 0


def test_sequence_dict_vectorizer_output_stores_no_zeros():
    # DictVectorizer stores the zeros of False values; the estimator drops
    # them (the same features in any storage), sequence by sequence, a copy
    # each: most of a predict's time on token dicts with boolean flags. The
    # vectorizer's output comes without them.
    dicts = [[{"w": "a", "upper": False, "n": 0.0}, {"w": "b", "upper": True}],
             [{"upper": False}]]
    stored = DictVectorizer().fit_transform([t for s in dicts for t in s])
    assert not stored.data.all()  # what DictVectorizer gives
    out = SequenceDictVectorizer().fit_transform(dicts)
    for part, rows in zip(out, (slice(0, 2), slice(2, 3)), strict=True):
        assert part.data.all()
        np.testing.assert_array_equal(part.toarray(), stored[rows].toarray())


def test_sequence_dict_vectorizer_splits_any_sparse_output():
    # A wrapped transformer giving COO (which cannot be sliced by rows)
    # crashed with "'coo_matrix' object is not subscriptable".
    from sklearn.preprocessing import FunctionTransformer

    to_coo = FunctionTransformer(lambda m: m.tocoo(), accept_sparse=True)
    vec = SequenceDictVectorizer(make_pipeline(DictVectorizer(), to_coo))
    out = vec.fit_transform(TOKEN_DICTS)
    reference = SequenceDictVectorizer().fit_transform(TOKEN_DICTS)
    assert len(out) == len(reference)
    for a, b in zip(out, reference, strict=True):
        assert a.format == "csr"
        np.testing.assert_array_equal(a.toarray(), b.toarray())


def test_vectorizers_pickled_before_the_template_literals_load():
    # Until ed49d5e a template line held a str.format string ("fmt"), not
    # its literal text: vectorizers (and CLI model files) pickled then did
    # not load, and the CLI called the file damaged.
    import pickle

    X = [[["a", "x"], ["b", "y"]], [["{c}", "z"]]]
    vec = CRFppTemplateVectorizer("U00:%x[0,0]\nU01:%x[-1,0]/{%x[0,1]}\nU02:x\nB")
    expected = vec.fit_transform(X)
    old_lines = []
    for line in vec._unigrams + vec._bigrams:
        _, slots = line.__getstate__()
        slots = {name: value for name, value in slots.items() if name != "literals"}
        slots["fmt"] = "(a str.format string, not read)"
        old = object.__new__(type(line))
        old.__setstate__((None, slots))
        assert old.literals == line.literals and old.macros == line.macros
        old_lines.append(old)
    n = len(vec._unigrams)
    vec._unigrams, vec._bigrams = old_lines[:n], old_lines[n:]
    loaded = pickle.loads(pickle.dumps(vec))
    for a, b in zip(loaded.transform(X), expected, strict=True):
        assert (a != b).nnz == 0
