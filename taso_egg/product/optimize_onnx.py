"""ONNX in, ONNX out: what ``taso-egg optimize`` does to a file, as one function, so the
command, the benchmark and a user's script run the same path.

The model is read (external data included; opsets before 13 upgraded), imported at
the sizes its symbolic dims are priced at (``dynamic.DynamicModel``), optimized
(``api.optimize``: saturate, extract, decide by measurement, check what is chosen),
and the chosen candidate is made the model to write: the original's own bytes, or
the re-export or the result with the input's symbolic dims, checked in onnxruntime
at two sizes of each (``dynamic.write_symbolic``; a candidate that cannot be written
so gives way to the original, with the reason). Nothing here writes a file.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

from .optimize_graph import OptimizeResult, Writer, optimize
from .dynamic import DynamicModel, write_symbolic
from ..egraph.saturate import tensor_classes
from ..onnx_io.counts import describe
from ..onnx_io.last_position import describe as describe_last_position, parse_last_position, read_last_position
from ..onnx_io.reading import read_model_file, upgraded
from .dims import describe_sizes
from ..options import Hooks, OptimizeOptions
from .phases import PhaseTimes


@dataclass
class OnnxInput:
    """An ONNX file as read: the model (``original``), whether its weights were in
    external data, and its import at the sizes its symbolic dims are priced at."""

    path: str
    original: object
    external_data: bool
    dynamic: DynamicModel

    @classmethod
    def read(cls, path, input_shapes: Mapping[str, Sequence[int]] | None = None,
             fix_shapes: bool = False, last_position: Mapping[str, int] | None = None) -> OnnxInput:
        """Read and import ``path`` (one clear error for what is wrong with it, before
        any work). ``input_shapes`` (input name -> shape) are the sizes to price,
        saturate and time a model with symbolic dims at; with ``fix_shapes`` it is to
        be written with those sizes fixed (so all that depends on them may fold).
        ``last_position`` (output name -> axis): those outputs become their last
        position (``last_position.read_last_position``), and that model is the original."""
        # fed: the weights read once into arrays that the imports, candidates and
        # onnxruntime sessions share, never whole into protobuf
        original, external = _read_as_asked(path, last_position, fed=True)
        reference = upgraded(original)  # what onnxruntime runs as the original
        where = os.fspath(path) if isinstance(path, (str, os.PathLike)) else "model"
        return cls(where, original, external, DynamicModel.load(reference, input_shapes, fixed=fix_shapes))


@dataclass
class OnnxOptimization:
    """What ``optimize_onnx`` made of a file."""

    model: object                 # the model to write (the original's own when it is chosen), a fed.FedModel
    source: OnnxInput             # the file as read (its external data kept by what is written)
    chosen: str                   # "original", "re-export" or "result": what ``model`` is
    result: OptimizeResult
    # lines worth a user's eye that optimize's stats do not hold: what became of the
    # symbolic dims (checked at two sizes, or why the input was written instead)
    notes: list[str] = field(default_factory=list)


def optimize_onnx(source, *, rules=None, options: OptimizeOptions | None = None,
                  hooks: Hooks | None = None) -> OnnxOptimization:
    """Optimize an ONNX file (see the module docstring): ``source`` is an ``OnnxInput``
    or a path (read at the default sizes, symbolic dims kept: they are fixed only
    where ``OnnxInput.read`` is asked to). ``hooks.phase_times`` gets each phase's seconds."""
    hooks = hooks or Hooks()
    if hooks.phase_times is None:
        hooks = replace(hooks, phase_times=PhaseTimes())
    phases = hooks.phase_times
    if not isinstance(source, OnnxInput):
        with phases("reading"):
            source = OnnxInput.read(source)
    dyn = source.dynamic
    phase = (hooks or Hooks()).phase or (lambda message: None)
    phase(f"{source.path}: {describe(source.original)}")
    if dyn.symbolic:
        phase(f"symbolic dims priced, saturated and timed at {describe_sizes(dyn.first)}"
              + (f" (one new token on the cache: {', '.join(sorted(dyn.new_tokens))} = 1, the step a "
                 f"generation loop runs for each token)" if dyn.new_tokens else "") + "; "
              + ("written fixed there (fix_shapes)" if dyn.fixed else
                 f"written symbolic, checked there and at {describe_sizes(dyn.second)}"
                 + (f" and {describe_sizes(dyn.empty)}" if dyn.empty else "")
                 + (f" ({', '.join(held)} held at one size: the model runs at no other)"
                    if (held := [d for d in dyn.first if dyn.first[d] == dyn.second[d]]) else "")))
    symbolic = dyn.symbolic and not dyn.fixed
    # id(candidate graph) -> its SymbolicWrite, made once: the re-export's, and the last
    # extraction's (what is timed is reused when it is chosen)
    writes: dict = {}

    def writable(ext, sat):
        """An extraction written with the input's symbolic dims (what ``optimize`` times
        is what can be written): ("", ()), else why not and the tensors responsible."""
        phase("writing the extracted graph with the input's symbolic dims, checked at both sizes")
        written = write_symbolic(dyn, ext.graph, ext.classes, tensor_classes(sat))
        for key in [key for key in writes if key != id(dyn.graph)]:
            del writes[key]
        writes[id(ext.graph)] = written
        return ("", ()) if written.model is not None else (written.why, written.culprits)

    def as_written(candidate):
        """The model ``candidate`` is written as, what the guard times (None: it cannot
        be written with the input's symbolic dims)."""
        if id(candidate) not in writes:  # the re-export (the result was written by ``writable``)
            phase("writing the re-export with the input's symbolic dims, checked at both sizes")
            writes[id(candidate)] = written = write_symbolic(dyn, candidate)
            if written.model is None:
                phase(f"note: the re-export is no candidate: it cannot be written with the input's "
                      f"symbolic dims ({written.why})")
        return writes[id(candidate)].model

    result = optimize(dyn.graph, rules=rules, options=options, hooks=hooks, reference=dyn.reference,
                      writer=Writer(writable, as_written) if symbolic else None)
    chosen = result.stats.chosen
    out = OnnxOptimization(source.original if chosen == "original" else result.exported_fed, source, chosen, result)
    ext = result.stats.extraction
    if ext.refused:
        last = writes.get(id(ext.graph))
        out.notes.append(f"symbolic dims: {len(ext.refused)} extracted graph(s) held only at the priced sizes "
                         f"(first: {ext.refused[0]}); " +
                         (f"the graph weighed was extracted without the {len(ext.forbidden)} e-node(s) "
                          f"responsible, and holds at both sizes" if last is not None and last.model is not None
                          else "no graph extracted without the e-nodes responsible holds at both sizes"))
    if symbolic and chosen != "original":
        with phases("writing"):
            _keep_symbolic_dims(out, writes.get(id(result.graph)))
    return out


