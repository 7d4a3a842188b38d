"""``check_locally``: an extracted graph against its input, region by region (float64,
tracked exponents).

Each tensor the extraction built carries the e-class it came from; the input's tensors
have classes too. A node of the result that repeats an input node (same operator and
parameters, same input and output classes) is not recomputed; every other node is
computed from the input's own tensors at its region's boundary and compared with what
the input computes of the same class (from the same boundary values; through random
projections where matmuls make it). Errors do not compound through depth, so deep
ill-conditioned graphs (TASO's BERT at 32 layers) are checked as tightly as shallow
ones.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from ..errors import VerificationError, first_line
from ..ops.precision import ROUNDING_STEP
from .scaled_executor import normalize, pow2, scaled_apply, scaled_error, scaled_leaf, scaled_values
from .tolerance import LOCAL_RTOL, check_tolerance, max_abs
from .whole_graph import note_stand_ins, same_inputs, share_weights, stand_ins, zero_weights

log = logging.getLogger("taso_egg.check")


@dataclass
class LocalCheck:
    """What ``check_locally`` compared."""

    error: float       # the worst relative error of a recomputed tensor against the input's
    regions: int       # changed regions computed and compared
    recomputed: int    # result nodes computed (the others repeat an input node)
    nodes: int         # result nodes in all, leaves included
    input_nodes_run: int  # the input's nodes run for the values the regions read and compare
    compared: int      # tensors compared
    projected: int     # of those, compared through random projections (``PROJECTIONS`` columns)
    rechecked: int     # projected groups past their floor, so compared whole after all
    # True: each region against the input's own operators run from the same boundary
    # values (the input's tensors computed in float32); False: against the input's
    # tensors computed in float64 (where a boundary does not cut the input's
    # computation, classes are shared, or the first way fails)
    cones: bool = False
    # with ``outputs``: whether an output of the input lies beyond float32's range (then
    # no float32 run of it proves anything); None when not asked
    outputs_beyond_float32: bool | None = None


def check_locally(original, candidate, original_classes: Mapping, candidate_classes: Mapping,
                  seed: int = 0, rtol: float = LOCAL_RTOL, what: str = "optimized graph",
                  outputs: bool = False) -> LocalCheck:
    """Check ``candidate`` (an extracted graph) against ``original`` (its input) region
    by region, in float64 with tracked exponents, on random inputs.

    ``original_classes`` and ``candidate_classes`` map ``(node id, output index)`` to
    the e-class the tensor belongs to (the claim to check: equal classes, equal values).
    A candidate node that repeats an input node, the same operator and parameters with
    inputs and outputs of the same classes, computes what that node computes and is
    not recomputed. Every other node is computed, with connected ones grouped into
    regions through the tensors no input tensor shares a class with; a region's inputs
    are the input graph's own tensors of the classes at its boundary, and each tensor
    it produces of such a class is compared with the input's. The input's tensors that
    share a class are compared with each other, and the outputs' classes must be the
    input's. By induction over the candidate's order every tensor then equals the
    input's of its class, outputs included, to within ``rtol`` per region (or SAFETY
    times the region's round-off noise, measured only when ``rtol`` is exceeded).

    Two ways (``LocalCheck.cones``). First: the input's tensors regions read are
    computed in float32 (tracked exponents), and each region is compared with its
    cone, the input's own operators from the classes it reads to the classes it makes,
    run in float64 from the same values; both sides then start from the same numbers,
    however far float32's round-off has moved them from float64's. Where a region's
    cone reaches a graph input (its boundary does not cut the input's computation),
    classes are shared, a read is not finite in float32, or a region fails, the check
    runs again the second way, on the input's float64 tensors, whose verdict stands.
    Tensors made by matmuls (through splits, concats and adds) are compared through
    PROJECTIONS random projections (``_Projected``; Freivalds): ``sum_k T_k @ R_k``,
    with ``A @ B @ R`` computed as ``A @ (B @ R)``, so neither side runs a matmul
    whole; their floor is ``rtol`` over 4 times the root of the contracted length,
    about what one entry off by ``rtol`` moves a projection by, and a group past it is
    compared whole, entry by entry (``LocalCheck.rechecked``): projections only speed
    up a pass.

    ``outputs`` also computes the input's outputs, for ``outputs_beyond_float32`` (the
    first way reads their range from float32 values, so only a margin of 2**32 past
    float32's limits counts).

    Regions never read each other's results: a tensor one region makes and another
    reads is the input's own at the second one's boundary, and the first is compared
    on it, so no error travels from one to the next. A wrong rule's merge of classes
    shows where it is used: the node built from the merged class computes something
    else than the input's tensor of that class. Opaque nodes always repeat the input's
    and are not run for the result (they are for the input where a region needs what
    they feed). Weights are the input's by name; one whose data differs is compared
    too. All-zero weights get random stand-ins, as in ``check_graphs_equivalent``.

    What it cannot see: a region's error below its tolerance (1e-9 relative, against
    float64 round-off of ~1e-14 for a few operators) however much the rest of the
    graph would amplify it; a region whose input path to a compared tensor is much
    worse conditioned than the region itself (its noise is measured on the region);
    inputs on which a wrong rewrite happens to agree (random inputs make this
    unlikely; a projected difference is missed with probability zero, but its size
    is judged from PROJECTIONS columns); and the exporter, which only the onnxruntime
    check sees."""
    from ..executor import random_inputs

    feeds = random_inputs(original, seed)
    same_inputs(candidate, feeds, what)
    share_weights(original, candidate)
    zero = zero_weights(original)
    if zero:
        note_stand_ins(zero)
    with np.errstate(all="ignore"), stand_ins(original, candidate, zero, seed):
        return _Local(original, candidate, original_classes, candidate_classes, feeds, rtol, what,
                      seed, outputs).run()


def _beyond_float32(value, margin: int = 0) -> bool:
    """A float tensor (``m * 2**e``) float32 cannot hold: not finite, all zeros, or
    its largest entry past float32's largest or below its smallest normal number.
    ``margin`` > 0 (for a value computed in float32, whose round-off may be large):
    only an entry past those limits by ``2**margin`` counts, and a tensor that is not
    finite or all zeros does not."""
    m, e = value
    if m.dtype.kind != "f" or not m.size:
        return False
    peak = max_abs(m)
    if peak == 0 or not math.isfinite(peak):
        return not margin
    return not -126 - margin <= e + math.log2(peak) < 128 + margin


@dataclass
class _Region:
    nodes: list          # candidate nodes, in the candidate's topological order
    needs: set           # classes of the input graph's tensors it reads or compares
    waiting: int = 0     # of those, not yet computed
    reads: set = field(default_factory=set)   # of ``needs``, those its nodes read
    # the input's nodes that compute the classes it makes from the classes it reads (in
    # the input's order); None where that computation reaches past them to a graph input
    cone: list | None = None
    need: set = field(default_factory=set)    # what this run waits for: ``needs``, or ``reads``


class _Local:
    def __init__(self, original, candidate, ocls, ccls, feeds, rtol, what, seed, outputs):
        self.original, self.candidate, self.ccls, self.outputs = original, candidate, ccls, outputs
        self.feeds, self.rtol, self.what, self.seed = feeds, rtol, what, seed
        self.order = original.topo_order()
        self.by_class: dict[str, list[tuple[int, int]]] = {}
        for n in self.order:
            for i in range(len(n.outputs)):
                cls = ocls.get((n.id, i))
                if cls is None:
                    raise VerificationError(f"{what}: the input's {n.label()} output {i} has no e-class")
                self.by_class.setdefault(cls, []).append((n.id, i))
        self.ocls = ocls
        self.worst, self.compared, self.projected, self.rechecked = 0.0, 0, 0, 0

    def anchored(self, cls) -> bool:
        return cls in self.by_class

    def run(self) -> LocalCheck:
        cand, ccls = self.candidate, self.ccls
        self._check_outputs()
        changed = self._changed()
        regions = self._regions(changed)
        # classes the candidate uses that hold several input tensors: they must agree
        used = {ccls.get((t.node, t.index)) for n in cand.nodes.values() for t in n.inputs}
        used |= {ccls.get((t.node, t.index)) for _, t in cand.outputs}
        shared = {c for c in used if self.anchored(c) and len(self.by_class[c]) > 1}
        if not shared and all(self._cone(r) for r in regions):
            try:
                return self._run(regions, shared, cones=True)
            except VerificationError as e:  # a region that may rely on its boundary's exact values
                log.info("%s; checked again on the input's own float64 tensors", first_line(str(e)))
                self.worst, self.compared, self.projected, self.rechecked = 0.0, 0, 0, 0
        return self._run(regions, shared, cones=False)

    def _run(self, regions, shared, cones: bool) -> LocalCheck:
        """With ``cones``: the input's tensors that regions read are computed in float32
        (tracked exponents; half a float64 run's cost), and each region is compared
        with the input's own operators (``_Region.cone``) run in float64 from the same
        boundary values, so both sides of a comparison start from the same numbers.
        Else the input's tensors are computed in float64, regions compared with them."""
        cand = self.candidate
        for r in regions:
            r.need = r.reads if cones else r.needs
        wanted = {self.by_class[c][0] for r in regions for c in r.need}
        wanted |= {k for c in shared for k in self.by_class[c]}
        holds = {c: len(self.by_class[c]) - 1 for c in shared}  # comparisons still to come
        waiters: dict[str, list[_Region]] = {}
        for r in regions:
            r.waiting = len(r.need)
            for c in r.need:
                waiters.setdefault(c, []).append(r)
                holds[c] = holds.get(c, 0) + 1
        values: dict[str, tuple[np.ndarray, int]] = {}
        outputs = {(t.node, t.index) for _, t in self.original.outputs} if self.outputs else set()
        beyond = False
        ran = self._needed_input_nodes(wanted | outputs)
        dtype = np.float32 if cones else np.float64

        def release(c):
            holds[c] -= 1
            if not holds[c]:
                values.pop(c, None)

        for key, v in scaled_values(self.original, self.feeds, wanted | outputs, dtype=dtype):
            if key in outputs:
                beyond = beyond or _beyond_float32(v, margin=32 if cones else 0)
                if key not in wanted:
                    continue
            if cones and v[0].dtype == np.float32:
                if not math.isfinite(max_abs(v[0])):  # float64 may hold it: no place to compare from
                    raise VerificationError(f"{self.what}: the input's {self._name(key)} is not finite "
                                            f"in float32")
                v = (v[0].astype(np.float64), v[1])
            c = self.ocls[key]
            if c in values:  # another input tensor of a class already computed
                error = scaled_error(values[c], v)
                self.compared += 1
                check_tolerance(error, self.rtol, lambda: 0.0, self.what,
                           f"the input's {self._name(key)}, which the e-graph holds equal to its "
                           f"{self._name(self.by_class[c][0])},")
                self.worst = max(self.worst, error)
                release(c)
                continue
            values[c] = v
            for r in waiters.get(c, ()):
                r.waiting -= 1
                if not r.waiting:
                    self._evaluate(r, values, cones)
                    for need in r.need:
                        release(need)
        return LocalCheck(self.worst, len(regions), sum(len(r.nodes) for r in regions),
                          len(cand.nodes), ran, self.compared, self.projected, self.rechecked, cones,
                          beyond if self.outputs else None)

    def _name(self, key) -> str:
        return f"{self.original.nodes[key[0]].label()} output {key[1]}"

    def _check_outputs(self) -> None:
        theirs = dict(self.candidate.outputs)
        if set(theirs) != {name for name, _ in self.original.outputs}:
            raise VerificationError(f"{self.what}: outputs {sorted(theirs)} differ from the original's "
                                    f"{sorted(name for name, _ in self.original.outputs)}")
        for name, t in self.original.outputs:
            mine, ours = self.ocls[(t.node, t.index)], self.ccls.get((theirs[name].node, theirs[name].index))
            if mine != ours:
                raise VerificationError(f"{self.what}: output {name!r} is built from e-class {ours}, "
                                        f"the input's from {mine}")

    def _changed(self) -> list:
        """Candidate nodes that do not repeat an input node."""
        cand, ccls = self.candidate, self.ccls
        repeats: dict[tuple, list[tuple]] = {}
        for n in self.order:
            repeats.setdefault(_signature(n, self.ocls), []).append(
                tuple(self.ocls[(n.id, i)] for i in range(len(n.outputs))))
        used = {(t.node, t.index) for n in cand.nodes.values() for t in n.inputs}
        used |= {(t.node, t.index) for _, t in cand.outputs}
        weights = {n.params["name"]: n for n in self.original.weights()}
        changed = []
        for n in cand.topo_order():
            mine = [ccls.get((n.id, i)) for i in range(len(n.outputs))]
            same = any(all(m == o or (n.id, i) not in used for i, (m, o) in enumerate(zip(mine, outs)))
                       for outs in repeats.get(_signature(n, ccls), ()))
            if same and n.op == "weight":  # a weight repeats the input's only with its data
                a, b = cand.weight_array(n), self.original.weight_array(weights[n.params["name"]])
                same = a is b or np.array_equal(a, b)
            if not same:
                changed.append(n)
        return changed

    def _regions(self, changed) -> list[_Region]:
        """Changed nodes joined through tensors of classes no input tensor has; a region
        none of whose tensors has such a class computes nothing the outputs use."""
        ccls = self.ccls
        ids = {n.id for n in changed}
        parent = {i: i for i in ids}

        def root(i):
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        for n in changed:
            for t in n.inputs:
                if t.node in ids and not self.anchored(ccls.get((t.node, t.index))):
                    parent[root(t.node)] = root(n.id)
        groups: dict[int, _Region] = {}
        for n in changed:  # candidate order, so each region's nodes stay in it
            r = groups.setdefault(root(n.id), _Region([], set()))
            r.nodes.append(n)
            r.reads.update(c for c in (ccls.get((t.node, t.index)) for t in n.inputs) if self.anchored(c))
            r.needs.update(r.reads)
            r.needs.update(c for c in (ccls.get((n.id, i)) for i in range(len(n.outputs))) if self.anchored(c))
        return [r for r in groups.values()
                if any(self.anchored(ccls.get((n.id, i))) for n in r.nodes for i in range(len(n.outputs)))]

    def _cone(self, region: _Region) -> bool:
        """Find the input's nodes that compute the classes ``region`` makes from the
        classes it reads (``region.cone``); False where they reach a graph input, that
        is, where the region's boundary does not cut the input's computation of them."""
        made = {self.ccls.get((n.id, i)) for n in region.nodes for i in range(len(n.outputs))}
        todo = [self.by_class[c][0] for c in made if self.anchored(c)]
        seen: set[int] = set()
        while todo:
            node = self.original.nodes[todo.pop()[0]]
            if node.id in seen:
                continue
            if node.op == "input":
                return False
            seen.add(node.id)
            todo += [(t.node, t.index) for t in node.inputs
                     if self.ocls[(t.node, t.index)] not in region.reads]
        region.cone = [n for n in self.order if n.id in seen]
        return True

    def _needed_input_nodes(self, wanted) -> int:
        needed = {k[0] for k in wanted}
        for node in reversed(self.order):
            if node.id in needed:
                needed.update(t.node for t in node.inputs)
        return len(needed)

    def _region_values(self, region: _Region, values, perturb=None) -> _RegionValues:
        return _RegionValues(self.candidate, region.nodes, self.ccls, self.anchored, values, self.feeds,
                             perturb)

    def _evaluate(self, region: _Region, values, cones: bool = False) -> None:
        """Compute the region from the input's tensors at its boundary and compare what it
        makes with the input's tensors of the same classes (with ``cones``: with what
        the input's own operators make from the same boundary values): exactly, or, for
        tensors made by matmuls (through splits, concats and adds), through random
        projections (``_Projected``), which skip the matmuls' cubic cost."""
        rng = np.random.default_rng(self.seed + 3)
        ev = self._region_values(region, values)
        exact, groups = ev.plan(rng)
        if cones:
            reads = region.reads
            ref_ev = _RegionValues(self.original, region.cone, self.ocls, lambda c: c in reads, values,
                                   self.feeds)
            exact_ref = lambda key: ref_ev.make(self.by_class[self.ccls[key]][0])
            group_ref = lambda g: ref_ev.project([(self.by_class[c][0], r, 0, True)
                                                  for c, r in zip(g.classes, g.mats)])
        else:
            exact_ref = lambda key: values[self.ccls[key]]
            group_ref = lambda g: g.reference(values)
        refs = [group_ref(g) for g in groups]
        if not all(np.all(np.isfinite(m)) for m, _ in refs):
            exact, groups, refs = exact + [k for g in groups for k in g.keys], [], []  # entry by entry
        measured = {("exact", key): (exact_ref(key), ev.make(key)) for key in exact}
        errors = {label: scaled_error(ref, got) for label, (ref, got) in measured.items()}
        flagged = {}  # projections past their floor: each tensor of the group compared whole
        for g, ref in zip(groups, refs):
            error, floor = scaled_error(ref, g.value(ev)), g.floor(self.rtol)
            if error <= floor:
                self.worst = max(self.worst, error)
                continue
            self.rechecked += 1
            for key in g.keys:
                measured[("exact", key)] = (exact_ref(key), ev.make(key))
                errors[("exact", key)] = scaled_error(*measured[("exact", key)])
                flagged[key] = (error, floor, g.columns)
        self.compared += len(exact) + sum(len(g.keys) for g in groups)
        self.projected += sum(len(g.keys) for g in groups)
        if not errors:
            return
        worst = max(errors, key=errors.get)
        if errors[worst] > self.rtol:  # round-off or a wrong rewrite: how noisy is this region?
            noisy = {c: (m * (1 + ROUNDING_STEP["float64"] * rng.standard_normal(m.shape)), e)
                     if m.dtype.kind == "f" else (m, e) for c, (m, e) in values.items() if c in region.needs}
            noise = lambda: scaled_error(measured[worst][1],
                                          self._region_values(region, noisy, rng).make(worst[1]))
            key = worst[1]
            against = " (and the input's operators from the same values)" if cones else ""
            seen = (f"; its group's {flagged[key][2]} random projections differ by {flagged[key][0]:.3g}, "
                    f"above their floor {flagged[key][1]:.3g}") if key in flagged else ""
            where = (f"{self.candidate.nodes[key[0]].label()} (e-class {self.ccls[key]}; in a region of "
                     f"{len(region.nodes)} changed node(s), computed from the input's tensors at its "
                     f"boundary{against}{seen})")
            check_tolerance(errors[worst], self.rtol, noise, self.what, where)
        self.worst = max(self.worst, max(errors.values()))


# Random projections per compared group: Freivalds' check, each column an independent
# chance to see a difference (a nonzero difference is missed with probability 0).
PROJECTIONS = 4


@dataclass
class _Projected:
    """Tensors a region makes, compared through ``sum_k key_k @ R_k`` (the last axis
    contracted with random ``R_k``): the matmuls that make them run on ``PROJECTIONS``
    columns instead of whole matrices (``A @ B @ R`` as ``A @ (B @ R)``)."""

    keys: list              # candidate tensors, one leading shape
    mats: list              # their R, (last dim, PROJECTIONS) each
    classes: list           # their e-classes (the input's tensors to compare with)

    @property
    def columns(self) -> int:
        return self.mats[0].shape[1]

    def floor(self, rtol: float) -> float:
        # A projection's scale, its largest entry, is up to ~4 standard deviations of a
        # row's random sum, sqrt(contracted length) entries of the tensor's scale; one
        # entry off by ``rtol`` moves it by ~rtol times a standard normal. So the floor
        # is that much lower (and still far above float64 round-off).
        return rtol / (4 * math.sqrt(sum(r.shape[0] for r in self.mats)))

    def reference(self, values) -> tuple[np.ndarray, int]:
        return _sum_scaled([_times(values[c], r) for c, r in zip(self.classes, self.mats)])

    def value(self, ev: _RegionValues) -> tuple[np.ndarray, int]:
        return ev.project([(k, r, 0, True) for k, r in zip(self.keys, self.mats)])


def _times(value, r: np.ndarray, f: int = 0) -> tuple[np.ndarray, int]:
    """``value @ (r * 2**f)``, ``value`` tracked as ``(m, e)``."""
    m, e = value
    return normalize(np.matmul(m, r), e + f, owned=True)


def _sum_scaled(terms) -> tuple[np.ndarray, int]:
    top = max(e for _, e in terms)
    out = None
    for m, e in terms:  # each a fresh array
        m = m * pow2(e - top) if e != top else m
        out = m if out is None else out + m
    return normalize(out, top, owned=True)


class _RegionValues:
    """The tensors ``nodes`` (of ``graph``, in its order) compute from ``values`` (by
    class) at their boundary, the tensors whose class ``stop`` accepts: whole
    (``make``), or contracted with random matrices (``project``). A changed region of
    the candidate, or its cone in the input."""

    def __init__(self, graph, nodes, classes, stop, values, feeds, perturb=None):
        self.graph, self.classes, self.stop = graph, classes, stop
        self.values, self.feeds, self.perturb = values, feeds, perturb
        self.nodes = {n.id: n for n in nodes}
        self.pos = {n.id: i for i, n in enumerate(nodes)}
        self.made: dict[tuple[int, int], tuple[np.ndarray, int]] = {}

    def _cls(self, key):
        return self.classes.get(key)

    def read(self, key):
        """A tensor as a node reads it: the boundary's value where its class is a
        boundary class, else made here."""
        c = self._cls(key)
        return self.values[c] if self.stop(c) else self.make(key)

    def make(self, key):
        if key not in self.made:
            from ..executor import leaf_value

            node = self.nodes[key[0]]
            outs = scaled_leaf(self.graph, node, self.feeds, leaf_value, self.perturb)
            if outs is None:
                outs = scaled_apply(node, [self.read((t.node, t.index)) for t in node.inputs])
            for i, v in enumerate(outs):
                self.made[(node.id, i)] = v
        return self.made[key]

    # --- projections ---

    def plan(self, rng) -> tuple[list, list[_Projected]]:
        """The region's tensors of the input's classes, split into those compared entry
        by entry and groups compared through projections (those a matmul makes)."""
        exact, groups = [], {}
        for n in self.nodes.values():
            for i, t in enumerate(n.outputs):
                key = (n.id, i)
                if not self.stop(self._cls(key)):
                    continue
                if len(t.shape) >= 2 and t.dtype.startswith("float") and self._reaches_matmul(key):
                    g = groups.setdefault(t.shape[:-1], _Projected([], [], []))
                    g.keys.append(key)
                    g.mats.append(rng.standard_normal((t.shape[-1], PROJECTIONS)))
                    g.classes.append(self._cls(key))
                else:
                    exact.append(key)
        return exact, list(groups.values())

    def _reaches_matmul(self, key) -> bool:
        node = self.nodes.get(key[0])
        if node is None:
            return False
        pushed = self._push(node, {key[1]: None}, dry=True)
        if pushed is None:
            return False
        if pushed == "matmul":
            return True
        return any(self._reaches_matmul(k) for k, _, _ in pushed if not self.stop(self._cls(k)))

    def project(self, demands) -> tuple[np.ndarray, int]:
        """``sum key @ (R * 2**e)`` over ``demands`` (``(key, R, e, made)``; ``made``: the
        tensor these nodes make, else as a node reads it), all of one leading shape.
        Splits, concats and adds pass the contraction to their inputs, and a matmul
        ``A @ B`` becomes ``A @ (B @ R)``, ``A`` contracted in turn where ``B @ R`` is a
        matrix (demands on one tensor add up, so it is contracted once); anything else
        is made whole and multiplied."""
        pending: dict[tuple, tuple[np.ndarray, int]] = {}

        def add(key, r, e, made):
            made = made or not self.stop(self._cls(key))
            pending[(key, made)] = _sum_scaled([pending[(key, made)], (r, e)]) if (key, made) in pending \
                else (r, e)

        for key, r, e, made in demands:
            add(key, r, e, made)
        terms = []
        while pending:
            # latest producer first, so that every demand on a node's outputs is in
            (key, made) = max(pending, key=lambda km: self.pos[km[0][0]] if km[1] else -1)
            if not made:
                terms.append(_times(self.read(key), *pending.pop((key, made))))
                continue
            node = self.nodes[key[0]]
            outs = {k[1]: pending.pop((k, m)) for k, m in list(pending) if m and k[0] == node.id}
            pushed = self._push(node, outs)
            if pushed is None:
                terms += [_times(self.make((node.id, i)), *r) for i, r in outs.items()]
            elif isinstance(pushed, tuple):  # a matmul's term
                terms.append(pushed)
            else:
                for k, r, e in pushed:
                    add(k, r, e, False)
        return _sum_scaled(terms)

    def _push(self, node, outs: dict, dry: bool = False):
        """Where ``sum out_i @ R_i`` over ``node``'s outputs (``R_i`` as ``(r, e)``) goes: a
        list of demands ``(key, r, e)`` on its inputs, a term (``"matmul"`` when ``dry``),
        or None (made whole)."""
        types = [t.type for t in node.inputs]
        if not all(t.dtype.startswith("float") for t in list(types) + list(node.outputs)):
            return None
        last = len(node.outputs[0].shape) - 1
        keys = [(t.node, t.index) for t in node.inputs]
        if node.op == "matmul" and node.params.get("activation", "NONE") == "NONE":
            if dry:
                return "matmul"
            p, e = self.project([(keys[1], *outs[0], False)])
            if p.ndim == 2:  # A @ P is a contraction of A's last axis as well
                return [(keys[0], p, e)]
            m, f = self.read(keys[0])
            return normalize(np.matmul(m, p), e + f, owned=True)
        if node.op == "split" and node.params["axis"] % (last + 1) == last:
            if dry:
                return [(keys[0], None, 0)]
            top = max(e for _, e in outs.values())
            r = np.zeros((types[0].shape[-1], next(iter(outs.values()))[0].shape[1]))
            offsets = np.cumsum((0,) + tuple(node.params["sizes"]))
            for i, (ri, e) in outs.items():
                r[offsets[i]:offsets[i + 1]] = ri * pow2(e - top)
            return [(keys[0], r, top)]
        if node.op == "concat" and node.params["axis"] % (last + 1) == last:
            offsets = np.cumsum((0,) + tuple(t.shape[-1] for t in types))
            r, e = outs[0] if not dry else (None, 0)
            return [(k, None if dry else r[offsets[j]:offsets[j + 1]], e) for j, k in enumerate(keys)]
        if node.op == "ewadd" and all(t.shape == node.outputs[0].shape for t in types):
            return [(k, *(outs[0] if not dry else (None, 0))) for k in keys]
        return None


def _signature(node, classes) -> tuple:
    return (node.op, _freeze(node.params), tuple(classes.get((t.node, t.index)) for t in node.inputs),
            node.outputs)


def _freeze(v):
    if isinstance(v, dict):
        return tuple(sorted((k, _freeze(x)) for k, x in v.items()))
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, np.ndarray):
        return (v.dtype.str, v.shape, v.tobytes())
    return v
