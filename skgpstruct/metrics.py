"""Token and chunk scores for sequence labelling, and their scorers.

Every function takes lists of label sequences: ``y_true[i]`` and
``y_pred[i]`` are the labels of the ``T_i`` tokens of sequence ``i``.

Chunk scores follow the CoNLL ``conlleval`` script (Erik Tjong Kim Sang,
version 2004-01-26). A label is split at its first dash into a tag and a
type (``"B-NP"`` -> ``("B", "NP")``); a label without a dash is a tag with an
empty type (``"O"``, or the untyped ``"B"`` / ``"I"`` of CRF++'s basenp
data, whose chunks have the type ``""``); bytes labels are split as the
UTF-8 text they hold. ``"O"`` is outside any chunk.
A chunk is correct when it starts and ends at the same tokens, with the same
type, in both sequences. Sequences are scored as separate sentences: no
chunk crosses from one sequence into the next. Precision, recall and F1 are
0 when undefined, as in ``conlleval``.

The ``scheme`` parameter picks how chunk starts and ends are decided:

``None`` (default)
    The rules of ``conlleval``: generic over the tags ``B``, ``I``, ``E`` and
    ``O`` (and the bracket tags ``[``, ``]``, ``.`` of older CoNLL formats).
    It reproduces ``conlleval`` on IOB1, IOB2, IOE1 and IOE2 data. It does
    not know the ``S`` tag of IOBES, and it merges ``E-X`` followed by
    ``B-X``; use ``scheme="iobes"`` for such data.
``"iob1"``, ``"iob2"``
    Tags ``B``, ``I``, ``O``. A chunk starts at ``B``, at ``I`` after ``O``
    and at a type change; it ends before ``B``, before ``O`` and at a type
    change. Both schemes are decoded alike (``conlleval`` is lenient about
    an ``I`` that starts a chunk); they differ only in how labels are
    written.
``"ioe1"``, ``"ioe2"``
    Tags ``I``, ``E``, ``O``. A chunk ends at ``E``, before ``O`` and at a
    type change; it starts after ``E``, after ``O`` and at a type change.
``"iobes"``
    Tags ``B``, ``I``, ``E``, ``S``, ``O``. A chunk starts at ``B`` and
    ``S`` (and, leniently, at ``I`` / ``E`` after ``O``, ``E``, ``S`` or a
    type change); it ends at ``E`` and ``S`` (and before ``O``, ``B``,
    ``S`` or a type change).

With an explicit scheme, a label whose tag is not one of the scheme's raises
a ``ValueError``.

Scorers for :class:`~sklearn.model_selection.GridSearchCV` and
:func:`~sklearn.model_selection.cross_val_score` are in :data:`SCORERS`
(names ``"token_accuracy"``, ``"sequence_accuracy"``, ``"chunk_f1"``,
``"chunk_precision"``, ``"chunk_recall"``); :func:`get_sequence_scorer`
returns one by name. The same scorers are importable one by one:
``token_accuracy_scorer``, ``sequence_accuracy_scorer``, ``chunk_f1_scorer``,
``chunk_precision_scorer`` and ``chunk_recall_scorer``. Each is called as
``scorer(estimator, X, y)`` and scores ``estimator.predict(X)`` against
``y``; higher is better.

Examples
--------
Every scorer of :data:`SCORERS` at once, in a cross-validation over whole
sequences (chunk labels are made up from the synthetic classes):

>>> import numpy as np
>>> from sklearn.model_selection import cross_validate
>>> from skgpstruct import GPStructClassifier
>>> from skgpstruct.datasets import make_sequences
>>> from skgpstruct.metrics import SCORERS
>>> X, y = make_sequences(n_sequences=30, random_state=0)
>>> y = [np.array(["O", "B-NP", "I-NP"])[labels] for labels in y]
>>> scores = cross_validate(GPStructClassifier(random_state=0), X, y, cv=2,
...                         scoring=SCORERS)
>>> sorted(name for name in scores if name.startswith("test_"))[:3]
['test_chunk_f1', 'test_chunk_precision', 'test_chunk_recall']
>>> sorted(name for name in scores if name.startswith("test_"))[3:]
['test_sequence_accuracy', 'test_token_accuracy']
>>> scores["test_token_accuracy"].shape  # one score per fold
(2,)

One scorer on a fitted model, called as ``scorer(estimator, X, y)``:

>>> from skgpstruct.metrics import (
...     chunk_f1_scorer, chunk_precision_scorer, chunk_recall_scorer,
...     sequence_accuracy_scorer, token_accuracy_scorer)
>>> clf = GPStructClassifier(random_state=0).fit(X[:20], y[:20])
>>> scorers = [token_accuracy_scorer, sequence_accuracy_scorer, chunk_f1_scorer,
...            chunk_precision_scorer, chunk_recall_scorer]
>>> all(0.0 <= scorer(clf, X[20:], y[20:]) <= 1.0 for scorer in scorers)
True
>>> SCORERS["chunk_f1"] is chunk_f1_scorer
True
"""