def _keep_symbolic_dims(out: OnnxOptimization, written=None) -> None:
    """The chosen candidate with the input's symbolic dims, checked at two sizes
    (``written``, where already made); else the original, with the reason in ``notes``."""
    result, dyn = out.result, out.source.dynamic
    if written is None and out.chosen == "re-export":
        written = write_symbolic(dyn, dyn.graph)
    elif written is None:
        written = write_symbolic(dyn, result.graph, result.stats.extraction.classes,
                                 tensor_classes(result.stats.saturation))
    if written.model is None:
        out.notes.append(f"result: the input is written instead of the {out.chosen}, which cannot be written "
                         f"with the input's symbolic dims: {written.why}")
        out.model, out.chosen = out.source.original, "original"
        return
    out.notes.append("check: written with the input's symbolic dims, its outputs equal the input's in "
                     f"onnxruntime within {at_sizes(written.errors)} (relative)")
    out.model = written.model


def at_sizes(errors: Mapping[str, float]) -> str:
    """Relative errors by the sizes they were measured at, as one phrase."""
    return "; ".join(f"{e:.2g} at {where}" for where, e in errors.items())


# Past this many bytes of weights a model is written with external data whatever its
# input had: protobuf cannot serialize a message of 2 GB.
EXTERNAL_DATA_BYTES = 1 << 31


@dataclass
class OptimizeReport:
    """What ``optimize_model`` decided and measured, for a caller that does not read the
    stages' own records (``details`` holds them)."""

    written: str                     # "result", "re-export" or "original": what the returned model is
    why: str                         # why the input was written ("" when the result is)
    speedup: float | None            # measured: the written candidate over the original (None: not timed)
    interval: tuple[float, float] | None  # the speedup's interval (the guard's confidence)
    predicted: dict[str, float]      # each candidate's predicted speedup over the original
    phases: dict[str, float]         # wall seconds per phase (reading, saturation, ..., writing)
    seconds: float                   # all of them
    notes: list[str] = field(default_factory=list)
    details: OnnxOptimization | None = field(default=None, repr=False)  # None: carried whole
    interface_change: str = ""       # what the caller asked to change (last_position), "" when nothing

    def headline(self) -> str:
        """One line: what was written, at what speed, and where the time went."""
        if self.speedup is not None and self.written != "original":
            low, high = self.interval
            what = f"{self.written} written, {self.speedup:.3f}x [{low:.3f}, {high:.3f}] measured"
        elif self.written != "original":  # chosen on its predicted cost (measure=0)
            predicted = self.predicted.get(self.written)
            what = f"{self.written} written, not timed" + (f": predicted {predicted:.3f}x" if predicted else "")
        else:
            what = f"the input written: {self.why}"
        phases = ", ".join(f"{name} {s:.1f} s" for name, s in self.phases.items())
        change = f"; {self.interface_change}" if self.interface_change else ""
        return f"{what}{change} ({self.seconds:.1f} s: {phases})"


