"""A cache of derived data across processes, in the user's cache folder.

Entries are pickles keyed by a hash of everything they are computed from (the caller
makes the key), so an entry is never stale, only unused. Each file carries a checksum
of its payload: a truncated or damaged entry reads as a miss, never as wrong data.
Any failure (an unwritable or missing folder, a damaged file, a class that no longer
unpickles) is a miss too, silently: the caller computes the value as if there were no
cache. Entries are written to a temporary file and renamed into place, so concurrent
processes see a whole entry or none.

Where: ``$TASO_EGG_CACHE_DIR``, else ``$XDG_CACHE_HOME/taso-egg``, else
``~/.cache/taso-egg``; never the installed package's own folder. ``TASO_EGG_NO_CACHE=1``
turns it off (nothing read, nothing written).

The cache trusts its folder as the user's own: unpickling runs code, so a folder that
others can write to should not be used (the folder is created private, mode 0700).
"""

from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
from pathlib import Path

_MAGIC = b"taso-egg cache 1\n"
_DIGEST = 32  # sha256 of the payload, after the magic
# Entries kept per kind; the least recently used (written or read) go when one is written.
KEEP = 32


def enabled() -> bool:
    return os.environ.get("TASO_EGG_NO_CACHE", "") in ("", "0")


def folder() -> Path:
    explicit = os.environ.get("TASO_EGG_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "taso-egg"


def key(*parts: bytes | str) -> str:
    """A hex key from the parts, each length-prefixed so that no two lists collide."""
    h = hashlib.sha256()
    for p in parts:
        b = p.encode() if isinstance(p, str) else p
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


def source_digest(paths) -> str:
    """A key part for code: the bytes of the given source files (a missing one counts
    as empty), so that editing any of them retires the entries computed by it."""
    return key(*(p.name.encode() + b"\0" + _bytes(p) for p in sorted(map(Path, paths))))


def _bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def _path(kind: str, k: str) -> Path:
    return folder() / kind / f"{k}.pickle"


def load(kind: str, k: str):
    """The value stored under ``kind``/``k``, or None."""
    if not enabled():
        return None
    path = _path(kind, k)
    try:
        data = path.read_bytes()
        if not data.startswith(_MAGIC):
            return None
        digest, payload = data[len(_MAGIC):len(_MAGIC) + _DIGEST], data[len(_MAGIC) + _DIGEST:]
        if hashlib.sha256(payload).digest() != digest:
            return None
        value = pickle.loads(payload)
    except Exception:  # a miss, whatever the damage: the caller recomputes
        return None
    try:
        os.utime(path)  # pruning keeps the entries used last
    except OSError:
        pass
    return value


def store(kind: str, k: str, value) -> None:
    """Store ``value`` under ``kind``/``k`` if the cache can be written; else nothing."""
    if not enabled():
        return
    tmp = None
    try:
        payload = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        target = _path(kind, k)
        folder().mkdir(parents=True, exist_ok=True, mode=0o700)
        target.parent.mkdir(exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(prefix=".", suffix=".tmp", dir=target.parent)
        with os.fdopen(fd, "wb") as f:
            f.write(_MAGIC + hashlib.sha256(payload).digest() + payload)
        os.replace(tmp, target)
        tmp = None
        _prune(target.parent)
    except Exception:
        pass
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _prune(kind_folder: Path) -> None:
    entries = sorted(kind_folder.glob("*.pickle"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in entries[KEEP:]:
        try:
            old.unlink()
        except OSError:
            pass
