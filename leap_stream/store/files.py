"""Durable file writes, one way: a file appears whole under its final name or not at all.

Write a temp file beside the target (a dot name, which every reader skips), fsync it, rename it
over the target, then fsync the folder so the rename survives a power loss. The offline store,
the registry and the dev tooling's state files all write through `write_atomic`.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())


def temp_name(path: Path) -> Path:
    """A hidden, unique sibling of ``path`` (readers skip dot files; a crash leaves only that)."""
    return path.with_name(f".tmp-{uuid.uuid4().hex}-{path.name}")


def write_atomic(
    path: Path, content: bytes | Callable[[BinaryIO], object], durable: bool = True
) -> Path:
    """Replace ``path`` with ``content`` (bytes, or a function that writes to the open file).

    ``durable=False`` skips both fsyncs: still whole or absent, but a power loss may take the
    latest write back (for caches that are rebuilt from elsewhere)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_name(path)
    try:
        with open(tmp, "wb") as fh:
            if isinstance(content, bytes):
                fh.write(content)
            else:
                content(fh)
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)
    return path


__all__ = ["fsync_dir", "fsync_file", "temp_name", "write_atomic"]
