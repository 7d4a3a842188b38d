"""The public API: saturate a graph, extract the cheapest equivalent graph, or both.

``optimize`` runs in stages, each with a typed result: saturate (``Saturation``), price
the e-nodes and extract (``Extraction``: the extractor with its own options, its time
limit included, then the graph rebuilt), decide (``min_gain``, ``measure``), and check
the returned graph against the input: exported, in onnxruntime (float32) where that
proves something, else in our executor (float64, region by region). A mismatch raises
VerificationError. ``OptimizeStats`` records every stage.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable

from ..check.onnx_precision import check_precision_kept
from ..check.regions import LocalCheck, check_locally
from ..check.runtime import OnnxCheck, check_float32_proves_nothing, check_onnx_model
from ..check.whole_graph import check_graphs_equivalent, share_weights
from ..cost import CostModel, graph_cost, load_cost_model
from .decide import Decision, decide
from .guard import GuardReport
from ..egraph.convert import build_graph
from ..egraph.pricing import priced_egraph
from ..egraph.saturate import Saturation, saturate, tensor_classes
from ..errors import CannotRun, ExtractionError
from ..graph import Graph
from ..options import ExtractionOptions, Hooks, Limits, OptimizeOptions
from .phases import PhaseTimes
from ..onnx_io.exporter import export_for_check, fed_from_check
from ..onnx_io.key_masks import key_masks
from ..onnx_io.fed import FedModel, feed, inline
from ..rules.corpus import FUSIONS, RuleFamily, load_corpus
from .fuse_attention import fuse_attention
from .join_moves import join_moves
from .pack_nbits import pack_nbits

if TYPE_CHECKING:
    import onnx


@dataclass(frozen=True)
class Writer:
    """How ``optimize``'s candidates are written where that is not the graph exported
    as it is (a model with symbolic dims: ``onnx_optimize``): ``refusal(extraction,
    saturation)`` is ``("", ())`` for an extraction that can be written, else why not
    and sets of its tensors responsible, the narrowest first; ``model(candidate)`` the
    ONNX model a candidate graph (the input graph, or an extraction ``refusal``
    accepted) is written as, or None where it cannot be."""

    refusal: Callable
    model: Callable


@dataclass
class Extraction:
    graph: Graph
    dag_cost: float
    seconds: float
    extractor: str
    status: str
    picks: list[str] = field(default_factory=list)  # the chosen e-node ids (for pictures)
    # the e-class each tensor of ``graph`` was built from, ``(node id, output index) ->
    # class id`` (what check.regions.check_locally compares with the input's tensors)
    classes: dict | None = None
    cpu_seconds: float = 0.0  # this process's CPU time: pricing, the extractor, the rebuild
    chosen: dict = field(default_factory=dict)  # class id -> the e-node id chosen there
    # ``optimize``'s ``writer``: why each earlier extraction was refused, and the e-nodes
    # forbidden for it (this one extracted without them)
    refused: list[str] = field(default_factory=list)
    forbidden: frozenset = frozenset()


@dataclass
class CheckReport:
    """The check stage: which check ran on the returned graph, and what it found."""

    # "onnxruntime" (float32, the written model), "regions" (our executor, float64: the
    # changed regions, ``local``), "whole" (our executor on both whole graphs), ""
    # (none: the input returned, or verify=False)
    kind: str = ""
    seconds: float = 0.0                 # export, onnxruntime, our executor
    # the returned graph, exported, against the input in onnxruntime (float32); None
    # when not run (the input returned, verify=False)
    onnxruntime: OnnxCheck | None = None
    error: float | None = None           # our executor's (float64) relative error; None: not run
    local: LocalCheck | None = None      # what the region check compared

    @property
    def ort_error(self) -> float | None:
        """onnxruntime's relative error; None when not run or skipped (``skipped``)."""
        return self.onnxruntime.error if self.onnxruntime is not None else None

    @property
    def skipped(self) -> str:
        """Why onnxruntime's comparison would prove nothing; "" when it did not."""
        return self.onnxruntime.skipped if self.onnxruntime is not None else ""