def optimize_model(model, output=None, *, input_shapes: Mapping[str, Sequence[int]] | None = None,
                   fix_shapes: bool = False, last_position: Mapping[str, int] | Sequence[str] | None = None, rules=None, extra_rules=(), options: OptimizeOptions | None = None,
                   hooks: Hooks | None = None, read_back: bool = True, **option_changes):
    """``model`` (an ``onnx.ModelProto`` or a path) optimized: ``(ModelProto, OptimizeReport)``.

    The returned model has the input's interface (inputs, outputs, names, dtypes,
    symbolic dims) and precision, and was checked against it; it is the input itself
    where nothing was confirmed faster (``report.written`` says which candidate it is,
    ``report.why`` why the input was kept). ``option_changes`` are ``OptimizeOptions``
    fields by name (``measure=0``, ``extractor="greedy-dag"``, ``nodes=5000``), applied
    over ``options``; ``input_shapes`` (input name -> shape) size the symbolic dims
    (``fix_shapes``: written fixed there). ``last_position`` (output names, or name ->
    axis; the axis defaults to 1) is the one change of interface made, on request: those
    outputs become their last position along the axis, as a generation loop reads
    ``logits`` (``report.interface_change`` says so). With ``output`` (a path) the model is written
    there as ``taso-egg optimize`` writes it, all or nothing, with external data
    (``OUT.data``) where the input had it or its weights pass 2 GB, and the model
    returned is that file read back, external data left on disk as ``onnx.load(path,
    load_external_data=False)`` leaves it (``read_back=False``: the model as written from
    memory, a ``fed.FedModel`` or ModelProto, which spares a file with its weights inline
    a second copy of them; the command only counts its operators); without ``output`` the returned model holds
    its weights (past 2 GB too, in memory: ``onnx.save(model, path,
    save_as_external_data=True)`` writes it). A model the operator table cannot model
    (sequences, a custom operator nothing can type) comes back unchanged, with the
    reason. ``rules`` replace the proved corpus, ``extra_rules`` are added to it (or to
    ``rules``), loaded once the model is read. Errors a caller can cause are
    ``TasoEggError``s naming what is wrong."""
    from ..errors import ExportError, NotModelled
    from ..disk.files import check_writable
    from ..onnx_io.exporter import save_atomically
    from ..onnx_io.fed import FedModel, inline

    options = (options or OptimizeOptions()).replace(**option_changes)
    if last_position is not None and not isinstance(last_position, Mapping):
        last_position = parse_last_position([last_position] if isinstance(last_position, str) else last_position)
    change = describe_last_position(last_position) if last_position else ""
    path_given = isinstance(model, (str, os.PathLike))
    if output is not None:
        check_writable(output, ExportError, inputs=[model] if path_given else [])
    start = time.perf_counter()
    phases = hooks.phase_times if hooks is not None and hooks.phase_times is not None else PhaseTimes()
    try:
        with phases("reading"):
            source = OnnxInput.read(model, input_shapes, fix_shapes=fix_shapes, last_position=last_position)
    except NotModelled as e:  # valid, but not what the table models: carried whole
        with phases("writing"):
            original, external = _read_as_asked(model, last_position, validate=False)
            if output is not None:
                save_atomically(original, output, external_data=external)
        why = f"{e}: the input is written unchanged"
        report = OptimizeReport("original", why, None, None, {}, dict(phases.ordered()),
                                time.perf_counter() - start, [change] if change else [], interface_change=change)
        return _returned(original, output, external, read_back), report
    if extra_rules:
        from ..rules.corpus import load_corpus

        rules = list(load_corpus() if rules is None else rules) + list(extra_rules)
    hooks = replace(hooks or Hooks(), phase_times=phases)
    out = optimize_onnx(source, rules=rules, options=options, hooks=hooks)
    external = source.external_data or _weight_bytes(out.model) >= EXTERNAL_DATA_BYTES
    with phases("writing"):
        if output is not None:
            save_atomically(out.model, output, external_data=external)
        returned = out.model if output is not None else \
            (inline(out.model) if isinstance(out.model, FedModel) else out.model)
    st = out.result.stats
    measured = st.guard.comparisons.get(out.chosen) if st.guard is not None else None
    report = OptimizeReport(out.chosen, st.kept_input if out.chosen != "result" else "",
                            measured.ratio if measured else None,
                            (measured.low, measured.high) if measured else None,
                            {name: p.speedup for name, p in st.decision.predictions.items()},
                            dict(phases.ordered()), time.perf_counter() - start,
                            ([change] if change else []) + list(out.notes), out, interface_change=change)
    return _returned(returned, output, external, read_back), report


def _read_as_asked(model, last_position: Mapping[str, int] | None, **read):
    """``read_model_file(model, **read)``, with the outputs the caller reads at their
    last position made so (``read_last_position``) on a copy: a caller's ModelProto is
    never changed."""
    import onnx

    if last_position and isinstance(model, onnx.ModelProto):
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        model = copy
    original, external = read_model_file(model, **read)
    if last_position:
        read_last_position(original, last_position)
    return original, external


def _returned(model, output, external: bool, read_back: bool):
    """The model to hand back: ``model`` (what was written, where there is an output),
    or the file written at ``output`` read back."""
    import onnx

    if output is None or not read_back:
        return model
    return onnx.load(os.fspath(output), load_external_data=not external)


def _weight_bytes(model) -> int:
    """The bytes of ``model``'s initializers (a ModelProto or a FedModel)."""
    from ..onnx_io.fed import array_of

    return sum(array_of(model, t).nbytes for t in model.graph.initializer)
