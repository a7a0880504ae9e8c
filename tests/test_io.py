import io

import numpy as np
import pytest

from skgpstruct.io import format_conll, parse_conll, read_conll, write_conll

# (folder, file, encoding, sequences, tokens, columns without the label),
# counted independently of the reader (awk over blank-line separated blocks).
CRFPP_FILES = [
    ("basenp", "train.data", "utf-8", 77, 1896, 2),
    ("basenp", "test.data", "utf-8", 823, 19172, 2),
    ("chunking", "train.data", "utf-8", 77, 1896, 2),
    ("chunking", "test.data", "utf-8", 823, 19172, 2),
    ("seg", "train.data", "utf-8", 36, 965, 2),
    ("seg", "test.data", "utf-8", 19, 981, 2),
    ("JapaneseNE", "train.data", "euc-jp", 216, 4772, 3),
    ("JapaneseNE", "test.data", "euc-jp", 500, 12678, 3),
]


@pytest.mark.shared_data
@pytest.mark.parametrize(
    "folder, name, encoding, n_sequences, n_tokens, n_columns", CRFPP_FILES
)
def test_reads_every_crfpp_file(
    shared_data_dir, folder, name, encoding, n_sequences, n_tokens, n_columns
):
    tokens, labels = read_conll(shared_data_dir / "crfpp" / folder / name, encoding)
    assert len(tokens) == len(labels) == n_sequences
    assert sum(len(seq) for seq in tokens) == n_tokens
    assert [len(seq) for seq in tokens] == [len(seq) for seq in labels]
    assert {len(row) for seq in tokens for row in seq} == {n_columns}
    assert all(label for seq in labels for label in seq)


@pytest.mark.shared_data
def test_first_tokens_of_basenp_and_japanese(shared_data_dir):
    tokens, labels = read_conll(shared_data_dir / "crfpp" / "basenp" / "train.data")
    assert tokens[0][:2] == [["Confidence", "NN"], ["in", "IN"]]
    assert labels[0][:3] == ["B", "O", "B"]
    tokens, labels = read_conll(
        shared_data_dir / "crfpp" / "JapaneseNE" / "train.data", encoding="euc-jp"
    )
    assert labels[0][0] == "O"
    # Full-width spaces (U+3000) are token characters, not separators.
    assert any("\u3000" in value for seq in tokens for row in seq for value in row)


@pytest.mark.shared_data
def test_japanese_with_wrong_encoding_names_file_line_and_encoding(shared_data_dir):
    path = shared_data_dir / "crfpp" / "JapaneseNE" / "train.data"
    with pytest.raises(ValueError, match=r"train\.data, line 1: .*'utf-8'"):
        read_conll(path)


@pytest.mark.shared_data
@pytest.mark.parametrize("folder, name, encoding", [f[:3] for f in CRFPP_FILES])
def test_round_trip_of_shared_files(shared_data_dir, tmp_path, folder, name, encoding):
    tokens, labels = read_conll(shared_data_dir / "crfpp" / folder / name, encoding)
    out = tmp_path / "copy.data"
    write_conll(out, tokens, labels, encoding=encoding)
    assert read_conll(out, encoding=encoding) == (tokens, labels)


def test_parse_spaces_tabs_crlf_and_blank_lines():
    text = (
        "\n \n"
        "He\tPRP  B-NP\r\n"
        "reckons VBZ\t\tB-VP  \r\n"
        "\t\r\n"
        "\n"
        "the DT B-NP\n"
        "\u3000 SYM O\n"
        "\n\n"
    )
    tokens, labels = parse_conll(text)
    assert tokens == [[["He", "PRP"], ["reckons", "VBZ"]],
                      [["the", "DT"], ["\u3000", "SYM"]]]
    assert labels == [["B-NP", "B-VP"], ["B-NP", "O"]]


def test_indented_lines_parse_as_unindented():
    # Leading spaces and tabs separate nothing: no empty first column.
    indented = "  He PRP B-NP\n\t reckons VBZ B-VP\n\n \tthe DT B-NP\n"
    plain = "He PRP B-NP\nreckons VBZ B-VP\n\nthe DT B-NP\n"
    assert parse_conll(indented) == parse_conll(plain)
    assert parse_conll(indented)[0][0][0] == ["He", "PRP"]