@dataclass
class OptimizeStats:
    """What each stage of ``optimize`` did, as the stage's own result, and what the
    whole run measured. Costs in seconds as the cost model predicts."""

    saturation: Saturation          # the e-graph, its iterations, stop reason and times
    extraction: Extraction          # the extractor, its status and times, the graph rebuilt
    decision: Decision              # which candidate is returned and why, the guard's timing
    check: CheckReport              # the check of what is returned
    eclasses: int                   # e-classes of the saturated e-graph
    ops_before: dict[str, int]      # operators that run after export
    ops_after: dict[str, int]
    extracted_cost: float           # the extracted graph
    input_cost: float               # the input, every operator priced alone, no fusions
    total_seconds: float
    cost_lookups: dict[str, int] | None = None    # a profiled model: measured vs estimated
    # wall seconds per phase, each its own (``taso_egg.product.phases``): the caller's PhaseTimes,
    # its phases before optimize (reading the model) included
    phases: PhaseTimes = field(default_factory=PhaseTimes)

    # The decision's record, which most callers read:
    @property
    def chosen(self) -> str:
        """The candidate returned: "original" (the model as given: ``reference``, or
        the input graph when there is none), "re-export" (the input graph exported: the
        importer's clean-up) or "result" (the extracted graph)."""
        return self.decision.chosen

    @property
    def kept_input(self) -> str:
        """Why the input is returned; "" when the result is."""
        return self.decision.kept_input

    @property
    def measured_ms(self) -> dict[str, float] | None:
        """onnxruntime, median ms of each candidate timed; None when not timed."""
        return self.decision.measured_ms

    @property
    def guard(self) -> GuardReport | None:
        """The guard's record when timed: each candidate's ratio to the original with
        its interval and decision, the rounds and seconds timed."""
        return self.decision.guard


@dataclass
class OptimizeResult:
    graph: Graph
    original: Graph
    cost_before: float
    cost_after: float
    cost_model: str
    stats: OptimizeStats
    # what was checked in onnxruntime: an ONNX model, or the ``export_for_check`` pair
    # (model, weights fed) that ``exported`` turns into one when it is first read
    checked: tuple | onnx.ModelProto | None = field(default=None, repr=False)

    @property
    def exported(self) -> onnx.ModelProto | None:
        """``graph`` exported to ONNX, as checked in onnxruntime (the input graph's
        export when the re-export is chosen); None when the original is returned or
        verify is off. Made when read (copying the weights into protobuf is writing's
        cost, not the search's: VGG-19's is 0.5 GB); ``exported_fed`` copies none."""
        return inline(self.exported_fed)

    @property
    def exported_fed(self) -> FedModel | None:
        """``exported`` as an ``onnx_io.fed.FedModel``: its large weights the graph's
        arrays, not copied into protobuf (what a model past 2 GB is written from)."""
        if isinstance(self.checked, tuple):
            self.checked = fed_from_check(*self.checked)
        return None if self.checked is None else feed(self.checked)

    @property
    def speedup(self) -> float:
        return self.cost_before / self.cost_after if self.cost_after > 0 else math.inf


def _proved_key_masks(saturation: Saturation, attention: str) -> dict:
    """The e-classes of the input's masks (``Graph.masks``) proved to be the causal mask,
    maybe a sliding window, and an input's zeros (``onnx_io/key_masks.py``) -> (that
    input's name, the window's width or -1): what the kernel form reads in their place."""
    g = saturation.graph
    if attention != "kernel" or not g.masks:
        return {}
    proved = key_masks(g.source)
    classes = tensor_classes(saturation)
    return {classes[key]: proved[name] for key, name in g.masks.items() if name in proved and key in classes}


