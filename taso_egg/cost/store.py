"""Profiles on disk: ``profiles/<device>-<backend>.json``.

A profile is one JSON object::

    {"format": "taso-egg-profile", "version": 1,
     "meta": {"device", "backend", "device_name", "dtype", "threads", "libraries",
              "created", "updated", "warmups", "repeats", "calibration": {...}},
     "entries": {<OpConfig.key>: {"op", "params", "inputs", "seconds", "spread_s", ...}}}

Profiles merge, entry by entry: a configuration already measured is kept unless the
caller asks to replace it, and measurements only merge into a profile taken on the
same device, back end and library versions (anything else raises ProfileError, as a
corrupt or foreign-version file does). Writes are atomic.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from ..errors import ProfileError
from ..disk.files import write_atomically
from .config import OpConfig

FORMAT = "taso-egg-profile"
VERSION = 1
# Metadata that must agree for measurements to be comparable, hence mergeable.
IDENTITY = ("device", "backend", "device_name", "dtype", "threads", "libraries")
_CALIBRATION = ("peak_flops", "bandwidth", "overhead_s", "run_overhead_s")


def profiles_dir() -> Path:
    """The shipped profiles (the repository's ``profiles/`` folder)."""
    from .. import profiles

    return Path(profiles.__file__).parent


def resolve_profile(name_or_path) -> Path:
    """A path as given, or a shipped profile's name (``cpu-ort`` -> profiles/cpu-ort.json)."""
    text = os.fspath(name_or_path)
    if os.sep in text or "/" in text or text.endswith(".json"):
        return Path(text)
    path = profiles_dir() / f"{text}.json"
    if not path.is_file():
        shipped = sorted(p.stem for p in profiles_dir().glob("*.json"))
        raise ProfileError(f"no profile named {text!r}; shipped: {', '.join(shipped) or 'none'} "
                           f"(or 'analytic', or the path of a profile file)")
    return path


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass
class MergeReport:
    added: int = 0
    kept: int = 0       # already measured; the old value stays
    replaced: int = 0


@dataclass
class Profile:
    meta: dict
    entries: dict[str, dict] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.meta['device']}-{self.meta['backend']} ({self.meta['device_name']})"

    def add(self, config: OpConfig, measurement: dict, replace: bool = False) -> bool:
        """Record one measurement; an existing entry stays unless ``replace``.
        Returns whether the entry was written."""
        key = config.key
        if key in self.entries and not replace:
            return False
        self.entries[key] = {**config.to_json(), **measurement}
        return True

    def check_compatible(self, other_meta: dict, where: str = "") -> None:
        for name in IDENTITY:
            mine, theirs = self.meta.get(name), other_meta.get(name)
            if mine != theirs:
                raise ProfileError(f"{where}cannot merge measurements taken with {name} = {theirs!r} "
                                   f"into a profile taken with {name} = {mine!r}; write them to "
                                   f"another file")

    def merge(self, other: Profile, replace: bool = False) -> MergeReport:
        """Add ``other``'s entries; same-key entries stay unless ``replace``."""
        self.check_compatible(other.meta)
        report = MergeReport()
        for key, entry in other.entries.items():
            if key not in self.entries:
                report.added += 1
            elif replace:
                report.replaced += 1
            else:
                report.kept += 1
                continue
            self.entries[key] = entry
        self.meta["updated"] = now()
        return report

    def to_json(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "meta": self.meta,
                "entries": dict(sorted(self.entries.items()))}

    def save(self, path) -> None:
        """Write through a temporary file and rename: all or nothing."""
        def write(tmp):
            with open(tmp, "w") as f:
                json.dump(self.to_json(), f, indent=1)
                f.write("\n")

        write_atomically(path, write, ProfileError)


_CACHE: dict[tuple, Profile] = {}


def load_profile(path) -> Profile:
    """Read and validate a profile; ProfileError names what is wrong with the file.
    Loaded files are cached by path and modification time (callers get a copy)."""
    path = Path(path)
    try:
        stat = path.stat()
    except FileNotFoundError:
        raise ProfileError(f"{path}: no such profile") from None
    cache_key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    if cache_key not in _CACHE:
        _CACHE[cache_key] = _parse(path)
    cached = _CACHE[cache_key]
    return Profile(json.loads(json.dumps(cached.meta)), dict(cached.entries))


def _parse(path: Path) -> Profile:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ProfileError(f"{path}: corrupt profile, not valid JSON ({e})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ProfileError(f"{path}: cannot read profile ({e})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ProfileError(f"{path}: not a taso-egg profile (no \"format\": \"{FORMAT}\")")
    if data.get("version") != VERSION:
        raise ProfileError(f"{path}: profile format version {data.get('version')!r}; this taso-egg "
                           f"reads version {VERSION} (re-profile with `taso-egg profile`)")
    meta, entries = data.get("meta"), data.get("entries")
    if not isinstance(meta, dict) or not isinstance(entries, dict):
        raise ProfileError(f"{path}: corrupt profile: \"meta\" and \"entries\" must be objects")
    for name in IDENTITY:
        if name not in meta:
            raise ProfileError(f"{path}: corrupt profile: metadata lacks {name!r}")
    calibration = meta.get("calibration")
    if not isinstance(calibration, dict):
        raise ProfileError(f"{path}: corrupt profile: metadata lacks the device calibration")
    for name in _CALIBRATION:
        if not _finite(calibration.get(name), positive=name in ("peak_flops", "bandwidth")):
            raise ProfileError(f"{path}: corrupt profile: calibration {name} = "
                               f"{calibration.get(name)!r} is not a valid number")
    for key, entry in entries.items():
        if not isinstance(entry, dict) or not _finite(entry.get("seconds")):
            raise ProfileError(f"{path}: corrupt profile: entry {key!r} has no valid \"seconds\"")
    return Profile(meta, entries)


def _finite(v, positive: bool = False) -> bool:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
    return ok and (v > 0 or not positive)
