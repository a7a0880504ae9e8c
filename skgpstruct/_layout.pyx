"""Compiled bookkeeping of a chunk's layout and collapsed sampling design.

A chunk evaluated in the stacked form (see
:class:`skgpstruct.inference.inducing.FeatureLayout`) numbers every
sequence's distinct active features, then its bias, as *stacked rows*, and
lists the entries of ``U`` (the block-diagonal matrix of the sequences'
rows by tokens) token by token and, for the rows drawn with their own
noise, row by row (:class:`skgpstruct.inference.inducing.RowSplit`).
:func:`chunk_rows` and :func:`split_rows` build those arrays in a pass or
two over the chunk's entries, with one NumPy sort of packed integer keys;
written as NumPy on the whole chunk they were a few dozen array operations
and three sorts of every entry, which made a sentence's layout 3.4 to 3.6
times as long.

:meth:`skgpstruct.inference.inducing.CollapsedFeatures.sampling_design`
rewrites a chunk's tokens for the posterior ``predict_marginals`` samples
when the fit collapsed the lone features (features active at a single
training token): at token ``t``, with ``a . v`` the sum over its lone
entries ``x_tj`` of ``x_tj c_j a_j`` per collapsed variable (``c_j`` the
feature's scale, ``a_j`` its loading), every lone feature ``i`` of that
variable is shifted by ``(a . v) a_i / c_i`` and the variable gets a column
of its own, ``(a . v) / sigma``::

    X_s = [X - ((X_v A^T) A) / c,  (X_v A^T) / sigma]

:func:`collapsed_design` makes it in one pass over the tokens, each
token's entries once. The sums are those of the NumPy construction it
replaces, in the same order (``a . v`` summed in the token's entry order
from zero, as ``numpy.bincount`` sums), so the design is the same to the
last bit (the tests compare it, entry for entry, with the sparse algebra
above).

Every function runs without the GIL: ``predict_marginals`` lays out its
chunks in threads.
"""

import numpy as np

cimport numpy as cnp
from libc.stdint cimport int32_t, int64_t

cnp.import_array()


cdef extern from *:
    """
    /* Introsort of (key, index) pairs by key: quicksort (median of three),
       insertion sort below 16 pairs, heapsort past 2 log2(n) levels (no
       quadratic worst case). For the few new entries of a token of the
       collapsed design, where a NumPy call would cost more than the sort. */
    typedef struct { long long key; long long index; } KeyIndex;

    static void ki_insertion(KeyIndex *a, Py_ssize_t n) {
        for (Py_ssize_t i = 1; i < n; i++) {
            KeyIndex x = a[i];
            Py_ssize_t j = i;
            while (j > 0 && a[j - 1].key > x.key) { a[j] = a[j - 1]; j--; }
            a[j] = x;
        }
    }

    static void ki_sift(KeyIndex *a, Py_ssize_t root, Py_ssize_t n) {
        KeyIndex x = a[root];
        for (;;) {
            Py_ssize_t child = 2 * root + 1;
            if (child >= n) break;
            if (child + 1 < n && a[child + 1].key > a[child].key) child++;
            if (a[child].key <= x.key) break;
            a[root] = a[child];
            root = child;
        }
        a[root] = x;
    }

    static void ki_heapsort(KeyIndex *a, Py_ssize_t n) {
        for (Py_ssize_t i = n / 2 - 1; i >= 0; i--) ki_sift(a, i, n);
        for (Py_ssize_t end = n - 1; end > 0; end--) {
            KeyIndex x = a[0]; a[0] = a[end]; a[end] = x;
            ki_sift(a, 0, end);
        }
    }

    static void ki_introsort(KeyIndex *a, Py_ssize_t n, int depth) {
        while (n > 16) {
            if (depth-- == 0) { ki_heapsort(a, n); return; }
            Py_ssize_t mid = n / 2;
            KeyIndex t;
            /* median of three to a[mid] */
            if (a[mid].key < a[0].key) { t = a[mid]; a[mid] = a[0]; a[0] = t; }
            if (a[n - 1].key < a[0].key) { t = a[n - 1]; a[n - 1] = a[0]; a[0] = t; }
            if (a[n - 1].key < a[mid].key) {
                t = a[n - 1]; a[n - 1] = a[mid]; a[mid] = t;
            }
            long long pivot = a[mid].key;
            Py_ssize_t i = 0, j = n - 1;
            for (;;) {
                while (a[i].key < pivot) i++;
                while (a[j].key > pivot) j--;
                if (i >= j) break;
                t = a[i]; a[i] = a[j]; a[j] = t;
                i++; j--;
            }
            /* a[:j + 1] <= pivot <= a[j + 1:]: recurse on the smaller part */
            if (j + 1 < n - j - 1) {
                ki_introsort(a, j + 1, depth);
                a += j + 1; n -= j + 1;
            } else {
                ki_introsort(a + j + 1, n - j - 1, depth);
                n = j + 1;
            }
        }
        ki_insertion(a, n);
    }

    static void sort_by_key(KeyIndex *a, Py_ssize_t n) {
        int depth = 0;
        for (Py_ssize_t m = n; m > 1; m >>= 1) depth += 2;
        ki_introsort(a, n, depth);
    }
    """
    ctypedef struct KeyIndex:
        long long key
        long long index
    void sort_by_key(KeyIndex* a, Py_ssize_t n) nogil
    void ki_introsort(KeyIndex* a, Py_ssize_t n, int depth) nogil