def extract_graph(saturation: Saturation, extractor: str = ExtractionOptions.extractor,
                  cost_model: CostModel | None = None, time_limit: float | None = None,
                  forbidden=frozenset(), attention: str = "none", pack: bool = False) -> Extraction:
    """Pick the cheapest graph in a saturated e-graph (DAG cost) and rebuild it: price
    every e-node (but the ``forbidden`` ones), run the extractor (``time_limit``
    seconds; the ILP's default when None), build the chosen graph, with ``pack`` its 4-bit
    products of one activation packed into one (``pack_nbits``), its split trees and
    reshape chains joined (``join_moves``), a decoder's attention in the ``attention``
    form (``fuse_attention``)."""
    from ..extract import EXTRACTORS
    from ..extract.choice_check import used_classes

    if extractor not in EXTRACTORS:
        raise ExtractionError(f"unknown extractor {extractor!r}; choose from {sorted(EXTRACTORS)}")
    cpu_start = time.process_time()
    xgraph, configs = priced_egraph(saturation, cost_model or load_cost_model(), forbidden)
    result = EXTRACTORS[extractor]().extract(xgraph, None, time_limit)
    class_ids, node_ids = xgraph.class_ids, xgraph.node_ids
    picks = [(class_ids[c], node_ids[result.choice[c]]) for c in used_classes(xgraph, result.choice)]
    classes: dict = {}
    graph = build_graph(configs.eg, picks, saturation.graph, saturation.program.opaque, classes)
    if pack:
        graph = pack_nbits(graph, classes)
    # onnxruntime's attention kernels, which no rule writes (they take the cache and the
    # positions as the graph holds them), after the data movement in steps is joined:
    # the kernel takes a packed projection's one split as one tensor
    graph = fuse_attention(join_moves(graph, classes), classes, attention, _proved_key_masks(saturation, attention))
    return Extraction(graph, result.dag_cost, result.seconds, extractor, result.status,
                      [node for _, node in picks], classes, time.process_time() - cpu_start, dict(picks),
                      forbidden=frozenset(forbidden))


