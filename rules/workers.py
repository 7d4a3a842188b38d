"""Worker processes for the rule pipeline. One pool serves a whole generation run (its
float checks, derivation batches and proofs), so the run pays once, not at every
level and phase, for spawning workers that load NumPy, egglog, Z3 and the axioms."""

from __future__ import annotations

import multiprocessing
import os
from contextlib import contextmanager

from taso_egg.errors import RuleError


def default_jobs() -> int:
    return os.cpu_count() or 1


def check_jobs(jobs) -> int:
    if not (isinstance(jobs, int) and not isinstance(jobs, bool) and jobs >= 1):
        raise RuleError(f"jobs must be a positive integer, got {jobs!r}")
    return jobs


@contextmanager
def worker_pool(jobs: int):
    """A pool of ``jobs`` worker processes, or None when ``jobs`` is 1 (work then runs
    in this process). The workers are stopped on leaving, also on an error or Ctrl-C."""
    if check_jobs(jobs) == 1:
        yield None
        return
    # spawn, not fork: the parent may hold Z3 and egglog threads, which a fork copies badly
    pool = multiprocessing.get_context("spawn").Pool(jobs)
    try:
        yield pool
    finally:
        pool.terminate()
        pool.join()


def map_in_order(pool, fn, items: list, jobs: int):
    """``fn`` over ``items``, results in input order (an iterator): in ``pool`` (of
    ``jobs`` workers) when there is one, in small chunks so that the workers finish
    together."""
    if pool is None:
        return map(fn, items)
    chunk = max(1, min(16, len(items) // (jobs * 8)))
    return pool.imap(fn, items, chunksize=chunk)


__all__ = ["default_jobs", "check_jobs", "worker_pool", "map_in_order"]