def _sorted_by_key(const int64_t[::1] keys, int depth=-1):
    """``(keys, positions)`` sorted by the introsort of :func:`collapsed_design`
    (``depth``: its quicksort levels before heapsort, -1 for its own
    choice, 0 for heapsort alone). For the tests."""
    cdef Py_ssize_t n = keys.shape[0], i
    work_arr = np.empty(max(n, 1) * sizeof(KeyIndex), dtype=np.uint8)
    cdef KeyIndex* work = <KeyIndex*> cnp.PyArray_DATA(work_arr)
    for i in range(n):
        work[i].key = keys[i]
        work[i].index = i
    if depth < 0:
        sort_by_key(work, n)
    else:
        ki_introsort(work, n, depth)
    out_keys = np.empty(n, dtype=np.int64)
    positions = np.empty(n, dtype=np.int64)
    for i in range(n):
        out_keys[i] = work[i].key
        positions[i] = work[i].index
    return out_keys, positions

ctypedef fused x_index:
    int32_t
    int64_t

ctypedef fused loading_index:
    int32_t
    int64_t

ctypedef fused lookup_index:
    int32_t
    int64_t


cdef inline Py_ssize_t _search(
    const x_index* indices, Py_ssize_t lo, Py_ssize_t hi, int64_t column
) noexcept nogil:
    """Position of ``column`` in the increasing ``indices[lo:hi]``, or -1
    (a token's entries, or the lone columns)."""
    cdef Py_ssize_t end = hi, mid
    while lo < hi:
        mid = lo + (hi - lo) // 2
        if indices[mid] < column:
            lo = mid + 1
        else:
            hi = mid
    if lo < end and indices[lo] == column:
        return lo
    return -1