def optimize(graph: Graph, *, rules=None, options: OptimizeOptions | None = None, hooks: Hooks | None = None,
             reference=None, writer: Writer | None = None) -> OptimizeResult:
    """Saturate, extract, decide what to return, and check what is returned.

    ``options`` (``taso_egg.options.OptimizeOptions``, every default in one place) say
    how, stage by stage: ``limits`` bound saturation; ``extraction`` names the extractor
    and its time limit; ``costs`` give the cost model (``model``, an object) or
    ``profile`` (a shipped profile's name, a profile path, or "analytic"; see
    ``taso_egg.cost.load_cost_model``) and its ``calibration`` (by default, where the
    decision is timed, scaled by one onnxruntime profile of ``graph``: ``calibrate``;
    where onnxruntime cannot run it, not); ``decision`` says how many runs to time
    (``measure``) and, without timing, the predicted gain that must be passed
    (``min_gain``); ``check`` whether to check (``verify``) and the random inputs' seed.
    ``rules`` default to the proved corpus. Without measurement the result replaces the
    input only when its predicted cost is lower by more than ``min_gain`` (a fraction):
    smaller predicted gains are within the cost model's error and measured as often
    slower as faster. With ``measure`` > 0 (the default) the candidates below are
    exported and timed in onnxruntime by the guard instead (``decide``: paired
    interleaved rounds until the answer is clear, ``measure`` rounds at most).

    Three candidates are weighed (``OptimizeStats.chosen``): the original model as
    given (``reference``, or ``graph`` exported when None), the re-export (``graph``
    exported: the importer's clean-up, constants folded, Shape/Expand/CastLike chains
    gone; a candidate only when ``reference`` is given) and the extracted result. The
    cost model prices the first two alike, so only measurement can tell them apart:
    with ``measure`` > 0 every candidate is timed (one that computes node for node what
    an earlier one does is left out), and the fastest confirmed faster than the
    original (its ratio's interval above 1 + guard.MARGIN; ``OptimizeStats.guard``)
    is returned, whatever the prediction said; else the original. With ``measure`` = 0 the result is returned on its predicted gain
    and the re-export is listed in ``Decision.not_measured`` (``OptimizeStats.decision``).

    With ``verify`` (the default) what is returned, and only that, is checked once on
    random inputs (``OptimizeStats.check``): a returned result or re-export is exported
    and run in onnxruntime (float32) against ``reference`` (the ONNX model ``graph`` was
    read from; ``graph`` exported when None); the exported model is
    ``OptimizeResult.exported``. Where that proves nothing (float32 outputs not finite
    or all zero, round-off past ``check.tolerance.MAX_RTOL``, or onnxruntime cannot run the
    input: ``CheckReport.skipped``) a returned result is checked in our executor instead
    (float64, tracked exponents), only its changed regions, each on the input's own
    tensors at its boundary (``check.regions.check_locally``). The check's tolerance follows
    each output's dtype and the quantization on its path (``check.onnx_precision.rounding_steps``),
    and what is written may not change the model's precision
    (``check.onnx_precision.check_precision_kept``). A candidate no check can run on (a re-export
    onnxruntime's comparison proves nothing for; a result whose input neither
    onnxruntime nor our executor can run, ``errors.CannotRun``) gives way to the
    original, and ``OptimizeStats.kept_input`` says why; where onnxruntime cannot run the input,
    nothing is timed.

    ``hooks`` (``taso_egg.options.Hooks``) report progress: ``progress(iteration_stats)``
    after each saturation iteration, ``phase(message)`` when a later phase starts (and
    with notes), and ``measure_progress(done, total)`` after each measured round.

    ``writer`` (``Writer``), when given, writes the candidates: an extraction it refuses
    has the chosen e-nodes of the first set of tensors responsible that leaves
    something to extract forbidden, and the e-graph extracted again
    (``MAX_REEXTRACTIONS`` times at most; saturation is not redone), so that what is
    timed and returned is the best graph that can be written; where none is found the
    result is no candidate (``Extraction.refused`` says why). The guard times each
    candidate as the writer writes it, not exported at the priced sizes: onnxruntime
    runs the two differently (a BERT exported with its sizes fixed got Gemm and
    SkipLayerNormalization fusions and ran 4 % slower than with its symbolic dims).

    ``hooks.phase_times`` (``taso_egg.product.phases.PhaseTimes``), when given, gets the seconds
    of each phase (beside a caller's own, reading the model say);
    ``OptimizeStats.phases`` holds them either way."""
    options = options or OptimizeOptions()
    hooks = hooks or Hooks()
    phases = hooks.phase_times if hooks.phase_times is not None else PhaseTimes()
    progress, measure_progress = hooks.progress, hooks.measure_progress
    phase = hooks.phase or (lambda message: None)
    extraction, decision_options, seed = options.extraction, options.decision, options.check.seed
    model = options.costs.model or load_cost_model(options.costs.profile)
    graph.validate()
    t0 = time.perf_counter()
    with phases("saturation"):  # the corpus, and the runtime form's own small saturation
        rules = tuple(load_corpus() if rules is None else rules)
        form = runtime_form(graph, rules, model)  # the input as the runtime runs it: what a gain is over
    if options.costs.calibration == "runtime" or (options.costs.calibration == "auto" and decision_options.measure):
        phase("calibrating the costs on one onnxruntime profile of the input")
        with phases("calibration"):
            model = runtime_calibrated(form, model, seed, phase)
    limits = options.limits
    phase(f"saturating with {len(rules)} rules (limits: {limits.nodes} e-nodes, {limits.iterations} iterations, "
          f"{limits.seconds:g} s, multi-pattern iterations {limits.multi_iterations})")
    # Counting e-classes serializes the e-graph: per iteration only for a progress display.
    with phases("saturation"):
        sat = saturate(graph, rules=rules, limits=options.limits, progress=progress,
                       count_classes=progress is not None)
    phase(f"extracting ({extraction.extractor}, time limit {extraction.time_limit:g} s)")
    with phases("extraction"):
        ext = extract_graph(sat, extraction.extractor, model, extraction.time_limit,
                            attention=extraction.attention, pack=True)
        unwritable = ""
        if writer is not None:
            ext, unwritable = _writable_extraction(sat, ext, phases.wrap("writing", writer.refusal), model,
                                                   extraction, phase)
        before, after = graph_cost(form, model), graph_cost(ext.graph, model)
    kernels = ext.graph.op_counts()
    if kernels["rotary"] or kernels["gqa"]:
        hint = (" (--attention kernel writes the attention itself as GroupQueryAttention: faster on short caches, "
                "slower on long ones)" if extraction.attention == "rotary" else "")
        phase(f"attention: {kernels['rotary']} rotary embedding(s) as RotaryEmbedding, {kernels['gqa']} "
              f"attention(s) over the cache as GroupQueryAttention{hint}")
    # Decide first, check what is returned: a result that is not returned needs no
    # check (timing an unchecked candidate writes nothing).
    decision = decide(graph, None if unwritable else ext.graph, before, after, decision_options.min_gain,
                      decision_options.measure, phase, measure_progress, reference, unwritable,
                      phases.wrap("writing", writer.model) if writer is not None else None, phases)
    # The returned graph is checked once: in onnxruntime (float32) where that proves
    # something, else in our executor (float64, tracked exponents).
    t_check = time.perf_counter()
    with phases("check"):
        decision, check_report, checked = _check_returned(graph, sat, ext, decision, reference, options.check.verify,
                                                          seed, phase)
    check_report.seconds = time.perf_counter() - t_check
    stats = OptimizeStats(
        check=check_report,
        total_seconds=time.perf_counter() - t0,
        saturation=sat,
        extraction=ext,
        decision=decision,
        eclasses=sat.iterations[-1].eclasses if progress is not None else sat.eclasses(),
        ops_before=graph.op_counts(runtime_only=True),
        ops_after=decision.graph.op_counts(runtime_only=True),
        extracted_cost=after,
        input_cost=graph_cost(graph, model),
        cost_lookups=model.lookups() if hasattr(model, "lookups") else None,
        phases=phases,
    )
    cost_after = after if decision.graph is ext.graph else before
    return OptimizeResult(decision.graph, graph, before, cost_after, getattr(model, "name", "cost model"),
                          stats, checked)