import inspect
import numbers

import numpy as np
from sklearn.metrics import make_scorer

from ._checks import check_flag, check_integer
from ._sequences import check_sequence_labels, label_kinds

__all__ = [
    "token_accuracy",
    "sequence_accuracy",
    "chunk_precision_recall_fscore_support",
    "chunk_precision_score",
    "chunk_recall_score",
    "chunk_f1_score",
    "classification_report",
    "token_accuracy_scorer",
    "sequence_accuracy_scorer",
    "chunk_f1_scorer",
    "chunk_precision_scorer",
    "chunk_recall_scorer",
    "SCORERS",
    "get_sequence_scorer",
]


def _check_label_pair(y_true, y_pred):
    """Validate two lists of label sequences; return them as lists of lists."""
    for name, y in (("y_true", y_true), ("y_pred", y_pred)):
        if isinstance(y, str | bytes) or not hasattr(y, "__len__"):
            raise ValueError(
                f"{name} must be a list of per-sequence label lists, got "
                f"{type(y).__name__}"
            )
    if len(y_true) != len(y_pred):
        raise ValueError(
            f"y_true and y_pred have different numbers of sequences: "
            f"{len(y_true)} and {len(y_pred)}"
        )
    if len(y_true) == 0:
        raise ValueError("y_true and y_pred contain no sequences")
    true = check_sequence_labels(y_true, [np.size(s) for s in y_true], name="y_true")
    pred = check_sequence_labels(y_pred, [np.size(s) for s in y_pred], name="y_pred")
    for i, (a, b) in enumerate(zip(true, pred, strict=True)):
        if a.shape[0] != b.shape[0]:
            raise ValueError(
                f"sequence {i} has {a.shape[0]} labels in y_true but "
                f"{b.shape[0]} in y_pred"
            )
    # Strings never equal numbers nor bytes: every label would count as
    # wrong (check_sequence_labels refused a mix within y_true or y_pred).
    kinds = {
        name: set().union(*(label_kinds(seq) for seq in y))
        for name, y in (("y_true", y_true), ("y_pred", y_pred))
    }
    if kinds["y_true"] and kinds["y_pred"] and kinds["y_true"] != kinds["y_pred"]:
        (true_kind,), (pred_kind,) = kinds["y_true"], kinds["y_pred"]
        raise ValueError(
            f"y_true and y_pred mix label types ({true_kind} labels in y_true, "
            f"{pred_kind} labels in y_pred); give both as one type"
        )
    return [a.tolist() for a in true], [b.tolist() for b in pred]


