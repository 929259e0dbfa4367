"""Writing private files: all or nothing, owner-only from the first byte."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path


class FileError(Exception):
    """A file the gateway needs is missing, unsafe or cannot be written."""


def write_private_files(files: Mapping[Path, bytes]) -> None:
    """Write every file with mode 0600, or none of them.

    Refuses if any target exists. Each file is first written to a temporary
    name created 0600 (never readable by others, not even for a moment), then
    all are renamed into place; a failure removes whatever was written.
    """
    for path in files:
        if path.exists():
            raise FileError(f"{path} already exists; refusing to overwrite it")
    written: list[Path] = []
    temporary: dict[Path, Path] = {}
    try:
        for path, content in files.items():
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            scratch = path.with_name(f".{path.name}.tmp")
            descriptor = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            temporary[path] = scratch
            with os.fdopen(descriptor, "wb") as handle:
                handle.write(content)
                handle.flush()
                os.fsync(handle.fileno())
        for path, scratch in temporary.items():
            os.link(scratch, path)  # fails if the target appeared meanwhile
            written.append(path)
    except OSError as error:
        for path in written:
            path.unlink(missing_ok=True)
        raise FileError(f"cannot write {error.filename or 'file'}: {error.strerror}") from None
    finally:
        for scratch in temporary.values():
            scratch.unlink(missing_ok=True)


def check_private(path: Path, what: str) -> None:
    """Refuse a secret-holding file that is missing or readable by group or others."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise FileError(f"{what} {path} does not exist") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise FileError(
            f"{what} {path} is readable by group or others (mode {stat.S_IMODE(mode):04o}); "
            f"run: chmod 600 {path}"
        )