def _check_returned(graph: Graph, sat: Saturation, ext: Extraction, decision: Decision, reference, verify: bool,
                    seed: int, phase) -> tuple[Decision, CheckReport, object]:
    """The returned candidate checked once (see ``optimize``): the decision (the input's,
    where no check can run on the candidate), the check's report, and what was checked
    in onnxruntime (None where nothing was)."""
    if not verify or decision.chosen == "original":
        return decision, CheckReport(), None
    check, check_error, local = "", None, None
    ort, written = _check_in_onnxruntime(graph, decision.graph, reference, phase, decision.exported, seed)
    unchecked = ""  # why no check can run on the candidate: then the input is returned
    if ort.error is not None:
        check = "onnxruntime"
    elif decision.chosen == "result":
        try:
            check, check_error, local = _check_numerically(graph, sat, ext, seed, phase, ort.skipped)
        except CannotRun as e:  # an operator neither onnxruntime nor the table runs
            unchecked = f"{ort.skipped}, and our executor cannot run the input either ({e})"
    else:  # the input exported: our executor would compare the graph with itself
        unchecked = f"{ort.skipped}, and the re-export can be checked nowhere else"
    if unchecked:
        phase(f"note: no check can run on the {decision.chosen}: {unchecked}; the input is returned")
        decision = Decision(graph, f"no check can run on the {decision.chosen}: {unchecked}",
                            decision.measured_ms, "original", predictions=decision.predictions)
    elif not ort.reference_run and not (local is not None and local.outputs_beyond_float32):
        # the written model's float32 outputs proved nothing: neither may the input's
        check_float32_proves_nothing(export_for_check(graph) if reference is None else reference, graph,
                                     ort.skipped, seed)
    return decision, CheckReport(check, 0.0, ort, check_error, local), None if unchecked else written


# Extractions after the first that the writer may refuse: each forbids more e-nodes
# (extraction is cheap next to saturation, which is not redone).
MAX_REEXTRACTIONS = 8


def _writable_extraction(sat: Saturation, ext: Extraction, writable, model, options: ExtractionOptions,
                         phase) -> tuple[Extraction, str]:
    """Extract again, without the e-nodes ``writable`` names responsible, until what is
    extracted can be written: that extraction, its ``refused`` the reasons on the way,
    and ""; else the last one refused and why no writable graph was found."""
    forbidden: set = set()
    refused: list[str] = []
    ext = replace(ext, refused=refused)
    while True:
        why, culprits = writable(ext, sat)
        if not why:
            return ext, ""
        refused.append(why)
        if len(refused) > MAX_REEXTRACTIONS:
            return ext, f"{why}, after {MAX_REEXTRACTIONS} extractions without the e-nodes responsible"
        again, tried = None, False
        for tensors in culprits:  # the narrowest first; a wider one where nothing is left to extract
            chosen = (ext.chosen.get((ext.classes or {}).get(key)) for key in tensors)
            more = {node for node in chosen if node is not None} - forbidden
            if not more:
                continue
            tried = True
            phase(f"note: the extracted graph cannot be written: {why}; extracting again without the "
                  f"{len(more)} e-node(s) responsible ({len(forbidden | more)} in all)")
            try:
                again = extract_graph(sat, options.extractor, model, options.time_limit, frozenset(forbidden | more),
                                      options.attention, pack=True)
            except ExtractionError:
                continue
            forbidden |= more
            break
        if again is None:
            return ext, f"{why}, and " + ("without the e-nodes responsible nothing can be extracted" if tried
                                          else "no e-node could be found responsible")
        # the time reported is every extraction's, the refused ones' too
        ext = replace(again, refused=refused, seconds=ext.seconds + again.seconds,
                      cpu_seconds=ext.cpu_seconds + again.cpu_seconds)


