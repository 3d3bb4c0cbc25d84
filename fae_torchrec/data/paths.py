"""Data file paths: one or several as a list, and why a path is not a data file to read."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Sequence


def as_paths(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str]:
    """One path or several, as a list of strings."""
    return [os.fspath(paths)] if isinstance(paths, str | os.PathLike) else [os.fspath(p) for p in paths]


#: Why a path cannot be opened, by ``errno``.
_OPEN_ERRORS = {
    errno.ENOENT: "no such file",
    errno.ELOOP: "a symbolic-link loop",
    errno.EACCES: "permission denied",
    errno.ENOTDIR: "a path through a file, not a directory",
}
#: What a path that is not a regular file is.
_FILE_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def file_problem(path: str | os.PathLike) -> str | None:
    """Why ``path`` is not a data file to read (None when it is a readable regular file): no such file, a
    symbolic link to none, a symbolic-link loop, permission denied, or a directory, FIFO, socket or device,
    which reading would fail on or wait on forever."""
    try:
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for is_kind, name in _FILE_KINDS if is_kind(mode)), "a special file")
            return f"{kind}, not a regular file"
        with open(path, "rb"):
            return None
    except OSError as error:
        if error.errno == errno.ENOENT and os.path.islink(path):
            return "a symbolic link to a missing file"
        return _OPEN_ERRORS.get(error.errno or 0, error.strerror or str(error))
