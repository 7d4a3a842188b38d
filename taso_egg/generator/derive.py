"""Derivability pruning: a candidate rule that smaller proved rules already imply adds
nothing to equality saturation, which derives it anyway.

The sides of many candidates are built as concrete graphs on their example shapes
(:func:`~taso_egg.rules.instantiate.add_rule_sides`) into one graph, which is saturated
with the smaller proved rules under tight limits: the left sides alone are saturated,
then the right sides added without rewriting, and a candidate whose right side was
already in its left side's e-class follows from those rules in its own direction:
saturating a graph that holds the left side finds the right one. (Saturating both
sides together would also count sides that only meet in a third term, the right side
growing into what the left shrinks into, which no graph holding one side reaches; the
generator did so until session 14 and dropped rules saturation never derives.) That is
a proof by derivation (each rule used is proved), so it needs no Z3 call.

A derivation on the example covers the example's shapes only. A candidate that
generalizes to other shapes is therefore built a second time, on a variant of its
example with other dimensions (as the other-shape float check draws them): it counts
as derived when both instances are. ``example_only`` reports the candidates derived
on the example alone, which are derivable once their own check pins them to it.
"""

from __future__ import annotations

import functools
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from itertools import islice
from pathlib import Path

from taso_egg.egraph.convert import graph_to_program
from taso_egg.egraph.saturate import Limits, rules_egraph, saturate
from taso_egg.errors import RuleError, TasoEggError
from taso_egg.graph import Graph

from ..rules.instantiate import add_rule_sides, builds_on, other_examples
from ..rules.ast import Guard, Rule, Var
from ..rules.workers import fetch, map_in_order, shared

# A handful of rewrites reach what smaller rules imply for a candidate; the node limit
# keeps one exploding candidate from starving its batch (and bounds it within an
# iteration). No time limit: where a batch stops must not depend on the machine's load,
# or two runs of the generator (local, Ray) would drop different candidates. Multi-pattern
# rules (merges) stay off: the constants every candidate shares made them pair up
# across candidates (thousands of matches, 40 s per batch), for few derivations.
DEFAULT_LIMITS = Limits(nodes=60_000, iterations=4, seconds=float("inf"), multi_iterations=0)
BATCH = 500


@dataclass
class Derivation:
    """Per candidate (input order): ``derived`` when the sides of both instances (or
    of the example, when no other shape builds) share an e-class; ``example_only``
    when the example's did and the variant's did not."""

    derived: list
    example_only: list
    seconds: float = 0.0
    batches: int = 0
    stop_reasons: dict = field(default_factory=dict)


def _variant(rule: Rule, attempts: int = 100):
    """Bindings of a shape variant on which both sides build, or None (drawn as the
    other-shape float check draws them, with as many attempts)."""
    for bindings in islice(other_examples(rule, seed=1), attempts):
        if builds_on(rule, bindings):
            return bindings
    return None


def _eclass(egraph, var: str):
    """The canonical e-class of an egglog global (comparable with ``==``)."""
    from egglog.bindings import PanicSpan, Var

    return egraph.eval_expr(Var(PanicSpan(), var))[1]


def check_derivable(candidates, corpus, limits: Limits | None = None, batch: int = BATCH,
                    progress=None, pool=None, jobs: int = 1) -> Derivation:
    """Which of ``candidates`` (rules with examples) follow from ``corpus`` (proved
    rules) by equality saturation from the left side. ``progress(done, total)``
    after each batch of the examples. With ``pool`` (a :func:`~.workers.worker_pool`
    of ``jobs`` workers) the batches saturate in parallel."""
    candidates = list(candidates)
    corpus = tuple(corpus)
    limits = limits or DEFAULT_LIMITS
    if batch < 1:
        raise TasoEggError(f"derivation batch size must be at least 1, got {batch}")
    start = time.perf_counter()
    out = Derivation([False] * len(candidates), [False] * len(candidates))
    if not corpus:
        return out
    with _shared(corpus, pool) as ref:
        _derive(candidates, _BatchRunner(candidates, ref, limits, batch, out, pool, jobs), out, progress)
    out.seconds = round(time.perf_counter() - start, 3)
    return out


