"""Proving one rule: the axioms encoded once, a Z3 solver under a time or resource
limit, the unsat core naming the axioms a proof used, and the float checks that
refute a rule or back a proof.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import z3

from taso_egg.errors import RuleError, TasoEggError, VerificationError

from ..ast import Rule
from ..corpus import load_rule_file
from ..instantiate import check_rule_numerically, check_rule_on_other_shapes
from .encode import _encode_axiom, _Encoder, _past_rank_zero, _Shape, _Unsupported, _var_sorts
from .shape_facts import _example_builds, _lhs_typing, _shape_axiom

AXIOM_FILE = Path(__file__).parent.parent / "axioms.rules"

STATUSES = ("proved", "refuted", "unknown", "unsupported")


@dataclass(frozen=True)
class ProofResult:
    rule: str                      # rule name
    status: str                    # one of STATUSES
    seconds: float
    axioms_used: tuple[str, ...]   # axioms in the unsat core (when proved)
    reason: str                    # why refuted/unknown/unsupported; "" when proved


def load_axioms() -> list[Rule]:
    """The axioms of ``rules/axioms.rules``."""
    return load_rule_file(AXIOM_FILE)


# --- proving -----------------------------------------------------------------------


class _AxiomSet:
    """Axioms encoded once (Z3's Python API makes encoding cost more than most proofs)."""

    def __init__(self, axioms):
        self.encoder = _Encoder()
        self.formulas: dict[str, z3.BoolRef] = {}
        for ax in axioms:
            try:
                self.formulas[ax.name] = z3.And(*_encode_axiom(self.encoder, ax))
            except _Unsupported as e:
                raise RuleError(f"{ax.where}: axiom cannot be encoded: {e}") from None
        self.trackers = {name: z3.Bool(f"axiom {name}") for name in self.formulas}
        self.shape_axioms: dict[tuple, z3.BoolRef] = {}

    def rule_encoder(self) -> _Encoder:
        enc = _Encoder()
        enc.funcs = dict(self.encoder.funcs)
        return enc

    def shapes_for(self, enc: _Encoder) -> list:
        for key, f in enc.funcs.items():
            if key not in self.shape_axioms:
                self.shape_axioms[key] = _shape_axiom(key, f)
        return [self.shape_axioms[k] for k in sorted(enc.funcs, key=str)
                if self.shape_axioms[k] is not None]


_AXIOM_SETS: dict[tuple, _AxiomSet] = {}


def _axiom_set(axioms) -> _AxiomSet:
    key = tuple(axioms)
    if key not in _AXIOM_SETS:
        if len(_AXIOM_SETS) >= 4:  # a few axiom lists at most (the file's, tests' subsets)
            _AXIOM_SETS.pop(next(iter(_AXIOM_SETS)))
        _AXIOM_SETS[key] = _AxiomSet(axioms)
    return _AXIOM_SETS[key]


# The float evidence of a rule the generator already checked on floats (its example and
# other shapes, or pinned to its example): the same checks with the same seeds.
FLOAT_CHECKED = "passed when the rule was generated"

# The generator's per-rule proof budget in Z3 resource units, in place of a wall-clock
# timeout: proofs of the shipped corpus use about 0.1 million, and 10 million is 2-9 s
# of a failing proof on this project's 2-core machine. Under it a proof's count depends
# on the rule alone (each runs in a fresh Z3 context), so two runs prove the same rules.
DEFAULT_RLIMIT = 10_000_000


# The check that a proof's hypotheses are consistent: the contradictions of the
# generator's batch-broadcasting matmuls showed within 0.11 million steps; consistent
# hypotheses keep E-matching the shape axioms up to the limit (0.3 million, about 0.1 s
# per proved rule), whatever limit the proof itself had.
CONSISTENCY_RLIMIT = 300_000
# Under a resource limit a proof also stops at this wall-clock time. Z3's resource count
# can stall: a generated division rule over a ones tensor of symbolic shape ran 25 min
# at rlimit 10 million (1.5 s at 1 million), while every proved rule of session 14's
# size-3 corpus took under 0.6 s and its 16,921 unknown ones 0.06 s on average. So
# only a stall meets this bound, and proofs do not depend on the machine's load.
RLIMIT_SAFETY_S = 5.0


def _solver(axset: _AxiomSet | None, facts: list, timeout_s: float, rlimit: int) -> z3.Solver:
    """A solver holding the axioms (tracked, for the unsat core; none without
    ``axset``) and ``facts``. Under an ``rlimit`` it works in a fresh Z3 context: the
    ids of the terms earlier proofs left in the process's context steer Z3's search,
    so a proof's outcome, resource count and unsat core would depend on which proofs
    its worker ran before."""
    ctx = z3.Context() if rlimit else None
    move = (lambda f: f.translate(ctx)) if ctx else (lambda f: f)
    solver = z3.Solver(ctx=ctx)
    if rlimit:
        solver.set("rlimit", rlimit)
        solver.set("timeout", int(RLIMIT_SAFETY_S * 1000))
    else:
        solver.set("timeout", max(1, int(timeout_s * 1000)))
    solver.set("smt.mbqi", False)
    for name, formula in (axset.formulas.items() if axset else ()):
        solver.assert_and_track(move(formula), move(axset.trackers[name]))
    solver.add(*[move(f) for f in facts])
    return solver


def prove_rule(rule: Rule, timeout_s: float = 10.0, axioms=None,
               float_checked: bool = False, rlimit: int = 0) -> ProofResult:
    """Prove ``rule`` (each ``lhs[i] = rhs[i]``) from ``axioms`` (default: the file's)
    within ``timeout_s`` seconds, or, when ``rlimit`` is positive, within that many Z3
    resource units instead (a bound that does not depend on the machine's load).
    A rule not proved is checked on floats for the reason (refuted on a disagreement),
    unless ``float_checked`` says it passed those checks already."""
    if rlimit < 0 or (not rlimit and not timeout_s > 0):
        raise RuleError(f"{rule.where}: proof limit must be positive, got "
                        f"{f'rlimit {rlimit}' if rlimit else f'timeout {timeout_s}'}")
    start = time.perf_counter()
    axset = _axiom_set(load_axioms() if axioms is None else axioms)

    def result(status, reason="", used=()):
        return ProofResult(rule.name, status, time.perf_counter() - start, tuple(used), reason)

    enc = axset.rule_encoder()
    facts = []
    try:
        env = {v: z3.Const(v, s) for v, s in _var_sorts(rule).items()}
        facts += [_past_rank_zero(_Shape(env[v])) for v in rule.tensor_vars()]
        for g in rule.guards:
            formula = enc.guard(g, env)
            if formula is not None:
                facts.append(formula)
        # Typing's requirements of the left side, where the example shows that they can
        # hold with the guards (else they might contradict them: a proof of nothing;
        # deciding that with Z3 costs more than most proofs).
        if _example_builds(rule):
            for pat in rule.lhs:
                facts += _lhs_typing(enc, pat, env)
        sides = [enc.term(l, env) == enc.term(r, env) for l, r in zip(rule.lhs, rule.rhs)]
    except _Unsupported as e:
        return result("unsupported", str(e))
    except (z3.Z3Exception, TypeError) as e:  # e.g. arithmetic on a vector parameter
        return result("unsupported", f"parameter expressions of mismatched kinds: {e}")
    hypotheses = facts + axset.shapes_for(enc)
    solver = _solver(axset, hypotheses + [z3.Not(z3.And(*sides))], timeout_s, rlimit)
    answer = solver.check()
    if answer == z3.unsat:
        # Hypotheses that contradict each other prove anything: such a rule is in no
        # shape case the e-graph holds (a batched matmul broadcasting its batch dims).
        if _solver(None, hypotheses, 0, CONSISTENCY_RLIMIT).check() == z3.unsat:
            return result("unknown", "no proof: its guards and what typing asks of its left side "
                                     "contradict each other (a proof of nothing)")
        core = {str(b) for b in solver.unsat_core()}
        return result("proved", used=[a for a, t in axset.trackers.items() if str(t) in core])
    reason = solver.reason_unknown()
    if answer == z3.sat or reason == "(incomplete quantifiers)":
        why = "no proof from the axioms (E-matching ran out of instances)"
    elif reason in ("timeout", "canceled"):
        if rlimit and time.perf_counter() - start >= RLIMIT_SAFETY_S:
            why = (f"no proof within the {RLIMIT_SAFETY_S:g} s that bound a proof under a resource limit "
                   f"(Z3's resource count stalled short of {rlimit:,})")
        else:
            why = (f"no proof within Z3's resource limit ({rlimit:,})" if rlimit
                   else f"no proof within the {timeout_s:g} s timeout")
    else:
        why = f"no proof from the axioms (Z3: {reason})"
    if float_checked:
        return result("unknown", f"{why}; float check: {FLOAT_CHECKED}")
    agrees, evidence = _float_evidence(rule)
    if agrees is False:
        return result("refuted", f"{why}; float counterexample: {evidence}")
    return result("unknown", f"{why}; float check: {evidence}")


def _float_evidence(rule: Rule, trials: int = 3, seed: int = 0) -> tuple[bool | None, str]:
    """Float agreement on the example and on ``trials`` other shapes: (True, what was
    checked), (False, the disagreement) or (None, why nothing could be checked)."""
    if not rule.example:
        return None, f"{rule.where}: no :example to vary"
    try:
        check_rule_numerically(rule, seed=seed)
        checked = check_rule_on_other_shapes(rule, trials, seed)
    except VerificationError as e:
        return False, str(e)
    except RuleError as e:  # the example itself violates a guard or does not type-check
        return None, str(e)
    if not checked:
        return None, (f"{rule.where}: no shape other than the example (dims in 1..4) "
                      f"satisfies the guards and type-checks")
    shapes = "; ".join(", ".join(f"?{k} {list(v)}" for k, v in c.items()) for c in checked)
    return True, f"agrees on the example and {len(checked)} other shape(s): {shapes}"


def prove_and_check(rule: Rule, timeout_s: float = 10.0, axioms=None,
                    float_checked: bool = False, rlimit: int = 0) -> ProofResult:
    """:func:`prove_rule`, then the float check a proof must also pass (on the example
    and on other shapes): a proved rule whose floats disagree is ``refuted``.
    ``float_checked``: the rule passed these float checks already (the generator's)."""
    res = prove_rule(rule, timeout_s, axioms, float_checked, rlimit)
    if res.status != "proved" or float_checked:
        return res
    try:
        check_rule_numerically(rule)
        check_rule_on_other_shapes(rule)
    except TasoEggError as err:
        return ProofResult(res.rule, "refuted", res.seconds, res.axioms_used,
                           f"proved from the axioms but the float check fails: {err}")
    return res


def float_check(rule: Rule, trials: int = 3, seed: int = 0) -> tuple[bool, str]:
    """True when both sides agree on random float data on the rule's :example and on
    up to ``trials`` other shapes (its dimension values re-mapped consistently into
    1..4; variants violating a guard or not type-checking are skipped). False, with
    the reason, on a disagreement or when no other shape could be checked."""
    agrees, why = _float_evidence(rule, trials, seed)
    return agrees is True, why


__all__ = ["ProofResult", "STATUSES", "DEFAULT_RLIMIT", "AXIOM_FILE", "load_axioms", "prove_rule",
           "prove_and_check", "float_check"]
