"""Validation and layout of ragged sequence data.

This is the one place that checks lists of per-sequence feature matrices,
concatenates them into a single matrix with an ``offsets`` array, and cuts
them into chunks. Everything else calls these helpers.
"""

import numbers
from collections.abc import Mapping, Set

import numpy as np
import scipy.sparse as sp

__all__ = [
    "canonical_csr",
    "check_sequence_features",
    "check_sequence_labels",
    "offsets_from_lengths",
    "stack_sequences",
    "split_by_offsets",
    "chunk_slices",
]


def _describe(obj):
    return type(obj).__name__


def _holds_token_dicts(seq):
    """Whether ``seq`` is a list of token feature dicts (sklearn-crfsuite's
    input), judged by its first token."""
    return (
        isinstance(seq, list | tuple) and len(seq) > 0
        and isinstance(seq[0], Mapping)
    )


def _holds_text_rows(seq):
    """Whether ``seq`` is a list of tokens given as lists of strings (CoNLL
    rows, or python-crfsuite's lists of feature names), by its first one."""
    return (
        isinstance(seq, list | tuple) and len(seq) > 0
        and isinstance(seq[0], list | tuple)
        and all(isinstance(v, str) for v in seq[0])
    )


def refuse_no_sequences(name="X"):
    """The error of a fit given no sequence in ``name``."""
    raise ValueError(f"{name} contains no sequences; at least one is required")


def canonical_csr(X, dtype=np.float64):
    """``X`` as a canonical CSR matrix (sorted indices, duplicates summed,
    stored zeros kept), never changing the caller's matrix.

    ``sp.csr_matrix`` shares a CSR input's arrays, so a matrix that is not
    canonical is copied before it is sorted and summed; a canonical one is
    returned without a copy (``dtype`` permitting).
    """
    if not (type(X) is sp.csr_matrix and X.dtype == dtype):
        X = sp.csr_matrix(X, dtype=dtype)
    if not X.has_canonical_format:
        X = X.copy()
        X.sum_duplicates()
    return X


def sorted_unique(values):
    """``np.unique`` of a 1-D integer array, by one sort and a comparison.

    The same array, faster on the short arrays a prediction call makes:
    on 500 integers numpy 2.4's ``np.unique`` took 41 to 42 us on this
    project's machine, this 8 us (with ``return_inverse`` both took about
    28 us: call ``np.unique`` for the inverse).
    """
    ordered = np.sort(values)
    first = np.ones(ordered.size, dtype=bool)
    np.not_equal(ordered[1:], ordered[:-1], out=first[1:])
    return ordered[first]


def column_positions(columns, n_columns):
    """A lookup table of ``columns`` among ``n_columns``: ``table[j]`` is the
    position of column ``j`` in ``columns``, or -1 (int32 when it fits).

    For :func:`entries_in_columns` called many times with the same columns:
    a gather per stored entry instead of a binary search, for 4 bytes per
    column of the design (4 MiB for 2**20 hashed columns).
    """
    columns = np.asarray(columns, dtype=np.int64)
    dtype = np.int32 if columns.size < np.iinfo(np.int32).max else np.int64
    table = np.full(n_columns, -1, dtype=dtype)
    table[columns] = np.arange(columns.size, dtype=dtype)
    return table


def entries_in_columns(X, columns, positions=None):
    """Which stored entries of ``X`` lie in ``columns``, and where.

    Parameters
    ----------
    X : canonical CSR matrix
    columns : ndarray of int
        Increasing column indices.
    positions : ndarray of int or None, default=None
        ``column_positions(columns, X.shape[1])``, when the caller keeps it.

    Returns
    -------
    inside : ndarray of bool of shape (X.nnz,)
        Whether each stored entry's column is one of ``columns``.
    position : ndarray of int of shape (X.nnz,)
        The entry's column's position in ``columns`` (meaningless where not
        ``inside``).

    The cost is the stored entries' (a binary search each, or a gather with
    ``positions``), not the design's width: 2**20 hashed columns cost what
    their tokens store.
    """
    if positions is not None:
        position = positions[X.indices]  # -1 outside: meaningless there
        return position >= 0, position
    columns = np.asarray(columns, dtype=np.int64)
    if columns.size == 0:
        return np.zeros(X.nnz, dtype=bool), np.zeros(X.nnz, dtype=np.int64)
    position = np.minimum(np.searchsorted(columns, X.indices), columns.size - 1)
    return columns[position] == X.indices, position


