"""Input sources: files, folders, stdin ("-"), gzip by magic bytes; each opened as a streaming text reader."""
from __future__ import annotations

import gzip
import io
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ..errors import InvalidInput

# Files picked up when a folder is given (compressed variants too); anything else in a folder is ignored.
FOLDER_SUFFIXES = (".jsonl", ".ndjson", ".json")
GZIP_MAGIC = b"\x1f\x8b"
STDIN_NAME = "-"

PathSpec = str | os.PathLike[str]


@dataclass(frozen=True, slots=True)
class Source:
    """One input stream.

    name: the stable part of memory ids for turns without their own conversation id: the file's
        name, or its path inside a folder given on the command line, without ".gz" (so moving the
        folder or compressing a file does not duplicate memories).
    display: how error messages show it (the path as given).
    """

    name: str
    display: str
    path: Path | None  # None for stdin
    size: int | None

    @contextmanager
    def open(self) -> Iterator[tuple[BinaryIO, BinaryIO]]:
        """Yields (the decompressed byte stream, the underlying byte stream whose tell() gives progress).

        Bytes, not text: records.py decodes line by line so a bad byte is reported with its line.
        """
        raw: BinaryIO = sys.stdin.buffer if self.path is None else open(self.path, "rb")
        try:
            buffered = raw if isinstance(raw, io.BufferedReader) else io.BufferedReader(raw)  # type: ignore[arg-type]
            compressed = buffered.peek(2)[:2] == GZIP_MAGIC
            binary: BinaryIO = gzip.GzipFile(fileobj=buffered, mode="rb") if compressed else buffered  # type: ignore[assignment]
            yield binary, raw
        finally:
            if self.path is not None:
                raw.close()


def _stable_name(relative: str) -> str:
    return relative[: -len(".gz")] if relative.endswith(".gz") else relative


def _wanted_in_folder(path: Path) -> bool:
    name = path.name.lower()
    if name.startswith("."):
        return False
    return _stable_name(name).endswith(FOLDER_SUFFIXES)


def expand_sources(paths: PathSpec | Sequence[PathSpec]) -> list[Source]:
    """Files, folders (searched recursively, sorted) and "-" -> Sources, each file once."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    if not isinstance(paths, Sequence) or len(paths) == 0:
        raise InvalidInput("paths is empty; pass at least one file, folder or '-' for stdin")
    sources: list[Source] = []
    seen: set[str] = set()
    for given in paths:
        if not isinstance(given, (str, os.PathLike)):
            raise InvalidInput(f"paths must hold file or folder paths, got {type(given).__name__}")
        text = os.fspath(given)
        if text == STDIN_NAME:
            if STDIN_NAME not in seen:
                seen.add(STDIN_NAME)
                sources.append(Source(name=STDIN_NAME, display="<stdin>", path=None, size=None))
            continue
        path = Path(text)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and _wanted_in_folder(p))
            if not found:
                raise InvalidInput(
                    f"folder {text!r} holds no {'/'.join(FOLDER_SUFFIXES)} files (optionally .gz); "
                    "pass the files themselves or another folder"
                )
            members = [(p, p.relative_to(path).as_posix()) for p in found]
        elif path.is_file():
            members = [(path, path.name)]
        elif path.exists():
            raise InvalidInput(f"{text!r} is neither a regular file nor a folder; pass a file, a folder or '-'")
        else:
            raise InvalidInput(f"no such file or folder: {text!r}; check the path (use '-' to read stdin)")
        for file_path, relative in members:
            real = os.path.realpath(file_path)
            if real in seen:
                continue  # the same file named twice (e.g. a folder and a file in it) is read once
            seen.add(real)
            sources.append(
                Source(name=_stable_name(relative), display=str(file_path), path=file_path, size=file_path.stat().st_size)
            )
    return sources
