"""An ONNX model read: a path, bytes or ModelProto to a ModelProto (or a
``fed.FedModel``) with its external data, its opset checked, validated, and upgraded
to ``versions.MIN_OPSET`` when older; one OnnxImportError naming what is wrong
otherwise."""

from __future__ import annotations

import os

from ..errors import OnnxImportError, TasoEggError, first_line
from ..ops.versions import MIN_OPSET
from .fed import FedModel, feed
from .validate import validate_model


def read_model(model):
    """The ModelProto of a path, bytes or ModelProto, with any external data loaded;
    one OnnxImportError naming what is wrong otherwise."""
    return read_model_file(model)[0]


def read_model_file(model, validate: bool = True, fed: bool = False):
    """``(proto, external)``: as ``read_model``, and whether the file kept its weights
    in external data (so that what is written back can keep them apart too). With
    ``validate``, a model read from a file or bytes passes ``validate.validate_model``.
    With ``fed``, the model is a ``fed.FedModel``: its large weights arrays, external
    data read tensor by tensor, never whole into protobuf."""
    import onnx
    from google.protobuf.message import DecodeError

    if isinstance(model, onnx.ModelProto) and fed:  # a caller's model in memory: read as a file would be
        return _fed_in_memory(model, validate), False
    if isinstance(model, (onnx.ModelProto, FedModel)):
        return model, False
    where, external = "bytes", False
    try:
        if isinstance(model, (bytes, bytearray)):
            proto = onnx.load_from_string(bytes(model))
        else:
            where = os.fspath(model)
            if os.path.isdir(where):
                raise OnnxImportError(f"{where}: is a folder, not an ONNX file")
            if not os.path.isfile(where):
                raise OnnxImportError(f"{where}: no such file")
            proto = onnx.load(where, load_external_data=False)
            external = has_external_data(proto)
            if external and not fed:
                _load_external_data(proto, where)
    except TasoEggError:
        raise
    except (DecodeError, ValueError, RuntimeError, OSError) as e:
        raise OnnxImportError(f"{where}: not a readable ONNX model ({type(e).__name__}: {e})") from None
    if not proto.graph.node and not proto.graph.output:
        raise OnnxImportError(f"{where}: not an ONNX model (no graph)")
    _check_opset(proto, where)
    if validate:
        validate_model(proto, where)
    if fed:
        try:
            proto = feed(proto, os.path.dirname(os.path.abspath(where)) if where != "bytes" else None)
        except (ValueError, OSError) as e:
            raise OnnxImportError(f"{where}: its external weight data cannot be read ({first_line(e)})") from None
    return proto, external


def _fed_in_memory(proto, validate: bool) -> FedModel:
    """A ModelProto given in memory, checked as a file is and fed. Its weights must be
    in it: external data it still points to has no folder to be read from."""
    where = "model"
    if has_external_data(proto):
        raise OnnxImportError(f"{where}: its weights point to external data files that were not loaded; "
                              f"pass the model's path, or load it with onnx.load(path)")
    if not proto.graph.node and not proto.graph.output:
        raise OnnxImportError(f"{where}: not an ONNX model (no graph)")
    _check_opset(proto, where)
    if validate:
        validate_model(proto, where)
    return feed(proto)


def has_external_data(proto) -> bool:
    """Whether any initializer keeps its data in another file (not loaded yet)."""
    from onnx import TensorProto

    return any(t.data_location == TensorProto.EXTERNAL for t in proto.graph.initializer)


def _load_external_data(proto, path: str) -> None:
    from onnx import checker
    from onnx.external_data_helper import load_external_data_for_model

    try:
        load_external_data_for_model(proto, os.path.dirname(os.path.abspath(path)))
    except (checker.ValidationError, OSError) as e:
        raise OnnxImportError(f"{path}: its external weight data cannot be read "
                              f"({first_line(e)})") from None


def _check_opset(proto, where) -> None:
    import onnx

    opset, newest = default_opset(proto), onnx.defs.onnx_opset_version()
    if opset > newest:
        raise OnnxImportError(f"{where}: model uses opset {opset}; the installed onnx "
                              f"{onnx.__version__} knows opsets up to {newest}")
    if opset < 1:
        raise OnnxImportError(f"{where}: model declares opset {opset}, which does not exist")


def upgraded(proto):
    """``proto`` converted to opset MIN_OPSET when it is older (onnxruntime runs no
    opset before 7, and the importers read the sizes and axes that opset 13 moved to
    inputs); ``proto`` itself otherwise."""
    from onnx import version_converter

    opset = default_opset(proto)
    if opset >= MIN_OPSET:
        return proto
    try:
        if isinstance(proto, FedModel):  # the stubs convert as they are, the arrays stay
            return FedModel(version_converter.convert_version(proto.model, MIN_OPSET), proto.arrays)
        return version_converter.convert_version(proto, MIN_OPSET)
    except Exception as e:
        raise OnnxImportError(f"model uses opset {opset}; converting it to opset "
                              f"{MIN_OPSET} failed: {first_line(e)}") from None


def default_opset(proto) -> int:
    for o in proto.opset_import:
        if o.domain in ("", "ai.onnx"):
            return o.version
    raise OnnxImportError("model imports no version of the default ONNX domain")