def select_columns(X, columns, positions=None):
    """``X[:, columns]`` of a canonical CSR ``X`` for increasing ``columns``,
    canonical, in time linear in the stored entries (see
    :func:`entries_in_columns`, and its ``positions``)."""
    inside, position = entries_in_columns(X, columns, positions)
    kept_before = np.concatenate([[0], np.cumsum(inside)])
    return sp.csr_matrix(
        (X.data[inside], position[inside], kept_before[X.indptr]),
        shape=(X.shape[0], len(columns)),
    )


def hstack_csr(blocks):
    """Side-by-side concatenation of canonical CSR matrices with the same
    rows, from their arrays: canonical, the same matrix as scipy's
    ``sp.hstack(blocks, format="csr")`` (which goes through COO and costs
    milliseconds at tens of thousands of entries)."""
    n_rows = blocks[0].shape[0]
    if any(b.shape[0] != n_rows for b in blocks):
        raise ValueError(
            "blocks must have the same number of rows, got "
            f"{[b.shape[0] for b in blocks]}"
        )
    counts = [np.diff(b.indptr).astype(np.int64) for b in blocks]
    indptr = np.zeros(n_rows + 1, dtype=np.int64)
    np.cumsum(np.sum(counts, axis=0), out=indptr[1:])
    data = np.empty(indptr[-1], dtype=np.float64)
    indices = np.empty(indptr[-1], dtype=np.int64)
    before = indptr[:-1].copy()  # where each row's next block goes
    column_offset = 0
    for block, count in zip(blocks, counts, strict=True):
        # entry i of row r goes to before[r] + (i - block.indptr[r])
        target = np.repeat(before - block.indptr[:-1], count)
        target += np.arange(block.indptr[-1], dtype=np.int64)
        data[target] = block.data[: block.indptr[-1]]
        indices[target] = block.indices[: block.indptr[-1]] + column_offset
        before += count
        column_offset += block.shape[1]
    out = sp.csr_matrix((data, indices, indptr), shape=(n_rows, column_offset))
    out.has_canonical_format = True
    return out


def without_stored_zeros(X):
    """A canonical CSR ``X`` without its explicitly stored zeros (a copy if
    it has any: the caller's matrix is never changed)."""
    if X.nnz and not X.data.all():
        X = X.copy()
        X.eliminate_zeros()
    return X


def _as_csr(matrix, label):
    """A sparse input as CSR (float64, the caller's matrix unchanged).

    A CSC, BSR or COO input's indices are checked first: scipy's conversion
    trusts them and writes out of bounds on a malformed matrix. A CSR's are
    checked by :func:`_check_csr_structure`, for all sequences at once.
    """
    if type(matrix) is sp.csr_matrix and matrix.dtype == np.float64:
        # Used as it is (never changed): a copy costs tens of microseconds,
        # seconds over many short sequences. Its arrays are checked by
        # _check_csr_structure.
        return matrix
    try:
        if matrix.format in ("csc", "bsr"):
            # A shell on the same arrays: the check may trim its arrays.
            shell = type(matrix)(
                (matrix.data, matrix.indices, matrix.indptr), shape=matrix.shape
            )
            shell.check_format(full_check=True)
        elif matrix.format == "coo":
            for axis, index in enumerate((matrix.row, matrix.col)):
                size = matrix.shape[axis]
                if index.size and not 0 <= index.min() <= index.max() < size:
                    raise ValueError(
                        f"{('row', 'column')[axis]} indices must lie in [0, {size})"
                    )
        # scipy's own (partial) check: index pointers of the right length,
        # from 0 to at most the number of stored entries.
        return sp.csr_matrix(matrix, dtype=np.float64)
    except ValueError as exc:
        raise ValueError(f"{label} is not a valid sparse matrix: {exc}") from None