def _derive(candidates, run, out: Derivation, progress) -> None:
    # First every example; then a shape variant of those derived there (few, and
    # finding a variant that builds is most of the cost of an instance: the batch
    # that derived the example finds it).
    on_example, found = run([(i, None) for i in range(len(candidates))], progress)
    variants = []
    for i in (i for i, same in on_example.items() if same):
        if found[i] is None:
            out.derived[i] = True  # no other shape builds: the example is the rule
        else:
            variants.append((i, found[i]))
    for i, same in run(variants, None)[0].items():
        out.derived[i] = same
        out.example_only[i] = not same


@dataclass(frozen=True)
class _CorpusRef:
    """What a batch needs to find its corpus: the rules themselves (in this process),
    or the pool's handle to them (:func:`~.workers.shared`: sent once, not in every
    batch)."""
    token: str
    rules: tuple | None = None
    handle: object = None


@contextmanager
def _shared(corpus: tuple, pool):
    token = uuid.uuid4().hex
    if pool is None:
        yield _CorpusRef(token, rules=corpus)
        return
    with shared(pool, corpus) as handle:
        yield _CorpusRef(token, handle=handle)


@dataclass
class _BatchRunner:
    candidates: list
    corpus: _CorpusRef
    limits: Limits
    batch: int
    out: Derivation
    pool: object = None
    jobs: int = 1

    def __call__(self, instances, progress) -> tuple[dict, dict]:
        """``{candidate index: both sides in one e-class}`` for ``(index, bindings)``
        instances (bindings None: the example), ``batch`` candidates per e-graph; and
        the shape variants found for the examples derived."""
        batches = [([(i, self.candidates[i], b) for i, b in instances[lo:lo + self.batch]],
                    self.corpus, self.limits) for lo in range(0, len(instances), self.batch)]
        same, variants, done = {}, {}, 0
        for (result, found, stop), job in zip(map_in_order(self.pool, _batch, batches, self.jobs), batches):
            same.update(result)
            variants.update(found)
            self.out.stop_reasons[stop] = self.out.stop_reasons.get(stop, 0) + 1
            self.out.batches += 1
            done += len(job[0])
            if progress:
                progress(done, len(instances))
        return same, variants


def _batch(job) -> tuple[dict, dict, str]:
    """Saturate the left sides of one batch of ``(index, rule, bindings)`` instances
    with the corpus, then add both sides (see the module's text): ``({index: derived},
    {index: a shape variant or None, for the examples derived}, why saturation
    stopped)``."""
    instances, ref, limits = job
    lefts, whole = Graph(), Graph()
    sides = []  # (candidate index, output names of its sides)
    for i, rule, bindings in instances:
        prefix = f"c{i}_"
        try:
            add_rule_sides(lefts, rule, bindings, prefix=prefix, sides="lhs")
            lhs, rhs = add_rule_sides(whole, rule, bindings, prefix=prefix)
        except RuleError as err:
            raise RuleError(f"derivability check: {err}") from None
        names = []
        for k, (l, r) in enumerate(zip(lhs, rhs)):
            names += [f"{prefix}lhs{k}", f"{prefix}rhs{k}"]
            whole.mark_output(l, names[-2])
            whole.mark_output(r, names[-1])
        sides.append((i, names))
    # a weight is a term by its index among the graph's weights: both graphs must agree
    if [n.label() for n in lefts.weights()] != [n.label() for n in whole.weights()]:
        raise TasoEggError("derivability check: the left sides' weights differ from both sides'")
    corpus, egraph = _corpus_egraph(ref)
    egraph.parse_and_run_program("(push)")
    try:
        sat = saturate(lefts, corpus, limits, count_classes=False, egraph=egraph)
        added = graph_to_program(whole, names="$both_")
        egraph.parse_and_run_program(added.text)
        var_of = dict(zip((name for name, _ in whole.outputs), added.output_vars))
        same = {i: all(_eclass(egraph, var_of[a]) == _eclass(egraph, var_of[b])
                       for a, b in zip(names[::2], names[1::2]))
                for i, names in sides}
        stop = sat.stop_reason.split(" (")[0]
    finally:
        egraph.parse_and_run_program("(pop)")
    examples = {i: rule for i, rule, bindings in instances if bindings is None}
    return same, {i: _variant(examples[i]) for i in examples if same[i]}, stop


_COMPILED: dict = {}  # this process's last corpus: {token: (rules, e-graph)}


