"""Proving many rules: in rule order, in worker processes where asked (each proof is
independent of the others), and a rule file rewritten with the proof records.
"""

from __future__ import annotations

from pathlib import Path

from taso_egg.errors import RuleError
from taso_egg.disk.files import write_atomically

from ..ast import Proof
from ..records import with_proof_records
from ..syntax import parse_rules
from ..workers import check_jobs, map_in_order, worker_pool
from .prover import ProofResult, load_axioms, prove_and_check


def _prove_in_worker(job: tuple) -> ProofResult:
    rule, timeout_s, float_checked, rlimit = job
    return prove_and_check(rule, timeout_s, None, float_checked, rlimit)  # axioms encoded once per worker


def verify_rules(rules, timeout_s: float = 10.0, progress=None, jobs: int = 1,
                 float_checked: bool = False, pool=None, rlimit: int = 0) -> list[ProofResult]:
    """:func:`prove_and_check` every rule (axioms loaded once per process), in rule
    order; ``progress(i, n, result)`` is called after each (``i`` counts from 0).
    ``jobs`` > 1 proves in that many worker processes (or in ``pool``, a
    :func:`~.workers.worker_pool` of ``jobs`` workers), with the same results: each
    proof is independent of the others."""
    rules = list(rules)
    check_jobs(jobs)
    if pool is None and jobs > 1 and len(rules) > 1:
        with worker_pool(min(jobs, len(rules))) as own:
            return verify_rules(rules, timeout_s, progress, jobs, float_checked, own, rlimit)
    if pool is None:
        axioms = load_axioms()
        results_iter = (prove_and_check(r, timeout_s, axioms, float_checked, rlimit) for r in rules)
    else:
        results_iter = map_in_order(pool, _prove_in_worker, [(r, timeout_s, float_checked, rlimit) for r in rules],
                                    jobs)
    results = []
    for i, res in enumerate(results_iter):
        results.append(res)
        if progress is not None:
            progress(i, len(rules), res)
    return results


def verify_file(path, timeout_s: float = 10.0, progress=None, jobs: int = 1) -> list:
    """Prove every rule of ``path`` (in ``jobs`` processes), float-check the proved
    ones, and rewrite the file with the records, all at once at the end (an
    interrupted run leaves the file as it was). Returns ``[(rule, Proof)]``."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    rules = parse_rules(text, str(path))
    results = verify_rules(rules, timeout_s, progress=progress, jobs=jobs)
    proofs, out = {}, []
    for rule, res in zip(rules, results):
        found_by = rule.proof.found_by if rule.proof and rule.proof.found_by else "hand"
        proof = Proof(res.status, found_by, tuple(res.axioms_used), round(res.seconds, 4), res.reason)
        proofs[rule.name] = proof
        out.append((rule, proof))
    write_atomically(path, lambda tmp: Path(tmp).write_text(with_proof_records(text, proofs, str(path)),
                                                            encoding="utf-8"), RuleError)
    return out


__all__ = ["verify_rules", "verify_file"]