#: Up to this many matrices, :func:`_check_csr_structure` checks them one by
#: one (a few NumPy calls, about 8 us a matrix); more, all at once (about
#: ten calls in all, some 35 us plus 2.5 us a matrix), and then one by one
#: only to name a malformed one.
FEW_MATRICES = 4


def _csr_problem(m):
    """What is wrong with a CSR matrix's row pointers (non-decreasing) or
    its column indices (within its columns), or None. Its pointers must
    already run from 0 to at most its stored entries."""
    pointers = m.indptr
    if (pointers[1:] < pointers[:-1]).any():
        return "row pointers must be non-decreasing"
    used = m.indices[: pointers[-1]]
    if used.size and not 0 <= used.min() <= used.max() < m.shape[1]:
        return f"column indices must lie in [0, {m.shape[1]})"
    return None


def _check_csr_structure(matrices, name):
    """Raise unless every CSR matrix's row pointers are as many as its rows
    plus one, non-decreasing from 0 to at most its stored entries, and its
    column indices lie within its columns (scipy's sorting and products and
    the compiled code read out of bounds otherwise). Beyond
    ``FEW_MATRICES`` matrices, vectorised over all of them but for a few
    comparisons each."""
    if not matrices:
        return
    for i, m in enumerate(matrices):  # what scipy's constructor checks
        n_stored = min(m.indices.size, m.data.size)
        if (
            m.indptr.ndim != 1 or m.indptr.size != m.shape[0] + 1
            or m.indptr[0] != 0 or not 0 <= m.indptr[-1] <= n_stored
        ):
            raise ValueError(
                f"{name}[{i}] is not a valid sparse matrix: row pointers must "
                f"be {m.shape[0] + 1} non-decreasing values from 0 to at most "
                f"the {n_stored} stored entries"
            )
    if len(matrices) > FEW_MATRICES:
        pointers = np.concatenate([m.indptr for m in matrices])
        steps = np.diff(pointers)
        # The differences between one matrix's last pointer and the next one's first.
        ends = np.cumsum([m.indptr.size for m in matrices])[:-1] - 1
        steps[ends] = 0
        widths = np.repeat(
            [m.shape[1] for m in matrices], [int(m.indptr[-1]) for m in matrices]
        )
        columns = np.concatenate([m.indices[: m.indptr[-1]] for m in matrices])
        if not ((steps < 0).any() or ((columns < 0) | (columns >= widths)).any()):
            return
    for i, m in enumerate(matrices):  # each, or the first malformed one
        problem = _csr_problem(m)
        if problem is not None:
            raise ValueError(f"{name}[{i}] is not a valid sparse matrix: {problem}")


def _check_finite(values, label):
    if not np.all(np.isfinite(values)):
        raise ValueError(
            f"{label} contains NaN or infinite values; features must be finite"
        )


