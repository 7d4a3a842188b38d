"""One home for every default: what ``optimize`` and the commands that share its
options can be told, as frozen dataclasses.

Each field's ``metadata`` carries its command-line flag and help (``{default}`` in the
help is the field's default), so ``cli_args.add_option_arguments`` builds every
command's options from here and a default is written once: the library, ``taso-egg
optimize``, ``search``, ``extract`` and the benchmarks read the same value.
``tests/test_options.py`` holds every command's parsed defaults equal to these.

This module sits at the bottom of the package (it imports only ``errors``), so the cost
model, saturation and the extractors can take their defaults from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable

from .errors import LimitError, TasoEggError


def option(default, flag: str, help: str, **argparse_extra):
    """A dataclass field that is also a command-line option (``flag``)."""
    return field(default=default, metadata={"flag": flag, "help": help, "argparse": argparse_extra})


# --- saturation ----------------------------------------------------------------------------

# The ceiling's headroom above the node limit is the limit itself, and never less than
# this: a step that adds fewer e-nodes (a few MB) still runs whole, so a small limit
# still stops saturation at the iteration that crosses it, as before the ceiling.
MIN_HEADROOM = 10_000


@dataclass(frozen=True)
class Limits:
    """Saturation stops at whichever limit comes first."""
    nodes: int = option(
        20_000, "--node-limit",  # e-nodes in the tensor language
        "stop after the iteration that passes this many e-nodes (default {default}). The e-graph "
        "never holds more than twice the limit (the limit + 10000 below 10000), even within an "
        "iteration: an iteration whose matches could pass that applies only the rules that fit, "
        "and is the last; peak memory follows")
    iterations: int = option(15, "--iter-limit", "stop after this many iterations (default {default})")
    seconds: float = option(30.0, "--time-limit", "stop saturating after this many seconds (default {default})")
    # Iterations in which multi-pattern rules run (k_multi). Tensat uses 1; 2 lets a
    # merge see the results of the first round (BERT's q/k/v after associativity,
    # NasRNN's concatenated pairs) and, measured on the zoo, beats backtracking search
    # on every model at a few thousand extra e-nodes; 3 blows NasRNN past 50,000.
    multi_iterations: int = option(2, "--multi-iterations",
                                   "iterations in which multi-pattern rules run (k_multi; default {default})")
    # After the first iteration, merges of merges grow combinatorially where many
    # operators share an input (NasRNN: 1,876 -> 11,961 e-nodes in iteration 2, for no
    # cheaper graph), while where they pay they add little (BERT's q/k/v +36 %,
    # Inception-v3's +24 %). So a later multi-pattern step whose matches could add more
    # than this times the e-graph's e-nodes applies only the rules that fit, and
    # saturation goes on without multi-pattern rules. Measured on the zoo: no extracted
    # cost changes.
    multi_growth: float = option(
        1.0, "--multi-growth",
        "after the first iteration, multi-pattern rules apply only where their matches could add "
        "at most this many times the e-graph's e-nodes; past that only the rules that fit apply, "
        "and saturation goes on without multi-pattern rules (default {default})")

    @property
    def ceiling(self) -> int:
        """The most e-nodes saturation lets the e-graph hold at any time, even in the
        middle of an iteration: the node limit plus max(limit, MIN_HEADROOM), twice
        the limit from 10,000 up. (An input graph above it gets no rewrite that could
        add an e-node.)"""
        return self.nodes + max(self.nodes, MIN_HEADROOM)

    def __post_init__(self):
        for name in ("nodes", "iterations", "multi_iterations"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < (0 if name == "multi_iterations" else 1):
                raise LimitError(f"limit {name}={v!r} must be an integer >= "
                                 f"{0 if name == 'multi_iterations' else 1}")
        if not self.seconds > 0:
            raise LimitError(f"limit seconds={self.seconds!r} must be positive")
        if not (isinstance(self.multi_growth, (int, float)) and self.multi_growth > 0):
            raise LimitError(f"limit multi_growth={self.multi_growth!r} must be positive")


# --- extraction ----------------------------------------------------------------------------

# The extractors, by the names their classes carry (``extract.registry`` holds it equal
# to its classes at import): the one list every command offers.
EXTRACTOR_NAMES = ("tree", "greedy-dag", "ilp")
# Those that choose DAGs, whose graphs the profiler covers and the GPU run times (the
# tree extractor, which prices shared subgraphs once per use, is a baseline for studies).
DAG_EXTRACTORS = ("greedy-dag", "ilp")


ATTENTION_FORMS = ("rotary", "kernel", "none")


@dataclass(frozen=True)
class ExtractionOptions:
    # The ILP finds the cheapest DAG the e-graph holds (on NASNet-A 0.716 s of predicted
    # cost against greedy-dag's 0.911 s; scripts/fingerprint.py) and, when its time
    # limit runs out, keeps the best graph found so far. greedy-dag is faster and stays
    # the choice where speed matters more (the runtime form's fusions).
    extractor: str = option("ilp", "--extractor", "the extractor (default {default})",
                            choices=EXTRACTOR_NAMES)
    time_limit: float = option(60.0, "--extract-time-limit",
                               "stop the extractor after this many seconds (default {default}; the ILP "
                               "then keeps its best graph so far)", metavar="S")

    # A decoder's attention: its rotary embedding as onnxruntime's RotaryEmbedding (5 to 6
    # kernels fewer each, exact at any position); the attention itself as
    # GroupQueryAttention only when asked: on CPU its kernel multiplies each query head
    # alone, so it wins on short caches (a Llama step 1.156x against 1.139x at 64 cached
    # positions) and loses on long ones (1.426x against 1.583x at 1023): history.md.
    attention: str = option("rotary", "--attention",
                            "how a decoder's attention is written: rotary (default: its rotary embedding as "
                            "onnxruntime's RotaryEmbedding), kernel (also the attention over the cache as "
                            "GroupQueryAttention, the mask as its bias; exact for any mask), none",
                            choices=ATTENTION_FORMS)

    def __post_init__(self):
        if self.attention not in ATTENTION_FORMS:
            raise TasoEggError(f"unknown attention form {self.attention!r}; choose from {', '.join(ATTENTION_FORMS)}")
        if self.extractor not in EXTRACTOR_NAMES:
            raise TasoEggError(f"unknown extractor {self.extractor!r}; choose from {', '.join(EXTRACTOR_NAMES)}")
        if not (isinstance(self.time_limit, (int, float)) and self.time_limit > 0):
            raise LimitError(f"extraction time limit (--extract-time-limit) must be a positive number "
                             f"of seconds, got {self.time_limit!r}")


# --- costs ---------------------------------------------------------------------------------

# The profile of optimize() on a CPU: onnxruntime is what exported models run in.
DEFAULT_PROFILE = "cpu-ort"
CALIBRATIONS = ("auto", "runtime", "none")
CALIBRATION = "auto"


@dataclass(frozen=True)
class CostOptions:
    profile: str = option(DEFAULT_PROFILE, "--profile",
                          "cost profile: a shipped name (cpu-ort, cpu-numpy), a profile file, or "
                          "'analytic' (default {default})")
    # onnxruntime fuses and re-lays-out what it runs, so a sum of per-operator costs
    # misprices it (a ConvNeXt predicted 1.143x measured 1.045x); one profiled run of
    # the input (a few seconds) scales each operator's costs by what the kind of kernel
    # that runs it measured there (``taso_egg.product.calibrate``). It reads the clock, so 'auto' calibrates only
    # where the decision is timed anyway (measure > 0): with measure=0 the same input
    # gives the same graph.
    calibration: str = option(CALIBRATION, "--calibration",
                              "'runtime': scale the profile's costs by one onnxruntime profile of the "
                              "input, each operator by measured over predicted time of the kind of "
                              "kernel that runs it, so that fused and re-laid-out work is priced as it "
                              "runs (a few seconds; costs then vary a little from run to run); 'none': "
                              "the profile's costs as they are; 'auto': runtime unless --measure is 0 "
                              "(default {default})",
                              choices=CALIBRATIONS)
    # A cost model object (``taso_egg.cost.CostModel``) used instead of ``profile``: for
    # the Python API only (studies with a model of one's own).
    model: Any = None


# --- TASO's backtracking search ----------------------------------------------------------

@dataclass(frozen=True)
class SearchOptions:
    budget: int = option(1000, "--budget", "graphs the search pops from its queue (default {default}, "
                                           "TASO's)", metavar="N")
    alpha: float = option(1.05, "--alpha", "queue graphs cheaper than A x the best cost (default "
                                           "{default}, TASO's; 1 = greedy)", metavar="A")

    def __post_init__(self):
        if not isinstance(self.budget, int) or self.budget < 1:
            raise LimitError(f"budget must be a positive integer, got {self.budget!r}")
        if not self.alpha >= 1.0:
            raise LimitError(f"alpha must be >= 1 (1 = greedy), got {self.alpha!r}")


# --- the decision --------------------------------------------------------------------------

# Predicted gains at or below this fraction are not acted on without measurement: on
# the zoo the cpu-ort profile's predicted speedups missed the measured ones by up to
# 5.5 % (python -m taso_egg.profiling.latency_bench), and gains of 0-1.4 % measured 2-4.5 % slower.
MIN_GAIN = 0.05
# ``measure`` is the most paired rounds the guard (``decide``) may time. The fewest
# rounds before its first look: with ten, the exact signed-rank interval can exclude no
# difference at each look's share of guard.ALPHA (its smallest one-sided p, 2^-10, is
# below 0.025 / 18: nine looks, two candidates), and half of them run each order.
MIN_ROUNDS = 10
# The most rounds by default: a true 3 % gain with 2 % run-to-run noise is confirmed in
# about 25 rounds (tests/test_decide.py); small models, whose rounds take milliseconds,
# can afford the 200 that noisier timings need, and guard.TIME_BUDGET stops large
# ones first.
MAX_ROUNDS = 200
# The most rounds a caller may ask for: past a few hundred the interval narrows by
# little more than the machine's drift, only the wait grows.
MAX_MEASURE = 500


@dataclass(frozen=True)
class DecisionOptions:
    # The library measures by default, as the command does: what replaces a user's
    # model must have paid for itself in the runtime that runs it, and on real exports
    # the cost model's prediction missed measurement by up to 14 % (a ConvNeXt predicted
    # 1.143x measured 1.001x). Studies of the search itself set measure=0 (or call
    # saturate and extract_graph, which never time anything).
    measure: int = option(MAX_ROUNDS, "--measure",
                          f"time the original, its re-export and the result in onnxruntime in paired "
                          f"interleaved rounds until the answer is clear, N rounds at most "
                          f"({MIN_ROUNDS} to {MAX_MEASURE}; default {{default}}; and a time budget), "
                          f"and write the fastest confirmed faster than the original (its speedup's "
                          f"confidence interval above the guard's margin), else the original; 0: "
                          f"skip, and the result is written on its predicted gain, else the original",
                          metavar="N")
    min_gain: float = option(MIN_GAIN, "--min-gain",
                             "with --measure 0, keep the original unless the predicted cost drops by "
                             "more than this fraction (default {default}: the cost model's measured "
                             "error on speedups)", metavar="F")

    def __post_init__(self):
        if not (isinstance(self.min_gain, (int, float)) and 0 <= self.min_gain < 1):
            raise TasoEggError(f"min_gain (--min-gain) must be a fraction in [0, 1), got {self.min_gain!r}")
        check_measure(self.measure)


def check_measure(runs) -> None:
    """LimitError unless ``runs`` is 0 (no timing) or a most-rounds count the guard can
    decide with: from MIN_ROUNDS to MAX_MEASURE."""
    if not (isinstance(runs, int) and not isinstance(runs, bool)
            and (runs == 0 or MIN_ROUNDS <= runs <= MAX_MEASURE)):
        raise LimitError(f"measure (--measure) is the most interleaved rounds the guard may time: "
                         f"0 (no timing) or from {MIN_ROUNDS} to {MAX_MEASURE}, got {runs!r} "
                         f"(fewer than {MIN_ROUNDS} rounds cannot confirm a gain)")


# --- the check -----------------------------------------------------------------------------

@dataclass(frozen=True)
class CheckOptions:
    # Off only for studies that time or count what they would otherwise check; nothing
    # the command writes goes unchecked, so it has no flag.
    verify: bool = True
    seed: int = option(0, "--seed", "seed of the random inputs the check and the timing run on "
                                    "(default {default})")


# --- all of optimize's options -------------------------------------------------------------

@dataclass(frozen=True)
class OptimizeOptions:
    """Everything ``optimize`` can be told, by stage."""
    limits: Limits = field(default_factory=Limits)
    extraction: ExtractionOptions = field(default_factory=ExtractionOptions)
    costs: CostOptions = field(default_factory=CostOptions)
    decision: DecisionOptions = field(default_factory=DecisionOptions)
    check: CheckOptions = field(default_factory=CheckOptions)

    def replace(self, **changes) -> OptimizeOptions:
        """A copy with ``changes``: a stage by its name (``limits=Limits(nodes=5000)``;
        None: the stage's defaults) or a field of one stage by the field's name
        (``extractor="greedy-dag"``, ``measure=0``; every field name is one stage's alone)."""
        stages = {f.name: getattr(self, f.name) for f in fields(self)}
        defaults = {f.name: f.default_factory for f in fields(self)}
        for name, value in changes.items():
            if name in stages:
                stages[name] = defaults[name]() if value is None else value
                continue
            owner = next((s for s, v in stages.items() if name in {f.name for f in fields(v)}), None)
            if owner is None:
                raise TasoEggError(f"optimize has no option {name!r}")
            stages[owner] = replace(stages[owner], **{name: value})
        return OptimizeOptions(**stages)


@dataclass(frozen=True)
class Hooks:
    """What ``optimize`` reports as it goes: ``progress(iteration_stats)`` after each
    saturation iteration, ``phase(message)`` when a later phase starts (and with
    notes), ``measure_progress(done, total)`` after each measured run, and
    ``phase_times`` (a ``taso_egg.product.phases.PhaseTimes``) gets each phase's seconds."""
    progress: Callable | None = None
    phase: Callable[[str], None] | None = None
    measure_progress: Callable[[int, int], None] | None = None
    phase_times: Any = None
