"""The generator's pipeline: enumerate, prune, then level by level drop what smaller
proved rules derive, check the rest on floats, and prove them (``generate_rules``)."""

from __future__ import annotations

import gc
import sys
import time
from collections import Counter
from contextlib import contextmanager

from taso_egg.errors import RuleError, TasoEggError

from ..rules.lang import Proof, Rule, load_corpus
from ..rules.verify import STATUSES, verify_rules
from ..rules.workers import map_in_order, worker_pool
from .derive import check_derivable
from .enumerate import MENUS, enumerate_terms
from .prune import generalize_or_pin, pinned_to_example, prune, sized_rules


def _bar(total: int, desc: str):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, file=sys.stderr, leave=False, dynamic_ncols=True)


def generate_rules(size: int = 3, menu=None, seed: int = 0, progress_bars: bool = False,
                   timeout_s: float = 5.0, jobs: int = 1, base=None):
    """Enumerate, prune, and emit rules one level at a time (by size, then by number
    of input variables, most first). A level's candidate rules that follow from
    ``base`` (default: the proved hand rules) and the rules proved at the levels before
    are dropped as ``derivable`` (:mod:`.derive`); the rest pass the float check on
    their example (and are pinned to it where they do not generalize), then Z3 with
    ``timeout_s`` per rule, and the proved ones join the
    derivation corpus of the next level. Derivation, checks and proofs run in ``jobs``
    processes. Returns ``(rules, stats)``; every rule
    carries its proof record. Derivable rules are not emitted: saturation derives
    them from the emitted ones."""
    if menu is None:
        menu = MENUS["taso" if size <= 3 else "reduced"]()
    elif isinstance(menu, str):
        if menu not in MENUS:
            raise TasoEggError(f"unknown menu {menu!r}; choose from {', '.join(MENUS)}")
        menu = MENUS[menu]()
    start = time.perf_counter()
    with _cycle_collector_paused():
        bar = _bar(size * len(menu.ops), f"enumerating size {size}") if progress_bars else None
        e = enumerate_terms(menu, size, seed,
                            progress=(lambda d, n: bar.update(d - bar.n)) if bar else None)
        if bar:
            bar.close()
        bar = _bar(len([c for c in e.classes.values() if len(c) > 1]), "pruning") if progress_bars else None
        pruned = prune(e, progress=(lambda d, n: bar.update(d - bar.n)) if bar else None)
        if bar:
            bar.close()
        # Levels: by size, then most variables first. A candidate that reuses an input is a
        # special case of the same-size rule with distinct inputs, proved one level before.
        by_level: dict[tuple, list] = {}
        for k, rule in sized_rules(e, pruned, f"gen{size}"):
            by_level.setdefault((k, -len(rule.tensor_vars())), []).append(rule)
    enumeration_stats = dict(e.stats)
    del e  # the terms and their values (gigabytes at size 4) are done with
    found_by = f"generator-{size}"
    known = list(load_corpus(["taso_hand"]) if base is None else base)
    emitted, failed, levels = [], [], []
    proving_seconds = 0.0
    with worker_pool(jobs) as pool:
        for k, minus_vars in sorted(by_level):
            rules, level, seconds = _generate_level(by_level[k, minus_vars], known, found_by, timeout_s,
                                                    (pool, jobs), progress_bars, failed)
            proving_seconds += seconds
            emitted += rules
            known += [r for r in rules if r.proved]
            levels.append({"size": k, "variables": -minus_vars, **level})
    counts = Counter(r.proof.status for r in emitted)
    stats = enumeration_stats
    stats.update({
        "candidates": pruned.candidates, "multi_candidates": pruned.multi_candidates,
        "pruned": {**pruned.dropped, "derivable": sum(lv["derivable"] for lv in levels)},
        "kept_candidates": len(pruned.kept),
        "candidate_rules": sum(lv["candidate_rules"] for lv in levels),
        "rules_emitted": len(emitted), "multi_rules": sum(r.multi for r in emitted),
        "shapes_pinned": sum(lv["pinned"] for lv in levels), "failed_example_check": len(failed),
        "failed_example_check_first": failed[:5], "pruning_seconds": pruned.seconds,
        "derivation_seconds": round(sum(lv["derivation_seconds"] for lv in levels), 3),
        "levels": levels,
        "generation_seconds": round(time.perf_counter() - start - proving_seconds, 3),
        "verification": {"rules": len(emitted), **{s: counts.get(s, 0) for s in STATUSES},
                         "timeout_s": timeout_s, "jobs": jobs, "seconds": round(proving_seconds, 2)},
    })
    return emitted, stats


