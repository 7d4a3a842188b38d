"""A decoder's attention written as onnxruntime's kernels (ops/attention.py,
product/fuse_attention.py): each operator's semantics against onnxruntime's own kernel,
and the rewrite of an exported attention step equal to the export where other tools
are not: left padding, a mask with holes, one new token and several, a batch of
several new tokens on a cache (the input GroupQueryAttention refuses)."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from taso_egg import executor
from taso_egg.graph import Graph
from taso_egg.onnx_io.exporter import export_onnx

HEADS, KV_HEADS, SIZE, HIDDEN = 4, 2, 8, 32


def _session(model):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _mask_bias(mask: np.ndarray, seq: int, no_key: str = "-inf") -> np.ndarray:
    """The additive mask an exporter builds: key j is seen by new token i where the mask
    keeps it and j <= past + i; -inf (or the dtype's minimum) elsewhere."""
    batch, total = mask.shape
    past = total - seq
    seen = (np.arange(total)[None, :] <= past + np.arange(seq)[:, None])[None] & (mask[:, None, :] == 1)
    fill = -np.inf if no_key == "-inf" else np.finfo(np.float32).min
    return np.where(seen, 0.0, fill).astype(np.float32)[:, None]


def _holey_mask(batch: int, total: int, rng) -> np.ndarray:
    """Row 0 left-padded by two, row 1 with a hole in the middle, the others full."""
    mask = np.ones((batch, total), np.int64)
    mask[0, :2] = 0
    if batch > 1 and total > 3:
        mask[1, total // 2] = 0
    return mask


# --- the operators against onnxruntime's kernels -------------------------------------

@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("batch,seq,past", [(2, 1, 5), (2, 4, 0), (1, 3, 4), (3, 4, 5)])
def test_gqa_computes_what_onnxruntimes_kernels_do_for_any_mask(batch, seq, past, causal):
    """One new token on a cache, a left-padded prompt, several tokens on a cache at batch
    1, several at batch 3 (without its causal mask the kernel refuses that one: the
    formula runs), a holey mask each time, rows that see no key included (0, as the
    export's guard after softmax makes them)."""
    rng = np.random.default_rng(batch * 100 + seq * 10 + past)
    total = past + seq
    g = Graph(opset=17)
    q = g.new_input((batch, seq, HEADS * SIZE), "q")
    k, v = (g.new_input((batch, seq, KV_HEADS * SIZE), n) for n in ("k", "v"))
    past_k, past_v = (g.new_input((batch, KV_HEADS, past, SIZE), n) for n in ("past_k", "past_v"))
    bias = g.new_input((batch, 1, seq, total), "bias")
    outs = g.add_node("gqa", [q, k, v, past_k, past_v, q, past_k, bias], num_heads=HEADS, kv_num_heads=KV_HEADS,
                      scale=0.3, nan_to_zero=1, causal=causal)
    for name, t in zip(("out", "present_k", "present_v"), outs):
        g.mark_output(t, name)
    feeds = {n.params["name"]: rng.standard_normal(n.params["shape"]).astype(np.float32) for n in g.inputs()}
    feeds["bias"] = _mask_bias(_holey_mask(batch, total, rng), seq)
    want = executor.run(g, feeds)
    model = export_onnx(g)
    got = dict(zip(["out", "present_k", "present_v"], _session(model).run(None, feeds)))
    assert not np.isnan(want["out"]).any()
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)
    # the kernel itself, where it takes the input: causal off, every row's keys the whole cache
    if not causal and (batch == 1 or seq == 1 or past == 0):
        raw = helper.make_node("GroupQueryAttention", ["q", "k", "v", "past_k", "past_v", "seqlens_k", "total", "",
                                                       "", "", "bias"], ["out", "present_k", "present_v"],
                               domain="com.microsoft", num_heads=HEADS, kv_num_heads=KV_HEADS, causal=0, scale=0.3)
        inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in feeds] + \
            [helper.make_tensor_value_info(n, TensorProto.INT32, None) for n in ("seqlens_k", "total")]
        outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("out", "present_k", "present_v")]
        one = helper.make_model(helper.make_graph([raw], "gqa", inputs, outputs),
                                opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
        kernel = _session(one).run(None, dict(feeds, seqlens_k=np.full(batch, total - 1, np.int32),
                                              total=np.array(total, np.int32)))
        out = np.where(np.isnan(kernel[0]), 0, kernel[0])  # the guard the operator writes after it
        np.testing.assert_allclose(out, want["out"], rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(kernel[1], want["present_k"])


@pytest.mark.parametrize("window", [-1, 3])
@pytest.mark.parametrize("batch,seq,past", [(2, 1, 5), (2, 4, 0), (3, 4, 5)])
def test_gqa_reading_the_key_mask_computes_the_full_mask_and_window(batch, seq, past, window):
    """``key_mask`` (the [B, T] attention_mask in the bias's place) and ``window`` (the
    kernel's local_window_size): our semantics, onnxruntime's kernel as exported, and the
    operator given the full additive mask (causal, padding, window) all equal."""
    rng = np.random.default_rng(batch * 100 + seq * 10 + past + window)
    total = past + seq
    mask = _holey_mask(batch, total, rng)
    full = _mask_bias(mask, seq)
    if window > 0:
        own = past + np.arange(seq)[:, None]
        full = np.where((np.arange(total)[None, :] <= own - window)[None, None], -np.inf, full).astype(np.float32)
    results = []
    for reads_mask in (True, False):
        g = Graph(opset=17)
        q = g.new_input((batch, seq, HEADS * SIZE), "q")
        k, v = (g.new_input((batch, seq, KV_HEADS * SIZE), n) for n in ("k", "v"))
        past_k, past_v = (g.new_input((batch, KV_HEADS, past, SIZE), n) for n in ("past_k", "past_v"))
        last = g.new_input((batch, total), "mask", dtype="int64") if reads_mask else \
            g.new_input((batch, 1, seq, total), "bias")
        outs = g.add_node("gqa", [q, k, v, past_k, past_v, q, past_k, last], num_heads=HEADS,
                          kv_num_heads=KV_HEADS, scale=0.3, nan_to_zero=1, causal=1, key_mask=int(reads_mask),
                          window=window if reads_mask else -1)
        for name, t in zip(("out", "present_k", "present_v"), outs):
            g.mark_output(t, name)
        feeds = {n: rng.standard_normal(t.shape).astype(np.float32) if not results else results[0][0][n]
                 for n, t in (("q", q), ("k", k), ("v", v), ("past_k", past_k), ("past_v", past_v))}
        feeds.update({"mask": mask} if reads_mask else {"bias": full})
        want = executor.run(g, feeds)
        got = dict(zip(["out", "present_k", "present_v"], _session(export_onnx(g)).run(None, feeds)))
        results.append((feeds, want, got))
    (_, ours, kernel), (_, full_mask, _) = results
    for name in ours:
        np.testing.assert_allclose(kernel[name], ours[name], rtol=1e-5, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(ours[name], full_mask[name], rtol=1e-6, atol=1e-7, err_msg=name)


@pytest.mark.parametrize("layout", ["bsnd", "bnsd"])
def test_rotary_computes_what_onnxruntimes_kernel_does_at_any_position(layout):
    rng = np.random.default_rng(3)
    batch, seq, heads, size = 3, 5, 2, 8
    g = Graph(opset=17)
    shape = (batch, seq, heads * size) if layout == "bsnd" else (batch, heads, seq, size)
    x = g.new_input(shape, "x")
    cos, sin = (g.new_input((batch, 1, seq, size // 2), n) for n in ("cos", "sin"))
    g.mark_output(g.add_node("rotary", [x, cos, sin, x], num_heads=heads)[0], "y")
    # angles of arbitrary positions (left padding: any number at any place)
    angles = rng.integers(0, 100, (batch, 1, seq, 1)) * rng.random(size // 2).astype(np.float32)
    feeds = {"x": rng.standard_normal(shape).astype(np.float32), "cos": np.cos(angles).astype(np.float32),
             "sin": np.sin(angles).astype(np.float32)}
    want = executor.run(g, feeds)["y"]
    x4 = feeds["x"].reshape(batch, seq, heads, size).transpose(0, 2, 1, 3) if layout == "bsnd" else feeds["x"]
    first, second = x4[..., :size // 2], x4[..., size // 2:]
    textbook = np.concatenate([first * feeds["cos"] - second * feeds["sin"],
                               second * feeds["cos"] + first * feeds["sin"]], axis=-1)
    if layout == "bsnd":
        textbook = textbook.transpose(0, 2, 1, 3).reshape(shape)
    np.testing.assert_allclose(want, textbook, rtol=1e-5, atol=1e-6)
    model = export_onnx(g)
    assert "RotaryEmbedding" in {n.op_type for n in model.graph.node}
    np.testing.assert_allclose(_session(model).run(None, feeds)[0], want, rtol=1e-5, atol=1e-6)


# --- an exported attention step, rewritten -------------------------------------------

def _int4(w: np.ndarray, block: int = 32):
    """``w`` [K, N] as MatMulNBits holds it: 4-bit symmetric blocks along K, two to a
    byte ([N, K / block, block / 2]), one scale a block."""
    k, n = w.shape
    blocks = w.T.reshape(n, k // block, block)
    scale = np.abs(blocks).max(axis=-1) / 7
    q = (np.clip(np.round(blocks / scale[..., None]), -8, 7) + 8).astype(np.uint8)
    return (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8), scale.astype(np.float32).reshape(-1)


def _decoder_step(repeat_kv: bool = True, int4: bool = False, no_key: str = "-inf",
                  mask: str = "padding", whole_part: bool = False) -> onnx.ModelProto:
    """One attention layer of a Llama-style decoder step as torch's exporter writes it
    (rotary embedding of q and k, the cache grown by concat, the keys and values repeated
    for their group of query heads, scaled scores, the additive causal and padding mask,
    softmax with SDPA's NaN guard), symbolic batch, sequence and past. ``int4``: the
    projections as onnxruntime's MatMulNBitsQuantizer writes them (block 32). ``no_key``:
    what the mask adds for a key not seen, -inf or the dtype's minimum ("min"). ``mask``:
    the causal mask and the padding ("padding"), also a window of 3 keys ("window") or of
    4096 ("wide_window"), or the padding read as ``attention_mask == 1`` ("equal_one": 2
    keeps no key). ``whole_part``: rotary as a partial embedding whose turned part is the
    whole head, concat(turned x[..., :D], x[..., D:]) (transformers' Phi-3)."""
    rng = np.random.default_rng(0)
    group = HEADS // KV_HEADS
    inits = []

    def const(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    shapes = {"wq": (HIDDEN, HEADS * SIZE), "wk": (HIDDEN, KV_HEADS * SIZE), "wv": (HIDDEN, KV_HEADS * SIZE),
              "wo": (HEADS * SIZE, HIDDEN)}
    floats = {n: (rng.standard_normal(shape) * 0.3).astype(np.float32) for n, shape in shapes.items()}
    w = {n: const(n, value) for n, value in floats.items()} if not int4 else {}
    inv_freq = const("inv_freq", (1.0 / 10000 ** (np.arange(0, SIZE, 2) / SIZE)).astype(np.float32)[None, :, None])
    nodes = []

    def node(op, ins, out=None, **attrs):
        out = out or f"t{len(nodes)}"
        nodes.append(helper.make_node(op, ins, [out], **attrs))
        return out

    i64 = lambda name, v: const(name, np.asarray(v, np.int64))  # noqa: E731
    # angles: position_ids [B, S] -> freqs [B, S, D/2] -> concat(f, f) -> cos, sin [B, 1, S, D]
    pos = node("Cast", [node("Unsqueeze", ["position_ids", i64("ax1", [1])])], to=TensorProto.FLOAT)
    freqs = node("Transpose", [node("MatMul", [node("Expand", [inv_freq, node("Concat", [
        node("Gather", [node("Shape", ["position_ids"]), i64("zero_vec", [0])], axis=0), i64("one_vec0", [1]),
        i64("one_vec", [1])], axis=0)]), pos])], perm=[0, 2, 1])
    emb = node("Concat", [freqs, freqs], axis=-1)
    cos = node("Unsqueeze", [node("Cos", [emb]), "ax1"])
    sin = node("Unsqueeze", [node("Sin", [emb]), "ax1"])

    def heads(x, n):  # [B, S, n*D] -> [B, n, S, D]
        return node("Transpose", [node("Reshape", [x, i64(f"shape_{n}_{len(nodes)}", [0, 0, n, SIZE])])],
                    perm=[0, 2, 1, 3])

    def rotate(x):
        if whole_part:  # the part passed through, x[..., D:], is empty
            part, rest = (node("Slice", [x, i64(f"p{a}_{len(nodes)}", [a]), i64(f"e{a}_{len(nodes)}", [SIZE]),
                                         i64(f"x{a}_{len(nodes)}", [3])]) for a in (0, SIZE))
            return node("Concat", [turn(part), rest], axis=-1)
        return turn(x)

    def turn(x):
        first = node("Slice", [x, i64(f"s0_{len(nodes)}", [0]), i64(f"s1_{len(nodes)}", [SIZE // 2]),
                               i64(f"s2_{len(nodes)}", [3])])
        second = node("Slice", [x, i64(f"s3_{len(nodes)}", [SIZE // 2]), i64(f"s4_{len(nodes)}", [SIZE]),
                                i64(f"s5_{len(nodes)}", [3])])
        return node("Add", [node("Mul", [x, cos]), node("Mul", [node("Concat", [node("Neg", [second]), first],
                                                                        axis=-1), sin])])

    def project(x, name):
        if not int4:
            return node("MatMul", [x, w[name]])
        packed, scales = _int4(floats[name])
        k, n = shapes[name]
        out = f"t{len(nodes)}"
        nodes.append(helper.make_node("MatMulNBits", [x, const(name + "_q", packed), const(name + "_scales", scales)],
                                      [out], domain="com.microsoft", K=k, N=n, bits=4, block_size=32))
        return out

    q = rotate(heads(project("x", "wq"), HEADS))
    k = rotate(heads(project("x", "wk"), KV_HEADS))
    v = heads(project("x", "wv"), KV_HEADS)
    present_k = node("Concat", ["past_key", k], "present_key", axis=2)
    present_v = node("Concat", ["past_value", v], "present_value", axis=2)

    def repeated(x):  # transformers' repeat_kv: [B, Hkv, T, D] -> [B, H, T, D]
        if not repeat_kv:
            return x
        shape = node("Shape", [x])
        b, t = (node("Gather", [shape, i64(f"axis{a}_{len(nodes)}", [a])], axis=0) for a in (0, 2))
        wide = node("Concat", [b, i64(f"kvh{len(nodes)}", [KV_HEADS]), i64(f"g{len(nodes)}", [group]), t,
                               i64(f"d{len(nodes)}", [SIZE])], axis=0)
        flat = node("Concat", [b, i64(f"h{len(nodes)}", [HEADS]), t, i64(f"d{len(nodes)}", [SIZE])], axis=0)
        return node("Reshape", [node("Expand", [node("Unsqueeze", [x, i64(f"ax2_{len(nodes)}", [2])]), wide]), flat])

    scale = const("scale", np.asarray(1 / np.sqrt(SIZE), np.float32))
    scores = node("Mul", [node("MatMul", [q, node("Transpose", [repeated(present_k)], perm=[0, 1, 3, 2])]), scale])
    # the mask: key j seen by token i where attention_mask keeps it and j <= past + i
    total = node("Gather", [node("Shape", ["attention_mask"]), i64("one", 1)], axis=0)
    seq = node("Gather", [node("Shape", ["position_ids"]), i64("one_again", 1)], axis=0)
    keys = node("Range", [i64("start", 0), total, i64("step", 1)])
    rows = node("Add", [node("Range", [i64("start2", 0), seq, i64("step2", 1)]), node("Sub", [total, seq])])
    causal = node("LessOrEqual", [keys, node("Unsqueeze", [rows, i64("ax_last", [1])])])
    if mask in ("window", "wide_window"):
        width = i64("width", 3 if mask == "window" else 4096)
        near = node("Greater", [keys, node("Unsqueeze", [node("Sub", [rows, width]), "ax_last"])])
        causal = node("And", [causal, near])
    kept = node("Unsqueeze", ["attention_mask", i64("ax12", [1, 2])])
    kept = node("Equal", [kept, i64("one_kept", 1)]) if mask == "equal_one" else node("Cast", [kept],
                                                                                       to=TensorProto.BOOL)
    bias = node("Where", [node("And", [causal, kept]), const("zero", np.zeros(1, np.float32)),
                          const("no_key", np.full(1, -np.inf if no_key == "-inf" else np.finfo(np.float32).min,
                                                  np.float32))])
    weights = node("Softmax", [node("Add", [scores, bias])], axis=-1)
    weights = node("Where", [node("IsNaN", [weights]), const("zero2", np.zeros((), np.float32)), weights])
    out = node("MatMul", [weights, repeated(present_v)])
    merged = node("Reshape", [node("Transpose", [out], perm=[0, 2, 1, 3]), i64("merge", [0, 0, HEADS * SIZE])])
    nodes.append(helper.make_node("Identity", [project(merged, "wo")], ["y"]))
    f, i = TensorProto.FLOAT, TensorProto.INT64
    inputs = [helper.make_tensor_value_info("x", f, ["batch", "seq", HIDDEN]),
              helper.make_tensor_value_info("attention_mask", i, ["batch", "total"]),
              helper.make_tensor_value_info("position_ids", i, ["batch", "seq"]),
              helper.make_tensor_value_info("past_key", f, ["batch", KV_HEADS, "past", SIZE]),
              helper.make_tensor_value_info("past_value", f, ["batch", KV_HEADS, "past", SIZE])]
    outputs = [helper.make_tensor_value_info("y", f, ["batch", "seq", HIDDEN]),
               helper.make_tensor_value_info("present_key", f, ["batch", KV_HEADS, "total", SIZE]),
               helper.make_tensor_value_info("present_value", f, ["batch", KV_HEADS, "total", SIZE])]
    model = helper.make_model(helper.make_graph(nodes, "step", inputs, outputs, inits),
                              opset_imports=[helper.make_opsetid("", 17)] +
                              ([helper.make_opsetid("com.microsoft", 1)] if int4 else []))
    if not int4:  # (the checker knows no contrib operator)
        onnx.checker.check_model(model, full_check=True)
    return model


def _step_feeds(batch, seq, past, rng, padded=True):
    total = past + seq
    mask = _holey_mask(batch, total, rng) if padded else np.ones((batch, total), np.int64)
    # positions as transformers numbers them: the count of kept tokens before, 1 on padding
    positions = np.where(mask == 1, np.cumsum(mask, axis=1) - 1, 1)[:, past:]
    return {"x": rng.standard_normal((batch, seq, HIDDEN)).astype(np.float32), "attention_mask": mask,
            "position_ids": positions.astype(np.int64),
            "past_key": rng.standard_normal((batch, KV_HEADS, past, SIZE)).astype(np.float32),
            "past_value": rng.standard_normal((batch, KV_HEADS, past, SIZE)).astype(np.float32)}


@pytest.fixture(scope="module")
def steps():
    return {no_key: _decoder_step(no_key=no_key) for no_key in ("-inf", "min")}


FORMS = [("rotary", "-inf"), ("kernel", "-inf"), ("kernel", "min")]


@pytest.fixture(scope="module")
def written(steps):
    """The step optimized in each attention form (as the command does, timing aside)."""
    from taso_egg import optimize_model

    return {(form, no_key): optimize_model(steps[no_key], measure=0, attention=form)[0] for form, no_key in FORMS}


def test_the_attention_kernels_are_written(written):
    ops = {key: [n.op_type for n in m.graph.node] for key, m in written.items()}
    assert "RotaryEmbedding" in ops["rotary", "-inf"] and "Softmax" in ops["rotary", "-inf"]
    assert "If" not in ops["rotary", "-inf"]
    # a 0 / -inf mask: the kernel with its causal mask on takes every input
    assert "GroupQueryAttention" in ops["kernel", "-inf"] and "If" not in ops["kernel", "-inf"]
    assert "Softmax" not in ops["kernel", "-inf"]
    # the dtype's minimum: a row that sees no key averages every key, causal mask or not,
    # so the kernel runs without one, and the formula where it then refuses the input
    branches = {n.op_type for n in written["kernel", "min"].graph.node if n.op_type == "If"
                for a in n.attribute for n in a.g.node}
    assert "GroupQueryAttention" in branches and "Softmax" in branches


@pytest.mark.parametrize("form", ["rotary", "kernel"])
def test_the_angles_are_computed_once_at_half_width(written, form):
    """The kernels read each position's first half of the angles: cos and sin of the
    frequencies themselves (no concat(f, f) to slice in two), the frequencies the
    positions times inv_freq as MatMul broadcasts it (no Expand over the batch). The
    step stays equal to the export (the tests below)."""
    nodes = written[form, "-inf"].graph.node
    made = {o: n for n in nodes for o in n.output}
    for n in nodes:
        if n.op_type in ("Cos", "Sin"):
            assert made[n.input[0]].op_type != "Concat"
    assert "Slice" not in {n.op_type for n in nodes}
    assert not [n for n in nodes if n.op_type == "MatMul" and n.input[0] in made
                and made[n.input[0]].op_type == "Expand"]


@pytest.mark.parametrize("form,no_key", FORMS)
@pytest.mark.parametrize("batch,seq,past", [(2, 1, 5), (2, 1, 9), (2, 5, 0), (1, 3, 4), (3, 4, 6)])
def test_the_rewritten_step_equals_the_export_with_holes_and_padding(steps, written, form, no_key, batch, seq,
                                                                      past):
    """Two cache lengths for one new token, a left-padded prompt, several tokens on a
    cache at batch 1 and at batch 3: logits and present cache equal the export's, rows
    that see no key included."""
    feeds = _step_feeds(batch, seq, past, np.random.default_rng(batch + seq + past))
    want = _session(steps[no_key]).run(None, feeds)
    got = _session(written[form, no_key]).run(None, feeds)
    for name, a, b in zip(("y", "present_key", "present_value"), got, want):
        assert a.shape == b.shape, name
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, err_msg=f"{form}: {name}")


def _key_mask_reads(model) -> bool:
    """Whether the attention kernel's bias is made from attention_mask alone (Cast,
    Unsqueeze, Where, Expand): the export's own mask arithmetic gone."""
    made = {o: n for n in model.graph.node for o in n.output}
    kernels = [n for n in model.graph.node if n.op_type == "GroupQueryAttention"]
    t, chain = kernels[0].input[10], []
    while t in made:
        chain.append(made[t].op_type)
        t = made[t].input[0]
    return t == "attention_mask" and chain == ["Expand", "Where", "Unsqueeze", "Cast"]


def test_the_kernel_reads_the_attention_mask_where_z3_proves_the_bias_causal_and_its_zeros(written):
    """The export's mask, proved (product/key_mask.py) to be the causal mask and
    attention_mask's zeros, becomes four operators on attention_mask; its comparisons
    are gone. The step stays equal to the export (the test above)."""
    ops = [n.op_type for n in written["kernel", "-inf"].graph.node]
    assert _key_mask_reads(written["kernel", "-inf"])
    assert "LessOrEqual" not in ops and "And" not in ops


@pytest.mark.parametrize("mask,proved", [("padding", -1), ("window", 3), ("wide_window", 4096),
                                         ("equal_one", None)])
def test_z3_proves_a_mask_causal_padding_and_its_window_for_every_size_and_nothing_else(mask, proved):
    """The proof is over the dims, not at the sizes a model is priced at: a window of
    4096 keys, which no cache shorter than that shows, is proved as a window of 4096;
    ``attention_mask == 1`` is not the padding (a 2 keeps no key)."""
    from taso_egg.onnx_io.key_masks import key_masks

    model = _decoder_step(mask=mask)
    where = [n for n in model.graph.node if n.op_type == "Where"][0].output[0]
    assert key_masks(model) == ({where: ("attention_mask", proved)} if proved is not None else {})


def _equal_to_the_export(model, out):
    for batch, seq, past in ((2, 1, 6), (3, 4, 6), (2, 5, 0)):
        feeds = _step_feeds(batch, seq, past, np.random.default_rng(seq + past))
        feeds["attention_mask"][-1, -1] *= 2  # 2 keeps its key, read as != 0; none, read as == 1
        want = _session(model).run(None, feeds)
        got = _session(out).run(None, feeds)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mask,width", [("window", 3), ("wide_window", 4096)])
def test_a_sliding_window_is_the_kernels_local_window(mask, width):
    """A mask proved causal, padding and a window of ``width`` keys: the kernel reads
    attention_mask and hides the rest itself (local_window_size), equal to the export
    where the window of 3 hides keys (a cache of 6)."""
    from taso_egg import optimize_model

    model = _decoder_step(mask=mask)
    out = optimize_model(model, measure=0, attention="kernel")[0]
    kernel = [n for n in out.graph.node if n.op_type == "GroupQueryAttention"][0]
    assert _key_mask_reads(out)
    assert {a.name: a.i for a in kernel.attribute}["local_window_size"] == width
    _equal_to_the_export(model, out)


def test_a_mask_read_as_equal_to_one_stays_the_exports():
    """``attention_mask == 1`` is no proof: the kernel gets the export's own mask as its
    bias, and the step is still the export's (a mask of 2s included)."""
    from taso_egg import optimize_model

    model = _decoder_step(mask="equal_one")
    out = optimize_model(model, measure=0, attention="kernel")[0]
    assert "GroupQueryAttention" in [n.op_type for n in out.graph.node] and not _key_mask_reads(out)
    _equal_to_the_export(model, out)


def _kernel_form_with_head_size(size: int, **step):
    """The step exported with heads of ``size`` (and ``step``, _decoder_step's options),
    and written in the kernel form."""
    from taso_egg import optimize_model

    global SIZE
    kept = SIZE
    try:
        SIZE = size
        model = _decoder_step(**step)
        return model, optimize_model(model, measure=0, attention="kernel")[0]
    finally:
        SIZE = kept


def test_an_attention_the_kernel_cannot_take_is_left_as_exported():
    """A head size GroupQueryAttention refuses (not a multiple of 8): the step is
    written without it, and equal."""
    model, out = _kernel_form_with_head_size(6)
    assert "If" not in {n.op_type for n in out.graph.node}
    global SIZE
    kept, SIZE = SIZE, 6
    try:
        feeds = _step_feeds(2, 1, 5, np.random.default_rng(1))
    finally:
        SIZE = kept
    np.testing.assert_allclose(_session(out).run(None, feeds)[0], _session(model).run(None, feeds)[0],
                               rtol=1e-5, atol=1e-5)


def test_an_int4_step_keeps_its_precision_packs_its_projections_and_gets_the_rotary_kernel():
    """The MatMulNBits projections keep their bytes: q, k and v, which read one input,
    become one MatMulNBits over their bytes and scales stacked along N (bit for bit
    what they computed), the output projection stays; the rotary embedding between
    them is written as the kernel; equal to the export, padded."""
    from taso_egg import optimize_model

    model = _decoder_step(int4=True)
    out, _ = optimize_model(model, measure=0, min_gain=0.0)
    ops = [n.op_type for n in out.graph.node]
    assert ops.count("MatMulNBits") == 2 and "RotaryEmbedding" in ops
    stored = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer if t.data_type == TensorProto.UINT8}
    kept = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer if t.data_type == TensorProto.UINT8}
    assert np.array_equal(kept.pop("wo_q"), stored["wo_q"])
    (packed_bytes,) = kept.values()  # q, k and v's, in the order the graph reads them
    assert any(np.array_equal(packed_bytes, np.concatenate([stored[n + "_q"] for n in order]))
               for order in itertools.permutations(("wq", "wk", "wv")))
    packed = next(n for n in out.graph.node if n.op_type == "MatMulNBits" and n.input[0] == "x")
    assert {a.name: a.i for a in packed.attribute}["N"] == (HEADS + 2 * KV_HEADS) * SIZE
    feeds = _step_feeds(2, 3, 5, np.random.default_rng(2))
    for a, b in zip(_session(out).run(None, feeds), _session(model).run(None, feeds)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_the_command_says_how_the_attention_was_written(steps, tmp_path, capsys):
    from taso_egg.cli import main

    src = tmp_path / "step.onnx"
    onnx.save(steps["-inf"], str(src))
    assert main(["optimize", str(src), "-o", str(tmp_path / "out.onnx"), "--measure", "0"]) == 0
    said = capsys.readouterr().err
    assert "attention: 2 rotary embedding(s) as RotaryEmbedding, 0 attention(s)" in said
    assert "--attention kernel writes the attention itself" in said


def test_an_int4_step_in_the_kernel_form_feeds_its_packed_projection_to_the_kernel():
    """Heads of 16, the kernel form: q, k and v packed into one MatMulNBits (bit for bit),
    whose output GroupQueryAttention reads unsplit and turns itself; equal to the export
    with holes and padding, several new tokens at batch 3 included."""
    from taso_egg import optimize_model

    global SIZE
    kept = SIZE
    try:
        SIZE = 16
        model = _decoder_step(int4=True)
        out, _ = optimize_model(model, measure=0, min_gain=0.0, attention="kernel")
        produced = {o: n for n in out.graph.node for o in n.output}
        (kernel,) = [n for n in out.graph.node if n.op_type == "GroupQueryAttention"]
        assert produced[kernel.input[0]].op_type == "MatMulNBits" and kernel.input[1] == ""
        assert {a.name: a.i for a in kernel.attribute}["do_rotary"] == 1
        assert "Split" not in {n.op_type for n in out.graph.node}
        for batch, seq, past in [(2, 1, 5), (2, 5, 0), (3, 4, 6)]:
            feeds = _step_feeds(batch, seq, past, np.random.default_rng(batch + seq + past))
            for a, b in zip(_session(out).run(None, feeds), _session(model).run(None, feeds)):
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    finally:
        SIZE = kept
