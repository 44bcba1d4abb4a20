"""SSEParser: the pure framing of server-sent events, fed bytes as a socket hands them out."""

import pytest

from specadapt.wire.sse import SSEParser


def frame(*pieces: bytes) -> list[list[bytes]]:
    """The events completed by each piece, in order."""
    p = SSEParser()
    return [p.feed(x) for x in pieces]


def test_one_event_per_blank_line_and_one_space_dropped():
    assert frame(b"data: {\"a\":1}\n\ndata:x\n\n") == [[b'{"a":1}', b"x"]]
    assert frame(b"data:  two spaces\n\n") == [[b" two spaces"]]  # only the first space is syntax


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"])
def test_line_ends_lf_crlf_and_cr(eol):
    body = b"data: a" + eol + eol + b"data: b" + eol + b"data: c" + eol + eol
    if eol == b"\r":  # a CR that ends a read may be half a CRLF: the line ends when the next byte comes
        assert frame(body, b":") == [[b"a"], [b"b\nc"]]
    else:
        assert frame(body) == [[b"a", b"b\nc"]]


def test_crlf_split_between_reads_is_one_line_end():
    # A CR at the end of a read may be half a CRLF: it must not make a second (blank) line.
    assert frame(b"data: a\r", b"\ndata: b\r\n\r\n") == [[], [b"a\nb"]]
    assert frame(b"data: a\r\n\r", b"\n") == [[], [b"a"]]
    # A lone CR followed by other bytes is a line end of its own.
    assert frame(b"data: a\r", b"\rdata: b\r\r") == [[], [b"a"]]


def test_multi_line_data_is_joined_with_newlines():
    assert frame(b"data: {\"a\":\ndata: 1}\n\n") == [[b'{"a":\n1}']]
    assert frame(b"data\ndata: x\n\n") == [[b"\nx"]]  # a bare "data" line is an empty data line


def test_comments_event_id_retry_and_unknown_fields_are_ignored():
    body = b": keep-alive\n\nevent: message\nid: 7\nretry: 100\nfoo: bar\ndata: x\n\n"
    assert frame(body) == [[b"x"]]  # the comment-only block is no event


def test_a_block_without_data_is_not_an_event_and_empty_data_is():
    assert frame(b"event: ping\n\n") == [[]]
    assert frame(b"data:\n\n") == [[b""]]


def test_an_event_split_anywhere_arrives_with_its_last_line_end():
    body = b"data: hello\n\ndata: world\n\n"
    for cut in range(1, len(body)):
        got = frame(body[:cut], body[cut:])
        assert got[0] + got[1] == [b"hello", b"world"]
        assert got[0] == ([b"hello"] if cut >= len(b"data: hello\n\n") else [])


def test_byte_by_byte_and_multi_byte_utf8_split():
    body = "data: é€\n\n".encode()
    p = SSEParser()
    out = [e for i in range(len(body)) for e in p.feed(body[i:i + 1])]
    assert out == ["é€".encode()]


def test_leading_bom_is_dropped_once():
    assert frame(b"\xef\xbb\xbfdata: a\n\n") == [[b"a"]]
    assert frame(b"data: \xef\xbb\xbfa\n\n") == [[b"\xef\xbb\xbfa"]]


def test_unfinished_event_at_the_end_is_not_dispatched():
    assert frame(b"data: a\n", b"data: b") == [[], []]


def test_empty_read_changes_nothing():
    assert frame(b"", b"data: a\n", b"", b"\n") == [[], [], [], [b"a"]]
