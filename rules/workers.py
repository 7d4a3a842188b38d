"""Worker processes for the rule pipeline. One pool serves a whole generation run (its
float checks, derivation batches and proofs), so the run pays once, not at every
level and phase, for spawning workers that load NumPy, egglog, Z3 and the axioms.

The workers are local processes, or Ray tasks while :func:`ray_workers` is entered
(``--ray ADDRESS``): the same pool interface, the same results in the same order
(every job is a pure function of its arguments; nothing depends on which worker ran
it), so a corpus generated through Ray is byte for byte a local run's."""

from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
import socket
import tempfile
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from taso_egg.errors import RuleError, WorkerError


def default_jobs() -> int:
    return os.cpu_count() or 1


def check_jobs(jobs) -> int:
    if not (isinstance(jobs, int) and not isinstance(jobs, bool) and jobs >= 1):
        raise RuleError(f"jobs must be a positive integer, got {jobs!r}")
    return jobs


# The Ray session worker_pool hands out pools of, while ray_workers is entered.
_RAY = None


@contextmanager
def worker_pool(jobs: int):
    """A pool of ``jobs`` workers (processes, or Ray tasks inside :func:`ray_workers`),
    or None when ``jobs`` is 1 (work then runs in this process). The workers are
    stopped (Ray's tasks cancelled) on leaving, also on an error or Ctrl-C."""
    if check_jobs(jobs) == 1:
        yield None
        return
    if _RAY is not None:
        pool = _RayPool(_RAY, jobs)
        try:
            yield pool
        finally:
            pool.cancel()
        return
    pool = _LocalPool(jobs)
    try:
        yield pool
    finally:
        pool.stop()


