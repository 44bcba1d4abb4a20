"""Server-sent events framing (pure: fed bytes, no transport)."""

from __future__ import annotations


class SSEError(ValueError):
    """The answer is not an event stream."""


class SSEParser:
    """Server-sent events framing, fed raw bytes as they arrive; ``feed`` returns the data
    of each event the bytes completed (bytes; multi-line data joined with ``\\n``).

    Follows the WHATWG rules that matter here: lines end with CRLF, LF or CR; a blank line
    ends an event; an event without a ``data`` field is not dispatched; ``:`` starts a
    comment; one space after ``data:`` is dropped; ``event``/``id``/``retry`` and unknown
    fields are ignored; a leading UTF-8 BOM is dropped; an unfinished event at the end of
    the stream is dropped."""

    __slots__ = ("_tail", "_cr", "_data", "_started")

    def __init__(self) -> None:
        self._tail = b""          # an unfinished line
        self._cr = False          # the last byte seen was CR (it may be half of a CRLF)
        self._data: list[bytes] = []
        self._started = False

    def feed(self, chunk: bytes) -> list[bytes]:
        if self._cr:
            chunk = b"\r" + chunk
            self._cr = False
        if not self._started and chunk:
            self._started = True
            if chunk.startswith(b"\xef\xbb\xbf"):
                chunk = chunk[3:]
        if b"\r" in chunk:
            if chunk.endswith(b"\r"):
                chunk, self._cr = chunk[:-1], True
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        if b"\n" not in chunk:
            self._tail += chunk
            return []
        lines = (self._tail + chunk).split(b"\n") if self._tail else chunk.split(b"\n")
        self._tail = lines.pop()
        events: list[bytes] = []
        data = self._data
        for line in lines:
            if not line:
                if data:
                    events.append(data[0] if len(data) == 1 else b"\n".join(data))
                    data.clear()
            elif line.startswith(b"data:"):
                data.append(line[6:] if line[5:6] == b" " else line[5:])
            elif line == b"data":
                data.append(b"")
            # comments (":..."), event:, id:, retry: and unknown fields carry nothing we use
        return events


def is_done(data: bytes) -> bool:
    """The OpenAI end-of-stream event (``data: [DONE]``)."""
    return data == b"[DONE]" or data.strip() == b"[DONE]"


__all__ = ["SSEError", "SSEParser", "is_done"]