def token_accuracy(y_true, y_pred):
    """Fraction of tokens whose predicted label equals the true one.

    Parameters
    ----------
    y_true : list of array-like of shape (T_i,)
        True labels of every sequence.
    y_pred : list of array-like of shape (T_i,)
        Predicted labels, with the same sequence lengths.

    Returns
    -------
    accuracy : float
        In [0, 1], over all tokens of all sequences.

    Examples
    --------
    >>> from skgpstruct.metrics import token_accuracy
    >>> y_true = [["B-NP", "I-NP", "B-VP", "O"], ["B-NP", "O", "B-NP", "I-NP"]]
    >>> y_pred = [["B-NP", "I-NP", "O", "O"], ["B-NP", "O", "B-NP", "I-NP"]]
    >>> token_accuracy(y_true, y_pred)  # 7 of 8 tokens
    0.875
    """
    true, pred = _check_label_pair(y_true, y_pred)
    n_tokens = sum(len(s) for s in true)
    if n_tokens == 0:
        raise ValueError("y_true and y_pred contain no tokens")
    n_correct = sum(
        a == b for st, sp in zip(true, pred, strict=True)
        for a, b in zip(st, sp, strict=True)
    )
    return n_correct / n_tokens


def sequence_accuracy(y_true, y_pred):
    """Fraction of sequences whose labels are all predicted correctly.

    Parameters
    ----------
    y_true : list of array-like of shape (T_i,)
        True labels of every sequence.
    y_pred : list of array-like of shape (T_i,)
        Predicted labels, with the same sequence lengths.

    Returns
    -------
    accuracy : float
        In [0, 1].

    Examples
    --------
    >>> from skgpstruct.metrics import sequence_accuracy
    >>> y_true = [["B-NP", "I-NP", "B-VP", "O"], ["B-NP", "O", "B-NP", "I-NP"]]
    >>> y_pred = [["B-NP", "I-NP", "O", "O"], ["B-NP", "O", "B-NP", "I-NP"]]
    >>> sequence_accuracy(y_true, y_pred)  # the second sequence only
    0.5
    """
    true, pred = _check_label_pair(y_true, y_pred)
    return sum(a == b for a, b in zip(true, pred, strict=True)) / len(true)


# Chunk boundary rules. Each takes (previous tag, tag, previous type, type)
# and says whether a chunk ends before / starts at the current token.


def _conlleval_end(prev, tag, prev_type, type_):
    if (prev, tag) in _CONLLEVAL_END_PAIRS or prev in ("[", "]"):
        return True
    return prev not in ("O", ".") and prev_type != type_


def _conlleval_start(prev, tag, prev_type, type_):
    if (prev, tag) in _CONLLEVAL_START_PAIRS or tag in ("[", "]"):
        return True
    return tag not in ("O", ".") and prev_type != type_


_CONLLEVAL_END_PAIRS = frozenset(
    [("B", "B"), ("B", "O"), ("I", "B"), ("I", "O"),
     ("E", "E"), ("E", "I"), ("E", "O")]
)
_CONLLEVAL_START_PAIRS = frozenset(
    [("B", "B"), ("I", "B"), ("O", "B"), ("O", "I"),
     ("E", "E"), ("E", "I"), ("O", "E")]
)


def _iob_end(prev, tag, prev_type, type_):
    return prev != "O" and (tag in ("B", "O") or prev_type != type_)


def _iob_start(prev, tag, prev_type, type_):
    return tag != "O" and (tag == "B" or prev == "O" or prev_type != type_)


def _ioe_end(prev, tag, prev_type, type_):
    return prev != "O" and (prev == "E" or tag == "O" or prev_type != type_)


def _ioe_start(prev, tag, prev_type, type_):
    return tag != "O" and (prev in ("E", "O") or prev_type != type_)


def _iobes_end(prev, tag, prev_type, type_):
    if prev == "O":
        return False
    return prev in ("E", "S") or tag in ("O", "B", "S") or prev_type != type_


def _iobes_start(prev, tag, prev_type, type_):
    if tag == "O":
        return False
    return tag in ("B", "S") or prev in ("O", "E", "S") or prev_type != type_


