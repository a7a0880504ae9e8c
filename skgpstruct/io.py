"""Read and write CoNLL / CRF++ column files.

The format is the one CRF++ reads: one token per line, columns separated by
ASCII spaces or tabs (a run of them counts as one separator), the last column
the label, and a blank line between sequences. Every token line of a file has
the same number of columns.

:func:`read_conll` reads a path or an open file, :func:`parse_conll` a string;
:func:`write_conll` and :func:`format_conll` write tokens back with one or
more label columns (e.g. the gold labels and the predicted ones, the layout
the CoNLL ``conlleval`` script reads).
"""

import codecs
import io
import math
import numbers
import os
import re
import warnings

import numpy as np

__all__ = ["read_conll", "parse_conll", "write_conll", "format_conll"]

# CRF++ splits columns on ASCII spaces and tabs only; other Unicode spaces
# (e.g. U+3000 in the Japanese data) are token characters.
_SEPARATORS = re.compile(r"[ \t]+")
_BLANKS = " \t\r"


def read_conll(source, encoding="utf-8"):
    """Read a CoNLL / CRF++ file into token rows and labels.

    Parameters
    ----------
    source : str, path-like or file object
        Path of the file, or a file object open for reading in text or binary
        mode. A string is always taken as a path; use :func:`parse_conll` for
        text.
    encoding : str, default="utf-8"
        Encoding used to decode the file (and a binary file object). The
        Japanese data shipped with CRF++ needs ``"euc-jp"``. Ignored for a
        file object open in text mode, which decodes with its own encoding.

    Returns
    -------
    tokens : list of list of list of str
        ``tokens[i][t]`` is the list of column strings of token ``t`` of
        sequence ``i``, without the label column; every token has
        ``n_columns - 1`` columns.
    labels : list of list of str
        ``labels[i]`` holds the ``T_i`` labels of sequence ``i``.

    Raises
    ------
    ValueError
        If the file holds no token, if lines have different numbers of
        columns, or if it cannot be decoded with ``encoding`` (the message
        names the file and the line); if ``encoding`` is not a text
        encoding; if ``source`` is a directory.
    FileNotFoundError
        If ``source`` is a path that does not exist.

    Warns
    -----
    UserWarning
        If a line other than the first starts with U+FEFF, a byte-order mark
        inside the file (as where files with marks were concatenated): it is
        kept as part of that line's first value, which the warning names
        the line of. A mark at the start of the file is dropped.

    See Also
    --------
    parse_conll : The same for text already in a string.
    write_conll : Write tokens and labels back.

    Examples
    --------
    A file object works as well as a path; a binary one is decoded with
    ``encoding``:

    >>> import io
    >>> from skgpstruct.io import read_conll
    >>> data = "東京 名詞 B-LOC\\n都 名詞 I-LOC\\n\\nです 助動詞 O\\n".encode("euc-jp")
    >>> tokens, labels = read_conll(io.BytesIO(data), encoding="euc-jp")
    >>> tokens
    [[['東京', '名詞'], ['都', '名詞']], [['です', '助動詞']]]
    >>> labels
    [['B-LOC', 'I-LOC'], ['O']]
    """
    # Not used on a text file object (it is already decoded), but a wrong
    # one is still an error, as for write_conll.
    _check_encoding(encoding)
    if isinstance(source, str | bytes | os.PathLike):
        name = os.fsdecode(source)
        if os.path.isdir(source):
            raise ValueError(f"{name!r} is a directory, not a data file")
        with open(source, "rb") as handle:
            data = handle.read()
        return _parse(_decode(data, encoding, name), name)
    if not hasattr(source, "read"):
        raise TypeError(
            "source must be a path (str or path-like) or a file object open "
            f"for reading, got {type(source).__name__}"
        )
    name = str(getattr(source, "name", "<file>"))
    try:
        data = source.read()
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"{name}: cannot decode the file with the encoding it was opened "
            f"with ({getattr(source, 'encoding', 'unknown')!r}): {exc}; open it "
            "with the right encoding, or in binary mode and pass encoding="
        ) from None
    if isinstance(data, bytes):
        data = _decode(data, encoding, name)
    return _parse(data, name)