def map_in_order(pool, fn, items: list, jobs: int):
    """``fn`` over ``items``, results in input order (an iterator): in ``pool`` (of
    ``jobs`` workers) when there is one, in small chunks so that the workers finish
    together."""
    if pool is None:
        return map(fn, items)
    chunk = max(1, min(16, len(items) // (jobs * 8)))
    return pool.imap(fn, items, chunksize=chunk)


@dataclass(frozen=True)
class Shared:
    """A handle to a value that :func:`shared` made readable by the workers of a pool:
    a file (local processes) or an object in Ray's store (every node reaches it)."""
    path: str | None = None
    ref: object = None


@contextmanager
def shared(pool, value):
    """A small :class:`Shared` handle to ``value`` for the jobs of ``pool`` (pickling a
    corpus of thousands of rules into every job cost more than the job), which
    :func:`fetch` turns back into the value in any worker; gone on leaving."""
    if isinstance(pool, _RayPool):
        yield Shared(ref=pool.ray.put(value))
        return
    with tempfile.TemporaryDirectory(prefix="taso-egg-shared-") as tmp:
        path = Path(tmp) / "value.pickle"
        path.write_bytes(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
        yield Shared(path=str(path))


def fetch(handle: Shared):
    if handle.ref is not None:
        import ray

        return ray.get(handle.ref)
    return pickle.loads(Path(handle.path).read_bytes())


# --- Ray -----------------------------------------------------------------------------

# What ``--ray`` takes besides a cluster's address (Ray's own words for them).
RAY_LOCAL, RAY_AUTO = "local", "auto"
# An address that does not answer makes ray.init retry for minutes: probe it first.
PROBE_SECONDS = 5.0
# A worker must answer the import probe within this (it starts a Python, imports us).
FIRST_TASK_SECONDS = 120.0


@contextmanager
def ray_workers(address: str | None, jobs: int):
    """While entered, :func:`worker_pool` hands out pools of Ray tasks: ``address``
    ``"local"`` starts a Ray instance of ``jobs`` CPUs for this run (stopped on
    leaving), ``"auto"`` joins the one running on this machine (``ray start --head``),
    ``HOST:PORT`` or ``ray://HOST:PORT`` a cluster's. None: local processes, as
    without it. Every node must have taso-egg installed (checked by a first task).
    :class:`~taso_egg.errors.WorkerError` when ray is missing, the address does not
    answer, or the workers cannot import taso-egg."""
    global _RAY
    if address is None:
        yield
        return
    if check_jobs(jobs) == 1:
        raise WorkerError("--ray with --jobs 1: one job runs in this process; give --jobs 2 or more")
    if _RAY is not None:
        raise WorkerError("a Ray session is already open in this process")
    ray = _connect(address, jobs)
    try:
        _check_workers(ray)
        _RAY = ray
        yield
    finally:
        _RAY = None
        ray.shutdown()


def _import_ray():
    try:
        import ray
    except ImportError:
        raise WorkerError("--ray needs the ray package: pip install 'taso-egg[ray]'") from None
    return ray


def _connect(address: str, jobs: int):
    ray = _import_ray()
    quiet = {"logging_level": logging.ERROR, "log_to_driver": True}
    if address == RAY_LOCAL:
        try:  # a small object store: jobs pass rules and results, never tensors
            ray.init(num_cpus=jobs, include_dashboard=False, object_store_memory=256 << 20, **quiet)
        except Exception as err:  # Ray raises bare RuntimeErrors and more for a failed start
            raise WorkerError(f"cannot start a local Ray instance: {_first_line(err)}") from None
        return ray
    if address != RAY_AUTO:
        _probe(address)
    try:
        ray.init(address=address, **quiet)
    except Exception as err:
        raise WorkerError(f"cannot join the Ray cluster at {address}: {_first_line(err)}") from None
    return ray


def _probe(address: str) -> None:
    """A TCP connection to ``address`` (``HOST:PORT`` or ``ray://HOST:PORT``), or a
    WorkerError saying why not."""
    parts = urlsplit(address if "://" in address else f"tcp://{address}")
    host = parts.hostname
    try:
        port = parts.port
    except ValueError:  # not a number
        port = None
    if not host or port is None:
        raise WorkerError(f"--ray {address!r}: give HOST:PORT, ray://HOST:PORT, {RAY_AUTO} or {RAY_LOCAL}")
    try:
        socket.create_connection((host, port), timeout=PROBE_SECONDS).close()
    except OSError as err:
        raise WorkerError(f"cannot reach the Ray cluster at {address}: {_first_line(err)}") from None


def _importable() -> str:
    import taso_egg.rules.workers as mod

    return mod.__name__


def _check_workers(ray) -> None:
    """One task that imports this module on a worker: a cluster whose nodes lack
    taso-egg fails here with one line, not inside the first batch."""
    ref = ray.remote(num_cpus=1)(_importable).remote()
    try:
        ray.get(ref, timeout=FIRST_TASK_SECONDS)
    except ray.exceptions.GetTimeoutError:
        ray.cancel(ref, force=True)
        raise WorkerError(f"no Ray worker ran a task within {FIRST_TASK_SECONDS:g} s (no free CPU "
                          f"in the cluster?)") from None
    except ray.exceptions.RayError as err:
        cause = getattr(err, "cause", None) or err
        raise WorkerError(f"the Ray workers cannot run taso-egg (install it on every node): "
                          f"{_first_line(cause)}") from None


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


class _LocalPool:
    """The part of a pool that :func:`map_in_order` uses, on local processes. A worker
    that dies (killed for memory, a crash in native code) fails the map with one line:
    multiprocessing's Pool replaced it and waited for its lost batch forever (a size-3
    generation hung so after the kernel killed a 20 GB derivation worker)."""

    def __init__(self, jobs: int):
        # spawn, not fork: the parent may hold Z3 and egglog threads, which a fork copies badly
        self.executor = ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"))

    def imap(self, fn, items, chunksize: int = 1):
        try:
            yield from self.executor.map(fn, items, chunksize=chunksize)
        except BrokenProcessPool:
            self.stop()
            raise WorkerError("a worker process died while it ran a job (killed for memory? the "
                              "kernel log says: dmesg)") from None

    def stop(self) -> None:
        """Cancel what has not started and stop the workers now, also mid-job (Ctrl-C)."""
        # the executor's own processes: shutdown alone lets running jobs finish first
        processes = list((getattr(self.executor, "_processes", None) or {}).values())
        self.executor.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            if process.is_alive():
                process.terminate()
        for process in processes:
            process.join()


def _run_chunk(fn, chunk: list) -> list:
    return [fn(item) for item in chunk]


class _RayPool:
    """The part of multiprocessing's Pool that :func:`map_in_order` uses, on Ray:
    chunks become tasks of one CPU each, ``2 * jobs`` in flight, their results handed
    back in submission order. A task's exception is raised here as itself (not as
    Ray's wrapper, whose message is a traceback)."""

    def __init__(self, ray, jobs: int):
        self.ray = ray
        self.jobs = jobs
        self.task = ray.remote(num_cpus=1)(_run_chunk)
        self.open: list[deque] = []  # the unfinished tasks of each map, for cancel

    def imap(self, fn, items, chunksize: int = 1):
        items = list(items)
        chunks = (items[lo:lo + chunksize] for lo in range(0, len(items), chunksize))
        fn_ref = self.ray.put(fn)  # pickled once, not once per chunk
        pending: deque = deque()
        self.open.append(pending)
        for chunk in chunks:
            pending.append(self.task.remote(fn_ref, chunk))
            if len(pending) >= 2 * self.jobs:
                yield from self._result(pending.popleft())
        while pending:
            yield from self._result(pending.popleft())
        self.open.remove(pending)

    def _result(self, ref) -> list:
        try:
            return self.ray.get(ref)
        except self.ray.exceptions.RayTaskError as err:
            self.cancel()
            cause = getattr(err, "cause", None)
            if isinstance(cause, Exception):
                raise cause from None
            raise WorkerError(f"a Ray task failed: {_first_line(err)}") from None
        except self.ray.exceptions.RayError as err:  # a worker or node died, ...
            self.cancel()
            raise WorkerError(f"a Ray task failed: {_first_line(err)}") from None

    def cancel(self) -> None:
        for pending in self.open:
            while pending:
                self.ray.cancel(pending.popleft(), force=True)


__all__ = ["default_jobs", "check_jobs", "worker_pool", "map_in_order", "Shared", "shared", "fetch",
           "ray_workers", "RAY_LOCAL", "RAY_AUTO"]