# scheme -> (start rule, end rule, accepted tags or None for any)
_SCHEMES = {
    None: (_conlleval_start, _conlleval_end, None),
    "iob1": (_iob_start, _iob_end, frozenset("BIO")),
    "iob2": (_iob_start, _iob_end, frozenset("BIO")),
    "ioe1": (_ioe_start, _ioe_end, frozenset("IEO")),
    "ioe2": (_ioe_start, _ioe_end, frozenset("IEO")),
    "iobes": (_iobes_start, _iobes_end, frozenset("BIESO")),
}


def _split_label(label):
    """``"B-NP"`` -> ``("B", "NP")``; a label without a dash has type ``""``.

    Bytes labels are split as the UTF-8 text they hold (``str(b"B-NP")``
    is ``"b'B-NP'"``, whose tag and type are nonsense).
    """
    if isinstance(label, bytes):
        label = label.decode("utf-8")
    tag, dash, type_ = str(label).partition("-")
    return tag, type_


def _chunk_counts(y_true, y_pred, scheme):
    """Per type: [true chunks, predicted chunks, correct chunks].

    The loop follows conlleval's: a chunk is correct when both sequences
    start a chunk of the same type at a token and both end it at the same
    later token, with no earlier disagreement about its end or type.
    """
    if not isinstance(scheme, str | None) or scheme not in _SCHEMES:
        raise ValueError(
            f"scheme must be None (conlleval's rules) or one of 'iob1', "
            f"'iob2', 'ioe1', 'ioe2', 'iobes', got {scheme!r}"
        )
    is_start, is_end, allowed = _SCHEMES[scheme]
    true, pred = _check_label_pair(y_true, y_pred)
    # The pair has one kind of label (checked): numbers have no chunk tag,
    # and every score would be 0, even of a perfect prediction.
    first = next((seq[0] for seq in true if seq), None)
    if isinstance(first, numbers.Number):
        raise ValueError(
            f"chunk scores need text labels with chunk tags such as 'B-PER', "
            f"'I-PER', 'O'; the labels are numbers (e.g. {first!r}): map them "
            "to their names first"
        )
    cache = {}

    def split(label, name, i):
        parts = cache.get(label)
        if parts is None:
            try:
                parts = _split_label(label)
            except UnicodeDecodeError as exc:
                raise ValueError(
                    f"{name}[{i}] has the bytes label {label!r}, which is not "
                    f"UTF-8 text ({exc.reason}); chunk labels are text such as "
                    "'B-NP'"
                ) from None
            if allowed is not None and parts[0] not in allowed:
                raise ValueError(
                    f"{name}[{i}] has the label {label!r}, whose tag "
                    f"{parts[0]!r} is not one of scheme={scheme!r}'s tags "
                    f"{sorted(allowed)}; labels look like 'B-NP' or 'O'"
                )
            cache[label] = parts
        return parts

    counts = {}

    def bump(type_, k):
        counts.setdefault(type_, [0, 0, 0])[k] += 1

    outside = ("O", "")
    # Kept across sequences, as conlleval reads a corpus: a chunk the
    # virtual "O" does not close (after a "." or an untyped "S" tag) is
    # closed later, or counted at the end (it was dropped: identical
    # [["B", "."]] scored 0).
    in_correct, correct_type = False, None
    for i, (seq_true, seq_pred) in enumerate(zip(true, pred, strict=True)):
        last_true = last_pred = outside
        # A virtual "O" after the sequence closes its last chunks.
        for a, b in zip([*seq_true, "O"], [*seq_pred, "O"], strict=True):
            cur_true = split(a, "y_true", i)
            cur_pred = split(b, "y_pred", i)
            end_true = is_end(last_true[0], cur_true[0], last_true[1], cur_true[1])
            end_pred = is_end(last_pred[0], cur_pred[0], last_pred[1], cur_pred[1])
            if in_correct:
                if end_true and end_pred and last_true[1] == last_pred[1]:
                    in_correct = False
                    bump(last_true[1], 2)
                elif end_true != end_pred or cur_true[1] != cur_pred[1]:
                    in_correct = False
            start_true = is_start(
                last_true[0], cur_true[0], last_true[1], cur_true[1]
            )
            start_pred = is_start(
                last_pred[0], cur_pred[0], last_pred[1], cur_pred[1]
            )
            if start_true and start_pred and cur_true[1] == cur_pred[1]:
                in_correct, correct_type = True, cur_true[1]
            if start_true:
                bump(cur_true[1], 0)
            if start_pred:
                bump(cur_pred[1], 1)
            last_true, last_pred = cur_true, cur_pred
    if in_correct:
        bump(correct_type, 2)
    return counts