def collapsed_design(
    const x_index[::1] indptr,
    const x_index[::1] indices,
    const double[::1] data,
    Py_ssize_t n_columns,
    const lookup_index[::1] lookup,
    bint use_lookup,
    const int64_t[::1] lone,
    const int64_t[::1] lone_variable,
    const double[::1] lone_scales,
    const double[::1] lone_loading,
    const double[::1] inverse_lone_scales,
    const loading_index[::1] loading_indptr,
    const loading_index[::1] loading_indices,
    const double[::1] loading_data,
    const double[::1] inverse_sigma,
):
    """The CSR arrays of the collapsed design of a canonical CSR ``X``.

    Parameters
    ----------
    indptr, indices, data : ndarray
        ``X``'s canonical CSR arrays (``indptr[0] == 0``), of shape
        (n_tokens, n_columns).
    n_columns : int
    lookup : ndarray of int32 or int64 of shape (n_columns,)
        Every column's position among the lone ones, or -1; read only when
        ``use_lookup`` (else a binary search in ``lone``).
    use_lookup : bool
    lone : ndarray of int64 of shape (n_lone,)
        The lone columns, increasing.
    lone_variable, lone_scales, lone_loading, inverse_lone_scales : ndarray
        Per lone column: its collapsed variable, ``c_j``, ``a_j``, ``1 / c_j``.
    loading_indptr, loading_indices, loading_data : ndarray
        The loadings (n_collapsed, n_lone) as CSR: each variable's lone
        features and their ``a_j``.
    inverse_sigma : ndarray of shape (n_collapsed,)

    Returns
    -------
    indptr, indices, data : ndarray of int64, int64, float64
        The design's CSR arrays, of shape (n_tokens, n_columns +
        n_collapsed): canonical, without stored zeros (a collapsed
        variable's column is kept whenever its ``a . v`` is not zero).
    """
    cdef Py_ssize_t n_tokens = indptr.shape[0] - 1
    cdef Py_ssize_t n_lone = lone.shape[0]
    cdef Py_ssize_t n_collapsed = inverse_sigma.shape[0]
    cdef Py_ssize_t n_entries = indptr[n_tokens]
    cdef Py_ssize_t t, e, a, b, i, j, k, v, out = 0, n_vars, n_extra
    cdef Py_ssize_t widest = 0, most_extra = 0, token_extra
    cdef int64_t p, column
    cdef double total, shift, value
    # Every entry's position among the lone columns (-1 for the others),
    # and a bound on the design's entries: X's, plus per lone entry its
    # variable's column and shifts of all its variable's lone features.
    position_arr = np.empty(n_entries, dtype=np.int64)
    cdef int64_t[::1] position = position_arr
    cdef Py_ssize_t bound = n_entries
    with nogil:
        for t in range(n_tokens):
            a, b = indptr[t], indptr[t + 1]
            token_extra = 0
            for e in range(a, b):
                if use_lookup:
                    p = lookup[indices[e]]
                else:
                    p = _search(&lone[0], 0, n_lone, indices[e]) if n_lone else -1
                position[e] = p
                if p >= 0:
                    v = lone_variable[p]
                    token_extra += 1 + loading_indptr[v + 1] - loading_indptr[v]
            bound += token_extra
            most_extra = max(most_extra, token_extra)
            widest = max(widest, b - a)
    out_indptr_arr = np.empty(n_tokens + 1, dtype=np.int64)
    out_indices_arr = np.empty(bound, dtype=np.int64)
    out_data_arr = np.empty(bound, dtype=np.float64)
    slot_arr = np.full(n_collapsed, -1, dtype=np.int64)
    variable_arr = np.empty(widest, dtype=np.int64)
    sum_arr = np.empty(widest, dtype=np.float64)
    values_arr = np.empty(widest, dtype=np.float64)
    extra_arr = np.empty(max(most_extra, 1) * sizeof(KeyIndex), dtype=np.uint8)
    extra_value_arr = np.empty(most_extra, dtype=np.float64)
    cdef int64_t[::1] out_indptr = out_indptr_arr
    cdef int64_t[::1] out_indices = out_indices_arr
    cdef double[::1] out_data = out_data_arr
    cdef int64_t[::1] slot = slot_arr
    cdef int64_t[::1] variable = variable_arr
    cdef double[::1] sums = sum_arr
    cdef double[::1] values = values_arr
    # the token's new entries: (column, position in extra_value)
    cdef KeyIndex* extra = <KeyIndex*> cnp.PyArray_DATA(extra_arr)
    cdef double[::1] extra_value = extra_value_arr
    with nogil:
        out_indptr[0] = 0
        for t in range(n_tokens):
            a, b = indptr[t], indptr[t + 1]
            # a . v per variable of the token, in its entries' order
            n_vars = 0
            for e in range(a, b):
                values[e - a] = data[e]
                p = position[e]
                if p < 0:
                    continue
                v = lone_variable[p]
                if slot[v] < 0:
                    slot[v] = n_vars
                    variable[n_vars] = v
                    sums[n_vars] = 0.0
                    n_vars += 1
                sums[slot[v]] += (data[e] * lone_scales[p]) * lone_loading[p]
            # The shifts of each variable's lone features (at an entry of X,
            # or a new entry), then the variable's own column. An exact zero
            # a . v is no entry.
            n_extra = 0
            for i in range(n_vars):
                v = variable[i]
                slot[v] = -1
                total = sums[i]
                if total == 0:
                    continue
                for j in range(loading_indptr[v], loading_indptr[v + 1]):
                    shift = total * loading_data[j]
                    if shift == 0:
                        continue
                    k = loading_indices[j]
                    shift = shift * inverse_lone_scales[k]
                    column = lone[k]
                    e = _search(&indices[0], a, b, column)
                    if e >= 0:
                        values[e - a] -= shift
                    elif -shift != 0:
                        extra[n_extra].key = column
                        extra[n_extra].index = n_extra
                        extra_value[n_extra] = -shift
                        n_extra += 1
                extra[n_extra].key = n_columns + v
                extra[n_extra].index = n_extra
                extra_value[n_extra] = total * inverse_sigma[v]
                n_extra += 1
            sort_by_key(extra, n_extra)
            # X's entries (a difference that is zero is no entry) and the
            # new ones, merged by column
            i = 0
            for e in range(a, b):
                column = indices[e]
                while i < n_extra and extra[i].key < column:
                    out_indices[out] = extra[i].key
                    out_data[out] = extra_value[extra[i].index]
                    out += 1
                    i += 1
                value = values[e - a]
                if value != 0:
                    out_indices[out] = column
                    out_data[out] = value
                    out += 1
            while i < n_extra:
                out_indices[out] = extra[i].key
                out_data[out] = extra_value[extra[i].index]
                out += 1
                i += 1
            out_indptr[t + 1] = out
    return out_indptr_arr, out_indices_arr[:out], out_data_arr[:out]