def parse_conll(text, *, source="<string>"):
    """Parse CoNLL / CRF++ formatted text.

    Parameters
    ----------
    text : str
        The content of a CoNLL / CRF++ file.
    source : str, default="<string>"
        Name used for the text in error messages.

    Returns
    -------
    tokens : list of list of list of str
        Token rows (without the label column) of every sequence, as in
        :func:`read_conll`.
    labels : list of list of str
        Labels of every sequence.

    Raises
    ------
    ValueError
        If the text holds no token or if lines have different numbers of
        columns (the message names the line).

    Warns
    -----
    UserWarning
        If a line other than the first starts with U+FEFF (see
        :func:`read_conll`).

    Examples
    --------
    >>> from skgpstruct.io import parse_conll
    >>> tokens, labels = parse_conll("He PRP B-NP\\nreckons VBZ B-VP\\n\\nYes UH O\\n")
    >>> tokens
    [[['He', 'PRP'], ['reckons', 'VBZ']], [['Yes', 'UH']]]
    >>> labels
    [['B-NP', 'B-VP'], ['O']]
    """
    if not isinstance(text, str):
        raise TypeError(
            f"text must be a str, got {type(text).__name__}; use read_conll "
            "for paths and file objects"
        )
    return _parse(text, source)


#: How :func:`_decode`'s errors tell the caller to give an encoding.
_ENCODING_HINT = (
    "pass the file's encoding, e.g. encoding='euc-jp' for CRF++'s JapaneseNE data"
)


#: The same advice where text is written.
_TEXT_ENCODING_HINT = "give a Python text encoding such as 'utf-8'"


def _check_encoding(encoding, hint=_ENCODING_HINT):
    """Raise a ValueError unless ``encoding`` names a Python text encoding
    (``'rot13'`` or ``'hex'`` are codecs, but not text encodings)."""
    try:
        codecs.lookup(encoding)
    except (LookupError, TypeError):
        problem = "is not a known codec"
    else:
        try:
            b"".decode(encoding)
            "".encode(encoding)
            return
        except (LookupError, UnicodeError):  # 'undefined' raises the latter
            problem = "is not a text encoding"
    raise ValueError(f"encoding {encoding!r} {problem}; {hint}")


def _decode(data, encoding, name, hint=_ENCODING_HINT):
    _check_encoding(encoding, hint)
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as exc:
        # Counted in the text before the bad bytes (which decodes), as
        # _text_lines counts lines: ended by \n, \r\n or a lone \r (bytes
        # miscounted lone CRs, and UTF-16's CR LF twice).
        before = data[: exc.start].decode(encoding, errors="replace")
        line = before.count("\n") + before.count("\r") - before.count("\r\n") + 1
        column = len(before) - max(before.rfind("\n"), before.rfind("\r"))
        bad = data[exc.start : exc.end].hex(" ")
        raise ValueError(
            f"{name}, line {line}: cannot decode byte(s) {bad} at column "
            f"{column} with encoding {encoding!r} ({exc.reason}); {hint}"
        ) from None


def _text_lines(text):
    """The lines of a file's text: a leading byte-order mark dropped (it is
    not data; some editors start utf-8 files with one), and lines ended by
    ``\\n``, ``\\r\\n`` or a lone ``\\r``, as Python's text files read them."""
    text = text.removeprefix("\ufeff")
    return text.replace("\r\n", "\n").replace("\r", "\n").split("\n")


def _parse(text, name):
    tokens, labels = [], []
    seq_tokens, seq_labels = [], []
    n_columns = None
    first_line = None
    marked_lines = []  # lines after the first that start with U+FEFF
    for line_number, line in enumerate(_text_lines(text), start=1):
        line = line.strip(_BLANKS)
        if line_number > 1 and line.startswith("\ufeff"):
            marked_lines.append(line_number)
        if not line:
            if seq_labels:
                tokens.append(seq_tokens)
                labels.append(seq_labels)
                seq_tokens, seq_labels = [], []
            continue
        columns = _SEPARATORS.split(line)
        if n_columns is None:
            n_columns, first_line = len(columns), line_number
        elif len(columns) != n_columns:
            raise ValueError(
                f"{name}, line {line_number}: found {len(columns)} column(s), "
                f"but line {first_line} has {n_columns}; every token line "
                "needs the same columns (separated by spaces or tabs), the "
                "last one the label"
            )
        seq_labels.append(columns.pop())
        seq_tokens.append(columns)
    if seq_labels:
        tokens.append(seq_tokens)
        labels.append(seq_labels)
    if not labels:
        raise ValueError(
            f"{name}: the file is empty (no token line); expected one token "
            "per line with the label in the last column, and blank lines "
            "between sequences"
        )
    if marked_lines:
        more = len(marked_lines) - 1
        warnings.warn(
            f"{name}, line {marked_lines[0]}"
            + (f" (and {more} more line{'s' * (more > 1)})" if more else "")
            + ": starts with U+FEFF, a byte-order mark inside the file (as "
            "where files were concatenated); it is kept as part of the "
            "line's first value: remove it from the file, or read the files "
            "one by one",
            UserWarning,
            stacklevel=3,
        )
    return tokens, labels


