"""The generator's pipeline: enumerate, prune, then level by level drop what smaller
proved rules derive, check the rest on floats, and prove them (``generate_rules``)."""

from __future__ import annotations

import gc
import sys
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import replace

from taso_egg.errors import RuleError, TasoEggError

from ..rules.ast import Proof, Rule
from ..rules.corpus import load_corpus
from ..rules.prove.driver import verify_rules
from ..rules.prove.prover import DEFAULT_RLIMIT, STATUSES
from ..rules.workers import map_in_order, worker_pool
from .derive import DEFAULT_LIMITS as DERIVATION_LIMITS, check_derivable
from .emit import generalize_or_pin, pinned_to_example, sized_rules
from .enumerate import MENUS, enumerate_terms
from .prune import prune


def _bar(total: int, desc: str):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, file=sys.stderr, leave=False, dynamic_ncols=True)


def generate_rules(size: int = 3, menu=None, seed: int = 0, progress_bars: bool = False,
                   rlimit: int = DEFAULT_RLIMIT, jobs: int = 1, base=None):
    """Enumerate, prune, and emit rules one level at a time (by size, then by number
    of input variables, most first). A level's candidate rules that follow from
    ``base`` (default: the proved hand rules) and the rules proved at the levels before
    are dropped as ``derivable`` (:mod:`.derive`); the rest pass the float check on
    their example (and are pinned to it where they do not generalize), then Z3 with
    ``rlimit`` resource units per rule, and the proved ones join the
    derivation corpus of the next level. Derivation, checks and proofs run in ``jobs``
    processes. No step stops at a wall-clock limit (derivation is bounded by e-nodes and
    iterations, proofs by ``rlimit``), so a run's rules do not depend on the machine's
    load or on where its workers run. Returns ``(rules, stats)``; every rule
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
            rules, level, seconds = _generate_level(by_level[k, minus_vars], known, found_by, rlimit,
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
                         "rlimit": rlimit, "jobs": jobs, "seconds": round(proving_seconds, 2)},
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


# A merge candidate alone: the batches' limits, with the multi-pattern rules on.
MERGE_LIMITS = replace(DERIVATION_LIMITS, multi_iterations=2)


def _derive_merges_alone(candidates, known, derivation, pool, jobs) -> None:
    """The two-output candidates (merges) that the batches left underived, each saturated
    alone with the multi-pattern rules on: the batches keep those off (the constants
    every candidate shares pair them up across candidates), so a generated merge that a
    hand merge implies (``x.w0, x.w1`` as one matmul of ``concat(w0, w1)``, for one
    activation) came out again and doubled that merge's matches in every saturation.
    Updates ``derivation`` in place."""
    merges = [k for k, r in enumerate(candidates) if r.multi and not derivation.derived[k]]
    if not merges:
        return
    alone = check_derivable([candidates[k] for k in merges], known, limits=MERGE_LIMITS, batch=1, pool=pool,
                            jobs=jobs)
    for k, derived, example_only in zip(merges, alone.derived, alone.example_only):
        derivation.derived[k] = derived
        derivation.example_only[k] = example_only
    derivation.seconds = round(derivation.seconds + alone.seconds, 3)


def _generate_level(candidates, known, found_by, rlimit, workers, progress_bars, failed):
    """One size level of :func:`generate_rules`: derivability, numeric check, proof,
    each spread over ``workers`` (a worker pool or None, and its size). Returns
    ``(rules, stats, seconds proving)``; numeric failures go to ``failed``.

    A candidate emitted in both orientations (sides of one size) is one equation: each
    orientation is derived on its own (saturation applies a rule in one direction),
    and the checks and proof run once for the equation, on its first orientation; a
    reverse takes their outcome (the same pins, the same proof record)."""
    pool, jobs = workers
    first = _first_orientations(candidates)
    work = [candidates[i] for i in sorted(set(first))]
    position = {i: k for k, i in enumerate(sorted(set(first)))}
    bar = _bar(len(candidates), "derivable?") if progress_bars else None
    derivation = check_derivable(candidates, known, pool=pool, jobs=jobs,
                                 progress=(lambda d, n: bar.update(d - bar.n)) if bar else None)
    if bar:
        bar.close()
    _derive_merges_alone(candidates, known, derivation, pool, jobs)
    start = time.perf_counter()
    derived = derivation.derived
    # an equation is checked and proved on its first orientation when any of its
    # orientations is left to emit
    todo = sorted({position[first[i]] for i in range(len(candidates)) if not derived[i]})
    bar = _bar(len(todo), "checking on other shapes") if progress_bars else None
    general = {}
    for k, (g, error) in zip(todo, map_in_order(pool, _generalize, [work[k] for k in todo], jobs)):
        if bar:
            bar.update()
        general[k] = (g, error)
    if bar:
        bar.close()
    check_seconds = time.perf_counter() - start
    checked, derivable, pinned = [], sum(derived), 0
    for i, r in enumerate(candidates):
        if derived[i]:
            continue
        k = position[first[i]]
        g, error = general[k]
        if g is None:  # both draws agreed, yet the float32 example does not
            failed.append(f"{r.lhs[0]} => {r.rhs[0]}: {error}")
            continue
        if first[i] != i:  # the reverse: the same pins, on the same example (its own guards are
            # the same equations, perhaps in other words; the example may list its sizes otherwise)
            g = _reversed_like(r, g, work[k])
        if g.guards != r.guards:
            if derivation.example_only[i] and pinned_to_example(g):  # where smaller rules derive it
                derivable += 1
                continue
            pinned += 1
        checked.append((k, g))
    start = time.perf_counter()
    to_prove = list(dict.fromkeys(k for k, _ in checked))
    proving = {k: g for k, g in reversed(checked)}  # the first orientation's rule
    bar = _bar(len(to_prove), f"proving ({jobs} jobs)") if progress_bars else None
    results = verify_rules([proving[k] for k in to_prove], progress=(lambda i, n, res: bar.update()) if bar else None,
                           jobs=jobs, float_checked=True, pool=pool, rlimit=rlimit)  # _generalize ran the float checks
    if bar:
        bar.close()
    result = dict(zip(to_prove, results))
    rules = [_with_proof(g, Proof(result[k].status, found_by, tuple(result[k].axioms_used),
                                  round(result[k].seconds, 4), result[k].reason)) for k, g in checked]
    proving_seconds = time.perf_counter() - start
    return rules, {"candidate_rules": len(candidates), "equations": len(work), "derivable": derivable,
                   "derivation_seconds": derivation.seconds, "derivation_stops": derivation.stop_reasons,
                   "pinned": pinned, "emitted": len(rules), "proved": sum(r.proved for r in rules),
                   "check_seconds": round(check_seconds, 3),
                   "proving_seconds": round(proving_seconds, 3)}, proving_seconds


def _first_orientations(candidates) -> list:
    """For each candidate, the index of the first candidate stating its equation: itself,
    or the earlier one with the sides swapped."""
    seen: dict = {}
    out = []
    for i, r in enumerate(candidates):
        j = seen.get((r.rhs, r.lhs))
        out.append(i if j is None else j)
        seen.setdefault((r.lhs, r.rhs), i)
    return out


def _reversed_like(rule: Rule, checked: Rule, first: Rule) -> Rule:
    """``rule``, the reverse of ``first``, with the pins ``checked`` (``first`` after its
    checks) added to ``first``'s guards, and ``checked``'s example."""
    pins = tuple(x for x in checked.guards if x not in first.guards)
    return Rule(rule.name, rule.lhs, rule.rhs, rule.guards + pins, checked.example, rule.doc, rule.source,
                rule.multi, rule.proof)


def _generalize(rule: Rule) -> tuple[Rule | None, str]:
    """:func:`~.emit.generalize_or_pin` for a worker: ``(rule, "")``, or ``(None, why)``
    when the rule fails on its own example."""
    try:
        return generalize_or_pin(rule), ""
    except RuleError as err:
        return None, str(err)


def _with_proof(rule: Rule, proof: Proof) -> Rule:
    return Rule(rule.name, rule.lhs, rule.rhs, rule.guards, rule.example, rule.doc, rule.source,
                rule.multi, proof)