def _prf(n_true, n_pred, n_correct):
    precision = n_correct / n_pred if n_pred else 0.0
    recall = n_correct / n_true if n_true else 0.0
    total = precision + recall
    f1 = 2 * precision * recall / total if total else 0.0
    return precision, recall, f1


def chunk_precision_recall_fscore_support(y_true, y_pred, *, scheme=None,
                                          average="micro"):
    """Chunk-level precision, recall, F1 and support, as ``conlleval``.

    Parameters
    ----------
    y_true : list of array-like of shape (T_i,)
        True labels of every sequence, e.g. ``["B-NP", "I-NP", "O"]``.
    y_pred : list of array-like of shape (T_i,)
        Predicted labels, with the same sequence lengths.
    scheme : {None, "iob1", "iob2", "ioe1", "ioe2", "iobes"}, default=None
        How chunk starts and ends are decided (see the module docstring);
        None applies ``conlleval``'s own rules.
    average : {"micro", None}, default="micro"
        ``"micro"`` pools the chunks of all types (``conlleval``'s overall
        line); None returns one value per chunk type.

    Returns
    -------
    precision : float or ndarray of shape (n_types,)
        Correct chunks over predicted chunks (0 when none is predicted).
    recall : float or ndarray of shape (n_types,)
        Correct chunks over true chunks (0 when there is none).
    f1 : float or ndarray of shape (n_types,)
        Harmonic mean of precision and recall (0 when both are 0).
    support : int or ndarray of shape (n_types,)
        Number of true chunks.
    types : ndarray of str of shape (n_types,)
        Only with ``average=None``: the sorted chunk types the other arrays
        refer to (types seen in ``y_true`` or ``y_pred``; ``""`` for untyped
        chunks).

    Examples
    --------
    Four true chunks (three ``NP``, one ``VP``); three predicted, all
    correct:

    >>> from skgpstruct.metrics import chunk_precision_recall_fscore_support
    >>> y_true = [["B-NP", "I-NP", "B-VP", "O"], ["B-NP", "O", "B-NP", "I-NP"]]
    >>> y_pred = [["B-NP", "I-NP", "O", "O"], ["B-NP", "O", "B-NP", "I-NP"]]
    >>> precision, recall, f1, support = chunk_precision_recall_fscore_support(
    ...     y_true, y_pred)
    >>> precision, recall, round(f1, 4), support
    (1.0, 0.75, 0.8571, 4)
    >>> precision, recall, f1, support, types = (
    ...     chunk_precision_recall_fscore_support(y_true, y_pred, average=None))
    >>> types.tolist(), recall.tolist(), support.tolist()
    (['NP', 'VP'], [1.0, 0.0], [3, 1])
    """
    if average not in ("micro", None):
        raise ValueError(f"average must be 'micro' or None, got {average!r}")
    counts = _chunk_counts(y_true, y_pred, scheme)
    if average == "micro":
        totals = np.sum([c for c in counts.values()], axis=0) if counts else [0] * 3
        n_true, n_pred, n_correct = (int(v) for v in totals)
        return (*_prf(n_true, n_pred, n_correct), n_true)
    types = sorted(counts)
    scores = np.array([_prf(*counts[t]) for t in types]).reshape(-1, 3)
    support = np.array([counts[t][0] for t in types], dtype=np.int64)
    return scores[:, 0], scores[:, 1], scores[:, 2], support, np.array(types, dtype=str)