def check_sequence_features(X, *, name="X", n_features=None, allow_empty=False):
    """Validate a list of per-sequence feature matrices.

    Parameters
    ----------
    X : sequence of array-like or sparse matrices of shape (T_n, n_features)
        One matrix per sequence; rows are tokens.
    name : str, default="X"
        Argument name used in error messages.
    n_features : int or None, default=None
        If given, the number of columns every sequence must have.
    allow_empty : bool, default=False
        Whether an empty list of sequences is accepted.

    Returns
    -------
    sequences : list
        float64 ndarrays (C-contiguous) or CSR matrices, one per sequence.
    is_sparse : bool
        True when the sequences are sparse.

    Raises
    ------
    ValueError
        On an empty list (unless allowed), a non two-dimensional sequence,
        a malformed sparse matrix (column indices out of range, row pointers
        not non-decreasing), mixed dense and sparse sequences, inconsistent
        or unexpected numbers of features, or NaN / infinite values.
    """
    if isinstance(X, np.ndarray) and X.dtype != object and X.ndim == 2:
        raise ValueError(
            f"{name} must be a list of per-sequence feature matrices of shape "
            f"(n_tokens, n_features), got one 2-D array of shape {X.shape}; "
            f"wrap a single sequence as [{name}]"
        )
    if (
        sp.issparse(X)
        or isinstance(X, str | bytes | Mapping | Set)
        or not hasattr(X, "__len__")
    ):
        raise ValueError(
            f"{name} must be a list of per-sequence feature matrices, "
            f"got {_describe(X)}"
        )
    if len(X) == 0 and not allow_empty:
        refuse_no_sequences(name)
    sequences = []
    kinds, empty_kinds = set(), set()  # formats of non-empty and empty ones
    for i, seq in enumerate(X):
        if sp.issparse(seq):
            if seq.dtype.kind not in "biuf":
                raise ValueError(
                    f"{name}[{i}] must hold real numbers, got a sparse matrix "
                    f"of dtype {seq.dtype}"
                )
            seq = _as_csr(seq, f"{name}[{i}]")
            values = None  # checked once canonical, below
            (kinds if seq.shape[0] else empty_kinds).add("sparse")
        else:
            if _holds_token_dicts(seq):
                raise ValueError(
                    f"{name}[{i}] holds token feature dicts; the estimator takes "
                    "numeric feature matrices: put a SequenceDictVectorizer "
                    "before it, make_pipeline(SequenceDictVectorizer(), "
                    "GPStructClassifier())"
                )
            try:  # a ragged list (rows of other lengths) raises here
                dtype = seq.dtype if hasattr(seq, "dtype") else np.asarray(seq).dtype
            except (TypeError, ValueError) as exc:
                hint = ""
                if _holds_text_rows(seq):
                    hint = (
                        "; for tokens given as lists of feature names put a "
                        "SequenceDictVectorizer before the estimator"
                    )
                raise ValueError(
                    f"{name}[{i}] could not be converted to a float array: "
                    f"{exc}{hint}"
                ) from None
            if dtype.kind in "USc":
                raise ValueError(
                    f"{name}[{i}] must hold real numbers, got an array of dtype "
                    f"{dtype}; for token rows of text (as "
                    "read_conll returns them) put a CRFppTemplateVectorizer "
                    "before the estimator"
                )
            try:
                seq = np.asarray(seq, dtype=np.float64)
            except (TypeError, ValueError) as exc:
                raise ValueError(
                    f"{name}[{i}] could not be converted to a float array: {exc}"
                ) from None
            if seq.ndim == 1 and seq.size == 0:
                seq = seq.reshape(0, n_features if n_features is not None else 0)
            if seq.ndim != 2:
                raise ValueError(
                    f"{name}[{i}] must be a 2-D matrix of shape (n_tokens, "
                    f"n_features), got an array with {seq.ndim} dimension(s)"
                )
            seq = np.ascontiguousarray(seq)
            values = seq
            (kinds if seq.shape[0] else empty_kinds).add("dense")
        if values is not None:
            _check_finite(values, f"{name}[{i}]")
        sequences.append(seq)
    if len(kinds) > 1:
        raise ValueError(
            f"{name} mixes dense and sparse sequences; give all sequences in "
            "one format"
        )
    # A zero-length sequence (``[]``, a (0, n) array or matrix) takes the
    # format of the others; if all are empty, sparse only if all were.
    is_sparse = kinds == {"sparse"} or (not kinds and empty_kinds == {"sparse"})
    sequences = [
        s if s.shape[0] or sp.issparse(s) == is_sparse
        else (sp.csr_matrix(s.shape) if is_sparse else np.zeros(s.shape))
        for s in sequences
    ]
    if is_sparse:
        _check_csr_structure(sequences, name)
        # Stored zeros dropped: the same values in any storage (a BSR
        # matrix's blocks, zeros written into a CSR) give the same features,
        # and so the same layouts and random draws.
        sequences = [without_stored_zeros(canonical_csr(seq)) for seq in sequences]
        # One pass over all the values; the loop only to name the culprit.
        if sequences and not np.isfinite(
            np.concatenate([seq.data for seq in sequences])
        ).all():
            for i, seq in enumerate(sequences):
                _check_finite(seq.data, f"{name}[{i}]")
    widths = {seq.shape[1] for seq in sequences if seq.shape[0] > 0} or {
        seq.shape[1] for seq in sequences
    }
    if len(widths) > 1:
        raise ValueError(
            f"all sequences of {name} must have the same number of features, "
            f"found {sorted(widths)}"
        )
    if n_features is not None and widths and widths != {n_features}:
        raise ValueError(
            f"{name} has {widths.pop()} features per token, but the estimator "
            f"was fitted with {n_features} features"
        )
    width = n_features if n_features is not None else next(iter(widths), None)
    if width is not None:
        # Zero-length sequences may carry a placeholder width (``[]``).
        sequences = [
            s if s.shape[0] > 0 or s.shape[1] == width
            else (sp.csr_matrix((0, width)) if is_sparse else np.zeros((0, width)))
            for s in sequences
        ]
    return sequences, is_sparse


