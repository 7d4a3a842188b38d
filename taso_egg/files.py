"""Writing user files safely: all or nothing."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable

from .errors import TasoEggError


def write_atomically(path, write: Callable[[str], None], error: type[TasoEggError]) -> None:
    """Have ``write(tmp_path)`` write a temporary file beside ``path``, then rename it
    over ``path``: the file is the old one or the new one, never half written, and a
    failure leaves no temporary behind. Failures raise ``error`` naming the path."""
    path = Path(path)
    folder = path.resolve().parent
    if not folder.is_dir():
        raise error(f"cannot write {path}: folder {folder} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; these files are shared data
        os.replace(tmp, path)
    except TasoEggError:
        raise
    except Exception as e:
        raise error(f"cannot write {path}: {e}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
