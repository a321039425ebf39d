"""Files the user names, read and written without harm (issue 25).

Writing: ``write_atomic`` is the one writer of every file autoparallel makes (``export -o``,
``calibrate -o``, ``runs import --runs``, every file of a run folder). It writes a temporary
file beside the target and renames it over the target, so the file is whole or untouched. A
rename replaces whatever sits at the name, so the target is checked first:

- a name that exists and is not a regular file (a device, a FIFO, a folder, a socket) is refused:
  renaming over ``/dev/sda`` as root would replace the device with a file;
- a symbolic link is written *through*: the file it finally points at is replaced and the link
  stays (a dangling link gets its target created), so a dotfile linked into a repository stays
  linked;
- a target or folder that cannot be written is one line naming it, not a PermissionError from
  the temporary file.

Reading: ``open_capped``/``read_bytes`` open a file only if it is a regular file (a FIFO or
``/dev/zero`` would block or never end) no larger than the limit of its kind (``LIMITS``), and
read it with that cap, so a file that grows while read (``/proc``, a log still being written
to) cannot exhaust memory either.
"""

from __future__ import annotations

import io
import os
import stat
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from autoparallel.errors import UserError

class WriteError(UserError):
    """A file that could not be written (no space, no permission); ``reason`` says why."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


MiB = 2**20
# The largest file of each kind that is read: far above any real one, far below memory.
LIMITS = {
    "YAML file": 16 * MiB,  # presets, spaces, plans, manifests, settings
    "runs CSV": 256 * MiB,  # measured runs (training, inference)
    "training log": 1024 * MiB,  # a job's stdout
    "workload file": 64 * MiB,  # request lengths: ~5 million input_len,output_len pairs
    # candidates.csv: DeepSeek-V3 on 1024 GPUs with --all-candidates (1.8 M layouts) writes ~400 MB,
    # which pandas holds in several times that; the default run folder keeps 50,000 rows (16 MB).
    "run table": 1024 * MiB,
    "layer-profile store": 256 * MiB,
}


def _kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "not a regular file"


def _size(n: int) -> str:
    return f"{n / MiB:,.0f} MiB" if n >= MiB else f"{n:,} bytes"


def _strerror(exc: OSError) -> str:
    return exc.strerror or str(exc)


class _Capped(io.RawIOBase):
    """A file descriptor read up to ``limit`` bytes; a byte more is a UserError."""

    def __init__(self, fd: int, path: Path, kind: str, limit: int) -> None:
        self._fd, self._path, self._kind, self._left, self._limit = fd, path, kind, limit, limit

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = os.read(self._fd, max(1, min(len(buffer), self._left + 1)))
        n = len(data)
        buffer[:n] = data
        self._left -= n
        if self._left < 0:
            raise UserError(f"{self._kind} {self._path} grew past {_size(self._limit)} while read; "
                            f"a {self._kind} is at most {_size(self._limit)}")
        return n

    def close(self) -> None:
        if not self.closed:
            os.close(self._fd)
        super().close()


def open_capped(path: Path | str, kind: str) -> io.BufferedReader:
    """``path`` opened for reading (binary) if it is a regular file of at most ``LIMITS[kind]``
    bytes, read with that cap; anything else is a UserError naming the file."""
    limit = LIMITS[kind]
    try:  # O_NONBLOCK: opening a FIFO with no writer returns at once instead of waiting forever
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise UserError(f"cannot read {path}: {_strerror(exc)}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UserError(f"{kind} {path} is {_kind(info.st_mode)}, not a regular file")
        if info.st_size > limit:
            raise UserError(f"{kind} {path} is {_size(info.st_size)}; a {kind} is at most {_size(limit)}")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return io.BufferedReader(_Capped(fd, Path(path), kind, limit))


def read_bytes(path: Path | str, kind: str) -> bytes:
    """The whole of a regular file of at most ``LIMITS[kind]`` bytes (see ``open_capped``)."""
    with open_capped(path, kind) as f:
        try:
            return f.read()
        except OSError as exc:
            raise UserError(f"cannot read {path}: {_strerror(exc)}") from None


def read_text(path: Path | str, kind: str, errors: str = "strict") -> str:
    return read_bytes(path, kind).decode("utf-8", errors=errors)


# --- writing ---------------------------------------------------------------------------------

def _example_name(flag: str) -> str:
    """A file name to suggest for ``flag``'s output: runs import's --runs is a CSV, not a YAML."""
    return "runs.csv" if flag == "--runs" else "out.yaml"


def output_target(path: Path | str, flag: str = "") -> Path:
    """The file a write to ``path`` replaces: ``path``, or the file a symbolic link finally
    points at. A UserError (naming ``flag`` and the path) if that is not a regular file, its
    folder does not exist, or it cannot be written."""
    if isinstance(path, str) and path.endswith(("/", os.sep)):  # Path() would drop the separator
        raise UserError(f"{flag + ' ' if flag else ''}{path} ends in a path separator, so it names a folder; "
                        f"give a file name, e.g. {Path(path) / _example_name(flag)}")
    path = Path(path)
    name = f"{flag} {path}" if flag else str(path)
    target = path
    if path.is_symlink():
        try:
            target = Path(os.path.realpath(path, strict=True))
        except FileNotFoundError:  # a dangling link: its target is created
            target = Path(os.path.realpath(path))
        except OSError as exc:  # ELOOP
            raise UserError(f"{name} is a symbolic link that cannot be followed: {_strerror(exc)}") from None
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        mode = None
    except NotADirectoryError:
        blocking = next(p for p in reversed(target.parents) if p.exists() and not p.is_dir())
        raise UserError(f"{name}: {blocking} is a file, not a folder") from None
    except OSError as exc:
        raise UserError(f"{name}: {_strerror(exc)}") from None
    if mode is not None and stat.S_ISDIR(mode):
        raise UserError(f"{name} is a folder; give a file name, e.g. {path / _example_name(flag)}")
    if mode is not None and not stat.S_ISREG(mode):
        raise UserError(f"{name} is {_kind(mode)}, not a regular file; refusing to replace it")
    if not target.parent.is_dir():
        raise UserError(f"{name}: the folder {target.parent} does not exist")
    if not os.access(target.parent, os.W_OK | os.X_OK):
        raise UserError(f"{name}: cannot write in {target.parent} (permission denied)")
    if mode is not None and not os.access(target, os.W_OK):
        raise UserError(f"{name}: the file {target} is read-only (permission denied)")
    return target


def check_folder(folder: Path | str, name: str) -> None:
    """A UserError now, before any work, if files cannot be made in ``folder`` (made with its
    parents when missing): the nearest existing folder on its path is a file or not writable.
    ``name`` says which folder it is (e.g. ``--results runs``)."""
    existing = Path(folder)
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    if not existing.is_dir():
        where = "is" if existing == Path(folder) else f"is under {existing}, which is"
        raise UserError(f"{name} {where} a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"{name}: cannot write in {existing} (permission denied)")


def check_output_file(path: Path | str, flag: str) -> None:
    """A UserError now, before any work, if ``path`` (a file the user named with ``flag``)
    cannot be written by ``write_atomic``."""
    output_target(path, flag)


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def replacing(path: Path | str, flag: str = "") -> Iterator[tuple[int, str]]:
    """A temporary file ``(fd, name)`` beside the file ``path`` replaces (``output_target``),
    renamed over it when the block ends without an error, removed when it does not. A new file
    gets the permissions the user's umask gives (teammates can read a run), a replaced one keeps
    its own. An OSError (no space left, permission denied) is a UserError naming ``path``."""
    target = output_target(path, flag)
    try:
        mode = stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        mode = 0o666 & ~current_umask()
    name = f"{flag} {path}" if flag else str(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    except OSError as exc:
        raise WriteError(f"cannot write {name}: {_strerror(exc)} (in {target.parent})", _strerror(exc)) from None
    try:
        os.fchmod(fd, mode)
        yield fd, tmp
        os.replace(tmp, target)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise WriteError(f"cannot write {name}: {_strerror(exc)}; the file is unchanged", _strerror(exc)) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_atomic(path: Path | str, content: str | bytes | Iterable[str], flag: str = "") -> None:
    """Write ``path`` whole or not at all (see ``replacing``); ``content`` may come in pieces
    (text), so that a large file is never held whole in memory."""
    with replacing(path, flag) as (fd, _):
        with os.fdopen(fd, "wb" if isinstance(content, bytes) else "w") as f:
            f.writelines([content] if isinstance(content, str | bytes) else content)