def chunk_rows(
    const x_index[::1] indptr,
    const x_index[::1] indices,
    const double[::1] data,
    const int64_t[::1] offsets,
    int64_t bias,
    int64_t n_inducing,
    bint compact,
):
    """A chunk's stacked rows and the token-by-token entries of its ``U``.

    Parameters
    ----------
    indptr, indices, data : ndarray
        The chunk's canonical CSR arrays (``indptr[0] == 0``; explicit
        zeros are entries), their columns below ``bias``.
    offsets : ndarray of int64 of shape (n_sequences + 1,)
    bias : int
        The bias' inducing variable (the number of features).
    n_inducing : int
        The number of inducing variables (``bias + 1``).
    compact : bool
        Number the rows within the chunk's support (its active features,
        then the bias), unless every feature is active in it.

    Returns
    -------
    row_starts : ndarray of int64 of shape (n_sequences + 1,)
        Sequence ``n`` owns the stacked rows ``row_starts[n]`` to
        ``row_starts[n + 1]``: its distinct active features, increasing,
        then its bias.
    stacked_rows : ndarray of int64
        The inducing variable of every stacked row (numbered within the
        support when there is one).
    support : ndarray of int64 or None
        The chunk's active features and the bias, when compact and not
        every feature is active; else None.
    u_indptr, u_rows : ndarray of int64
        ``U`` token by token: token ``t``'s entries are
        ``u_indptr[t]:u_indptr[t + 1]``, its feature entries (stacked rows
        increasing with the feature) then its sequence's bias row.
    u_values : ndarray of float64
        The entries' values: the features' values, 1 for the bias.

    Notes
    -----
    The entries are sorted once by (sequence, feature), as NumPy sorts
    integers (with vector instructions: a typed introsort of each
    sequence's entries here took 3.6 times as long on a 2,000-token chunk
    of basenp), the entry packed into the key's low bits; one walk over
    them numbers every sequence's rows and gives every entry its row. The
    support likewise, from the rows sorted by feature.
    """
    cdef Py_ssize_t n_seq = offsets.shape[0] - 1
    cdef Py_ssize_t n_tokens = indptr.shape[0] - 1
    cdef Py_ssize_t n_entries, n, t, e, i, row = 0, current = -1, n_rows
    cdef int64_t key, previous = -1, pair, mask
    cdef int shift
    if (n_seq < 0 or n_tokens < 0 or offsets[0] != 0 or offsets[n_seq] != n_tokens
            or indptr[0] != 0):
        raise ValueError("offsets must run from 0 to the number of tokens, "
                         "indptr from 0")
    n_entries = indptr[n_tokens]
    if n_entries and bias <= 0:
        raise ValueError("entries need columns: bias must be positive")
    keys_arr = _packed_keys(indptr, indices, offsets, bias)
    cdef int64_t[::1] keys = keys_arr
    shift = _bits(n_entries)
    mask = (<int64_t> 1 << shift) - 1
    row_starts_arr = np.empty(n_seq + 1, dtype=np.int64)
    rows_arr = np.empty(n_entries + n_seq, dtype=np.int64)
    entry_row_arr = np.empty(n_entries, dtype=np.int64)
    u_indptr_arr = np.empty(n_tokens + 1, dtype=np.int64)
    u_rows_arr = np.empty(n_entries + n_tokens, dtype=np.int64)
    u_values_arr = np.empty(n_entries + n_tokens, dtype=np.float64)
    cdef int64_t[::1] row_starts = row_starts_arr
    cdef int64_t[::1] rows = rows_arr
    cdef int64_t[::1] entry_row = entry_row_arr
    cdef int64_t[::1] u_indptr = u_indptr_arr
    cdef int64_t[::1] u_rows = u_rows_arr
    cdef double[::1] u_values = u_values_arr
    with nogil:
        # Sequence n's rows: its distinct features (in key order), then its
        # bias; sequences without entries have their bias row only.
        row_starts[0] = 0
        n = 0
        for i in range(n_entries):
            key = keys[i]
            pair = key >> shift
            while n < pair // bias:  # (bias > 0 wherever there are entries)
                rows[row] = bias
                row += 1
                n += 1
                row_starts[n] = row
            if pair != previous:
                rows[row] = pair - n * bias
                current = row
                row += 1
                previous = pair
            entry_row[key & mask] = current
        while n < n_seq:
            rows[row] = bias
            row += 1
            n += 1
            row_starts[n] = row
        for n in range(n_seq):
            for t in range(offsets[n], offsets[n + 1]):
                u_indptr[t] = indptr[t] + t
                for e in range(indptr[t], indptr[t + 1]):
                    u_rows[e + t] = entry_row[e]
                    u_values[e + t] = data[e]
                u_rows[indptr[t + 1] + t] = row_starts[n + 1] - 1
                u_values[indptr[t + 1] + t] = 1.0
        u_indptr[n_tokens] = n_entries + n_tokens
    n_rows = row
    rows_arr = rows_arr[:n_rows]
    support = None
    if compact:
        support = _support(rows_arr, row_starts, bias, n_inducing)
    return row_starts_arr, rows_arr, support, u_indptr_arr, u_rows_arr, u_values_arr