@pytest.mark.parametrize("value", ["", "a b", "a\tb", "a\rb", "a\nb", " a"])
def test_format_refuses_values_the_format_would_split(value):
    # Written, they would be read back as other columns or lines.
    message = "is empty or contains whitespace"
    with pytest.raises(ValueError, match=message):
        format_conll([[[value, "NN"]]], [["O"]])
    with pytest.raises(ValueError, match=message):
        format_conll([[["a", "NN"]]], [[value]])

def test_last_sequence_without_trailing_blank_line():
    tokens, labels = parse_conll("a B\nb I\n\nc O")
    assert labels == [["B", "I"], ["O"]]
    assert tokens == [[["a"], ["b"]], [["c"]]]


def test_label_only_lines():
    tokens, labels = parse_conll("B\nI\n\nO\n")
    assert tokens == [[[], []], [[]]]
    assert labels == [["B", "I"], ["O"]]


def test_read_from_text_and_binary_file_objects():
    text = "a x B-NP\nb y I-NP\n\nc z O\n"
    expected = parse_conll(text)
    assert read_conll(io.StringIO(text)) == expected
    assert read_conll(io.BytesIO(text.encode("utf-8"))) == expected
    japanese = "東京 名詞 B-LOCATION\n\n都 名詞 O\n"
    handle = io.BytesIO(japanese.encode("euc-jp"))
    assert read_conll(handle, encoding="euc-jp") == parse_conll(japanese)


def test_read_path_and_open_file(tmp_path):
    path = tmp_path / "data.txt"
    path.write_text("a B\nb I\n\nc O\n", encoding="utf-8")
    assert read_conll(str(path)) == read_conll(path)
    with open(path, encoding="utf-8") as handle:
        assert read_conll(handle) == read_conll(path)


def test_ragged_columns_name_file_and_line(tmp_path):
    path = tmp_path / "ragged.data"
    path.write_text("a x B\nb y I\n\nc O\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"ragged\.data, line 4: found 2 column\(s\), "
                       r"but line 1 has 3"):
        read_conll(path)


def test_undecodable_bytes_name_line_and_encoding(tmp_path):
    path = tmp_path / "latin.data"
    path.write_bytes("a B\n\nb\xe9 O\n".encode("latin-1"))
    message = r"latin\.data, line 3: .*byte\(s\) e9 .*'utf-8'"
    with pytest.raises(ValueError, match=message):
        read_conll(path)
    assert read_conll(path, encoding="latin-1")[0] == [[["a"]], [["b\xe9"]]]
    # Lines ended by a lone CR (read as lines) are counted as lines: the
    # message said line 1, byte column 9, for this byte of line 3.
    for ending in ("\r", "\r\n", "\n"):
        path.write_bytes(f"a B{ending}{ending}b\xe9 O{ending}".encode("latin-1"))
        with pytest.raises(ValueError, match=r"line 3: .*e9 at column 2 "):
            read_conll(path)
    # In UTF-16 (two bytes a character; CR LF are not adjacent bytes) the
    # lines and columns are the text's: the bytes said line 5 for line 3.
    text = "a B\r\n\r\nbc O\r\n".encode("utf-16-le")
    bad = text[:16] + b"\x00\xdc" + text[18:]  # a lone low surrogate for "c"
    path.write_bytes(bad)
    with pytest.raises(ValueError, match=r"line 3: .*00 dc at column 2 "):
        read_conll(path, encoding="utf-16-le")


