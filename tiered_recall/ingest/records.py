"""Streaming JSON containers: JSON Lines, one JSON document, or a top-level array read element by element.

Each record comes with the line it starts on so errors can say `file:line`. A top-level array is
decoded one element at a time from a growing buffer, so a file of many conversations never has to
fit in memory at once (only its largest element does).
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
import codecs
from typing import Any, BinaryIO

_CHUNK_CHARS = 1 << 16
_DECODER = json.JSONDecoder()
_WHITESPACE = " \t\n\r"


@dataclass(frozen=True, slots=True)
class Record:
    """One JSON value read from a stream, with the line it starts on."""

    line: int
    value: Any


@dataclass(frozen=True, slots=True)
class BadRecord:
    """A record that could not be read; `resumable` is False when the rest of the stream is unreadable too."""

    line: int
    message: str
    resumable: bool = True


class _ReadError(Exception):
    def __init__(self, line: int, message: str) -> None:
        super().__init__(message)
        self.line = line
        self.message = message


class _Lines:
    """Binary lines decoded one at a time, so a decoding error names its exact line."""

    def __init__(self, stream: BinaryIO) -> None:
        self.stream = stream
        self.line_number = 0

    def readline(self) -> str:
        data = self.stream.readline()
        if not data:
            return ""
        self.line_number += 1
        if self.line_number == 1 and data.startswith(codecs.BOM_UTF8):
            data = data[len(codecs.BOM_UTF8):]  # some editors write a byte-order mark
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as error:
            raise _ReadError(self.line_number, _not_utf8(error)) from None

    def __iter__(self) -> Iterator[str]:
        while text := self.readline():
            yield text


def _not_utf8(error: UnicodeDecodeError) -> str:
    return f"the file is not UTF-8 text ({error.reason} at byte {error.start} of the line); re-encode it as UTF-8"


class _Chunks:
    """Decodes binary chunks incrementally; a decoding error names the line it falls on."""

    def __init__(self, stream: BinaryIO) -> None:
        self.stream = stream
        self.decoder = codecs.getincrementaldecoder("utf-8")("strict")

    def read(self, size: int, *, line: int) -> str:
        data = self.stream.read(size)
        try:
            return self.decoder.decode(data, final=not data)
        except UnicodeDecodeError as error:
            raise _ReadError(line + data.count(b"\n", 0, error.start), _not_utf8(error).replace(" of the line", "")) from None


def iter_records(stream: BinaryIO) -> Iterator[Record | BadRecord]:
    """Yield the records of a JSON Lines file, a single JSON document or a top-level JSON array."""
    try:
        yield from _iter_records(stream)
    except _ReadError as error:
        yield BadRecord(error.line, error.message, resumable=False)


def _iter_records(stream: BinaryIO) -> Iterator[Record | BadRecord]:
    lines = _Lines(stream)
    first_line = lines.readline()
    while first_line and not first_line.strip():  # skip blank lines at the start
        first_line = lines.readline()
    if not first_line:
        return  # an empty file has no records
    start_line = lines.line_number
    if first_line.lstrip().startswith("["):
        yield from _iter_array(_Chunks(stream), first_line, start_line=start_line)
        return
    try:
        yield Record(start_line, json.loads(first_line))
    except json.JSONDecodeError:
        # Not one value per line: a pretty-printed single document, or JSON Lines with a bad first line.
        document = first_line + "".join(lines)
        try:
            yield Record(start_line, json.loads(document))
            return
        except json.JSONDecodeError as error:
            whole_error = error
        lines = document.splitlines()
        if len(lines) > 1 and _looks_like_json_lines(lines[1:]):
            yield from _iter_lines(iter(lines), start_line=start_line)
        else:
            yield BadRecord(
                start_line - 1 + whole_error.lineno, f"not valid JSON ({whole_error.msg})", resumable=False
            )
        return
    yield from _iter_lines(lines, start_line=start_line + 1)


def _looks_like_json_lines(lines: list[str]) -> bool:
    for text in lines:
        if text.strip():
            try:
                json.loads(text)
                return True
            except json.JSONDecodeError:
                return False
    return False


def _iter_lines(lines: Iterator[str] | _Lines, *, start_line: int) -> Iterator[Record | BadRecord]:
    line_number = start_line - 1
    for text in lines:
        line_number += 1
        if not text.strip():
            continue
        try:
            yield Record(line_number, json.loads(text))
        except json.JSONDecodeError as error:
            yield BadRecord(line_number, f"not valid JSON ({error.msg} at column {error.colno})")


def _iter_array(chunks: _Chunks, first_line: str, *, start_line: int) -> Iterator[Record | BadRecord]:
    buffer = first_line
    position = buffer.index("[") + 1
    # Line bookkeeping: `line_at_mark` is the line number of buffer[mark].
    mark, line_at_mark = 0, start_line
    eof = False
    expecting_value = True
    first_element = True

    def line_of(index: int) -> int:
        nonlocal mark, line_at_mark
        line_at_mark += buffer.count("\n", mark, index)
        mark = index
        return line_at_mark

    def refill() -> bool:
        nonlocal buffer, position, mark, eof
        if eof:
            return False
        # Read at least as much as is buffered so a large element costs amortised linear time to decode.
        chunk = chunks.read(max(_CHUNK_CHARS, len(buffer) - position), line=line_of(position))
        if not chunk:
            eof = True
            return False
        # Drop what was consumed (kept until now so error positions stay valid at the end of the file).
        line_of(position)
        buffer, mark, position = buffer[position:] + chunk, 0, 0
        return True

    while True:
        while position < len(buffer) and buffer[position] in _WHITESPACE:
            position += 1
        if position >= len(buffer):
            if refill():
                continue
            raise _ReadError(line_of(position), "the JSON array is not closed: the file ends before ']'")
        char = buffer[position]
        if char == "]" and (first_element or not expecting_value):
            return
        if not expecting_value:
            if char != ",":
                raise _ReadError(line_of(position), f"expected ',' or ']' between array elements, found {char!r}")
            position += 1
            expecting_value = True
            continue
        while True:
            try:
                value, end = _DECODER.raw_decode(buffer, position)
                break
            except json.JSONDecodeError as error:
                if refill():
                    continue
                raise _ReadError(line_of(error.pos), f"not valid JSON ({error.msg})") from None
        yield Record(line_of(position), value)
        position = end
        expecting_value = False
        first_element = False