cdef int _bits(int64_t n) noexcept:
    """Bits that hold every number below ``n``."""
    cdef int bits = 0
    while (<int64_t> 1 << bits) < n:
        bits += 1
    return bits


def _packed_keys(
    const x_index[::1] indptr, const x_index[::1] indices,
    const int64_t[::1] offsets, int64_t n_columns,
):
    """Every entry's ``(sequence * n_columns + column) << bits | entry``,
    sorted (``bits`` those of the number of entries)."""
    cdef Py_ssize_t n_seq = offsets.shape[0] - 1
    cdef Py_ssize_t n_entries = indptr[indptr.shape[0] - 1]
    cdef Py_ssize_t n, e
    cdef int shift = _bits(n_entries)
    if _bits(max(n_seq * n_columns, 1)) + shift > 62:
        raise ValueError(
            f"a chunk of {n_seq} sequences, {n_columns} columns and "
            f"{n_entries} entries is too large for its 64-bit sort keys"
        )
    keys_arr = np.empty(n_entries, dtype=np.int64)
    cdef int64_t[::1] keys = keys_arr
    with nogil:
        for n in range(n_seq):
            for e in range(indptr[offsets[n]], indptr[offsets[n + 1]]):
                keys[e] = ((n * n_columns + indices[e]) << shift) | e
    keys_arr.sort()
    return keys_arr


cdef object _support(
    int64_t[::1] rows, const int64_t[::1] row_starts, int64_t bias,
    int64_t n_inducing,
):
    """The chunk's active features then the bias, every row renumbered
    within them (the bias rows as the number of features); None, rows
    unchanged, when every feature is active in the chunk."""
    cdef Py_ssize_t n_seq = row_starts.shape[0] - 1
    cdef Py_ssize_t n_rows = rows.shape[0]
    cdef Py_ssize_t n, i, k = 0, n_support = 0
    cdef int shift = _bits(n_rows)
    cdef int64_t mask = (<int64_t> 1 << shift) - 1, previous = -1, feature
    if _bits(max(bias, 1)) + shift > 62:
        raise ValueError(
            f"{n_rows} rows of {bias} features are too many for 64-bit sort keys"
        )
    keys_arr = np.empty(n_rows - n_seq, dtype=np.int64)
    cdef int64_t[::1] keys = keys_arr
    with nogil:
        for n in range(n_seq):
            for i in range(row_starts[n], row_starts[n + 1] - 1):
                keys[k] = (rows[i] << shift) | i
                k += 1
    keys_arr.sort()
    with nogil:
        for i in range(k):
            feature = keys[i] >> shift
            if feature != previous:
                n_support += 1
                previous = feature
    if n_support + 1 >= n_inducing:
        # every feature is active in the chunk: the local numbers are the
        # global ones
        return None
    support_arr = np.empty(n_support + 1, dtype=np.int64)
    cdef int64_t[::1] support = support_arr
    with nogil:
        n_support = -1
        previous = -1
        for i in range(k):
            feature = keys[i] >> shift
            if feature != previous:
                n_support += 1
                support[n_support] = feature
                previous = feature
            rows[keys[i] & mask] = n_support
        n_support += 1
        support[n_support] = bias
        for n in range(n_seq):
            rows[row_starts[n + 1] - 1] = n_support
    return support_arr


