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

from dataclasses import dataclass, field
from typing import Mapping, Sequence

from .api import OptimizeResult, Writer, optimize
from .dynamic import DynamicModel, write_symbolic
from .egraph.saturate import tensor_classes
from .onnx_io.counts import describe
from .onnx_io.reading import read_model_file, upgraded
from .onnx_io.symbolic import describe_sizes
from .options import Hooks, OptimizeOptions


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
             fix_shapes: bool = False) -> OnnxInput:
        """Read and import ``path`` (one clear error for what is wrong with it, before
        any work). ``input_shapes`` (input name -> shape) are the sizes to price,
        saturate and time a model with symbolic dims at; with ``fix_shapes`` it is to
        be written with those sizes fixed (so all that depends on them may fold)."""
        # fed: the weights read once into arrays that the imports, candidates and
        # onnxruntime sessions share, never whole into protobuf
        original, external = read_model_file(path, fed=True)
        reference = upgraded(original)  # what onnxruntime runs as the original
        return cls(str(path), original, external, DynamicModel.load(reference, input_shapes, fixed=fix_shapes))


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
    where ``OnnxInput.read`` is asked to)."""
    if not isinstance(source, OnnxInput):
        source = OnnxInput.read(source)
    dyn = source.dynamic
    phase = (hooks or Hooks()).phase or (lambda message: None)
    phase(f"{source.path}: {describe(source.original)}")
    if dyn.symbolic:
        phase(f"symbolic dims priced, saturated and timed at {describe_sizes(dyn.first)}; "
              + ("written fixed there (fix_shapes)" if dyn.fixed else
                 f"written symbolic, checked there and at {describe_sizes(dyn.second)}"))
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