def test_unknown_encoding_is_reported(tmp_path):
    path = tmp_path / "x.data"
    path.write_text("a B\n", encoding="utf-8")
    with pytest.raises(ValueError, match="not a known codec"):
        read_conll(path, encoding="no-such-codec")
    # codecs, but not text encodings (they were reported as unknown)
    for codec in ("rot13", "hex", "undefined"):
        with pytest.raises(ValueError, match=f"encoding '{codec}' is not a text "):
            read_conll(path, encoding=codec)
    # Both check it also for a text file object, which decodes or encodes
    # on its own (read_conll ignored it, write_conll refused it).
    with pytest.raises(ValueError, match="encoding 'rot13' is not a text encoding"):
        write_conll(io.StringIO(), [[["a"]]], [["O"]], encoding="rot13")
    for encoding in ("no-such-codec", 42):
        with pytest.raises(ValueError, match="is not a known codec"):
            read_conll(io.StringIO("a O\n"), encoding=encoding)
    with pytest.raises(ValueError, match="is a directory, not a data file"):
        read_conll(tmp_path)  # was an IsADirectoryError


@pytest.mark.parametrize("content", ["", "\n\n  \n\t\n"])
def test_empty_file_is_an_error(tmp_path, content):
    path = tmp_path / "empty.data"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=r"empty\.data: the file is empty"):
        read_conll(path)


def test_bad_source_types():
    with pytest.raises(TypeError, match="path .* or a file object"):
        read_conll(42)
    with pytest.raises(TypeError, match="use read_conll"):
        parse_conll(b"a B\n")
    with pytest.raises(FileNotFoundError):
        read_conll("/no/such/file.data")


def test_write_with_gold_and_predicted_columns(tmp_path):
    tokens = [[["He", "PRP"], ["reckons", "VBZ"]], [["the", "DT"]]]
    gold = [["B-NP", "B-VP"], ["B-NP"]]
    pred = [np.array(["B-NP", "I-NP"]), np.array(["O"])]
    path = tmp_path / "out.txt"
    write_conll(path, tokens, gold, pred, sep="\t")
    text = path.read_text(encoding="utf-8")
    assert text == (
        "He\tPRP\tB-NP\tB-NP\nreckons\tVBZ\tB-VP\tI-NP\n\nthe\tDT\tB-NP\tO\n\n"
    )
    # Read back, the gold labels are the last token column.
    tokens2, labels2 = read_conll(path)
    assert [[row[:-1] for row in seq] for seq in tokens2] == tokens
    assert [[row[-1] for row in seq] for seq in tokens2] == gold
    assert labels2 == [list(p) for p in pred]


def test_write_to_file_objects():
    tokens, labels = [[["a"], ["b"]]], [["B", "I"]]
    text_handle = io.StringIO()
    write_conll(text_handle, tokens, labels)
    assert text_handle.getvalue() == "a B\nb I\n\n"
    binary_handle = io.BytesIO()
    write_conll(binary_handle, [[["都"]]], [["O"]], encoding="euc-jp")
    assert binary_handle.getvalue() == "都 O\n\n".encode("euc-jp")
    # A text stream encodes with its own encoding: the message said to give
    # an encoding, which the argument cannot do for it.
    ascii_text = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    with pytest.raises(ValueError, match=r"encoding='ascii'.*the text stream "
                       r"encodes with its own encoding.*pass a path or a binary"):
        write_conll(ascii_text, [[["é"]]], [["O"]], encoding="utf-8")


