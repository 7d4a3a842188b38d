"""Seconds per phase of one optimization (reading, calibration, saturation,
extraction, writing, timing, check), so that a slow phase is visible in the headline
and in ``bench``.

Phases nest: the symbolic writer runs inside extraction (an extraction it refuses is
extracted again) and inside timing (each candidate is written before it is timed), so
the seconds of an inner phase are its own and not its enclosing phase's too. The
phases' seconds therefore add up to the wall time they cover."""

from __future__ import annotations

import time
from contextlib import contextmanager

# The order phases are shown in; a phase not listed (none today) is shown after them.
ORDER = ("reading", "calibration", "saturation", "extraction", "writing", "timing", "check")


class PhaseTimes:
    """Wall seconds per phase name, each phase's own (nested phases excluded)."""

    def __init__(self, clock=time.perf_counter):
        self.seconds: dict[str, float] = {}
        self._clock = clock
        self._stack: list[list] = []  # [name, started, seconds spent in nested phases]

    @contextmanager
    def __call__(self, name: str):
        """Time the block as phase ``name`` (added to what the phase already holds)."""
        start = self._clock()
        self._stack.append([name, start, 0.0])
        try:
            yield
        finally:
            _, _, nested = self._stack.pop()
            spent = self._clock() - start
            self.seconds[name] = self.seconds.get(name, 0.0) + spent - nested
            if self._stack:
                self._stack[-1][2] += spent

    def wrap(self, name: str, function):
        """``function`` with each call timed as phase ``name``."""
        def timed(*args, **kwargs):
            with self(name):
                return function(*args, **kwargs)
        return timed

    def ordered(self) -> list[tuple[str, float]]:
        """(phase, seconds) in ``ORDER``, phases never entered left out."""
        known = [(name, self.seconds[name]) for name in ORDER if name in self.seconds]
        return known + [(name, s) for name, s in self.seconds.items() if name not in ORDER]

    def line(self) -> str:
        """``saturation 3.1 s, extraction 0.4 s, ...``."""
        return ", ".join(f"{name} {seconds:.1f} s" for name, seconds in self.ordered())
