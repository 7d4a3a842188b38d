"""Bounded equality saturation: one egglog iteration at a time, limits checked after
every iteration, statistics kept for the notebooks.

The node limit is checked between iterations, and one iteration can multiply the
e-graph (60 matmuls of one input: 9,210 e-nodes after iteration 1, 2.8 million after
iteration 2), so the e-graph also has a ceiling (:attr:`Limits.ceiling`, twice the
limit) that no step of an iteration (its rewrites, then its multi-pattern rules) may
pass, checked before the step from counts of what it can add (see :func:`_step`). A
step that fits runs as it always did; one that does not applies only the rules whose
matches fit, and saturation stops after it with the node limit as its reason.
Analyses and unions never add e-nodes.

A rule is compiled into egglog only before the first step whose e-graph could match
it (``admit.Admission``), which gives the same matches as compiling the corpus up front.

The time limit holds within an iteration too: egglog cannot stop a run once started,
so no step starts (its rules' admission, probe and run, with the analyses after it)
that :class:`_Pace` predicts would end past the deadline, and no run after a probe;
the analyses of what was applied always run.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from itertools import count

from ..errors import ExtractionError
from ..graph import Graph
from ..options import Limits
from ..rules.ast import App, Proj
from .admit import Admission, present_ops
from .bindings import bindings
from .convert import GraphProgram, TensorEGraph, add_fused_convs, graph_to_program, read_serialized
from .language import (MULTI, REWRITES, SELECT, STEPS, Ruleset, base_declarations, constructor, declarations,
                       probe_name, probed_rule, ruleset_of)
from .rule_compiler import compile_match_recorder, compile_probe, compile_rules

# Functions that are analyses, not e-nodes of the tensor language.
_ANALYSES = {"shape", "dtype", "wlo", "whi", "pending"}


@dataclass
class IterationStats:
    iteration: int
    enodes: int
    eclasses: int
    seconds: float
    matches: dict[str, int]
    multi: bool
    # rules whose new matches (their count here) the iteration did not apply, as they
    # could have taken the e-graph past the ceiling; saturation stops after it
    held_back: dict[str, int] = field(default_factory=dict)
    # multi-pattern rules (their new match counts) this iteration held back under
    # Limits.multi_growth; saturation went on
    deferred: dict[str, int] = field(default_factory=dict)


@dataclass
class Saturation:
    """The saturated e-graph of a graph, with how it got there."""
    graph: Graph
    egraph: object                  # egglog.bindings.EGraph
    program: GraphProgram
    stop_reason: str
    iterations: list[IterationStats] = field(default_factory=list)
    seconds: float = 0.0
    cpu_seconds: float = 0.0        # this process's CPU time over the same span
    rules: tuple = ()
    initial: IterationStats | None = None  # the e-graph before any rewrite ("iteration 0")
    admission: Admission | None = None     # which rules were compiled (``admission.compiled``)
    _decoded: TensorEGraph | None = field(default=None, repr=False)

    def serialized(self) -> dict:
        """The e-graph in egraph-serialize JSON form (analysis rows included)."""
        return _serialized(self.egraph, self.program)

    def tensor_egraph(self) -> TensorEGraph:
        """The final e-graph, decoded (once: it no longer changes), with the fused
        convs the graph builder writes as e-nodes of their own (``add_fused_convs``)."""
        if self._decoded is None:
            self._decoded = add_fused_convs(read_serialized(self.serialized()))
        return self._decoded

    def eclasses(self) -> int:
        """E-classes of tensor sorts (T, TTup) in the final e-graph, counted on the
        decoded e-graph that extraction reads anyway."""
        return sum(1 for nodes in self.tensor_egraph().classes.values() if nodes[0].op not in ("tnil", "tcons"))

    @property
    def enodes(self) -> int:
        return self.iterations[-1].enodes if self.iterations else 0


def _serialized(egraph, program) -> dict:
    eb = bindings()
    span = eb.PanicSpan()
    return json.loads(egraph.serialize([eb.Var(span, v) for v in program.output_vars]).to_json())


def _table_sizes(egraph) -> dict[str, int]:
    """Rows of each egglog function (constructors and analyses)."""
    out = egraph.parse_and_run_program("(print-size)")
    return dict(next(o for o in out if isinstance(o, bindings().PrintAllFunctionsSize)).sizes)


def _sizes(egraph) -> int:
    return sum(n for name, n in _table_sizes(egraph).items() if name not in _ANALYSES)


def _eclasses(egraph, program) -> int:
    eb = bindings()
    data = json.loads(egraph.serialize([eb.Var(eb.PanicSpan(), program.output_vars[0])]).to_json())
    sorts = {cid: info.get("type") for cid, info in data.get("class_data", {}).items()}
    return sum(1 for s in sorts.values() if s in ("T", "TTup"))


def _run(egraph, schedule: str):
    out = egraph.parse_and_run_program(f"(run-schedule {schedule})")
    return next(o.report for o in out if isinstance(o, bindings().RunScheduleOutput))


def built_terms(rule) -> list:
    """The distinct operator applications (projections included) of ``rule``'s
    right-hand sides, innermost first. Applying one match of the rule adds at most one
    e-node for each (a new row of its constructor's table), and none for those the
    e-graph already has; equal subterms are one e-node."""
    seen: list = []

    def walk(p):
        if isinstance(p, (App, Proj)) and p not in seen:
            for q in [p.pattern] if isinstance(p, Proj) else p.inputs:
                walk(q)
            seen.append(p)

    for p in rule.rhs:
        walk(p)
    return seen


class _PerMatch(dict):
    """Rule name -> the e-nodes one match can add (len of :func:`built_terms`), computed
    for the rules that come to match only."""

    def __init__(self, by_name: dict):
        super().__init__()
        self.by_name = by_name

    def __missing__(self, name: str) -> int:
        n = self[name] = len(built_terms(self.by_name[name]))
        return n


_recounts = count()     # recount rulesets and relations are named apart, for e-graphs that outlive a saturation


_PROBE_RULESETS = "".join(r.probes.declare() + "\n" for r in STEPS)
# Runs of the select ruleset per iteration at most: each moves every select one operator
# up, and a 12-layer transformer's last layer is about 30 operators from its head.
SELECT_RUNS = 64


def _probes(rules) -> str:
    return (_PROBE_RULESETS + "\n".join(
        compile_probe(r, ruleset_of(r).probes, probe_name(r.name)) for r in rules) + "\n")


def _cutoff(counts: dict[str, int], worst: dict[str, int], room: int) -> int:
    """The largest match count T such that the rules with at most T matches, applied
    in full, add at most ``room`` e-nodes at worst (``worst[rule]``); 0 when even the
    rules with the fewest matches could add more."""
    by_count: dict[int, int] = {}
    for rule, n in counts.items():
        by_count[n] = by_count.get(n, 0) + worst[rule]
    total, cutoff = 0, 0
    for n in sorted(by_count):
        total += by_count[n]
        if total > room:
            return cutoff
        cutoff = n
    return cutoff


@dataclass
class _Step:
    matches: dict[str, int]             # applied, per rule
    updated: bool
    held_back: dict[str, int] = field(default_factory=dict)  # counted, not applied
    worst: int = 0                      # the most e-nodes all the counted matches could add
    timed_out: bool = False             # the deadline passed, or would have, before the rules were applied
    probe_seconds: float = 0.0          # the probe's egglog run
    rule_seconds: dict[str, float] = field(default_factory=dict)  # each rule's search in it, as egglog timed it


class _Pace:
    """The deadline, and the seconds of saturation's next pieces of work predicted
    from the same pieces timed earlier in this saturation (on this machine, under its
    present load), so that work that would end past the deadline is not started:
    egglog cannot stop a run, and its scheduler's match limit bans a rule only after
    its search. One multi-pattern probe can take seconds (30 MatMuls of one input:
    0.01 s in iteration 1, 1 to 2.5 s in iteration 2, loaded).

    - Each kind of work (a ruleset's admission, its probe, an iteration's tail: the
      analyses, the counts) is predicted from its last, scaled linearly by the growth
      of its size since: the e-graph's e-nodes, but for each rule's search within a
      probe (egglog times it) the matches its patterns could join
      (:func:`_join_bound`): the MatMuls' merge search grew 100- to 230-fold for 26
      times the e-nodes. A kind not yet timed is not predicted (a rule's first
      search, for one); the initial e-graph's analyses and counts time the tail.
    - The rest of a step (a recount, the rules' own run) searches the probe's matches
      again and applies them: predicted as its probe's seconds times the largest
      ratio seen in a step whose probe took long enough to time (``TIMED``), and
      never less than ``FOLLOW``.
    - Nothing that applies rules starts unless the tail after it fits too (the
      analyses of what was applied always run)."""

    FOLLOW = 2.0   # the rest of a step against its probe, measured: 1.9 to 2.5 for the runs
    TIMED = 0.01   # seconds below which a probe's ratio is noise
    # Sizes up to which a timing is mostly fixed cost, so it is scaled from no less: the
    # initial analyses and counts of 120 e-nodes (0.05-0.1 s, loaded) scaled to 4,585
    # predicted 2-4 s for what took 0.2-0.4 s.
    FIXED = 1_000

    def __init__(self, deadline: float = math.inf):
        self.deadline = deadline
        self.last: dict[str, tuple[int, float]] = {}  # kind -> (size, seconds) when last timed
        self.follow = self.FOLLOW

    def allows(self, seconds: float) -> bool:
        """Whether work predicted to take ``seconds`` ends by the deadline."""
        return time.perf_counter() + seconds <= self.deadline

    def predict(self, kind: str, size: int) -> float:
        if kind not in self.last:
            return 0.0
        then, seconds = self.last[kind]
        return seconds * max(1.0, size / max(then, self.FIXED))

    def step_seconds(self, ruleset: str, enodes: int, bounds: dict[str, int]) -> float:
        """A whole step of the ruleset named ``ruleset`` (``bounds``: its rules' join bounds now) and the
        iteration's tail after it."""
        probe = self.predict(f"probe {ruleset}", enodes) + sum(
            self.predict(f"rule {rule}", n) for rule, n in bounds.items())
        return (self.predict(f"admit {ruleset}", enodes) + probe + self.rest_seconds(probe)
                + self.predict("tail", enodes))

    def rest_seconds(self, probe_seconds: float) -> float:
        return probe_seconds * self.follow

    def timed(self, kind: str, size: int, seconds: float) -> None:
        self.last[kind] = (size, seconds)

    def timed_rest(self, probe_seconds: float, seconds: float) -> None:
        if probe_seconds >= self.TIMED:
            self.follow = max(self.follow, seconds / probe_seconds)


def _join_bound(rule, sizes: dict[str, int]) -> int:
    """The most matches ``rule``'s left side could have: the product of the rows of
    each pattern's operator (``sizes``: egglog's table sizes)."""
    pairs = 1
    for pattern in rule.lhs:
        pairs *= sizes.get(constructor((pattern.pattern if isinstance(pattern, Proj) else pattern).op), 0) \
            if isinstance(pattern, (App, Proj)) else sum(sizes.values())
    return pairs


def _step(egraph, ruleset: Ruleset, rules: dict, per_match: dict[str, int], room: int,
          pace: _Pace | None = None, enodes: int = 0) -> _Step:
    """Run ``ruleset`` once if that cannot add more than ``room`` e-nodes, else only
    the rules with the fewest matches that fit (then ``held_back`` names the others).

    1. The probes count each rule's new matches (the rule's own query, run just
       before it, sees the same new facts); each match adds at most one e-node per
       term it builds (:func:`built_terms`).
    2. Where that could pass ``room``, a recount (:func:`_recount`) counts every match
       of each rule, old ones too, and for each term it builds the matches that lack
       it: they bound what the step adds.
    3. Where that could still pass ``room``, a fresh back-off scheduler (its queries
       are new too, and count as the recount's) applies every match of the rules
       with at most a cut-off's matches and none of the others'. The cut-off is the
       largest whose rules fit.

    No egglog run starts that ``pace`` predicts would end past its deadline, with
    the iteration's tail after it (at the e-nodes the step could reach from
    ``enodes``): then nothing more runs and nothing is applied (``timed_out``)."""
    pace = pace or _Pace()
    started = time.perf_counter()
    probe = _run(egraph, ruleset.probes.run())
    probed = time.perf_counter()
    probe_seconds = probed - started
    counts = {probed_rule(name): n for name, n in probe.num_matches_per_rule.items() if n}
    searched = {probed_rule(name): t.total_seconds() for name, t in probe.search_and_apply_time_per_rule.items()}
    reach = enodes + min(max(room, 0), sum(n * per_match[r] for r, n in counts.items()))
    rest = pace.rest_seconds(probe_seconds) + pace.predict("tail", reach)

    def timed(step: _Step) -> _Step:
        pace.timed_rest(probe_seconds, time.perf_counter() - probed)
        step.probe_seconds, step.rule_seconds = probe_seconds, searched
        return step

    if not pace.allows(rest):
        return _Step({}, False, timed_out=True, probe_seconds=probe_seconds, rule_seconds=searched)
    if sum(n * per_match[r] for r, n in counts.items()) <= max(room, 0):
        report = _run(egraph, ruleset.run())
        return timed(_Step({k: v for k, v in report.num_matches_per_rule.items() if v}, report.updated))

    every, worst = _recount(egraph, [r for r in counts if per_match[r]], rules, per_match)
    if not pace.allows(rest):
        return _Step({}, False, timed_out=True, probe_seconds=probe_seconds, rule_seconds=searched)
    total = sum(worst.values())
    if total <= max(room, 0):
        report = _run(egraph, ruleset.run())
        return timed(_Step({k: v for k, v in report.num_matches_per_rule.items() if v}, report.updated))

    cutoff = _cutoff(every, worst, room)
    held = {r: counts[r] for r in every if every[r] > cutoff}
    if len(held) == len(every):
        return _Step({}, False, held, total, probe_seconds=probe_seconds, rule_seconds=searched)
    report = _run(egraph, ruleset.run_with(f"(back-off :match-limit {cutoff})"))
    applied = {k: v for k, v in report.num_matches_per_rule.items() if v}
    if any(every[r] > cutoff for r in applied if r in every):
        raise RuntimeError(f"saturation applied a rule it held back: {sorted(set(applied) & set(held))}")
    return timed(_Step({r: counts[r] for r in applied if r in counts}, report.updated, held, total))


def _recount(egraph, growing: list, rules: dict, per_match: dict) -> tuple[dict, dict]:
    """``({rule: its matches}, {rule: the most e-nodes they can add})`` for the
    ``growing`` rules, counted by rules compiled now (a rule that has never run sees
    every match, old ones too) between ``(push)`` and ``(pop)``, which leave the e-graph
    as it was. Matches are recorded as rows of the variables the built terms read
    (:func:`~.rule_compiler.compile_match_recorder`); an old match's terms are all
    present (it was applied), so the rows lacking a term bound what the new ones add.
    A rule that cannot be recorded so counts every match as lacking every term."""
    tag = f"recount{next(_recounts)}"
    counting, present = Ruleset(tag), Ruleset(f"{tag}-present")  # as compile_match_recorder names them
    relations = {r: f"{tag}-{i}" for i, r in enumerate(growing)}
    programs = {r: compile_match_recorder(rules[r], built_terms(rules[r]), counting, relations[r]) for r in growing}
    egraph.parse_and_run_program("(push)")
    try:
        egraph.parse_and_run_program(f"{counting.declare()}\n{present.declare()}\n" + "\n".join(
            text or compile_probe(rules[r], counting, relations[r]) for r, text in programs.items()) + "\n")
        found = _run(egraph, counting.run()).num_matches_per_rule
        _run(egraph, present.run())
        rows = _table_sizes(egraph)
    finally:
        egraph.parse_and_run_program("(pop)")
    every = {r: found.get(relations[r], 0) for r in growing}
    worst = {}
    for r in growing:
        if programs[r] is None:
            worst[r] = every[r] * per_match[r]
        else:
            recorded = rows.get(relations[r], 0)
            worst[r] = sum(recorded - rows.get(f"{relations[r]}-{i}", 0) for i in range(per_match[r]))
    return every, worst


def rules_egraph(rules):
    """An egglog e-graph holding the tensor language and ``rules`` (with their probes),
    and no terms yet. :func:`saturate` compiles only the rules that can match as it
    goes (``admit.Admission``); callers that saturate many graphs with one corpus can
    instead compile it once here and reuse it, between egglog's ``(push)`` and ``(pop)``."""
    egraph = bindings().EGraph(num_threads=1)
    egraph.parse_and_run_program(declarations() + compile_rules(rules) + _probes(rules))
    return egraph


def saturate(graph: Graph, rules=None, limits: Limits | None = None, progress=None,
             count_classes: bool = True, egraph=None) -> Saturation:
    """Build the e-graph of ``graph`` and apply ``rules`` (parsed Rule objects;
    default: the proved corpus) until saturation or a limit. ``progress`` is called
    with each IterationStats. ``egraph``: a :func:`rules_egraph` of ``rules`` to add
    the graph to (the caller pushes and pops around it).

    The e-graph never grows past ``limits.ceiling`` e-nodes: an iteration whose
    matches could take it there applies only the rules that fit, and is the last."""
    from ..rules.corpus import load_corpus

    limits = limits or Limits()
    rules = tuple(load_corpus() if rules is None else rules)
    start, cpu_start = time.perf_counter(), time.process_time()
    pace = _Pace(start + limits.seconds)  # no egglog run starts that it predicts would end past this
    program = graph_to_program(graph)
    given = egraph is not None
    if not given:
        egraph = bindings().EGraph(num_threads=1)
        egraph.parse_and_run_program(base_declarations() + _PROBE_RULESETS)
    admission = Admission(egraph, rules, compiled=given)
    egraph.parse_and_run_program(program.text)
    admission.analyses(present_ops(_table_sizes(egraph)))
    tail = time.perf_counter()
    _run(egraph, "(saturate (run analysis))")
    sat = Saturation(graph, egraph, program, "saturated", rules=rules)
    sat.initial = IterationStats(0, _sizes(egraph), _eclasses(egraph, program) if count_classes else 0,
                                 time.perf_counter() - start, {}, False)
    pace.timed("tail", sat.initial.enodes, time.perf_counter() - tail)
    sat.admission = admission
    rulesets = {step: [r for r in rules if ruleset_of(r) == step] for step in STEPS}
    has_multi = bool(rulesets[MULTI])
    by_name = {r.name: r for r in rules}
    per_match = _PerMatch(by_name)
    ceiling = limits.ceiling
    enodes = sat.initial.enodes

    def serialized() -> dict:
        return _serialized(egraph, program)
    deferred_ever: dict[str, int] = {}
    for it in range(1, limits.iterations + 1):
        t0 = time.perf_counter()
        # once the growth bound held matches back, multi-pattern rules stop: their probes
        # have counted matches the rules never applied, so counts would no longer bound
        use_multi = has_multi and it <= limits.multi_iterations and not deferred_ever
        before = enodes
        matches: dict[str, int] = {}
        deferred: dict[str, int] = {}
        updated, cut, passed, timed_out = False, None, None, False
        select_done = False
        for ruleset in [*[SELECT] * SELECT_RUNS, REWRITES, *([MULTI] if use_multi else [])]:
            if ruleset == SELECT and select_done:
                continue
            sizes = _table_sizes(egraph)
            bounds = {r.name: _join_bound(r, sizes) for r in rulesets[ruleset]}
            if not pace.allows(pace.step_seconds(ruleset.name, enodes, bounds)):
                timed_out = True
                break
            admitting = time.perf_counter()
            if ruleset == SELECT:  # to a fixpoint: each run on what the last one made, joined to its classes
                _run(egraph, "(saturate (run analysis))")
            admission.admit(ruleset, lambda: _table_sizes(egraph), enodes, serialized)
            pace.timed(f"admit {ruleset.name}", enodes, time.perf_counter() - admitting)
            room = ceiling - enodes
            growth = min(room, int(limits.multi_growth * enodes)) if ruleset == MULTI and it > 1 else room
            step = _step(egraph, ruleset, by_name, per_match, growth, pace=pace, enodes=enodes)
            pace.timed(f"probe {ruleset.name}", enodes, max(0.0, step.probe_seconds - sum(step.rule_seconds.values())))
            for rule, seconds in step.rule_seconds.items():
                if rule in bounds:  # every probe is named after its rule (probe_name)
                    pace.timed(f"rule {rule}", bounds[rule], seconds)
            if step.timed_out:
                timed_out = True
                break
            for name, n in step.matches.items():
                matches[name] = matches.get(name, 0) + n
            updated = updated or step.updated
            select_done = ruleset == SELECT and not step.updated
            enodes = _sizes(egraph)
            if enodes > max(ceiling, before):
                # The probes counted fewer matches than the rules then applied: egglog's
                # per-rule counts for a join are not the matches a step applies
                # (architecture.md, known gaps; seen with generated conv merges on
                # SqueezeNet). The e-graph is sound: stop here, past the promise.
                passed = ruleset
                break
            if step.held_back and step.worst > room:
                cut = step
                break
            deferred.update(step.held_back)  # held back by the growth bound alone
        deferred_ever.update(deferred)
        if timed_out and not matches and not updated:  # nothing applied: as the last tail left it
            eclasses = (sat.iterations[-1] if sat.iterations else sat.initial).eclasses
        else:
            tail = time.perf_counter()
            _run(egraph, "(saturate (run analysis))")
            enodes = _sizes(egraph)
            eclasses = _eclasses(egraph, program) if count_classes else 0
            pace.timed("tail", enodes, time.perf_counter() - tail)
        stats = IterationStats(it, enodes, eclasses, time.perf_counter() - t0, matches, use_multi,
                               dict(cut.held_back) if cut else {}, deferred)
        sat.iterations.append(stats)
        if progress:
            progress(stats)
        elapsed = time.perf_counter() - start
        if passed:
            sat.stop_reason = _passed_the_ceiling(limits, it, enodes, passed)
            break
        if cut:
            sat.stop_reason = _held_back(limits, it, cut)
            break
        if timed_out:  # before "saturated": the rules left were not run, not matchless
            sat.stop_reason = (f"time limit ({limits.seconds:g} s), reached within iteration {it}, "
                               f"before {'any' if not matches else 'all'} of its rules were applied "
                               f"(no egglog run starts that is predicted to end past it)")
            break
        if not updated and enodes == before:
            sat.stop_reason = _saturated(limits, deferred_ever)
            break
        if enodes >= limits.nodes:
            sat.stop_reason = f"node limit ({limits.nodes})"
            break
        if elapsed >= limits.seconds:
            sat.stop_reason = f"time limit ({limits.seconds:g} s)"
            break
    else:
        sat.stop_reason = f"iteration limit ({limits.iterations})"
    sat.seconds = time.perf_counter() - start
    sat.cpu_seconds = time.process_time() - cpu_start
    return sat


# --- stop reasons --------------------------------------------------------------------


def _passed_the_ceiling(limits: Limits, it: int, enodes: int, ruleset: Ruleset) -> str:
    return (f"node limit ({limits.nodes}): the e-graph passed its ceiling of "
            f"{limits.ceiling} e-nodes in iteration {it} ({enodes} after its {ruleset.name} step: "
            f"the rules applied more matches than were counted beforehand)")


def _held_back(limits: Limits, it: int, cut: _Step) -> str:
    held = sorted(cut.held_back.items(), key=lambda kv: (-kv[1], kv[0]))
    names = ", ".join(f"{rule} x{n}" for rule, n in held[:3]) + \
        (f" and {len(held) - 3} more" if len(held) > 3 else "")
    return (f"node limit ({limits.nodes}): iteration {it} held back {names}; "
            f"its matches could have added {cut.worst} e-nodes, past the "
            f"ceiling of {limits.ceiling}")


def _saturated(limits: Limits, deferred_ever: dict[str, int]) -> str:
    if not deferred_ever:
        return "saturated"
    return ("saturated (multi-pattern matches held back by the growth bound, "
            f"{limits.multi_growth:g}x the e-graph: "
            + ", ".join(f"{r} x{n}" for r, n in sorted(deferred_ever.items())) + ")")


def tensor_classes(saturation: Saturation) -> dict:
    """The e-class of each tensor of the saturated graph, ``(node id, output index) ->
    class id``: the e-graph serialized once more with every tensor's variable as a
    root (class ids are the same in every serialization of an unchanged e-graph)."""
    eb = bindings()
    span = eb.PanicSpan()
    tensor_vars = saturation.program.tensor_vars
    data = json.loads(saturation.egraph.serialize([eb.Var(span, v) for v in tensor_vars.values()]).to_json())
    roots = data.get("root_eclasses", [])
    if len(roots) != len(tensor_vars):
        raise ExtractionError(f"serialized e-graph: {len(roots)} root classes for the input's "
                              f"{len(tensor_vars)} tensors")
    return dict(zip(tensor_vars, roots))
