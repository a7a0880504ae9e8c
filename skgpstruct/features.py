"""Feature extraction for sequences: CRF++ templates and token feature dicts.

Both transformers take a list of sequences and return one feature matrix per
sequence (``scipy.sparse`` CSR, rows are tokens), the ``X`` the estimator
takes, so they sit in front of it in a :class:`~sklearn.pipeline.Pipeline`
and are fitted on the training folds only.

:class:`CRFppTemplateVectorizer` expands a CRF++ feature template over token
rows as :func:`skgpstruct.io.read_conll` returns them;
:class:`SequenceDictVectorizer` wraps :class:`~sklearn.feature_extraction.
DictVectorizer` (or :class:`~sklearn.feature_extraction.FeatureHasher`) for
the lists of token feature dicts that sklearn-crfsuite users already have.
"""

import itertools
import os
import re
import warnings
from collections import Counter
from collections.abc import Mapping, Set
from numbers import Integral, Number

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, TransformerMixin, clone
from sklearn.feature_extraction import DictVectorizer
from sklearn.utils._param_validation import HasMethods, Interval
from sklearn.utils.validation import check_is_fitted

from ._checks import check_groups, check_integer, outside_stacklevel
from ._sequences import (
    offsets_from_lengths,
    refuse_no_sequences,
    split_by_offsets,
    without_stored_zeros,
)
from .io import _text_lines

__all__ = [
    "FeatureSequences",
    "CRFppTemplateVectorizer",
    "SequenceDictVectorizer",
    "expand_crfpp_template",
]

# CRF++ (feature_index.cpp) allows rows up to 8 tokens away and renders the
# positions outside the sequence as _B-1 .. _B-8 (before) and _B+1 .. _B+8
# (after).
_MAX_CONTEXT = 8
_BEFORE = [f"_B-{k}" for k in range(_MAX_CONTEXT, 0, -1)]
_AFTER = [f"_B+{k}" for k in range(1, _MAX_CONTEXT + 1)]
_MACRO = re.compile(r"%x\[(-?[0-9]+),([0-9]+)\]")


class _TemplateLine:
    """One ``U``/``B`` line: its (row, col) macros and the literal text
    around them (``literals``, one more than the macros)."""

    __slots__ = ("line_number", "text", "kind", "literals", "macros", "max_col")

    def __init__(self, line_number, text, kind, literals, macros):
        self.line_number = line_number
        self.text = text
        self.kind = kind
        self.literals = literals
        self.macros = macros
        self.max_col = max((col for _, col in macros), default=-1)

    def describe(self):
        return f"template line {self.line_number} ({self.text!r})"

    def __setstate__(self, state):
        # Pickled before ed49d5e, a line held a str.format string ("fmt")
        # instead of its literals: they are read from its text again.
        _, slots = state
        if "fmt" in slots:
            slots = {name: value for name, value in slots.items() if name != "fmt"}
            slots["literals"] = tuple(_MACRO.split(slots["text"])[0::3])
        for name, value in slots.items():
            setattr(self, name, value)


def _read_template_file(path):
    """The text of a template file (UTF-8), with errors that name it."""
    name = os.fspath(path)
    if os.path.isdir(name):
        raise ValueError(f"template {name!r} is a directory, not a template file")
    try:
        with open(name, encoding="utf-8") as handle:
            return handle.read()
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"template file {name!r} is not UTF-8 text ({exc.reason} at byte "
            f"{exc.start}); save it as UTF-8 (CRF++ templates are ASCII)"
        ) from None


def _read_template(template):
    """Template text from text or a path; returns (text, name)."""
    if isinstance(template, os.PathLike):
        return _read_template_file(template), os.fspath(template)
    if not isinstance(template, str):
        raise TypeError(
            "template must be the text of a CRF++ template or the path of a "
            f"template file (str or path-like), got {type(template).__name__}"
        )
    if "\n" not in template:
        if os.path.isfile(template) or os.path.isdir(template):
            return _read_template_file(template), template
        if "%" not in template:
            # Most likely a template file's path with a typo: as text, a line
            # such as 'Unigram.template' would be one constant feature.
            raise ValueError(
                f"template {template!r} is not an existing file (current "
                f"directory {os.getcwd()!r}), and as template text it has no "
                "%x[row,col] macro; give the path of a template file, or the "
                "template's text (a one-line template without a macro, such "
                "as a bare 'U' or 'B', ends with a newline: 'U\\n')"
            )
    return template, None