def chunk_precision_score(y_true, y_pred, *, scheme=None):
    """Overall chunk precision (correct / predicted chunks), as ``conlleval``.

    Parameters
    ----------
    y_true : list of array-like of shape (T_i,)
        True labels of every sequence.
    y_pred : list of array-like of shape (T_i,)
        Predicted labels, with the same sequence lengths.
    scheme : {None, "iob1", "iob2", "ioe1", "ioe2", "iobes"}, default=None
        How chunk starts and ends are decided; None applies ``conlleval``'s
        rules.

    Returns
    -------
    precision : float
        In [0, 1]; 0 when no chunk is predicted.

    Examples
    --------
    >>> from skgpstruct.metrics import chunk_precision_score
    >>> y_true = [["B-NP", "I-NP", "B-VP", "O"], ["B-NP", "O", "B-NP", "I-NP"]]
    >>> y_pred = [["B-NP", "I-NP", "O", "O"], ["B-NP", "O", "B-NP", "I-NP"]]
    >>> chunk_precision_score(y_true, y_pred)  # 3 correct of 3 predicted
    1.0
    """
    return chunk_precision_recall_fscore_support(y_true, y_pred, scheme=scheme)[0]


def chunk_recall_score(y_true, y_pred, *, scheme=None):
    """Overall chunk recall (correct / true chunks), as ``conlleval``.

    Parameters
    ----------
    y_true : list of array-like of shape (T_i,)
        True labels of every sequence.
    y_pred : list of array-like of shape (T_i,)
        Predicted labels, with the same sequence lengths.
    scheme : {None, "iob1", "iob2", "ioe1", "ioe2", "iobes"}, default=None
        How chunk starts and ends are decided; None applies ``conlleval``'s
        rules.

    Returns
    -------
    recall : float
        In [0, 1]; 0 when ``y_true`` has no chunk.

    Examples
    --------
    >>> from skgpstruct.metrics import chunk_recall_score
    >>> y_true = [["B-NP", "I-NP", "B-VP", "O"], ["B-NP", "O", "B-NP", "I-NP"]]
    >>> y_pred = [["B-NP", "I-NP", "O", "O"], ["B-NP", "O", "B-NP", "I-NP"]]
    >>> chunk_recall_score(y_true, y_pred)  # 3 found of 4 true chunks
    0.75
    """
    return chunk_precision_recall_fscore_support(y_true, y_pred, scheme=scheme)[1]


def chunk_f1_score(y_true, y_pred, *, scheme=None):
    """Overall chunk F1 as a fraction (``conlleval``'s FB1 divided by 100).

    Parameters
    ----------
    y_true : list of array-like of shape (T_i,)
        True labels of every sequence.
    y_pred : list of array-like of shape (T_i,)
        Predicted labels, with the same sequence lengths.
    scheme : {None, "iob1", "iob2", "ioe1", "ioe2", "iobes"}, default=None
        How chunk starts and ends are decided; None applies ``conlleval``'s
        rules.

    Returns
    -------
    f1 : float
        In [0, 1]; 0 when precision and recall are both 0.

    Examples
    --------
    >>> from skgpstruct.metrics import chunk_f1_score
    >>> y_true = [["B-NP", "I-NP", "B-VP", "O"], ["B-NP", "O", "B-NP", "I-NP"]]
    >>> y_pred = [["B-NP", "I-NP", "O", "O"], ["B-NP", "O", "B-NP", "I-NP"]]
    >>> round(chunk_f1_score(y_true, y_pred), 4)  # 2 * 1 * 0.75 / 1.75
    0.8571

    IOBES labels need their scheme (``conlleval`` does not know ``S``):

    >>> chunk_f1_score([["S-PER", "O", "B-LOC", "E-LOC"]],
    ...                [["S-PER", "O", "B-LOC", "E-LOC"]], scheme="iobes")
    1.0
    """
    return chunk_precision_recall_fscore_support(y_true, y_pred, scheme=scheme)[2]