def split_rows(
    const int64_t[::1] indptr,
    const int64_t[::1] entry_row,
    Py_ssize_t n_rows,
):
    """The drawn rows of ``U`` and their entries row by row.

    Parameters
    ----------
    indptr : ndarray of int64 of shape (n_tokens + 1,)
        Token ``t``'s entries are ``indptr[t]:indptr[t + 1]``
        (``indptr[0] == 0``).
    entry_row : ndarray of int64
        Every entry's stacked row, in ``[0, n_rows)``.
    n_rows : int

    Returns
    -------
    drawn : ndarray of int64
        The rows with other than one entry, increasing.
    entry_drawn : ndarray of int32
        Every entry's position in ``drawn``, or -1 (a lone row's entry).
    row_indptr : ndarray of int64 of shape (n_drawn + 1,)
        Drawn row ``i``'s entries are ``by_row[row_indptr[i]:row_indptr[i + 1]]``.
    by_row : ndarray of int64
        The drawn rows' entries row by row, each row's in token order.
    entry_token : ndarray of int32
        Every entry's token.
    """
    cdef Py_ssize_t n_tokens = indptr.shape[0] - 1
    cdef Py_ssize_t n_entries = entry_row.shape[0]
    cdef Py_ssize_t r, t, e, n_drawn = 0
    if n_tokens < 0 or indptr[0] != 0 or indptr[n_tokens] != n_entries:
        raise ValueError("indptr must run from 0 to the number of entries")
    per_row_arr = np.zeros(n_rows, dtype=np.int64)
    cdef int64_t[::1] per_row = per_row_arr
    entry_drawn_arr = np.empty(n_entries, dtype=np.int32)
    entry_token_arr = np.empty(n_entries, dtype=np.int32)
    cdef int32_t[::1] entry_drawn = entry_drawn_arr
    cdef int32_t[::1] entry_token = entry_token_arr
    with nogil:
        for e in range(n_entries):
            per_row[entry_row[e]] += 1
        for r in range(n_rows):
            if per_row[r] != 1:
                n_drawn += 1
    drawn_arr = np.empty(n_drawn, dtype=np.int64)
    row_indptr_arr = np.empty(n_drawn + 1, dtype=np.int64)
    position_arr = np.empty(n_rows, dtype=np.int32)
    cdef int64_t[::1] drawn = drawn_arr
    cdef int64_t[::1] row_indptr = row_indptr_arr
    cdef int32_t[::1] position = position_arr
    cdef Py_ssize_t i = 0
    with nogil:
        row_indptr[0] = 0
        for r in range(n_rows):
            if per_row[r] != 1:
                drawn[i] = r
                position[r] = i
                row_indptr[i + 1] = row_indptr[i] + per_row[r]
                i += 1
            else:
                position[r] = -1
    by_row_arr = np.empty(row_indptr[n_drawn], dtype=np.int64)
    cdef int64_t[::1] by_row = by_row_arr
    # (a counting sort: each drawn row's next free place)
    cdef int64_t[::1] fill = row_indptr_arr[:n_drawn].copy()
    with nogil:
        for t in range(n_tokens):
            for e in range(indptr[t], indptr[t + 1]):
                entry_token[e] = <int32_t> t
                i = position[entry_row[e]]
                entry_drawn[e] = <int32_t> i
                if i >= 0:
                    by_row[fill[i]] = e
                    fill[i] += 1
    return drawn_arr, entry_drawn_arr, row_indptr_arr, by_row_arr, entry_token_arr
