"""Writing user files safely: checked before the work starts, written all or nothing."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from .errors import TasoEggError


def check_writable(path, error: type[TasoEggError]) -> None:
    """Raise ``error`` now, before minutes of work, if ``path`` cannot be written: its
    folder is missing or refuses a new file, or the path is a folder. Nothing is left
    behind: the probe file is removed."""
    path = Path(path)
    folder = path.resolve().parent
    if path.is_dir():
        raise error(f"cannot write {path}: it is a folder")
    if not folder.is_dir():
        raise error(f"cannot write {path}: folder {folder} does not exist")
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".probe", dir=folder)
    except OSError as e:
        raise error(f"cannot write {path}: {e.strerror or e}") from None
    os.close(fd)
    os.unlink(probe)
    if path.exists() and not os.access(path, os.W_OK):
        raise error(f"cannot write {path}: the existing file is read-only")


def write_atomically(path, write: Callable[[str], None], error: type[TasoEggError],
                     companions: tuple[str, ...] = ()) -> None:
    """Have ``write(tmp_path)`` write a file in a temporary folder beside ``path``
    (and, next to it, whichever of ``companions`` it needs, such as external weight
    data), then rename them into place, companions first: each file is the old one or
    the new one, never half written, and a failure, Ctrl-C or SIGTERM (which the CLI
    turns into an exception) leaves no temporary behind. Failures raise ``error``
    naming the path."""
    path = Path(path)
    check_writable(path, error)
    folder = path.resolve().parent
    staging = tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    try:
        tmp = os.path.join(staging, path.name)
        write(tmp)
        written = [name for name in companions if os.path.exists(os.path.join(staging, name))]
        for name in (*written, path.name):
            os.chmod(os.path.join(staging, name), 0o644)
        for name in written:
            os.replace(os.path.join(staging, name), folder / name)
        os.replace(tmp, path)
    except TasoEggError:
        raise
    except Exception as e:
        raise error(f"cannot write {path}: {e}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
