"""Writing user files safely: checked before the work starts, written all or nothing."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Callable

from ..errors import TasoEggError


def check_writable(path, error: type[TasoEggError], inputs=()) -> None:
    """Raise ``error`` now, before minutes of work, unless ``path`` can be written as a
    regular file: its folder exists and takes a new file, its name is one the file
    system allows, and it is not a folder, a symbolic link, a device, FIFO or socket,
    a read-only file, or one of ``inputs`` (the files the command reads, under any
    path or hard link). Nothing is left behind: the probe file is removed."""
    path = Path(path)
    folder = path.absolute().parent
    if not folder.is_dir():
        raise error(f"cannot write {path}: folder {folder} does not exist")
    longest = os.pathconf(folder, "PC_NAME_MAX")
    if len(os.fsencode(path.name)) > longest:
        raise error(f"cannot write {path}: its name is {len(os.fsencode(path.name))} bytes long, "
                    f"past the {longest} the file system allows")
    folder = path.resolve().parent
    if os.path.islink(path):
        raise error(f"cannot write {path}: it is a symbolic link (to {os.readlink(path)}); "
                    f"name the file itself")
    if path.is_dir():
        raise error(f"cannot write {path}: it is a folder")
    if path.exists():
        _check_replaceable(path, error, inputs)
    try:
        fd, probe = tempfile.mkstemp(prefix=_TEMPORARY_PREFIX, suffix=".probe", dir=folder)
    except OSError as e:
        raise error(f"cannot write {path}: {e.strerror or e}") from None
    os.close(fd)
    os.unlink(probe)


# Temporary names beside the output: short, so that any legal output name leaves room.
_TEMPORARY_PREFIX = ".taso-egg."

_NOT_REGULAR = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))


def _check_replaceable(path: Path, error, inputs) -> None:
    """An existing ``path`` may be replaced only when it is a regular, writable file
    that the command does not read."""
    mode = path.stat().st_mode
    for test, kind in _NOT_REGULAR:
        if test(mode):
            raise error(f"cannot write {path}: it is {kind}, not a regular file")
    if not mode & stat.S_IWUSR or not os.access(path, os.W_OK):  # root passes os.access
        raise error(f"cannot write {path}: the existing file is read-only")
    for source in inputs:
        if os.path.exists(source) and os.path.samefile(path, source):
            raise error(f"cannot write {path}: it is the input {source}; write the result elsewhere")


def write_atomically(path, write: Callable[[str], None], error: type[TasoEggError],
                     companions: tuple[str, ...] = (), inputs=()) -> None:
    """Have ``write(tmp_path)`` write a file in a temporary folder beside ``path``
    (and, next to it, whichever of ``companions`` it needs, such as external weight
    data), then rename them into place, companions first: each file is the old one or
    the new one, never half written, and a failure, Ctrl-C or SIGTERM (which the CLI
    turns into an exception) leaves no temporary behind. Failures raise ``error``
    naming the path. ``path`` is checked again as ``check_writable`` checks it
    (``inputs``: the files the command reads)."""
    path = Path(path)
    check_writable(path, error, inputs)
    folder = path.resolve().parent
    staging = tempfile.mkdtemp(prefix=_TEMPORARY_PREFIX, suffix=".tmp", dir=folder)
    # a file replaced keeps its permissions; a new one is readable by all
    mode = stat.S_IMODE(path.stat().st_mode) if path.exists() else 0o644
    try:
        tmp = os.path.join(staging, path.name)
        write(tmp)
        written = [name for name in companions if os.path.exists(os.path.join(staging, name))]
        for name in (*written, path.name):
            os.chmod(os.path.join(staging, name), mode)
        for name in written:
            os.replace(os.path.join(staging, name), folder / name)
        os.replace(tmp, path)
    except TasoEggError:
        raise
    except Exception as e:
        raise error(f"cannot write {path}: {e}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