def runtime_calibrated(graph: Graph, model: CostModel, seed: int = 0, phase=None) -> CostModel:
    """``model`` calibrated on one onnxruntime profile of ``graph`` (``calibrate``; for
    ``optimize``, the input in its runtime form, whose cost is what a gain is over);
    ``model`` itself, with a note to ``phase``, where the graph cannot be exported or
    onnxruntime cannot run it (the guard, which times the same, then keeps the input)."""
    from .calibrate import calibrated_cost
    from ..executor import random_inputs

    try:
        return calibrated_cost(graph, model, random_inputs(graph, seed))
    except Exception as e:  # onnxruntime raises its own exception types; export, ours
        if phase is not None:
            phase(f"note: costs not calibrated: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        return model


def _check_numerically(graph: Graph, sat: Saturation, ext: Extraction, seed: int, phase,
                       why: str) -> tuple[str, float, LocalCheck | None]:
    """The returned result against ``graph`` in our executor (float64, tracked
    exponents), where onnxruntime's float32 comparison would prove nothing (``why``):
    region by region when the result's tensors carry their e-classes ("regions", with
    the ``LocalCheck``), else the whole graphs ("whole"); and the worst relative error."""
    if ext.classes is None:
        phase(f"checking the extracted graph in our executor (float64, whole graphs): {why}")
        return "whole", check_graphs_equivalent(graph, ext.graph, seed=seed), None
    phase(f"checking the extracted graph in our executor (float64, changed regions): {why}")
    local = check_locally(graph, ext.graph, tensor_classes(sat), ext.classes, seed=seed, outputs=True)
    return "regions", local.error, local


def _check_in_onnxruntime(graph: Graph, result: Graph, reference, phase, exported=None, seed: int = 0):
    """The returned graph's check (``exported``: its ONNX, when already made) against
    ``reference`` (or ``graph`` exported) in onnxruntime, float32, on random inputs:
    a ``check.runtime.OnnxCheck`` (skipped, with the reason, where it would prove nothing),
    and what was run: ``exported``, else the ``export_for_check`` pair."""
    phase("checking the written model in onnxruntime against the input")
    share_weights(graph, result)  # stand-in weights are made once, not again for the result
    # Where nothing is exported yet (not timed), both graphs run with their weights fed
    # rather than copied into protobuf and then into onnxruntime; the model to write is
    # exported by the same exporter, weights as initializers, once the check is done.
    written = export_for_check(result) if exported is None else exported
    if reference is not None:  # the precision is the user's, whatever the numbers say
        check_precision_kept(reference, written)
    check = check_onnx_model((lambda: export_for_check(graph)) if reference is None else reference,
                             written, graph, seed=seed)
    return check, written


def runtime_form(graph: Graph, rules, model: CostModel, fusions: RuleFamily = FUSIONS) -> Graph:
    """``graph`` as a runtime runs it: with the ``fusions`` among ``rules`` applied
    and nothing else; ``graph`` itself when none applies or pays. cuDNN and onnxruntime fuse activations and residual adds into convolutions
    by themselves, so a predicted gain must be measured from there, not from every
    operator priced alone."""
    fused_by_runtime = fusions.of(rules)
    if not fused_by_runtime:
        return graph
    sat = saturate(graph, rules=fused_by_runtime, limits=Limits(iterations=4, multi_iterations=0),
                   count_classes=False)
    fused = extract_graph(sat, "greedy-dag", model).graph
    return fused if graph_cost(fused, model) < graph_cost(graph, model) else graph


def runtime_cost(graph: Graph, rules, model: CostModel) -> float:
    return graph_cost(runtime_form(graph, rules, model), model)
