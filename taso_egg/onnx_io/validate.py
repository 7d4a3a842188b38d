"""One validation pass over a model read from the user, before anything else runs:
onnx's checker (each node against its operator's schema: arity, attribute types;
single assignment of every tensor) and onnx's shape inference in strict mode (shapes
and types that no operator accepts), then what the operator table cannot model
(values that are not tensors). Each failure is one ``OnnxImportError`` naming the
node; a model that passes is one onnxruntime can at least load. A model that onnx's
checks refuse but onnxruntime loads (a contrib operator registered in the default
domain, as onnxruntime-genai writes SimplifiedLayerNormalization) is what users deploy:
it passes, its unknown nodes carried as opaque ones."""

from __future__ import annotations

from ..errors import NotModelled, OnnxImportError, first_line

# Initializers longer than this are checked without their data: neither the checker
# nor inference reads values, and a copy without them stays small (and under
# protobuf's 2 GB for models read with external data).
_KEEP_ELEMENTS = 64


def validate_model(proto, where: str) -> None:
    """OnnxImportError (``where``: the file, for the message) when ``proto`` breaks
    its operators' schemas or ONNX's rules; NotModelled when it is valid but holds
    values other than tensors (sequences, maps, optionals) in its main graph."""
    import onnx

    light = without_weight_data(proto)
    checked = onnx.ModelProto()
    checked.CopyFrom(light)
    for vi in checked.graph.output:
        # onnx's checker wants every graph output's shape declared; exporters often
        # leave it out and onnxruntime does not need it: declare one (the checker
        # compares no shapes; strict inference below runs without it)
        tensor = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
        if tensor is not None and not tensor.HasField("shape"):
            tensor.shape.SetInParent()
    try:
        onnx.checker.check_model(checked)
        inferred = onnx.shape_inference.infer_shapes(light, check_type=True, strict_mode=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
        if not _runtime_loads(light):
            why = _located(checked, e) if isinstance(e, onnx.checker.ValidationError) else _inference_message(e)
            raise OnnxImportError(f"{where}: not a valid ONNX model: {why}") from None
        inferred = onnx.shape_inference.infer_shapes(light)
    _check_tensors_only(inferred.graph, where)


def checker_complaint(model, carried_ops=frozenset()) -> str:
    """onnx.checker's complaint about ``model`` (its weights' data unread), or "" where
    it has none. An operator it has no schema for is no complaint where it is one of
    ``carried_ops``: operators carried from an input that onnxruntime loaded."""
    import onnx

    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as e:
        message = str(e)
        if not any(f"No Op registered for {op} " in message for op in carried_ops):
            return message
    return ""


def _runtime_loads(light) -> bool:
    """Whether onnxruntime loads ``light`` (its long weights as inputs: loaded, not run)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4
    try:
        ort.InferenceSession(light.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception:  # onnxruntime's own error types: it refuses the model
        return False
    return True


def without_weight_data(proto):
    """A copy of ``proto`` whose long initializers are graph inputs of the same type
    and shape instead (the checker wants data of the declared size, which neither it
    nor inference reads); made field by field, so a model of any size is never copied
    whole."""
    import onnx
    from onnx import helper

    light = onnx.ModelProto()
    copy_fields(proto, light, skip="graph")
    copy_fields(proto.graph, light.graph, skip="initializer")
    inputs = {vi.name for vi in proto.graph.input}
    for init in proto.graph.initializer:
        n = 1
        for d in init.dims:
            n *= d
        if n <= _KEEP_ELEMENTS and init.data_location != onnx.TensorProto.EXTERNAL:
            light.graph.initializer.add().CopyFrom(init)  # inference reads small ones (Reshape's shape)
        elif init.name not in inputs:
            light.graph.input.append(helper.make_tensor_value_info(init.name, init.data_type, init.dims))
    return light


def copy_fields(source, target, skip: str) -> None:
    for fld, value in source.ListFields():
        if fld.name == skip:
            continue
        if hasattr(value, "extend"):  # a repeated field
            getattr(target, fld.name).extend(value)
        elif hasattr(value, "CopyFrom"):
            getattr(target, fld.name).CopyFrom(value)
        else:
            setattr(target, fld.name, value)


def _located(model, error) -> str:
    """The checker's first line, prefixed with the node it is about when a node
    checked alone fails with the same message (the checker's own names only the
    operator)."""
    import onnx

    message = first_line(error)
    ctx = onnx.checker.C.CheckerContext()
    ctx.ir_version = model.ir_version
    ctx.opset_imports = {o.domain: o.version for o in model.opset_import}
    lex = onnx.checker.C.LexicalScopeContext()
    for node in model.graph.node:
        try:
            onnx.checker.C.check_node(node.SerializeToString(), ctx, lex)
        except onnx.checker.ValidationError as e:
            if first_line(e) == message:
                name = node.name or (node.output[0] if node.output else "")
                return f"node {name!r} ({node.op_type}): {message}"
    return message


def _inference_message(error) -> str:
    """Shape inference's message without its boilerplate ("[ShapeInferenceError]
    Inference error(s): ...")."""
    text = first_line(error)
    for noise in ("[ShapeInferenceError] ", "Inference error(s): ", "[TypeInferenceError] "):
        text = text.replace(noise, "")
    return text


_KINDS = {"sequence_type": "a sequence", "map_type": "a map", "optional_type": "an optional",
          "sparse_tensor_type": "a sparse tensor"}


def _check_tensors_only(graph, where: str) -> None:
    for vi in (*graph.input, *graph.output, *graph.value_info):
        kind = vi.type.WhichOneof("value")
        if kind is not None and kind != "tensor_type":
            raise NotModelled(f"{where}: {vi.name!r} is {_KINDS.get(kind, kind)}; the operator table "
                              f"models tensors only")
    for node in graph.node:
        if node.op_type.startswith(("Sequence", "Optional")) or node.op_type in (
                "ConcatFromSequence", "SplitToSequence"):
            raise NotModelled(f"{where}: node {node.name or node.output[0]!r} ({node.op_type}) makes or "
                              f"reads a sequence or optional; the operator table models tensors only")
