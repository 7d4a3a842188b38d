"""GroupQueryAttention turning the queries and keys itself (its do_rotary): the
operator's semantics against the rotary operators and onnxruntime's kernel, and the
kernel form writing it wherever an export turns whole heads of a size it takes."""

from __future__ import annotations

import numpy as np
import pytest

from taso_egg import executor
from taso_egg.graph import Graph
from taso_egg.onnx_io.exporter import export_onnx
from test_attention import (HEADS, KV_HEADS, _holey_mask, _kernel_form_with_head_size, _mask_bias, _session,
                            _step_feeds)


@pytest.mark.parametrize("packed", [0, 1])
@pytest.mark.parametrize("batch,seq,past,angle_rows", [(2, 1, 5, 2), (2, 4, 0, 1), (1, 3, 4, 1), (3, 4, 5, 3)])
def test_gqa_turning_its_queries_and_keys_computes_what_the_rotary_kernels_do(batch, seq, past, angle_rows, packed):
    """With ``rotary`` the kernel turns the queries and keys by the angles given (one row
    each token, as RotaryEmbedding gets them: any positions), with ``packed`` it reads
    them from one projection: equal to ``rotary`` operators then the kernel, and
    onnxruntime's GroupQueryAttention (do_rotary) equal to both."""
    size, rng = 16, np.random.default_rng(batch * 100 + seq * 10 + past + packed)
    total = past + seq
    widths = (HEADS * size, KV_HEADS * size, KV_HEADS * size)

    def build(turning: bool):
        g = Graph(opset=17)
        qkv = g.new_input((batch, seq, sum(widths)), "qkv")
        past_k, past_v = (g.new_input((batch, KV_HEADS, past, size), n) for n in ("past_k", "past_v"))
        cos, sin = (g.new_input((angle_rows, 1, seq, size // 2), n) for n in ("cos", "sin"))
        bias = g.new_input((batch, 1, seq, total), "bias")
        q, k, v = g.split(qkv, 2, widths)
        if turning:
            ins = [qkv] if packed else [q, k, v]
            ins += [past_k, past_v, qkv, past_k, cos, sin, bias]
        else:
            q = g.add_node("rotary", [q, cos, sin, qkv], num_heads=HEADS)[0]
            k = g.add_node("rotary", [k, cos, sin, qkv], num_heads=KV_HEADS)[0]
            ins = [q, k, v, past_k, past_v, qkv, past_k, bias]
        outs = g.add_node("gqa", ins, num_heads=HEADS, kv_num_heads=KV_HEADS, scale=0.3, nan_to_zero=1, causal=1,
                          rotary=int(turning), packed=packed if turning else 0)
        for name, t in zip(("out", "present_k", "present_v"), outs):
            g.mark_output(t, name)
        return g

    angles = rng.integers(0, 100, (angle_rows, 1, seq, 1)) * rng.random(size // 2)
    feeds = {"qkv": rng.standard_normal((batch, seq, sum(widths))).astype(np.float32),
             "past_k": rng.standard_normal((batch, KV_HEADS, past, size)).astype(np.float32),
             "past_v": rng.standard_normal((batch, KV_HEADS, past, size)).astype(np.float32),
             "cos": np.cos(angles).astype(np.float32), "sin": np.sin(angles).astype(np.float32),
             "bias": _mask_bias(_holey_mask(batch, total, rng), seq)}
    separate, turning = build(False), build(True)
    want = executor.run(separate, feeds)
    assert not np.isnan(want["out"]).any()
    for name, value in executor.run(turning, feeds).items():
        np.testing.assert_allclose(value, want[name], rtol=1e-5, atol=1e-6, err_msg=name)
    model = export_onnx(turning)
    kernels = [n for n in model.graph.node if n.op_type == "GroupQueryAttention"]
    assert "RotaryEmbedding" not in {n.op_type for n in model.graph.node}
    assert [a.i for n in kernels for a in n.attribute if a.name == "do_rotary"] == [1]
    assert (kernels[0].input[1] == "") == bool(packed)
    got = dict(zip(["out", "present_k", "present_v"], _session(model).run(None, feeds)))
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("whole_part", [False, True])
def test_heads_of_16_are_turned_by_the_attention_kernel_itself(whole_part):
    """Where the head size is a multiple of 16 (what GroupQueryAttention's own rotary
    takes), the kernel form writes no RotaryEmbedding: the attention kernel turns the
    queries and keys, also where the export turns them as a partial embedding whose
    part is the whole head (``whole_part``, Phi-3's); equal to the export with holes and
    padding, several new tokens at batch 3 included."""
    model, out = _kernel_form_with_head_size(16, whole_part=whole_part)
    ops = [n.op_type for n in out.graph.node]
    assert "RotaryEmbedding" not in ops and "If" not in ops
    kernels = [n for n in out.graph.node if n.op_type == "GroupQueryAttention"]
    assert [a.i for n in kernels for a in n.attribute if a.name == "do_rotary"] == [1]
    for batch, seq, past in [(2, 1, 5), (2, 5, 0), (3, 4, 6)]:
        feeds = _step_feeds(batch, seq, past, np.random.default_rng(batch + seq + past))
        # _step_feeds sizes the cache by the other module's head size: the step's is 16
        rng = np.random.default_rng(past)
        feeds["past_key"], feeds["past_value"] = (rng.standard_normal((batch, KV_HEADS, past, 16)).astype(np.float32)
                                                  for _ in range(2))
        for a, b in zip(_session(out).run(None, feeds), _session(model).run(None, feeds)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