def classification_report(y_true, y_pred, *, scheme=None, digits=4,
                          output_dict=False):
    """Per-type and overall chunk precision, recall, F1 and support.

    Parameters
    ----------
    y_true : list of array-like of shape (T_i,)
        True labels of every sequence.
    y_pred : list of array-like of shape (T_i,)
        Predicted labels, with the same sequence lengths.
    scheme : {None, "iob1", "iob2", "ioe1", "ioe2", "iobes"}, default=None
        How chunk starts and ends are decided; None applies ``conlleval``'s
        rules.
    digits : int, default=4
        Decimal places of the fractions in the text report.
    output_dict : bool, default=False
        Return a dict instead of text.

    Returns
    -------
    report : str or dict
        The text report: one line per chunk type (the untyped chunks of
        data such as basenp are shown as ``(untyped)``), a ``micro avg``
        line pooling all chunks (``conlleval``'s overall line) and a
        ``token accuracy`` line. The dict maps every type (``""`` for
        untyped chunks) and ``"micro avg"`` to a dict with the keys
        ``"precision"``, ``"recall"``, ``"f1-score"``, ``"support"`` (true
        chunks) and ``"predicted"`` (predicted chunks), and
        ``"token accuracy"`` to a float.

    Examples
    --------
    >>> from skgpstruct.metrics import classification_report
    >>> y_true = [["B-NP", "I-NP", "B-VP", "O"], ["B-NP", "O", "B-NP", "I-NP"]]
    >>> y_pred = [["B-NP", "I-NP", "O", "O"], ["B-NP", "O", "B-NP", "I-NP"]]
    >>> print(classification_report(y_true, y_pred, digits=2))
                    precision     recall   f1-score   support predicted
    <BLANKLINE>
                NP       1.00       1.00       1.00         3         3
                VP       0.00       0.00       0.00         1         0
    <BLANKLINE>
         micro avg       1.00       0.75       0.86         4         3
    token accuracy       0.88
    <BLANKLINE>
    >>> classification_report(y_true, y_pred, output_dict=True)["NP"]["f1-score"]
    1.0
    """
    check_integer(digits, "digits", 0)
    output_dict = check_flag(output_dict, "output_dict")
    counts = _chunk_counts(y_true, y_pred, scheme)
    report = {}
    for type_ in sorted(counts):
        n_true, n_pred, n_correct = counts[type_]
        report[type_] = _report_row(n_true, n_pred, n_correct)
    totals = [sum(c[k] for c in counts.values()) for k in range(3)]
    report["micro avg"] = _report_row(*totals)
    report["token accuracy"] = token_accuracy(y_true, y_pred)
    if output_dict:
        return report
    names = ["(untyped)" if t == "" else t for t in sorted(counts)]
    width = max([len(n) for n in names] + [len("token accuracy")])
    header = (
        f"{'':>{width}} {'precision':>10} {'recall':>10} {'f1-score':>10} "
        f"{'support':>9} {'predicted':>9}"
    )
    lines = [header, ""]

    def row(name, values):
        return (
            f"{name:>{width}} {values['precision']:>10.{digits}f} "
            f"{values['recall']:>10.{digits}f} {values['f1-score']:>10.{digits}f} "
            f"{values['support']:>9d} {values['predicted']:>9d}"
        )

    for name, type_ in zip(names, sorted(counts), strict=True):
        lines.append(row(name, report[type_]))
    lines.append("")
    lines.append(row("micro avg", report["micro avg"]))
    accuracy = report["token accuracy"]
    lines.append(f"{'token accuracy':>{width}} {accuracy:>10.{digits}f}")
    return "\n".join(lines) + "\n"