_DTYPE_KINDS = {"U": "string", "S": "bytes", "b": "number", "i": "number",
                "u": "number", "f": "number"}


def _label_kind(value):
    if isinstance(value, np.generic):  # np.bool_ is no numbers.Number
        return _DTYPE_KINDS.get(value.dtype.kind, type(value).__name__)
    if isinstance(value, str):
        return "string"
    if isinstance(value, bytes | bytearray):
        return "bytes"
    if isinstance(value, numbers.Number):
        return "number"
    return type(value).__name__


def label_kinds(seq):
    """The kinds of the labels of one sequence as given (before NumPy
    converts them: it turns a list of strings and numbers into strings):
    "string", "bytes", "number" or a type name."""
    if isinstance(seq, np.ndarray) and seq.dtype.kind in _DTYPE_KINDS:
        return {_DTYPE_KINDS[seq.dtype.kind]} if seq.size else set()
    if np.ndim(seq) == 0:
        return {_label_kind(seq)}
    return {_label_kind(value) for value in np.asarray(seq, dtype=object).ravel()}


def _has_non_finite_number(arr):
    """Whether a label array holds NaN or an infinity (as floats, or as
    numbers in an object array)."""
    if arr.dtype.kind == "f":
        return not np.all(np.isfinite(arr))
    if arr.dtype.kind == "O":
        return any(
            isinstance(v, numbers.Real) and not np.isfinite(float(v))
            for v in arr
        )
    return False


def check_sequence_labels(y, lengths, *, name="y"):
    """Validate a list of per-sequence label arrays against sequence lengths.

    Parameters
    ----------
    y : sequence of array-like of shape (T_n,)
        Labels of every token (strings or integers).
    lengths : sequence of int
        Number of tokens of every sequence of the matching ``X``.
    name : str, default="y"
        Argument name used in error messages.

    Returns
    -------
    labels : list of ndarray of shape (T_n,)

    Raises
    ------
    ValueError
        Besides shapes and lengths: labels of several types (strings and
        numbers, strings and bytes: NumPy would turn numbers into strings),
        NaN or infinite labels.
    """
    if (
        isinstance(y, str | bytes | Mapping | Set)
        or not hasattr(y, "__len__")
    ):
        # A dict or set has a length, but iterates over its keys (unordered).
        raise ValueError(
            f"{name} must be a list of per-sequence label arrays, got {_describe(y)}"
        )
    if len(y) != len(lengths):
        raise ValueError(
            f"X and {name} have different numbers of sequences: "
            f"{len(lengths)} and {len(y)}"
        )
    labels, kinds = [], set()
    for i, (seq, length) in enumerate(zip(y, lengths, strict=True)):
        if isinstance(seq, str | bytes):
            raise ValueError(
                f"{name}[{i}] is a single string; give a list of per-token labels"
            )
        arr = np.asarray(seq)
        if arr.ndim == 0:
            arr = arr.reshape(1)
        if arr.ndim != 1:
            raise ValueError(
                f"{name}[{i}] must be a 1-D array of labels, got shape {arr.shape}"
            )
        if arr.shape[0] != length:
            raise ValueError(
                f"sequence {i} has {length} tokens in X but {arr.shape[0]} "
                f"labels in {name}"
            )
        kinds |= label_kinds(seq)
        if len(kinds) > 1:
            raise ValueError(
                f"{name} mixes label types ({', '.join(sorted(kinds))}), first "
                f"in {name}[{i}]; give every label as one type"
            )
        if _has_non_finite_number(arr):
            raise ValueError(f"{name}[{i}] contains NaN or infinite labels")
        labels.append(arr)
    return labels


