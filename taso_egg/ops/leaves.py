"""Leaves: graph inputs, weights, and TASO's generated constants.

Constants (const_iconv, const_imm, const_one, const_pool) have no inputs; their value
is a function of their shape alone, so they fold into initializers at export.
"""

from __future__ import annotations

import hashlib

import numpy as np

from .base import OpSpec, Param, TensorType, check_dims, fail, register
from .shapes import Case, P, vec

_LEAF_PARAMS = (Param("name", "symbol", ""), Param("shape", "dims", ()), Param("dtype", "dtype", "float32"))
_LEAF_SHAPE = (Case(P("shape")),)


def _leaf_infer(name):
    def infer(p, ins):
        return [TensorType(check_dims(name, p["shape"], "shape"), p["dtype"])]

    return infer


def _no_kernel(name):
    def kernel(xp, p):
        raise RuntimeError(f"{name} nodes are fed by the executor, not computed")

    return kernel


register(OpSpec(
    name="input", inputs=(0, 0), params=_LEAF_PARAMS, shape=_LEAF_SHAPE, in_rules=False,
    infer=_leaf_infer("input"), kernel=_no_kernel("input"), is_leaf=True,
    doc="A graph input, fed at run time."))

register(OpSpec(
    name="weight", inputs=(0, 0), params=_LEAF_PARAMS, shape=_LEAF_SHAPE, in_rules=False,
    egraph_params=(Param("id", "int", 0),) + _LEAF_PARAMS,  # the id orders weights (wlo/whi)
    infer=_leaf_infer("weight"), kernel=_no_kernel("weight"), is_leaf=True, is_constant=True,
    doc="A trained parameter (initializer). Its data lives in Graph.weight_data."))


def _identity_conv_value(xp, shape, dtype):
    # Output channel o reads input channel o, which sits at local index o % I inside
    # its group; this covers full (I == C) and depth-wise (I == 1) identity kernels.
    o, i, kh, kw = shape
    w = xp.zeros(shape, dtype=dtype)
    for oc in range(o):
        w[oc, oc % i, kh // 2, kw // 2] = 1
    return w


def _const_infer(name, rank=None, check=None):
    def infer(p, ins):
        shape = check_dims(name, p["shape"], "shape")
        if rank is not None and len(shape) != rank:
            fail(name, f"needs a rank-{rank} shape, got {list(shape)}")
        if check:
            check(shape)
        return [TensorType(shape, p["dtype"])]

    return infer


def _check_iconv(shape):
    o, i, kh, kw = shape
    if i == 0 or o % i or kh % 2 == 0 or kw % 2 == 0:
        fail("const_iconv", f"needs out channels divisible by in channels per group and odd "
                            f"kernel sizes, got {list(shape)}")


def _check_square(shape):
    if shape[0] != shape[1]:
        fail("const_imm", f"identity matrix must be square, got {list(shape)}")


_CONST_PARAMS = (Param("shape", "dims", ()), Param("dtype", "dtype", "float32", optional=True))

register(OpSpec(
    name="const_iconv", inputs=(0, 0), params=_CONST_PARAMS, shape=_LEAF_SHAPE,
    infer=_const_infer("const_iconv", 4, _check_iconv),
    kernel=lambda xp, p: [_identity_conv_value(xp, p["shape"], p["dtype"])],
    is_leaf=True, is_constant=True, generated=True, doc="Identity conv kernel: conv(x, it) == x (SAME, stride 1)."))

register(OpSpec(
    name="const_imm", inputs=(0, 0), params=_CONST_PARAMS, shape=_LEAF_SHAPE,
    infer=_const_infer("const_imm", 2, _check_square),
    kernel=lambda xp, p: [xp.eye(p["shape"][0], dtype=p["dtype"])],
    is_leaf=True, is_constant=True, generated=True, doc="Identity matrix: matmul(x, it) == x."))

register(OpSpec(
    name="const_one", inputs=(0, 0), params=_CONST_PARAMS, shape=_LEAF_SHAPE,
    infer=_const_infer("const_one"),
    kernel=lambda xp, p: [xp.ones(p["shape"], dtype=p["dtype"])],
    is_leaf=True, is_constant=True, generated=True, doc="All ones: ewmul(x, it) == x."))

register(OpSpec(
    name="const_pool", inputs=(0, 0), params=_CONST_PARAMS, shape=_LEAF_SHAPE,
    infer=_const_infer("const_pool", 4),
    kernel=lambda xp, p: [xp.full(p["shape"], 1.0 / (p["shape"][2] * p["shape"][3]), dtype=p["dtype"])],
    is_leaf=True, is_constant=True, generated=True,
    doc="Averaging kernel (C,1,kh,kw): a depth-wise conv with it is an average pool."))


register(OpSpec(
    name="scalar", inputs=(0, 0), params=(Param("value", "float", 0.0), Param("dtype", "dtype", "float32", optional=True)),
    shape=(Case(vec()),), infer=lambda p, ins: [TensorType((), p["dtype"])],
    kernel=lambda xp, p: [xp.asarray(p["value"], dtype=p["dtype"])],
    is_leaf=True, is_constant=True,
    doc="A 0-d constant known by its value, so that rules can name it (GELU's 0.5, 1 and "
        "sqrt 2). The bridge puts one in the e-class of every 0-d float weight with data."))


def weight_values(shape, dtype, key: str) -> np.ndarray:
    """Deterministic stand-in data for a weight built without data (keyed by name),
    scaled so that deep random networks keep activations in a sane range."""
    seed = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")
    rng = np.random.default_rng(seed)
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else max(int(np.prod(shape)), 1)
    scale = 1.0 / np.sqrt(max(fan_in, 1))
    return (rng.standard_normal(shape) * scale).astype(dtype)