def _report_row(n_true, n_pred, n_correct):
    precision, recall, f1 = _prf(n_true, n_pred, n_correct)
    return {
        "precision": precision,
        "recall": recall,
        "f1-score": f1,
        "support": int(n_true),
        "predicted": int(n_pred),
    }


_METRICS = {
    "token_accuracy": token_accuracy,
    "sequence_accuracy": sequence_accuracy,
    "chunk_f1": chunk_f1_score,
    "chunk_precision": chunk_precision_score,
    "chunk_recall": chunk_recall_score,
}

#: Scorer: token accuracy, for ``scoring=`` in model selection.
token_accuracy_scorer = make_scorer(token_accuracy)
#: Scorer: sequence accuracy.
sequence_accuracy_scorer = make_scorer(sequence_accuracy)
#: Scorer: overall chunk F1 with ``conlleval``'s rules.
chunk_f1_scorer = make_scorer(chunk_f1_score)
#: Scorer: overall chunk precision with ``conlleval``'s rules.
chunk_precision_scorer = make_scorer(chunk_precision_score)
#: Scorer: overall chunk recall with ``conlleval``'s rules.
chunk_recall_scorer = make_scorer(chunk_recall_score)

#: Scorers by name, for ``scoring=`` in GridSearchCV / cross_val_score
#: (``scoring=SCORERS["chunk_f1"]``, or a dict of several).
SCORERS = {
    "token_accuracy": token_accuracy_scorer,
    "sequence_accuracy": sequence_accuracy_scorer,
    "chunk_f1": chunk_f1_scorer,
    "chunk_precision": chunk_precision_scorer,
    "chunk_recall": chunk_recall_scorer,
}


def get_sequence_scorer(name, **kwargs):
    """Scorer for lists of label sequences, by name.

    Parameters
    ----------
    name : str
        One of the keys of :data:`SCORERS`: ``"token_accuracy"``,
        ``"sequence_accuracy"``, ``"chunk_f1"``, ``"chunk_precision"``,
        ``"chunk_recall"``.
    **kwargs : dict
        Passed to the metric, e.g. ``scheme="iobes"`` for the chunk scores.

    Returns
    -------
    scorer : callable
        ``scorer(estimator, X, y)``, as :func:`sklearn.metrics.make_scorer`
        builds; usable as ``scoring=`` where the estimator's ``predict``
        returns one label array per sequence.

    Raises
    ------
    ValueError
        If ``name`` is not a key of :data:`SCORERS`, or if the metric does
        not take ``kwargs`` (their names or their values).

    Examples
    --------
    >>> from skgpstruct.metrics import SCORERS, get_sequence_scorer
    >>> get_sequence_scorer("chunk_f1") is SCORERS["chunk_f1"]
    True
    >>> iobes_f1 = get_sequence_scorer("chunk_f1", scheme="iobes")

    ``iobes_f1(estimator, X, y)`` scores ``estimator.predict(X)``; it fits
    ``GridSearchCV(..., scoring=iobes_f1)``.
    """
    if not isinstance(name, str) or name not in SCORERS:
        raise ValueError(
            f"unknown sequence scorer {name!r}; the names are {sorted(SCORERS)}"
        )
    if not kwargs:
        return SCORERS[name]
    metric = _METRICS[name]
    try:  # now, not at the first call of the scorer
        inspect.signature(metric).bind(None, None, **kwargs)
    except TypeError:
        accepted = list(inspect.signature(metric).parameters)[2:]
        raise ValueError(
            f"the {name!r} scorer takes the keyword arguments {accepted}, got "
            f"{sorted(kwargs)}"
        ) from None
    try:  # their values too, by the metric's own checks on a one-token input
        metric([["O"]], [["O"]], **kwargs)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"the {name!r} scorer refuses {kwargs}: {exc}") from None
    return make_scorer(metric, **kwargs)
