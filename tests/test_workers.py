"""Local worker processes of the rule pipeline (rules/workers.py)."""

from __future__ import annotations

import os

import pytest

from taso_egg.rules import workers
from taso_egg.errors import RuleError, WorkerError


def test_local_workers_keep_order_pass_errors_and_fail_on_a_dead_worker():
    with workers.worker_pool(2) as pool:
        assert list(workers.map_in_order(pool, workers.check_jobs, list(range(1, 40)), 2)) == list(range(1, 40))
        with pytest.raises(RuleError, match=r"^jobs must be a positive integer, got 0$"):
            list(workers.map_in_order(pool, workers.check_jobs, [1, 2, 0, 3], 2))
    # a worker that dies (as one killed for memory does) ends the map, where a
    # multiprocessing Pool waited for its lost job forever
    with workers.worker_pool(2) as pool:
        with pytest.raises(WorkerError, match="a worker process died"):
            list(workers.map_in_order(pool, os._exit, [3, 3], 2))