def offsets_from_lengths(lengths):
    """Start offsets of ragged sequences: ``offsets[n]:offsets[n + 1]``.

    Parameters
    ----------
    lengths : array-like of int of shape (n_sequences,)

    Returns
    -------
    offsets : ndarray of int64 of shape (n_sequences + 1,)
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.ndim != 1 or np.any(lengths < 0):
        raise ValueError("lengths must be a 1-D array of non-negative integers")
    offsets = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return offsets


def stack_sequences(sequences):
    """Concatenate per-sequence matrices row-wise.

    Parameters
    ----------
    sequences : list of ndarray or CSR matrices, as returned by
        :func:`check_sequence_features`.

    Returns
    -------
    stacked : ndarray or CSR matrix of shape (n_tokens, n_features)
    offsets : ndarray of int64 of shape (n_sequences + 1,)
    """
    offsets = offsets_from_lengths([s.shape[0] for s in sequences])
    if not sequences:
        return np.zeros((0, 0)), offsets
    if sp.issparse(sequences[0]):
        stacked = _stack_csr(sequences)
    else:
        stacked = np.ascontiguousarray(np.vstack(sequences), dtype=np.float64)
    return stacked, offsets


def _stack_csr(matrices):
    """Row-wise concatenation of CSR matrices (float64) from their arrays:
    scipy's ``vstack`` costs tens of microseconds per piece, which many
    short sequences turn into seconds. Canonical pieces give a canonical
    result."""
    if not all(type(m) is sp.csr_matrix for m in matrices):
        return sp.vstack(matrices, format="csr", dtype=np.float64)
    nnz = np.array([m.indptr[-1] for m in matrices], dtype=np.int64)
    rows = np.array([m.shape[0] for m in matrices], dtype=np.int64)
    indptr = np.empty(int(rows.sum()) + 1, dtype=np.int64)
    indptr[0] = 0
    # Each piece's row pointers (after its first) shifted by the entries before it.
    shifts = np.repeat(np.cumsum(nnz) - nnz, rows)
    indptr[1:] = np.concatenate([m.indptr[1:] for m in matrices]) + shifts
    data = np.concatenate([m.data[: m.indptr[-1]] for m in matrices]).astype(
        np.float64, copy=False
    )
    indices = np.concatenate([m.indices[: m.indptr[-1]] for m in matrices])
    stacked = sp.csr_matrix(
        (data, indices, indptr), shape=(indptr.size - 1, matrices[0].shape[1])
    )
    if all(m.has_canonical_format for m in matrices):
        stacked.has_canonical_format = True
    return stacked


def split_by_offsets(array, offsets):
    """Split a stacked array back into per-sequence pieces (views).

    Parameters
    ----------
    array : ndarray of shape (n_tokens, ...) or CSR matrix
        A CSR matrix gives CSR row slices (copies).
    offsets : ndarray of int of shape (n_sequences + 1,)

    Returns
    -------
    pieces : list of ndarray
    """
    return [array[offsets[i] : offsets[i + 1]] for i in range(len(offsets) - 1)]


def chunk_slices(lengths, token_budget):
    """Cut consecutive sequences into chunks of about ``token_budget`` tokens.

    The cut depends only on the lengths and the budget, never on the number
    of workers, so sums over chunks are reduced in the same order (and give
    bit-identical results) whatever the parallel backend.

    Parameters
    ----------
    lengths : array-like of int of shape (n_sequences,)
    token_budget : int
        A chunk is closed as soon as it holds at least this many tokens.

    Returns
    -------
    slices : list of slice
        Consecutive slices over the sequences covering all of them.
    """
    if not isinstance(token_budget, numbers.Integral) or token_budget < 1:
        raise ValueError(
            f"token_budget must be a positive integer, got {token_budget!r}"
        )
    slices = []
    start, tokens = 0, 0
    for i, length in enumerate(lengths):
        tokens += int(length)
        if tokens >= token_budget:
            slices.append(slice(start, i + 1))
            start, tokens = i + 1, 0
    if start < len(lengths):
        slices.append(slice(start, len(lengths)))
    return slices