def _corpus_egraph(ref: _CorpusRef):
    """The corpus and its rules compiled into an empty e-graph, once per process and
    corpus (a level's batches share their corpus)."""
    if ref.token not in _COMPILED:
        _COMPILED.clear()
        rules = ref.rules if ref.rules is not None else fetch(ref.handle)
        _COMPILED[ref.token] = (rules, rules_egraph(rules))
    return _COMPILED[ref.token]




# --- what a corpus derives of a rule file (`taso-egg rules derive`) --------------------

# The corpora a rule file is measured against: the hand rules, the default corpus
# (hand + generated), and the verifier's axioms as rewrites in both orientations.
CORPORA = ("hand", "default", "axioms")  # what `rules derive` compares when not told
NAMED_CORPORA = CORPORA + ("generated", "study")  # the names corpus_for takes besides a rule file
# Deeper than the generator's pruning: a reference rule may be several steps away. Each
# target is saturated alone, so the corpus's multi-pattern rules (its merges) run as in
# saturation's default: they cannot pair up across targets.
DERIVE_LIMITS = Limits(nodes=60_000, iterations=8, seconds=60.0, multi_iterations=2)


def corpus_for(name: str, orientations: str | None = "given") -> list:
    """The rules of corpus ``name``: ``hand`` (the hand rules), ``default`` (hand and
    generated: what ``optimize`` loads), ``generated`` (the shipped generated rules
    alone), ``study`` (the default corpus and the generated rules over TASO's
    constants, which no exported model holds), ``axioms`` (the verifier's, always
    both ways, as it uses them), or the
    path of a rule file (the hand rules and that file's proved rules, in place of the
    shipped generated ones). The others are oriented as ``orientations`` says (None:
    ``load_corpus``'s default, ``TASO_EGG_ORIENTATIONS`` or ``given``)."""
    from ..rules.corpus import (AXIOM_FILES, corpus_files, default_orientations, load_corpus, load_rule_file,
                                with_orientations)

    if name == "hand":
        return load_corpus(["taso_hand"], orientations=orientations)
    if name == "default":
        return load_corpus(orientations=orientations)
    if name == "generated":
        return load_corpus(["generated"], orientations=orientations)
    if name == "study":
        return load_corpus(["taso_hand", "generated", "generated-constants"], orientations=orientations)
    if name == "axioms":
        folder = Path(corpus_files()[0]).parent
        return with_orientations(load_rule_file(folder / AXIOM_FILES[0]), "both")
    if Path(name).is_file():
        proved = [r for r in load_rule_file(name) if r.proved]
        return load_corpus(["taso_hand"], orientations=orientations) + \
            with_orientations(proved, orientations or default_orientations())
    raise RuleError(f"unknown corpus {name!r}: neither one of {', '.join(NAMED_CORPORA)} nor a rule file")


def is_corpus(name: str) -> bool:
    """Whether ``corpus_for`` takes ``name``: one of NAMED_CORPORA or a rule file."""
    return name in NAMED_CORPORA or Path(name).is_file()


def corpus_label(name: str) -> str:
    """A corpus's name as a table column shows it: a file by its name."""
    return name if name in NAMED_CORPORA else Path(name).name


@dataclass
class DerivationTable:
    """Per target rule (file order) and corpus: ``yes`` (derived on the example and on
    a shape variant), ``example`` (on the example only), ``no``, or ``-`` (the target
    does not build on its example: not checked)."""

    rules: list
    corpora: tuple
    cells: dict            # corpus -> [mark per rule]
    seconds: dict          # corpus -> seconds
    sizes: dict            # corpus -> rules in it

    def totals(self) -> dict:
        return {c: sum(m == "yes" for m in self.cells[c]) for c in self.corpora}

    def text(self) -> str:
        width = max([len("rule")] + [len(r.name) for r in self.rules])
        head = f"{'rule':<{width}}" + "".join(f"{corpus_label(c)[:9]:>10}" for c in self.corpora)
        rows = [head, "-" * len(head)]
        for i, r in enumerate(self.rules):
            rows.append(f"{r.name:<{width}}" + "".join(f"{self.cells[c][i]:>10}" for c in self.corpora))
        rows.append("-" * len(head))
        n = len(self.rules)
        rows.append(f"{'derived (of ' + str(n) + ')':<{width}}" + "".join(
            f"{self.totals()[c]:>10}" for c in self.corpora))
        rows.append(f"{'on the example only':<{width}}" + "".join(
            f"{sum(m == 'example' for m in self.cells[c]):>10}" for c in self.corpora))
        rows.append(f"{'corpus rules':<{width}}" + "".join(f"{self.sizes[c]:>10}" for c in self.corpora))
        rows.append(f"{'seconds':<{width}}" + "".join(f"{self.seconds[c]:>10.1f}" for c in self.corpora))
        return "\n".join(rows)


