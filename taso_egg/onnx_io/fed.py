"""Models whose large weights are NumPy arrays beside the protobuf, not inside it.

A ``FedModel`` is an ONNX model whose large initializers are stubs (data_location
EXTERNAL, location ``MEMORY``) with their values in ``arrays``. onnxruntime is given
the arrays themselves (``session_parts``), so candidates that share weights share one
copy of them (a session keeps only what it prepacks beside them), nothing serializes
the weights to bytes (protobuf refuses past 2 GB), and
writing streams the arrays tensor by tensor (into the external-data file, or inline
as the bytes protobuf would write). A model read from a file
becomes one (``feed``) before it is imported; the importer reads the arrays, the
exporter's candidates (``exporter.export_fed``) hold the graph's own arrays.
"""

from __future__ import annotations

import mmap
import os
import weakref
from dataclasses import dataclass, field

import numpy as np

# The stub's location: no file, the arrays are in memory.
MEMORY = "taso-egg-memory"
# Initializers of at least this many bytes are stubs.
STUB_BYTES = 4096


@dataclass
class FedModel:
    """``model`` (an onnx.ModelProto) with its large initializers fed from ``arrays``
    (initializer name -> array). ``graph`` and ``opset_import`` read the model's, so
    code that reads nodes and interfaces takes either."""

    model: object
    arrays: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def graph(self):
        return self.model.graph

    @property
    def opset_import(self):
        return self.model.opset_import

    @property
    def ir_version(self):
        return self.model.ir_version


def is_stub(t) -> bool:
    from onnx import TensorProto

    return t.data_location == TensorProto.EXTERNAL and \
        any(e.key == "location" and e.value == MEMORY for e in t.external_data)


def stub(name: str, array: np.ndarray, like=None):
    """An initializer that says ``array``'s type and shape and holds no data (with the
    other fields of ``like``, the initializer it stands for, where there is one)."""
    from onnx import TensorProto, helper

    t = TensorProto()
    if like is not None:
        for fld, value in like.ListFields():
            if fld.name not in ("raw_data", "external_data", "data_location"):
                _set(t, fld.name, value)
    else:
        t.name = name
        t.data_type = helper.np_dtype_to_tensor_dtype(array.dtype)
        t.dims.extend(array.shape)
    t.data_location = TensorProto.EXTERNAL
    for key, value in (("location", MEMORY), ("offset", "0"), ("length", str(array.nbytes))):
        entry = t.external_data.add()
        entry.key, entry.value = key, value
    return t


def feed(model, base_dir: str | None = None) -> FedModel:
    """``model`` (a ModelProto or a FedModel) as a FedModel: a new ModelProto without the
    large initializers' data, each array copied out once (external data still on disk
    is read from ``base_dir`` tensor by tensor, never into protobuf). A ModelProto
    without large initializers is wrapped as it is."""
    from onnx import TensorProto, numpy_helper

    from .validate import copy_fields

    if isinstance(model, FedModel):
        return model
    large = [t for t in model.graph.initializer if _large(t)]
    if not large:
        return FedModel(model)
    import onnx

    out = onnx.ModelProto()
    copy_fields(model, out, skip="graph")
    copy_fields(model.graph, out.graph, skip="initializer")
    arrays = {}
    for t in model.graph.initializer:
        if not _large(t):
            out.graph.initializer.add().CopyFrom(t)
            continue
        if t.data_location == TensorProto.EXTERNAL:
            array = _read_external(t, base_dir)
        else:
            array = numpy_helper.to_array(t)
        arrays[t.name] = array
        out.graph.initializer.append(stub(t.name, array, like=t))
    return FedModel(out, arrays)


def _large(t) -> bool:
    from onnx import TensorProto

    if is_stub(t):
        return False
    if t.data_location == TensorProto.EXTERNAL:
        return True
    return len(t.raw_data) >= STUB_BYTES if t.HasField("raw_data") else False


def _read_external(t, base_dir: str | None) -> np.ndarray:
    """Tensor ``t``'s external data: a read-only view of its file mapped into memory
    (``release_mapped_pages``), or, where the file cannot be mapped or the tensor is not
    aligned in it, a copy read from it."""
    from onnx import helper
    from onnx.external_data_helper import ExternalDataInfo

    info = ExternalDataInfo(t)
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type))
    path = os.path.join(base_dir or "", info.location)
    count = int(np.prod(t.dims, dtype=np.int64))
    offset = info.offset or 0
    mapped = _mapped(path) if offset % dtype.alignment == 0 else None
    if mapped is not None and offset + count * dtype.itemsize <= len(mapped):
        return np.frombuffer(mapped, dtype=dtype, count=count, offset=offset).reshape(tuple(t.dims))
    array = np.fromfile(path, dtype=dtype, count=count, offset=offset)
    if array.size != count:
        raise OSError(f"{info.location} ends before tensor {t.name!r} does")
    return array.reshape(tuple(t.dims))