def format_conll(tokens, labels, *more_labels, sep=" "):
    """Format token rows and label columns as CoNLL / CRF++ text.

    Parameters
    ----------
    tokens : list of list of list of str
        Token rows of every sequence (``tokens[i][t]`` the columns of token
        ``t`` of sequence ``i``), as returned by :func:`read_conll`. Rows may
        be empty (only label columns are written then).
    labels : list of array-like of shape (T_i,)
        Labels of every sequence, written as the first label column.
    *more_labels : list of array-like of shape (T_i,)
        Further label columns, e.g. predicted labels after the gold ones (the
        order the ``conlleval`` script expects).
    sep : {" ", "\\t"}, default=" "
        Column separator.

    Returns
    -------
    text : str
        One line per token, a blank line after every sequence.

    Raises
    ------
    ValueError
        If the numbers of sequences or tokens do not match, or the text
        could not be read back as given: a sequence is empty, a value is
        empty or contains whitespace, token lines have different numbers of
        columns, or the first value starts with a byte-order mark.

    Examples
    --------
    Gold labels, then predicted ones, as ``conlleval`` reads them:

    >>> from skgpstruct.io import format_conll
    >>> tokens = [[["He", "PRP"], ["reckons", "VBZ"]], [["Yes", "UH"]]]
    >>> gold = [["B-NP", "B-VP"], ["O"]]
    >>> predicted = [["B-NP", "I-NP"], ["O"]]
    >>> print(format_conll(tokens, gold, predicted), end="")
    He PRP B-NP B-NP
    reckons VBZ B-VP I-NP
    <BLANKLINE>
    Yes UH O O
    <BLANKLINE>
    """
    if sep not in (" ", "\t"):
        raise ValueError(f"sep must be ' ' or '\\t', got {sep!r}")
    columns = [("labels", labels)] + [
        (f"more_labels[{k}]", extra) for k, extra in enumerate(more_labels)
    ]
    for arg, value in [("tokens", tokens), *columns]:
        if isinstance(value, str | bytes) or not hasattr(value, "__len__"):
            raise ValueError(
                f"{arg} must be a list with one entry per sequence, got "
                f"{type(value).__name__}"
            )
        if len(value) != len(tokens):
            raise ValueError(
                f"tokens has {len(tokens)} sequences but {arg} has {len(value)}"
            )
    out = io.StringIO()
    n_columns = None  # of the first token line
    for i, rows in enumerate(tokens):
        if len(rows) == 0:
            raise ValueError(
                f"tokens[{i}] is an empty sequence; it cannot be written (a "
                "CoNLL file has no way to represent it)"
            )
        label_columns = []
        for arg, value in columns:
            seq = value[i]
            if isinstance(seq, str | bytes):
                raise ValueError(
                    f"{arg}[{i}] is a single string; give a list of labels"
                )
            seq = np.asarray(seq, dtype=object).reshape(-1).tolist()
            if len(seq) != len(rows):
                raise ValueError(
                    f"sequence {i} has {len(rows)} tokens but {len(seq)} "
                    f"labels in {arg}"
                )
            label_columns.append(seq)
        for t, row in enumerate(rows):
            if isinstance(row, str | bytes):
                raise ValueError(
                    f"tokens[{i}][{t}] is a string; each token must be a list "
                    "of column strings"
                )
            fields = [_field(v, i, t) for v in row] + [
                _field(col[t], i, t) for col in label_columns
            ]
            for value in fields:
                if not value or any(c in value for c in " \t\r\n"):
                    raise ValueError(
                        f"sequence {i}, token {t}: value {value!r} is empty or "
                        "contains whitespace, which the format uses as a "
                        "separator"
                    )
            if n_columns is None:
                n_columns = len(fields)
                if fields[0].startswith("\ufeff"):
                    raise ValueError(
                        f"sequence {i}, token {t}: the file's first value "
                        f"{fields[0]!r} starts with U+FEFF, which read_conll "
                        "drops as a byte-order mark"
                    )
            elif len(fields) != n_columns:
                raise ValueError(
                    f"sequence {i}, token {t} has {len(fields)} column(s), but "
                    f"the first token has {n_columns}; every line of a CoNLL "
                    "file has the same number of columns (read_conll refuses "
                    "the file otherwise)"
                )
            out.write(sep.join(fields))
            out.write("\n")
        out.write("\n")
    return out.getvalue()