@contextmanager
def _cycle_collector_paused():
    """Enumeration and pruning build about a million long-lived objects without cycles;
    Python's cycle collector would walk them again and again as they grow (a third of
    the enumeration's time). Paused meanwhile, it runs again afterwards."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _generate_level(candidates, known, found_by, timeout_s, workers, progress_bars, failed):
    """One size level of :func:`generate_rules`: derivability, numeric check, proof,
    each spread over ``workers`` (a worker pool or None, and its size). Returns
    ``(rules, stats, seconds proving)``; numeric failures go to ``failed``."""
    pool, jobs = workers
    bar = _bar(len(candidates), "derivable?") if progress_bars else None
    derivation = check_derivable(candidates, known, pool=pool, jobs=jobs,
                                 progress=(lambda d, n: bar.update(d - bar.n)) if bar else None)
    if bar:
        bar.close()
    start = time.perf_counter()
    checked, derivable, pinned = [], sum(derivation.derived), 0
    todo = [(r, ex) for r, d, ex in zip(candidates, derivation.derived, derivation.example_only) if not d]
    bar = _bar(len(todo), "checking on other shapes") if progress_bars else None
    for (r, example_only), (g, error) in zip(todo, map_in_order(pool, _generalize, [r for r, _ in todo], jobs)):
        if bar:
            bar.update()
        if g is None:  # both draws agreed, yet the float32 example does not
            failed.append(f"{r.lhs[0]} => {r.rhs[0]}: {error}")
            continue
        if g.guards != r.guards:
            if example_only and pinned_to_example(g):  # where smaller rules derive it
                derivable += 1
                continue
            pinned += 1
        checked.append(g)
    if bar:
        bar.close()
    check_seconds = time.perf_counter() - start
    start = time.perf_counter()
    bar = _bar(len(checked), f"proving ({jobs} jobs)") if progress_bars else None
    results = verify_rules(checked, timeout_s, progress=(lambda i, n, res: bar.update()) if bar else None,
                           jobs=jobs, float_checked=True, pool=pool)  # _generalize ran the float checks
    if bar:
        bar.close()
    rules = [_with_proof(r, Proof(res.status, found_by, tuple(res.axioms_used), round(res.seconds, 4),
                                  res.reason)) for r, res in zip(checked, results)]
    proving_seconds = time.perf_counter() - start
    return rules, {"candidate_rules": len(candidates), "derivable": derivable,
                   "derivation_seconds": derivation.seconds, "derivation_stops": derivation.stop_reasons,
                   "pinned": pinned, "emitted": len(rules), "proved": sum(r.proved for r in rules),
                   "check_seconds": round(check_seconds, 3),
                   "proving_seconds": round(proving_seconds, 3)}, proving_seconds


def _generalize(rule: Rule) -> tuple[Rule | None, str]:
    """:func:`~.prune.generalize_or_pin` for a worker: ``(rule, "")``, or ``(None, why)``
    when the rule fails on its own example."""
    try:
        return generalize_or_pin(rule), ""
    except RuleError as err:
        return None, str(err)


def _with_proof(rule: Rule, proof: Proof) -> Rule:
    return Rule(rule.name, rule.lhs, rule.rhs, rule.guards, rule.example, rule.doc, rule.source,
                rule.multi, proof)