# The weight files mapped (weakly: a mapping lives as long as an array viewing it).
_MAPPINGS: list = []


def _mapped(path: str):
    """``path`` mapped read-only, once for all its tensors; None where it cannot be."""
    for ref in list(_MAPPINGS):
        entry = ref()
        if entry is None:
            _MAPPINGS.remove(ref)
        elif entry.path == path:
            return entry
    try:
        with open(path, "rb") as f:
            mapping = _Mapping(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):  # an empty file, or one that cannot be mapped
        return None
    mapping.path = path
    _MAPPINGS.append(weakref.ref(mapping))
    return mapping


class _Mapping(mmap.mmap):
    """A read-only mapping of a weight file that knows its path."""

    path = ""


# A candidate whose weights are mapped from files moves the arrays it computed itself
# (merged projections, say) to a file too where they come to this many bytes in all.
SPILL_BYTES = 256 << 20


def file_backed(model):
    """``model`` (a FedModel whose other weights are views of mapped files; anything
    else is returned as it is) with the arrays it computed itself written to a
    temporary file (deleted as soon as it is made, its space freed when the last view
    goes) and mapped back: their pages then leave this process's memory whenever the
    input's do (``release_mapped_pages``), so that a candidate's merged weights are not
    resident while onnxruntime prepacks the original's beside the original's own.
    Unchanged where they come to less than SPILL_BYTES or the file cannot be written."""
    import tempfile

    if not isinstance(model, FedModel) or not any(_mapped_root(a) for a in model.arrays.values()):
        return model
    computed = {name: a for name, a in model.arrays.items() if not _mapped_root(a)}
    if sum(a.nbytes for a in computed.values()) < SPILL_BYTES:
        return model
    offsets, position = {}, 0
    try:
        with tempfile.TemporaryFile() as f:
            for name, a in computed.items():
                pad = -position % 64
                f.write(b"\0" * pad)
                offsets[name] = position = position + pad
                f.write(np.ascontiguousarray(a).data)
                position += a.nbytes
            f.flush()
            mapping = _Mapping(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):  # no room for it: the arrays stay in memory
        return model
    _MAPPINGS.append(weakref.ref(mapping))
    arrays = dict(model.arrays)
    for name, a in computed.items():
        arrays[name] = np.frombuffer(mapping, dtype=a.dtype, count=a.size, offset=offsets[name]).reshape(a.shape)
    return FedModel(model.model, arrays)


def _mapped_root(a: np.ndarray) -> bool:
    """Whether array ``a`` views a mapped file."""
    while isinstance(a, np.ndarray) and a.base is not None:
        a = a.base
    return isinstance(a.obj if isinstance(a, memoryview) else a, mmap.mmap)


def release_mapped_pages() -> None:
    """Drop the pages of the mapped weight files from this process's memory. They are
    read again, from the page cache, where they are next read: weights a model reads from
    its file count in its memory only while a session or a pass reads them, not beside
    the next session's copies (a 1B-wide Llama's q, k, v, gate and up weights stayed
    resident, unread, while onnxruntime prepacked the result's merged ones)."""
    if not hasattr(mmap, "MADV_DONTNEED"):
        return
    for ref in _MAPPINGS:
        mapping = ref()
        if mapping is not None:
            mapping.madvise(mmap.MADV_DONTNEED)


def array_of(model, t) -> np.ndarray:
    """The value of initializer ``t`` of ``model`` (a ModelProto or a FedModel)."""
    from onnx import numpy_helper

    if is_stub(t):
        return model.arrays[t.name]
    return numpy_helper.to_array(t)


def inline(model):
    """``model`` as a ModelProto with every weight inside it (a copy of each fed array:
    for writing a model that had no external data, or a caller that wants protobuf)."""
    from onnx import numpy_helper

    if not isinstance(model, FedModel):
        return model
    import onnx

    out = onnx.ModelProto()
    out.CopyFrom(model.model)
    for t in out.graph.initializer:
        if is_stub(t):
            t.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(model.arrays[t.name]), t.name))
    return out


def session_parts(model) -> tuple[bytes, list[str], list]:
    """What onnxruntime is given for ``model`` (a ModelProto or a FedModel): the
    serialized model without its large weights, their names, and OrtValues over the
    arrays (not copies: they must outlive the session), to add both as external
    initializers (onnxruntime copies those into the graph while it builds) and as
    shared ones (which the session reads in place: ``timing.make_session``)."""
    import onnxruntime as ort

    fed = feed(model)
    names = list(fed.arrays)
    values = [ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(fed.arrays[n])) for n in names]
    return fed.model.SerializeToString(), names, values