def _field(value, i, t):
    """One column value as text: a string, or a number (written as ``str``
    writes it); anything else would be written as its repr and read back
    as another value."""
    if isinstance(value, str):
        return value
    if isinstance(value, numbers.Number) and not isinstance(value, complex):
        if isinstance(value, numbers.Real) and not math.isfinite(value):
            raise ValueError(
                f"sequence {i}, token {t}: value {value} is not finite; "
                "labels and columns are strings or finite numbers"
            )
        return str(value)
    hint = " (decode bytes first)" if isinstance(value, bytes | bytearray) else ""
    raise ValueError(
        f"sequence {i}, token {t}: value {value!r} of type "
        f"{type(value).__name__} is neither a string nor a number{hint}"
    )


def _encode(text, encoding, advice="give an encoding that has it, e.g. 'utf-8'"):
    """``text`` encoded, or a ValueError naming ``encoding`` (before any file
    is opened, so that a failure leaves an existing file as it was)."""
    _check_encoding(encoding, _TEXT_ENCODING_HINT)
    try:
        return text.encode(encoding)
    except UnicodeEncodeError as exc:
        line = text.count("\n", 0, exc.start) + 1
        raise ValueError(
            f"cannot encode {text[exc.start:exc.end]!r} (line {line} of the "
            f"output) with encoding={encoding!r} ({exc.reason}); {advice}"
        ) from None


def write_conll(target, tokens, labels, *more_labels, sep=" ", encoding="utf-8"):
    """Write token rows and label columns to a CoNLL / CRF++ file.

    Parameters
    ----------
    target : str, path-like or file object
        Path of the file to (over)write, or a file object open for writing in
        text or binary mode.
    tokens : list of list of list of str
        Token rows of every sequence, as returned by :func:`read_conll`.
    labels : list of array-like of shape (T_i,)
        Labels of every sequence (the first label column).
    *more_labels : list of array-like of shape (T_i,)
        Further label columns, e.g. predicted labels after the gold ones.
    sep : {" ", "\\t"}, default=" "
        Column separator.
    encoding : str, default="utf-8"
        Encoding of the written file (or of a binary file object); checked
        always, but a file object open in text mode encodes with its own.

    Returns
    -------
    None

    Raises
    ------
    ValueError
        As :func:`format_conll`, or if ``encoding`` is unknown or cannot
        encode the text; an existing file is then left as it was.

    Examples
    --------
    >>> import os
    >>> import tempfile
    >>> from skgpstruct.io import read_conll, write_conll
    >>> tokens = [[["He", "PRP"], ["reckons", "VBZ"]], [["Yes", "UH"]]]
    >>> labels = [["B-NP", "B-VP"], ["O"]]
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     path = os.path.join(folder, "train.data")
    ...     write_conll(path, tokens, labels, sep="\\t")
    ...     read_back = read_conll(path)
    >>> read_back == (tokens, labels)
    True
    """
    text = format_conll(tokens, labels, *more_labels, sep=sep)
    if isinstance(target, str | bytes | os.PathLike):
        data = _encode(text, encoding)
        with open(target, "wb") as handle:
            handle.write(data)
        return
    if not hasattr(target, "write"):
        raise TypeError(
            "target must be a path (str or path-like) or a file object open "
            f"for writing, got {type(target).__name__}"
        )
    if not isinstance(target, io.RawIOBase | io.BufferedIOBase):
        # Not used on a text target (which encodes with its own), but a
        # wrong one is still an error (_encode checks it for the others).
        _check_encoding(encoding, _TEXT_ENCODING_HINT)
    if isinstance(target, io.TextIOBase):
        # Checked first: a text file that fails half-way keeps half the text.
        own = getattr(target, "encoding", None)
        if own:
            _encode(
                text, own,
                advice="the text stream encodes with its own encoding (the "
                "encoding argument is for paths and binary streams): open it "
                "with one that has it, or pass a path or a binary stream",
            )
        target.write(text)
    elif isinstance(target, io.RawIOBase | io.BufferedIOBase):
        target.write(_encode(text, encoding))
    else:
        target.write(text)