def _parse_template(template):
    """Parse a CRF++ template into unigram and bigram :class:`_TemplateLine`."""
    text, name = _read_template(template)
    where = f" of {name}" if name else ""
    unigrams, bigrams = [], []
    for line_number, line in enumerate(_text_lines(text), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        if line[0] not in "UB":
            hint = ""
            if name is None and line_number == 1 and "\n" not in text:
                hint = (
                    "; if this is a file path, no such file exists "
                    f"(current directory {os.getcwd()!r})"
                )
            raise ValueError(
                f"template line {line_number}{where}: {line!r} must start with "
                "'U' (unigram) or 'B' (bigram) or '#' (comment)" + hint
            )
        pieces = _MACRO.split(line)
        # pieces = [literal, row, col, literal, row, col, ..., literal]
        literals, macros = pieces[0::3], []
        for row, col in zip(pieces[1::3], pieces[2::3], strict=True):
            row, col = int(row), int(col)
            if abs(row) > _MAX_CONTEXT:
                raise ValueError(
                    f"template line {line_number}{where}: {line!r} uses row "
                    f"offset {row}; CRF++ accepts offsets from -{_MAX_CONTEXT} "
                    f"to {_MAX_CONTEXT}"
                )
            macros.append((row, col))
        for literal in literals:
            if "%" in literal:
                raise ValueError(
                    f"template line {line_number}{where}: {line!r} has a '%' "
                    "that does not start a macro; macros are written "
                    "%x[row,col] with an integer row offset and a column "
                    "index >= 0, e.g. %x[-1,0]"
                )
        parsed = _TemplateLine(line_number, line, line[0], tuple(literals), macros)
        (unigrams if line[0] == "U" else bigrams).append(parsed)
    return unigrams, bigrams


def _check_token_sequences(X):
    """Validate a list of sequences of token rows (lists of column strings)."""
    if (
        isinstance(X, str | bytes | Mapping | Set)
        or sp.issparse(X)
        or not hasattr(X, "__len__")
    ):
        raise ValueError(
            "X must be a list of sequences, each a list of token rows (lists "
            f"of column strings) as read_conll returns, got {type(X).__name__}"
        )
    for i, seq in enumerate(X):
        _check_token_rows(
            seq, f"X[{i}]",
            row_hint="X must be a list of sequences (wrap a single sequence as "
            "[seq])",
            value_hint="X must be the token sequences alone, not the (tokens, "
            "labels) pair read_conll returns",
        )
    return X


def _check_token_rows(seq, name, *, row_hint, value_hint):
    """Validate one sequence of token rows; ``name`` is its argument name."""
    if isinstance(seq, str | bytes | Mapping | Set) or not hasattr(seq, "__len__"):
        raise ValueError(
            f"{name} must be a sequence of token rows, got {type(seq).__name__}"
        )
    # The usual case, lists (or tuples) of str, in two passes at C speed;
    # anything else goes through the loop below, which names the culprit.
    if {type(row) for row in seq} <= {list, tuple} and {
        type(value) for value in itertools.chain.from_iterable(seq)
    } <= {str}:
        return
    for t, row in enumerate(seq):
        if isinstance(row, Mapping | Set):
            raise ValueError(
                f"{name}[{t}] must be a token row (a list of column strings), "
                f"got a {type(row).__name__}; per-token feature dicts go "
                "through SequenceDictVectorizer"
            )
        if isinstance(row, str | bytes) or not hasattr(row, "__len__"):
            raise ValueError(
                f"{name}[{t}] must be a token row (a list of column strings), "
                f"got {type(row).__name__} {row!r}; {row_hint}"
            )
        for c, value in enumerate(row):
            if not isinstance(value, str):
                raise ValueError(
                    f"{name}[{t}][{c}] must be a str (a column value), got "
                    f"{type(value).__name__}; {value_hint}"
                )


def _check_columns(lines, seq, i):
    """Raise if a template line (of ``lines``, U and B alike) reads a column
    a token of ``seq`` lacks."""
    if not lines or len(seq) == 0:
        return
    needed = max(line.max_col for line in lines)
    if needed < 0 or min(len(row) for row in seq) > needed:
        return
    for t, row in enumerate(seq):
        for line in lines:
            if line.max_col >= len(row):
                raise ValueError(
                    f"{line.describe()} reads column {line.max_col}, but token "
                    f"{t} of sequence {i} has only {len(row)} column(s) "
                    "(columns are numbered from 0; the label column is not "
                    "included)"
                )


def _expand(unigrams, seq):
    """Feature strings of every unigram line: a list (per line) of T strings."""
    n_tokens = len(seq)
    padded = {}
    for line in unigrams:
        for _, col in line.macros:
            if col not in padded:
                padded[col] = _BEFORE + [row[col] for row in seq] + _AFTER
    expanded = []
    for line in unigrams:
        literals = line.literals
        if not line.macros:
            expanded.append([literals[0]] * n_tokens)
            continue
        args = [
            padded[col][_MAX_CONTEXT + row : _MAX_CONTEXT + row + n_tokens]
            for row, col in line.macros
        ]
        # Joined literal and value pieces: two to five times faster than
        # str.format here.
        pieces = [itertools.repeat(literals[0])]
        for literal, values in zip(literals[1:], args, strict=True):
            pieces += [values, itertools.repeat(literal)]
        # (the literals repeat without end: the values set the length)
        expanded.append(list(map("".join, zip(*pieces, strict=False))))
    return expanded


def expand_crfpp_template(template, sequence):
    """Unigram feature strings of every token, as CRF++ expands a template.

    Every ``U`` line is rendered at every token: each macro ``%x[row,col]``
    becomes column ``col`` of the token ``row`` positions away, or ``_B-k`` /
    ``_B+k`` for a position ``k`` tokens before the start / after the end;
    the rest of the line (including its ``Uxx:`` name) is kept as written.

    Parameters
    ----------
    template : str or path-like
        The template text, or the path of a template file.
    sequence : list of list of str
        The token rows of one sequence (``sequence[t][col]``), as one entry
        of the tokens :func:`skgpstruct.io.read_conll` returns.

    Returns
    -------
    features : list of list of str
        ``features[t]`` holds the feature strings of token ``t``, one per
        unigram template line in template order.

    Raises
    ------
    ValueError
        On a malformed template line, a column index (of a ``U`` or ``B``
        line) beyond a token's columns, or a ``sequence`` that is not a list
        of token rows.

    Examples
    --------
    >>> from skgpstruct.features import expand_crfpp_template
    >>> template = "U00:%x[-1,0]\\nU01:%x[0,0]/%x[0,1]\\nB"
    >>> expand_crfpp_template(template, [["He", "PRP"], ["reckons", "VBZ"]])
    [['U00:_B-1', 'U01:He/PRP'], ['U00:He', 'U01:reckons/VBZ']]
    """
    unigrams, bigrams = _parse_template(template)
    _check_token_rows(
        sequence, "sequence",
        row_hint="sequence must be the token rows of one sequence, e.g. "
        "[['He', 'PRP'], ['reckons', 'VBZ']]",
        value_hint="sequence must be one sequence of token rows, not a list "
        "of sequences",
    )
    _check_columns(unigrams + bigrams, sequence, 0)
    expanded = _expand(unigrams, sequence)
    if not expanded:
        return [[] for _ in sequence]
    return [list(strings) for strings in zip(*expanded, strict=True)]


class FeatureSequences(list):
    """A list of per-sequence feature matrices that knows its column groups.

    Behaves exactly as a list; ``feature_groups`` (ndarray of int of shape
    (n_features,), or None) says which template produced every column, so
    that an estimator downstream in a ``Pipeline`` can give each template its
    own prior variance. Slicing or copying returns a plain list; every
    matrix that can hold an attribute (sparse matrices, not NumPy arrays)
    carries the same ``feature_groups`` too (set, and removed with None,
    by this list), so that the subsets cross-validation splitters take
    (plain lists of the same matrices) keep their groups, and a model
    cross-validated on them is the model ``fit`` builds on the whole list.

    Parameters
    ----------
    sequences : iterable of matrices
        One (T_n, n_features) feature matrix per sequence (sparse matrices
        carry the groups too).
    feature_groups : array-like of int of shape (n_features,) or None
        The group (template) of every column: non-negative integers, checked
        against the matrices' number of columns; None for no groups.

    Examples
    --------
    >>> import numpy as np
    >>> from skgpstruct.features import FeatureSequences
    >>> X = FeatureSequences([np.zeros((2, 3))], feature_groups=[0, 0, 1])
    >>> len(X), X.feature_groups.tolist()
    (1, [0, 0, 1])
    """

    def __init__(self, sequences=(), feature_groups=None):
        super().__init__(sequences)
        self.feature_groups = feature_groups

    @property
    def feature_groups(self):
        """The column groups (ndarray of int), or None; setting them sets
        (or, with None, removes) those of every sparse matrix too."""
        return self._feature_groups

    @feature_groups.setter
    def feature_groups(self, feature_groups):
        groups = None
        if feature_groups is not None:
            columns = {m.shape[1] for m in self if len(getattr(m, "shape", ())) == 2}
            groups = check_groups(
                feature_groups, "feature_groups",
                columns.pop() if len(columns) == 1 else None,
            )
        self._feature_groups = groups
        for matrix in self:
            if not sp.issparse(matrix):
                continue
            if groups is None:
                matrix.__dict__.pop("feature_groups", None)
            else:
                matrix.feature_groups = groups

    def __reduce__(self):
        return (type(self), (list(self), self.feature_groups))


class CRFppTemplateVectorizer(
    TransformerMixin, BaseEstimator, auto_wrap_output_keys=None
):
    """Binary features from a CRF++ template, one sparse matrix per sequence.

    Every unigram (``U``) line of the template is expanded at every token as
    CRF++ does (see :func:`expand_crfpp_template`); each distinct expanded
    string seen in ``fit`` at least ``min_count`` times becomes one binary
    feature. Bigram (``B``) lines ask for label transition features, which
    the estimator models as pairwise potentials: the vectorizer only reports
    them in ``uses_transitions_``. Macros on ``B`` lines (CRF++'s
    transitions conditioned on the tokens) are not modelled: ``fit`` warns,
    checks the columns they read, and treats the line as a bare ``B``.

    Parameters
    ----------
    template : str or path-like
        The CRF++ template: its text, or the path of a template file. A
        string without a newline that names an existing file is read as a
        path; one that names no file and has no ``%x[row,col]`` macro (no
        ``%`` at all) is refused as a missing file (one-line template text
        without a macro ends with a newline, e.g. ``"U\\n"``). Lines
        ``Uxx:...%x[row,col]...`` and ``Bxx...``; a line that is just ``U``
        or ``B`` has no macro (``U`` is then a bias feature); ``#`` comments
        and blank lines are ignored.
    min_count : int, default=1
        Keep features that occur at least this many times in the training
        sequences, counted as CRF++'s ``-f`` option counts them: once per
        token and template line that renders the string (two lines sharing
        an id that render it at one token count twice).

    Attributes
    ----------
    vocabulary_ : dict of str to int
        Feature string -> column index; columns are in sorted string order.
    uses_transitions_ : bool
        Whether the template has a ``B`` line, i.e. asks for transition
        features between neighbouring labels. Informative only:
        :class:`~skgpstruct.GPStructClassifier` always has pairwise
        potentials (their prior variance is learned, so unneeded transitions
        shrink); a template without ``B`` lines, which gives CRF++ a model
        without transitions, does not remove them.
    feature_groups_ : ndarray of int64 of shape (n_features,)
        For every column, the index in ``unigram_templates_`` of the
        template line that produced it (the first one, if two lines render
        the same string). Pass it to
        :class:`skgpstruct.kernels.GroupedLinearKernel` to learn one prior
        variance per template.
    unigram_templates_ : list of str
        The ``U`` lines, in template order.
    transition_templates_ : list of str
        The ``B`` lines, in template order.

    Examples
    --------
    >>> from skgpstruct.features import CRFppTemplateVectorizer
    >>> X = [[["He", "PRP"], ["reckons", "VBZ"]]]
    >>> vec = CRFppTemplateVectorizer("U00:%x[-1,0]\\nU01:%x[0,1]\\nB").fit(X)
    >>> vec.get_feature_names_out().tolist()
    ['U00:He', 'U00:_B-1', 'U01:PRP', 'U01:VBZ']
    >>> vec.transform(X)[0].toarray()
    array([[0., 1., 1., 0.],
           [1., 0., 0., 1.]])
    >>> vec.uses_transitions_
    True
    """

    _parameter_constraints = {
        "template": [str, os.PathLike],
        "min_count": [Interval(Integral, 1, None, closed="left")],
    }

    def __init__(self, template, *, min_count=1):
        self.template = template
        self.min_count = min_count

    def fit(self, X, y=None):
        """Learn the features of the template that occur in ``X``.

        Parameters
        ----------
        X : list of list of list of str
            Token rows of every sequence (``X[i][t][col]``), as the tokens
            :func:`skgpstruct.io.read_conll` returns.
        y : None
            Ignored; present for the Pipeline API.

        Returns
        -------
        self : CRFppTemplateVectorizer
            The fitted vectorizer.
        """
        self._fit(X)
        return self

    def fit_transform(self, X, y=None):
        """Fit and return the features of ``X`` (expanding it only once).

        Parameters
        ----------
        X : list of list of list of str
            Token rows of every sequence, as the tokens
            :func:`skgpstruct.io.read_conll` returns.
        y : None
            Ignored; present for the Pipeline API.

        Returns
        -------
        Xt : FeatureSequences of scipy.sparse.csr_matrix of shape (T_i, n_features)
            Binary float64 features of every sequence, with their
            ``feature_groups``, as :meth:`transform` returns them.
        """
        expanded = self._fit(X)
        return FeatureSequences(
            self._to_matrices(expanded, [len(seq) for seq in X]),
            feature_groups=self.feature_groups_,
        )

    def _fit(self, X):
        self._validate_params()
        check_integer(self.min_count, "min_count", 1)  # True passes the above
        unigrams, bigrams = _parse_template(self.template)
        X = _check_token_sequences(X)
        if len(X) == 0:
            refuse_no_sequences()
        conditioned = [line.text for line in bigrams if line.macros]
        if conditioned:
            warnings.warn(
                f"the template's B lines {conditioned} have macros: transitions "
                "conditioned on the tokens are not modelled (the pairwise "
                "potentials are one matrix for the whole sequence), so they act "
                "as a bare 'B'",
                UserWarning,
                stacklevel=outside_stacklevel(),
            )
        counts = Counter()
        source_line = {}
        expanded = []
        for i, seq in enumerate(X):
            _check_columns(unigrams + bigrams, seq, i)
            lines = _expand(unigrams, seq)
            for line_index, strings in enumerate(lines):
                counts.update(strings)
                for string in strings:
                    # The first line in template order that renders the
                    # string, whatever sequence showed it first.
                    if source_line.setdefault(string, line_index) > line_index:
                        source_line[string] = line_index
            expanded.append(lines)
        kept = sorted(f for f, n in counts.items() if n >= self.min_count)
        self.vocabulary_ = {f: k for k, f in enumerate(kept)}
        self.feature_groups_ = np.array([source_line[f] for f in kept], dtype=np.int64)
        self.uses_transitions_ = bool(bigrams)
        self.unigram_templates_ = [line.text for line in unigrams]
        self.transition_templates_ = [line.text for line in bigrams]
        self._unigrams, self._bigrams = unigrams, bigrams
        return expanded

    def transform(self, X):
        """Binary template features of every sequence.

        Features not seen in ``fit`` are ignored.

        Parameters
        ----------
        X : list of list of list of str
            Token rows of every sequence, as the tokens
            :func:`skgpstruct.io.read_conll` returns.

        Returns
        -------
        Xt : FeatureSequences of scipy.sparse.csr_matrix of shape (T_i, n_features)
            Binary float64 features of every sequence: a list that also
            carries ``feature_groups`` (the template of every column), which
            :class:`~skgpstruct.GPStructClassifier` uses with
            ``feature_groups="auto"``.
        """
        check_is_fitted(self, "vocabulary_")
        X = _check_token_sequences(X)
        lines = self._unigrams + self._bigrams
        expanded = []
        for i, seq in enumerate(X):
            _check_columns(lines, seq, i)
            expanded.append(_expand(self._unigrams, seq))
        return FeatureSequences(
            self._to_matrices(expanded, [len(seq) for seq in X]),
            feature_groups=self.feature_groups_,
        )

    def _to_matrices(self, expanded, lengths):
        """Canonical CSR matrices of every sequence's feature strings
        (``expanded[i]``: per unigram line, a string per token), a column
        once per token however many lines render it, unseen strings left
        out.

        One vocabulary lookup over all the strings and one sort for all the
        tokens, then each sequence's matrix from its slice of the arrays:
        scipy's COO constructor and ``sum_duplicates`` per sequence took
        more than half of ``transform``.
        """
        n_features, n_lines = len(self.vocabulary_), len(self._unigrams)
        total = int(sum(lengths))
        if n_lines == 0 or total == 0:
            return [sp.csr_matrix((n, n_features), dtype=np.float64) for n in lengths]
        strings = []
        for lines in expanded:
            for line in lines:
                strings.extend(line)
        codes = np.fromiter(
            map(self.vocabulary_.get, strings, itertools.repeat(-1)),
            dtype=np.int64, count=len(strings),
        )
        # Token rows of line codes: sequence i's block of codes is (line, token).
        ids = np.empty((total, n_lines), dtype=np.int64)
        token = code = 0
        for n in lengths:
            block = codes[code : code + n_lines * n]
            ids[token : token + n] = block.reshape(n_lines, n).T
            token, code = token + n, code + n_lines * n
        ids.sort(axis=1)
        keep = ids >= 0  # seen in fit
        keep[:, 1:] &= ids[:, 1:] != ids[:, :-1]  # a repeated line fires once
        indptr = np.zeros(total + 1, dtype=np.int64)
        np.cumsum(keep.sum(axis=1), out=indptr[1:])
        index_dtype = np.int32 if max(n_features, indptr[-1]) < 2**31 else np.int64
        indices = ids[keep].astype(index_dtype)  # row by row, increasing
        indptr = indptr.astype(index_dtype)
        matrices = []
        token = 0
        for n in lengths:
            first, last = indptr[token], indptr[token + n]
            matrix = sp.csr_matrix(
                (np.ones(last - first), indices[first:last].copy(),
                 indptr[token : token + n + 1] - first),
                shape=(n, n_features),
            )
            matrix.has_canonical_format = True
            matrices.append(matrix)
            token += n
        return matrices

    def get_feature_names_out(self, input_features=None):
        """Feature strings of the output columns.

        Parameters
        ----------
        input_features : None
            Ignored; present for API consistency.

        Returns
        -------
        feature_names_out : ndarray of str objects of shape (n_features,)
        """
        check_is_fitted(self, "vocabulary_")
        return np.array(sorted(self.vocabulary_, key=self.vocabulary_.get),
                        dtype=object)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.two_d_array = False
        tags.input_tags.string = True
        tags.requires_fit = True
        return tags


def _token_dict(token, name):
    """A token's features as one flat dict, from the formats python-crfsuite
    (hence sklearn-crfsuite) takes: a dict, whose nested dicts give
    ``"outer:inner"`` names, or a list (or set) of feature-name strings
    (each with value 1.0). NumPy scalar values become Python ones (a NumPy
    bool, from ``np.char.isupper`` or pandas, was refused by the
    DictVectorizer, or left out of its vocabulary)."""
    if isinstance(token, Mapping):
        if not any(isinstance(v, Mapping | np.generic) for v in token.values()):
            return token
        flat = {}

        def add(key, value):
            # A nested key and an equal flat one ({"w": {"lower": ...}} and
            # "w:lower") overwrote each other: one feature was lost.
            if key in flat:
                raise ValueError(
                    f"{name} has the feature {key!r} twice (a nested dict's "
                    "'outer:inner' name equals another key); rename one of "
                    "them"
                )
            flat[key] = value

        for key, value in token.items():
            if isinstance(value, Mapping):
                for inner, inner_value in _token_dict(value, name).items():
                    add(f"{key}:{inner}", inner_value)
            else:
                add(key, value.item() if isinstance(value, np.generic) else value)
        return flat
    if isinstance(token, list | tuple | set | frozenset) and all(
        isinstance(f, str) for f in token
    ):
        # (a set's order is arbitrary: sorted, so that the features' order
        # does not depend on the hash seed)
        names = sorted(token) if isinstance(token, set | frozenset) else token
        return dict.fromkeys(names, 1.0)
    raise ValueError(
        f"{name} must be a dict of token features (name -> value, nested "
        "dicts allowed) or a list or set of feature-name strings, got "
        f"{type(token).__name__}"
    )


def _check_dict_sequences(X):
    """Flatten a list of sequences of token dicts; return (dicts, lengths)."""
    if isinstance(X, str | bytes | Mapping) or not hasattr(X, "__len__"):
        raise ValueError(
            "X must be a list of sequences, each a list of token feature dicts, "
            f"got {type(X).__name__}"
        )
    flat, lengths = [], []
    for i, seq in enumerate(X):
        if isinstance(seq, str | bytes | Mapping) or not (
            hasattr(seq, "__len__") and hasattr(seq, "__iter__")
        ):  # (python-crfsuite's ItemSequence has a length, no iterator)
            raise ValueError(
                f"X[{i}] must be a sequence of token feature dicts, got "
                f"{type(seq).__name__}; X must be a list of sequences (wrap a "
                "single sequence as [seq])"
            )
        flat.extend(_token_dict(token, f"X[{i}][{t}]") for t, token in enumerate(seq))
        lengths.append(len(seq))
    return flat, lengths


def _keyed_names(flat):
    """The keys of the token dicts whose values name columns ``key=value``
    for a DictVectorizer (strings, and iterables of strings), as a set."""
    return {
        key for token in flat for key, value in token.items()
        if not isinstance(value, Number) and value is not None
    }


def _groups_by_key(names, keyed, separator):
    """(feature_groups, group_names): every column's token-dict key.

    A column named ``key<separator>value`` belongs to ``key`` when ``key``
    took string values (the shortest such prefix); any other column named
    with the separator to what precedes its first one (a feature name
    ``"w=the"`` of a token given as a list of strings, whose value is 1.0,
    belongs to ``"w"``); a column without it (a numeric or boolean value)
    is its own key. Groups are numbered in the keys' sorted order.
    """
    keys = []
    for name in names:
        first = start = name.find(separator)
        key = name if first < 0 else name[:first]
        while start >= 0:
            if name[:start] in keyed:
                key = name[:start]
                break
            start = name.find(separator, start + 1)
        keys.append(key)
    group_names, groups = np.unique(np.array(keys, dtype=object), return_inverse=True)
    return groups.astype(np.int64), group_names


def _split_tokens(stacked, lengths):
    """The wrapped vectorizer's output, one token per row, split into
    sequences: arrays, or CSR matrices (COO and other sparse formats cannot
    be sliced by rows) without stored zeros.

    ``DictVectorizer`` stores the zeros of ``False`` values: the estimator
    would drop them sequence by sequence (a copy each, most of the time of
    a ``predict``), here they go in one pass.
    """
    if sp.issparse(stacked):
        if stacked.format != "csr":
            stacked = stacked.tocsr()
        stacked = without_stored_zeros(stacked)
    return split_by_offsets(stacked, offsets_from_lengths(lengths))


class SequenceDictVectorizer(
    TransformerMixin, BaseEstimator, auto_wrap_output_keys=None
):
    """Token feature dicts -> one feature matrix per sequence.

    The input users of sklearn-crfsuite already have: a list of sequences,
    each a list of token feature dicts (``{"word.lower()": "the",
    "postag": "DT", "BOS": True}``), in the formats python-crfsuite takes:
    nested dicts give ``"outer:inner"`` feature names (``{"word": {"lower":
    "the"}}`` is ``{"word:lower": "the"}``), and a token may be a list or
    set of feature-name strings (each with value 1.0); NumPy scalar values
    are read as Python ones. The dicts of all tokens are handed to a
    :class:`~sklearn.feature_extraction.DictVectorizer` (string values become
    one-hot ``name=value`` features, numbers and booleans are kept as
    values) or to any transformer with the same interface, such as
    :class:`~sklearn.feature_extraction.FeatureHasher`; its output is cut
    back into sequences.

    With a ``DictVectorizer`` the columns are grouped by the token-dict key
    they come from (``"word.lower()=the"`` and ``"word.lower()=cat"`` are
    the key ``"word.lower()"``, and so are the feature names
    ``"word.lower()=the"`` of tokens given as lists of strings; a numeric or
    boolean feature is its own key), and the output carries the groups
    (``feature_groups``) as :class:`CRFppTemplateVectorizer`'s carries its
    templates:
    :class:`~skgpstruct.GPStructClassifier` (``feature_groups="auto"``, the
    default) then learns one prior variance per key. On the dev splits of
    the four CRF++ sets, with sklearn-crfsuite-style token dicts, that
    lowered the token error from 7.98 / 13.96 / 14.61 / 8.19 % to 6.79 /
    11.69 / 12.71 / 4.58 % (basenp / chunking / seg / JapaneseNE) for
    about twice the fit time (see :doc:`/benchmarks`, "Token dicts").
    ``GPStructClassifier(feature_groups=None)`` shares one variance.
    Hashed columns (``FeatureHasher``) have no key: no groups. Dense output
    (``DictVectorizer(sparse=False)``) carries the groups on its list only:
    the plain lists of its arrays that cross-validation splitters take do
    not, so compute such features inside the ``Pipeline``, or keep them
    sparse (each sparse matrix carries the groups too).

    Parameters
    ----------
    vectorizer : estimator or None, default=None
        An unfitted transformer taking a list of dicts, cloned in ``fit``;
        None means ``DictVectorizer()``.

    Attributes
    ----------
    vectorizer_ : estimator
        The fitted clone of ``vectorizer``.
    feature_groups_ : ndarray of int64 of shape (n_features,) or None
        For every column, the index in ``feature_group_names_`` of its
        token-dict key; None when the wrapped vectorizer does not name its
        columns ``key<separator>value`` as a ``DictVectorizer`` does (a
        ``FeatureHasher``), or has no column.
    feature_group_names_ : ndarray of str objects of shape (n_groups,) or None
        The keys, sorted (None with ``feature_groups_``).

    Examples
    --------
    >>> from skgpstruct.features import SequenceDictVectorizer
    >>> X = [[{"w": "the", "bos": True}, {"w": "cat"}], [{"w": "cat"}]]
    >>> vec = SequenceDictVectorizer().fit(X)
    >>> vec.get_feature_names_out().tolist()
    ['bos', 'w=cat', 'w=the']
    >>> [m.shape for m in vec.transform(X)]
    [(2, 3), (1, 3)]
    >>> vec.feature_groups_.tolist(), vec.feature_group_names_.tolist()
    ([0, 1, 1], ['bos', 'w'])
    """

    _parameter_constraints = {
        "vectorizer": [HasMethods(["fit", "transform"]), None],
    }

    def __init__(self, vectorizer=None):
        self.vectorizer = vectorizer

    def _fit_input(self, X):
        """A fresh vectorizer, and the checked token dicts of ``X`` (at
        least one sequence) with the sequence lengths."""
        self._validate_params()
        vectorizer = (
            DictVectorizer() if self.vectorizer is None else clone(self.vectorizer)
        )
        input_type = getattr(vectorizer, "input_type", "dict")
        if input_type != "dict":
            # A FeatureHasher(input_type="string") hashed the dicts' keys
            # only: two tokens with other values had the same features.
            raise ValueError(
                "vectorizer must take token dicts (SequenceDictVectorizer gives "
                f"it one dict per token), got input_type={input_type!r}; use "
                "FeatureHasher(input_type='dict'), the default"
            )
        flat, lengths = _check_dict_sequences(X)
        if not lengths:
            refuse_no_sequences()
        return vectorizer, flat, lengths

    def fit(self, X, y=None):
        """Fit the wrapped vectorizer on the dicts of all tokens.

        Parameters
        ----------
        X : list of list of dict
            Token feature dicts of every sequence (``X[i][t]``).
        y : None
            Ignored; present for the Pipeline API.

        Returns
        -------
        self : SequenceDictVectorizer
            The fitted vectorizer.
        """
        vectorizer, flat, _ = self._fit_input(X)
        self.vectorizer_ = vectorizer.fit(flat)
        self._set_groups(flat)
        return self

    def _set_groups(self, flat):
        """``feature_groups_`` and ``feature_group_names_`` of the fitted
        vectorizer (None when its columns are not named by key)."""
        self.feature_groups_ = self.feature_group_names_ = None
        vectorizer = self.vectorizer_
        separator = getattr(vectorizer, "separator", None)
        vocabulary = getattr(vectorizer, "vocabulary_", None)
        if not (isinstance(separator, str) and separator and hasattr(
            vocabulary, "__len__"
        ) and hasattr(vectorizer, "get_feature_names_out")):
            return
        # (a vectorizer only resembling DictVectorizer: no groups)
        names = vectorizer.get_feature_names_out()
        if 0 < len(names) == len(vocabulary):
            self.feature_groups_, self.feature_group_names_ = _groups_by_key(
                [str(name) for name in names], _keyed_names(flat), separator
            )

    def _with_groups(self, sequences):
        """The output: a :class:`FeatureSequences` carrying the groups, or
        the list as it is without them."""
        # (None too for a vectorizer pickled before the groups existed)
        groups = getattr(self, "feature_groups_", None)
        if groups is None:
            return sequences
        return FeatureSequences(sequences, feature_groups=groups)

    def fit_transform(self, X, y=None):
        """Fit the wrapped vectorizer and return the features of ``X``.

        Parameters
        ----------
        X : list of list of dict
            Token feature dicts of every sequence.
        y : None
            Ignored; present for the Pipeline API.

        Returns
        -------
        Xt : list of sparse matrices (or ndarrays) of shape (T_i, n_features)
            Features of every sequence, in the wrapped vectorizer's output
            format (CSR for the default ``DictVectorizer``); a
            :class:`FeatureSequences` carrying ``feature_groups`` when the
            columns are grouped by key (``feature_groups_``).
        """
        vectorizer, flat, lengths = self._fit_input(X)
        if not flat:  # as fit does (scikit-learn refuses to transform nothing)
            self.vectorizer_ = vectorizer.fit(flat)
            self._set_groups(flat)
            return self.transform(X)
        stacked = vectorizer.fit_transform(flat)
        self.vectorizer_ = vectorizer
        self._set_groups(flat)
        return self._with_groups(_split_tokens(stacked, lengths))

    def transform(self, X):
        """Features of every sequence.

        Parameters
        ----------
        X : list of list of dict
            Token feature dicts of every sequence.

        Returns
        -------
        Xt : list of sparse matrices (or ndarrays) of shape (T_i, n_features)
            Features of every sequence, in the wrapped vectorizer's output
            format (CSR for the default ``DictVectorizer``); a
            :class:`FeatureSequences` carrying ``feature_groups`` when the
            columns are grouped by key (``feature_groups_``). Features unseen
            in ``fit`` are ignored by ``DictVectorizer``.
        """
        check_is_fitted(self, "vectorizer_")
        flat, lengths = _check_dict_sequences(X)
        if not flat:
            # No token: the output of one token without features, with no
            # row (its width and kind: a FeatureHasher has no feature names
            # to count, sparse=False gives arrays).
            return self._with_groups(
                _split_tokens(self.vectorizer_.transform([{}])[:0], lengths)
            )
        stacked = self.vectorizer_.transform(flat)
        return self._with_groups(_split_tokens(stacked, lengths))

    def get_feature_names_out(self, input_features=None):
        """Feature names of the wrapped vectorizer.

        Parameters
        ----------
        input_features : None
            Ignored; present for API consistency.

        Returns
        -------
        feature_names_out : ndarray of str objects of shape (n_features,)

        Raises
        ------
        AttributeError
            If the wrapped vectorizer has no feature names (FeatureHasher).
        """
        check_is_fitted(self, "vectorizer_")
        if not hasattr(self.vectorizer_, "get_feature_names_out"):
            raise AttributeError(
                f"the wrapped {type(self.vectorizer_).__name__} has no feature "
                "names (hashed features cannot be named)"
            )
        return self.vectorizer_.get_feature_names_out()

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.two_d_array = False
        tags.input_tags.dict = True
        tags.requires_fit = True
        return tags