def weights_as_inputs(model) -> tuple[bytes, dict[str, np.ndarray]]:
    """``model`` (a ModelProto or a FedModel) serialized with its large weights as graph
    inputs, and the arrays to feed them: for a run without graph optimizations, where
    this computes what the model computes, and nothing is copied or prepacked while
    the session builds (``session_parts`` costs a copy then); inputs it reads in place."""
    import onnx
    from onnx import helper

    fed = feed(model)
    out = onnx.ModelProto()
    out.CopyFrom(fed.model)
    kept = [t for t in out.graph.initializer if not is_stub(t)]
    declared = {vi.name for vi in out.graph.input}
    out.graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                           for t in out.graph.initializer if is_stub(t) and t.name not in declared)
    del out.graph.initializer[:]
    out.graph.initializer.extend(kept)
    return out.SerializeToString(), fed.arrays


def save_inline(model: FedModel, path: str) -> None:
    """Write ``model`` with every weight inside the file, streamed tensor by tensor:
    the bytes protobuf would write for the whole model (fields in number order, each
    fed array as its tensor's raw_data), without a copy of all the weights in protobuf
    nor of their serialized bytes."""
    import onnx

    def split(message, at: int, skip: str = ""):
        """``message``'s fields numbered below ``at``, and those above, serialized."""
        before, after = type(message)(), type(message)()
        for fld, value in message.ListFields():
            if fld.name != skip:
                _set(before if fld.number < at else after, fld.name, value)
        return before.SerializeToString(), after.SerializeToString()

    tensors = []
    for t in model.model.graph.initializer:
        if not is_stub(t):
            tensors.append((t.SerializeToString(), None))
            continue
        header = onnx.TensorProto()
        header.CopyFrom(t)
        header.ClearField("data_location")
        del header.external_data[:]
        pre, post = split(header, 9)  # raw_data is field 9
        tensors.append((pre, post, memoryview(np.ascontiguousarray(model.arrays[t.name])).cast("B")))
    graph_pre, graph_post = split(model.model.graph, 5, skip="initializer")  # initializer is field 5
    pieces = [graph_pre]
    for parts in tensors:
        if parts[1] is None:
            pieces.append(_key(5, len(parts[0])) + parts[0])
        else:
            pre, post, data = parts
            pieces.append((_key(5, len(pre) + len(_key(9, len(data))) + len(data) + len(post)), pre,
                           _key(9, len(data)), data, post))
    pieces.append(graph_post)
    size = sum(len(p) if isinstance(p, bytes) else sum(len(x) for x in p) for p in pieces)
    model_pre, model_post = split(model.model, 7, skip="graph")  # graph is field 7
    with open(path, "wb") as f:
        f.write(model_pre + _key(7, size))
        for p in pieces:
            for x in ((p,) if isinstance(p, bytes) else p):
                f.write(x)
        f.write(model_post)


def _set(message, name: str, value) -> None:
    field = getattr(message, name)
    if hasattr(field, "extend"):  # a repeated field
        field.extend(value)
    elif hasattr(field, "CopyFrom"):
        field.CopyFrom(value)
    else:
        setattr(message, name, value)


def _key(number: int, length: int) -> bytes:
    """A length-delimited field's tag and length, as protobuf writes them."""
    out = bytearray()
    for v in ((number << 3) | 2, length):
        while v >= 0x80:
            out.append(v & 0x7F | 0x80)
            v >>= 7
        out.append(v)
    return bytes(out)


def save_external(model: FedModel, path: str, data_name: str) -> None:
    """Write ``model`` to ``path`` with each fed array (and every other initializer of
    at least 1 KiB) in ``data_name`` beside it, streamed array by array."""
    import onnx
    from onnx import TensorProto

    from .validate import copy_fields

    out = onnx.ModelProto()
    copy_fields(model.model, out, skip="graph")
    copy_fields(model.model.graph, out.graph, skip="initializer")
    offset = 0
    with open(os.path.join(os.path.dirname(path), data_name), "wb") as data:
        for t in model.model.graph.initializer:
            new = out.graph.initializer.add()
            array = model.arrays.get(t.name) if is_stub(t) else None
            if array is None and not (t.HasField("raw_data") and len(t.raw_data) >= 1024):
                new.CopyFrom(t)
                continue
            payload = np.ascontiguousarray(array).data if array is not None else t.raw_data
            new.CopyFrom(t)
            new.ClearField("raw_data")
            del new.external_data[:]
            new.data_location = TensorProto.EXTERNAL
            length = len(memoryview(payload).cast("B"))
            data.write(payload)
            for key, value in (("location", data_name), ("offset", str(offset)), ("length", str(length))):
                entry = new.external_data.add()
                entry.key, entry.value = key, value
            offset += length
            pad = -offset % 4096  # aligned, so that onnxruntime can map each tensor
            data.write(b"\0" * pad)
            offset += pad
    onnx.save(out, path)