# How a target's tensors are built: ``kernels`` as an exported model has them (what a
# conv reads as its kernel is an initializer; everything else an activation), ``none``
# every tensor an activation, ``all`` every tensor a weight.
WEIGHT_BUILDS = ("kernels", "none", "all")


@functools.cache
def kernel_operands() -> dict:
    """``{operator: operand positions}`` that the generator's menu feeds from weights
    alone (a conv's kernel, enlarge's operands): where a model holds initializers, so
    that the generator's rules guard them ``(weight ?v)``. Built once: the menu is fixed."""
    from .enumerate import default_menu

    out: dict = {}
    for c in default_menu().ops:
        for i, role in enumerate(c.operands or ()):
            if role in ("weight", "leaf"):
                out.setdefault(c.op, set()).add(i)
    return out


def kernel_vars(rule: Rule) -> list:
    """The tensor variables of ``rule`` that either side reads in a kernel operand
    (:func:`kernel_operands`), at any depth of it, and nowhere else."""
    from ..rules.ast import App, Proj

    positions = kernel_operands()
    kernel, other = [], set()

    def walk(node, in_kernel):
        if isinstance(node, Var):
            if in_kernel:
                kernel.append(node.name)
            else:
                other.add(node.name)
        elif isinstance(node, Proj):
            walk(node.pattern, in_kernel)
        elif isinstance(node, App):
            for i, child in enumerate(node.inputs):
                walk(child, in_kernel or i in positions.get(node.op, ()))

    for side in rule.lhs + rule.rhs:
        walk(side, False)
    return [v for v in dict.fromkeys(kernel) if v not in other]


def as_weights(rule: Rule, build: str = "all") -> Rule:
    """The rule with the tensor variables that ``build`` (one of WEIGHT_BUILDS) makes
    weights guarded ``(weight ?v)``: its instances are built with those tensors as
    weights, so corpus rules that apply only to weights (the merges, the scalar moves
    into weights: scheduling, not truth) can fire on them."""
    if build not in WEIGHT_BUILDS:
        raise RuleError(f"weights must be one of {', '.join(WEIGHT_BUILDS)}, got {build!r}")
    chosen = () if build == "none" else rule.tensor_vars() if build == "all" else kernel_vars(rule)
    have = set(rule.weight_vars())
    extra = tuple(Guard("weight", (Var(v),)) for v in chosen if v not in have)
    return replace(rule, guards=rule.guards + extra)


def derive_table(targets, corpora=CORPORA, orientations: str = "given",
                 limits: Limits | None = None, batch: int = 1, progress=None,
                 weights: str = "kernels") -> DerivationTable:
    """Which of ``targets`` (rules with examples) each corpus derives by saturation
    (:func:`check_derivable`). ``batch`` targets share an e-graph (1: each alone, so
    that one target's growth never takes another's node budget). ``weights``: which
    of the targets' tensors are built as weights (WEIGHT_BUILDS, :func:`as_weights`)."""
    targets = list(targets)
    limits = limits or DERIVE_LIMITS
    buildable = [i for i, r in enumerate(targets) if r.example and builds_on(r)]
    built = [as_weights(r, weights) for r in targets]
    cells, seconds, sizes = {}, {}, {}
    for name in corpora:
        corpus = corpus_for(name, orientations)
        start = time.perf_counter()
        d = check_derivable([built[i] for i in buildable], corpus, limits, batch,
                            progress=None if progress is None else lambda done, n: progress(name, done, n))
        marks = ["-"] * len(targets)
        for k, i in enumerate(buildable):
            marks[i] = "yes" if d.derived[k] else "example" if d.example_only[k] else "no"
        cells[name], sizes[name] = marks, len(corpus)
        seconds[name] = time.perf_counter() - start
    return DerivationTable(targets, tuple(corpora), cells, seconds, sizes)


__all__ = ["Derivation", "check_derivable", "DEFAULT_LIMITS", "BATCH", "CORPORA", "DERIVE_LIMITS",
           "corpus_for", "DerivationTable", "derive_table", "WEIGHT_BUILDS", "kernel_operands", "kernel_vars",
           "as_weights"]
