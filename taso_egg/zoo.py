"""TASO's benchmark graphs, built with the builder API (REFERENCE.md), each with a
small variant for tests."""

from __future__ import annotations

from .graph import Graph, Tensor, new_graph


def bert(layers: int = 8, batch: int = 16, seq: int = 64, hidden: int = 1024, heads: int = 16) -> Graph:
    """TASO's BERT: relu of the input, then attention layers (q, k, v projections,
    per-head batched matmuls, output projection)."""
    g = new_graph()
    rows, head = batch * seq, hidden // heads
    t = g.relu(g.new_input((rows, hidden), name="x"))
    for layer in range(layers):
        q, k, v = (g.matmul(t, g.new_weight((hidden, hidden), name=f"l{layer}.w{n}")) for n in "qkv")
        q = g.transpose(g.reshape(q, (batch, seq, heads, head)), (0, 2, 1, 3))
        k = g.transpose(g.reshape(k, (batch, seq, heads, head)), (0, 2, 3, 1))
        v = g.transpose(g.reshape(v, (batch, seq, heads, head)), (0, 2, 1, 3))
        att = g.matmul(g.matmul(q, k), v)
        att = g.reshape(g.transpose(att, (0, 2, 1, 3)), (rows, hidden))
        t = g.matmul(att, g.new_weight((hidden, hidden), name=f"l{layer}.wo"))
    g.mark_output(t, "y")
    return g


def bert_small(layers: int = 2) -> Graph:
    return bert(layers=layers, batch=2, seq=8, hidden=32, heads=4)


def _combine(g: Graph, x: Tensor, h: Tensor, hidden: int, name: str) -> Tensor:
    w1 = g.new_weight((x.dim(1), hidden), name=f"{name}.wx")
    w2 = g.new_weight((h.dim(1), hidden), name=f"{name}.wh")
    return g.add(g.matmul(x, w1), g.matmul(h, w2))


def _nas_cell(g: Graph, state: Tensor, x: Tensor, hidden: int, step: int) -> Tensor:
    t = [_combine(g, x, state, hidden, f"s{step}.c{i}") for i in range(8)]
    mid = [g.add(g.relu(t[0]), g.sigmoid(t[3])),
           g.add(g.sigmoid(t[1]), g.tanh(t[2])),
           g.mul(g.sigmoid(t[4]), g.tanh(t[5])),
           g.mul(g.sigmoid(t[6]), g.relu(t[7]))]
    mid.append(g.add(g.sigmoid(mid[1]), g.tanh(mid[2])))
    mid.append(g.mul(g.tanh(mid[0]), g.tanh(mid[3])))
    mid.append(g.mul(g.tanh(mid[4]), g.tanh(mid[5])))
    return g.tanh(mid[6])


def nasrnn(steps: int = 5, hidden: int = 512, batch: int = 1) -> Graph:
    """TASO's NasRNN: each cell combines 8 x.W1 + h.W2 pairs through a fixed tree of
    relu/sigmoid/tanh and add/mul."""
    g = new_graph()
    state = g.new_input((batch, hidden), name="h0")
    for step in range(steps):
        x = g.new_input((batch, hidden), name=f"x{step}")
        state = _nas_cell(g, state, x, hidden, step)
    g.mark_output(state, "h")
    return g


def nasrnn_small(steps: int = 2) -> Graph:
    return nasrnn(steps=steps, hidden=16)


MODELS = {
    "bert": bert,
    "bert-small": bert_small,
    "nasrnn": nasrnn,
    "nasrnn-small": nasrnn_small,
}
