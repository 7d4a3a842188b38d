"""One exception family for everything a user can get wrong.

Messages name the node, operator and shapes at fault; the CLI prints them as one
line and exits non-zero instead of showing a traceback.
"""


class TasoEggError(Exception):
    """Base of every error taso-egg raises on purpose."""


class ShapeError(TasoEggError):
    """An operator was given inputs or parameters its shape rule rejects."""


class GraphError(TasoEggError):
    """A graph is malformed: cycle, dangling input, duplicate name, ..."""


class OnnxImportError(TasoEggError):
    """An ONNX model cannot be read or mapped (truncated file, dynamic shape, ...)."""


class NotModelled(OnnxImportError):
    """A valid ONNX model holds what the operator table cannot model (a sequence, a
    map, an optional): ``optimize`` writes such a model unchanged."""


class ExportError(TasoEggError):
    """A graph cannot be written as ONNX."""


class ExecutionError(TasoEggError):
    """A graph could not be run (missing input, kernel failure)."""


class CannotRun(ExecutionError):
    """onnxruntime cannot build an operator the table does not model (a custom
    domain's, one it has no kernel for): what needs its values cannot be computed
    here, so a candidate that only such a run could check gives way to the input."""


class VerificationError(TasoEggError):
    """An optimized graph disagrees numerically with the original."""


class ExtractionError(TasoEggError):
    """An e-graph has no valid (complete, acyclic) extraction, or its file is malformed."""


class RuleError(TasoEggError):
    """A rule file is malformed or a rule is unsound."""


class WorkerError(TasoEggError):
    """The workers' back end (Ray) is not installed, cannot be reached or fails."""


class LimitError(TasoEggError):
    """A limit argument is impossible (negative, zero where not allowed, ...)."""


class ProfileError(TasoEggError):
    """A cost profile is corrupt, foreign or missing."""


class NotADecoder(TasoEggError):
    """A model a generation loop cannot run: not a decoder with a key/value cache, or one
    that fails at a step."""


def first_line(e: Exception) -> str:
    """The first line of a third-party exception's message (onnx and onnxruntime append
    C++ source locations and whole schemas), for one-line errors."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