def test_format_errors():
    with pytest.raises(ValueError, match="tokens has 1 sequences but labels has 2"):
        format_conll([[["a"]]], [["B"], ["O"]])
    with pytest.raises(ValueError, match="sequence 0 has 1 tokens but 2 labels in "
                       r"more_labels\[0\]"):
        format_conll([[["a"]]], [["B"]], [["B", "I"]])
    with pytest.raises(ValueError, match="sequence 0, token 0: value 'a b'"):
        format_conll([[["a b"]]], [["B"]])
    with pytest.raises(ValueError, match="empty sequence"):
        format_conll([[]], [[]])
    with pytest.raises(ValueError, match="sep must be"):
        format_conll([[["a"]]], [["B"]], sep=",")
    # Text read_conll would refuse or change: it was written without a word.
    with pytest.raises(ValueError, match=r"sequence 0, token 1 has 2 column\(s\), "
                       "but the first token has 3"):
        format_conll([[["He", "PRP"], ["reckons"]]], [["B-NP", "B-VP"]])
    with pytest.raises(ValueError, match=r"sequence 1, token 0 has 3 column"):
        format_conll([[["a"]], [["b", "c"]]], [["O"], ["O"]])
    with pytest.raises(ValueError, match="starts with U\\+FEFF"):
        format_conll([[["\ufeffa"]]], [["O"]])
    text = format_conll([[["a", "\ufeffb"]], [["c", "d"]]], [["O"], ["O"]])
    assert parse_conll(text) == ([[["a", "\ufeffb"]], [["c", "d"]]], [["O"], ["O"]])


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (b"a", "type bytes is neither a string nor a number"),
        (None, "type NoneType is neither"),
        (float("nan"), "value nan is not finite"),
        (np.float64(np.inf), "value inf is not finite"),
    ],
)
def test_format_refuses_values_it_would_write_as_their_repr(value, message):
    # They were written as "b'a'", "None" and "nan", read back as other text.
    with pytest.raises(ValueError, match=message):
        format_conll([[[value]]], [["O"]])
    with pytest.raises(ValueError, match=message):
        format_conll([[["a"]]], [[value]])
    # Numbers are written as str writes them.
    assert format_conll([[[3]]], [[np.int64(1)]]) == "3 1\n\n"


@pytest.mark.parametrize("encoding", ["latin-1", "no-such-codec"])
def test_write_that_cannot_encode_leaves_the_file_as_it_was(tmp_path, encoding):
    # The file was emptied before the encoding failed.
    path = tmp_path / "out.data"
    path.write_text("IMPORTANT DATA\n", encoding="utf-8")
    with pytest.raises(ValueError, match=f"encoding[= ]'{encoding}'"):
        write_conll(path, [[["日本"]]], [["O"]], encoding=encoding)
    assert path.read_text(encoding="utf-8") == "IMPORTANT DATA\n"
    buffer = io.TextIOWrapper(io.BytesIO(), encoding="latin-1")
    with pytest.raises(ValueError, match="cannot encode '日本'"):
        write_conll(buffer, [[["日本"]]], [["O"]])


def test_byte_order_mark_and_lone_carriage_returns(tmp_path):
    # The mark stayed in the first token; a file with CR line ends was read
    # as one line.
    expected = ([[["He", "PRP"], ["x", "Y"]], [["y", "Z"]]], [["B-NP", "O"], ["O"]])
    assert parse_conll("\ufeffHe PRP B-NP\nx Y O\n\ny Z O\n") == expected
    assert parse_conll("He PRP B-NP\rx Y O\r\ry Z O\r") == expected
    path = tmp_path / "bom.data"
    path.write_bytes("\ufeffHe PRP B-NP\r\nx Y O\r\n\r\ny Z O\r\n".encode())
    assert read_conll(path) == expected
    with open(path, encoding="utf-8") as handle:  # text mode keeps the mark
        assert read_conll(handle) == expected


def test_a_byte_order_mark_inside_the_file_is_kept_with_a_warning(tmp_path):
    # Two files with byte-order marks concatenated: the second mark starts
    # a line of the middle of the file. It is data there (U+FEFF may be a
    # value's character: format_conll writes it), but silently it made an
    # unseen feature of the token; the warning names the line.
    part = "\ufeffHe PRP B-NP\nx Y O\n\n".encode()
    path = tmp_path / "cat.data"
    path.write_bytes(part + part + part)
    with pytest.warns(UserWarning, match=r"cat\.data, line 4 \(and 1 more line\): "
                      "starts with U\\+FEFF") as caught:
        tokens, labels = read_conll(path)
    assert caught[0].filename == __file__  # the caller's line
    assert tokens[1][0] == ["\ufeffHe", "PRP"] and tokens[0][0] == ["He", "PRP"]
    assert labels == [["B-NP", "O"]] * 3
    with pytest.warns(UserWarning, match=r"line 2: starts with U\+FEFF"):
        parse_conll("a O\n\ufeffb O\n")
    text = format_conll([[["a"]], [["\ufeffc"]]], [["O"], ["O"]])
    with pytest.warns(UserWarning, match="line 3"):
        assert parse_conll(text) == ([[["a"]], [["\ufeffc"]]], [["O"], ["O"]])
