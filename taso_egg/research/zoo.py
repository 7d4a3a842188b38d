"""TASO's benchmark graphs, built with the builder API (REFERENCE.md, "Benchmark
graphs"), each with a small variant for tests.

Conventions shared by the CNNs: TASO's graphs are conv + relu, so batchnorm is left
out (at inference it folds into the conv anyway) and convs and fully connected layers
carry no bias; weights are named ``<block>.<layer>.w``. Padding follows TASO: "SAME"
(TensorFlow's rule) wherever the original keeps the spatial size or halves it with
padding, "VALID" where it pads nothing. Average pools count padding (TASO's pool,
and PyTorch's default). A classification head is global average pool + reshape +
matmul wherever the original has one; ResNet-50 is TASO's stem-less, head-less cut.
"""

from __future__ import annotations

from ..graph import Graph, Tensor, new_graph


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


# --- shared CNN pieces -------------------------------------------------------------------

def _conv(g: Graph, x: Tensor, out_channels: int, kernel, name: str, strides=(1, 1),
          padding="SAME", activation="RELU", groups: int = 1) -> Tensor:
    """A bias-free conv whose weight is ``name.w``; ``kernel`` is k or (kh, kw)."""
    kh, kw = (kernel, kernel) if isinstance(kernel, int) else kernel
    w = g.new_weight((out_channels, x.dim(1) // groups, kh, kw), name=f"{name}.w")
    return g.conv2d(x, w, strides=strides, padding=padding, activation=activation)


def _fc(g: Graph, x: Tensor, out_features: int, name: str, activation="NONE") -> Tensor:
    return g.matmul(x, g.new_weight((x.dim(1), out_features), name=f"{name}.w"), activation)


def _classifier(g: Graph, x: Tensor, classes: int) -> Tensor:
    """Global average pool, flatten, fully connected: the usual CNN head."""
    t = g.reshape(g.global_avgpool(x), (x.dim(0), x.dim(1)))
    return _fc(g, t, classes, "fc")


def _bottleneck(g: Graph, x: Tensor, width: int, out_channels: int, stride: int,
                groups: int, name: str) -> Tensor:
    """1x1 -> 3x3 (strided, grouped) -> 1x1, plus the input or, when the shape
    changes, its 1x1 projection (no relu, as in the original); relu after the add.
    The stride sits on the 3x3 conv (as in TASO's and torchvision's ResNets)."""
    t = _conv(g, x, width, 1, f"{name}.conv1")
    t = _conv(g, t, width, 3, f"{name}.conv2", strides=(stride, stride), groups=groups)
    t = _conv(g, t, out_channels, 1, f"{name}.conv3", activation="NONE")
    if stride > 1 or x.dim(1) != out_channels:
        x = _conv(g, x, out_channels, 1, f"{name}.shortcut", strides=(stride, stride),
                  activation="NONE")
    return g.relu(g.add(x, t))


def _bottleneck_stages(g: Graph, t: Tensor, blocks, widths, expansion: int, groups: int) -> Tensor:
    for s, (count, width) in enumerate(zip(blocks, widths), start=1):
        for b in range(1, count + 1):
            stride = 2 if s > 1 and b == 1 else 1
            t = _bottleneck(g, t, width, width * expansion, stride, groups, f"stage{s}.block{b}")
    return t


# --- ResNet-50 and ResNeXt-50 ------------------------------------------------------------

def resnet50(blocks=(3, 4, 6, 3), width: int = 64, size: int = 56, batch: int = 1) -> Graph:
    """TASO's ResNet-50: the four bottleneck stages only (input 1x64x56x56, the stem's
    output; no classification head), widths 64..512, expansion 4."""
    g = new_graph()
    x = g.new_input((batch, width, size, size), name="x")
    widths = [width * 2 ** i for i in range(len(blocks))]
    g.mark_output(_bottleneck_stages(g, x, blocks, widths, expansion=4, groups=1), "y")
    return g


def resnet50_small() -> Graph:
    return resnet50(blocks=(1, 2, 1, 1), width=4, size=16)


def resnext50(blocks=(3, 4, 6, 3), width: int = 128, groups: int = 32, stem: int = 64,
              size: int = 224, classes: int = 1000, batch: int = 1) -> Graph:
    """ResNeXt-50 (32x4d): 7x7/2 conv + relu, 3x3/2 max pool, bottleneck stages of
    widths 128..1024 whose 3x3 conv has ``groups`` groups and whose output is twice the
    width, then the classification head."""
    g = new_graph()
    x = g.new_input((batch, 3, size, size), name="x")
    t = _conv(g, x, stem, 7, "stem.conv", strides=(2, 2))
    t = g.maxpool2d(t, (3, 3), (2, 2), "SAME")
    widths = [width * 2 ** i for i in range(len(blocks))]
    t = _bottleneck_stages(g, t, blocks, widths, expansion=2, groups=groups)
    g.mark_output(_classifier(g, t, classes), "y")
    return g


def resnext50_small() -> Graph:
    return resnext50(blocks=(1, 2, 1, 1), width=8, groups=4, stem=8, size=32, classes=10)


# --- VGG-19 --------------------------------------------------------------------------------

VGG19_STAGES = ((64, 2), (128, 2), (256, 4), (512, 4), (512, 4))


def vgg19(stages=VGG19_STAGES, hidden: int = 4096, size: int = 224, classes: int = 1000,
          batch: int = 1) -> Graph:
    """VGG-19: five stages of 3x3 conv + relu, each closed by a 2x2/2 max pool, then
    flatten and three fully connected layers (relu after the first two; dropout is the
    identity at inference and is left out)."""
    g = new_graph()
    t = g.new_input((batch, 3, size, size), name="x")
    for s, (channels, convs) in enumerate(stages, start=1):
        for c in range(1, convs + 1):
            t = _conv(g, t, channels, 3, f"stage{s}.conv{c}")
        t = g.maxpool2d(t, (2, 2), (2, 2))
    t = g.reshape(t, (batch, -1))
    t = _fc(g, t, hidden, "fc1", "RELU")
    t = _fc(g, t, hidden, "fc2", "RELU")
    g.mark_output(_fc(g, t, classes, "fc3"), "y")
    return g


def vgg19_small() -> Graph:
    return vgg19(stages=((4, 1), (8, 1), (16, 2), (32, 2), (32, 2)), hidden=32, size=32, classes=10)


# --- SqueezeNet 1.1 ------------------------------------------------------------------------

# (squeeze, expand) channels of fire modules 2..9; None marks a 3x3/2 max pool.
SQUEEZENET11_FIRES = (None, (16, 64), (16, 64), None, (32, 128), (32, 128), None,
                      (48, 192), (48, 192), (64, 256), (64, 256))


def _fire(g: Graph, x: Tensor, squeeze: int, expand: int, name: str) -> Tensor:
    s = _conv(g, x, squeeze, 1, f"{name}.squeeze")
    return g.concat(1, [_conv(g, s, expand, 1, f"{name}.expand1x1"),
                        _conv(g, s, expand, 3, f"{name}.expand3x3")])


def squeezenet(size: int = 224, channel_div: int = 1, classes: int = 1000, batch: int = 1) -> Graph:
    """SqueezeNet 1.1: 3x3/2 conv (64) + relu, then fire modules 2..9 with 3x3/2 max
    pools before fires 2, 4 and 6; the head is a 1x1 conv to the classes + relu and a
    global average pool (no fully connected layer in the original). ``channel_div``
    divides every channel count (small variants)."""
    g = new_graph()
    x = g.new_input((batch, 3, size, size), name="x")
    t = _conv(g, x, 64 // channel_div, 3, "conv1", strides=(2, 2), padding="VALID")
    fire = 2
    for spec in SQUEEZENET11_FIRES:
        if spec is None:
            t = g.maxpool2d(t, (3, 3), (2, 2))
        else:
            t = _fire(g, t, spec[0] // channel_div, spec[1] // channel_div, f"fire{fire}")
            fire += 1
    t = _conv(g, t, classes, 1, "conv10")
    g.mark_output(g.reshape(g.global_avgpool(t), (batch, classes)), "y")
    return g


def squeezenet_small() -> Graph:
    return squeezenet(size=32, channel_div=8, classes=10)


# --- Inception-v3 --------------------------------------------------------------------------

def _avgpool_same(g: Graph, x: Tensor) -> Tensor:
    return g.avgpool2d(x, (3, 3), (1, 1), "SAME")


def _inception_a(g: Graph, x: Tensor, ch, pool_features: int, name: str) -> Tensor:
    b1 = _conv(g, x, ch(64), 1, f"{name}.branch1x1")
    b5 = _conv(g, x, ch(48), 1, f"{name}.branch5x5_1")
    b5 = _conv(g, b5, ch(64), 5, f"{name}.branch5x5_2")
    b3 = _conv(g, x, ch(64), 1, f"{name}.branch3x3dbl_1")
    b3 = _conv(g, b3, ch(96), 3, f"{name}.branch3x3dbl_2")
    b3 = _conv(g, b3, ch(96), 3, f"{name}.branch3x3dbl_3")
    bp = _conv(g, _avgpool_same(g, x), ch(pool_features), 1, f"{name}.branch_pool")
    return g.concat(1, [b1, b5, b3, bp])


def _inception_b(g: Graph, x: Tensor, ch, name: str) -> Tensor:
    b3 = _conv(g, x, ch(384), 3, f"{name}.branch3x3", strides=(2, 2), padding="VALID")
    bd = _conv(g, x, ch(64), 1, f"{name}.branch3x3dbl_1")
    bd = _conv(g, bd, ch(96), 3, f"{name}.branch3x3dbl_2")
    bd = _conv(g, bd, ch(96), 3, f"{name}.branch3x3dbl_3", strides=(2, 2), padding="VALID")
    return g.concat(1, [b3, bd, g.maxpool2d(x, (3, 3), (2, 2))])


def _inception_c(g: Graph, x: Tensor, ch, c7: int, name: str) -> Tensor:
    b1 = _conv(g, x, ch(192), 1, f"{name}.branch1x1")
    b7 = _conv(g, x, c7, 1, f"{name}.branch7x7_1")
    b7 = _conv(g, b7, c7, (1, 7), f"{name}.branch7x7_2")
    b7 = _conv(g, b7, ch(192), (7, 1), f"{name}.branch7x7_3")
    bd = _conv(g, x, c7, 1, f"{name}.branch7x7dbl_1")
    for i, (k, out) in enumerate((((7, 1), c7), ((1, 7), c7), ((7, 1), c7), ((1, 7), ch(192))), start=2):
        bd = _conv(g, bd, out, k, f"{name}.branch7x7dbl_{i}")
    bp = _conv(g, _avgpool_same(g, x), ch(192), 1, f"{name}.branch_pool")
    return g.concat(1, [b1, b7, bd, bp])


def _inception_d(g: Graph, x: Tensor, ch, name: str) -> Tensor:
    b3 = _conv(g, x, ch(192), 1, f"{name}.branch3x3_1")
    b3 = _conv(g, b3, ch(320), 3, f"{name}.branch3x3_2", strides=(2, 2), padding="VALID")
    b7 = _conv(g, x, ch(192), 1, f"{name}.branch7x7x3_1")
    b7 = _conv(g, b7, ch(192), (1, 7), f"{name}.branch7x7x3_2")
    b7 = _conv(g, b7, ch(192), (7, 1), f"{name}.branch7x7x3_3")
    b7 = _conv(g, b7, ch(192), 3, f"{name}.branch7x7x3_4", strides=(2, 2), padding="VALID")
    return g.concat(1, [b3, b7, g.maxpool2d(x, (3, 3), (2, 2))])


def _inception_e(g: Graph, x: Tensor, ch, name: str) -> Tensor:
    b1 = _conv(g, x, ch(320), 1, f"{name}.branch1x1")
    b3 = _conv(g, x, ch(384), 1, f"{name}.branch3x3_1")
    b3 = g.concat(1, [_conv(g, b3, ch(384), (1, 3), f"{name}.branch3x3_2a"),
                      _conv(g, b3, ch(384), (3, 1), f"{name}.branch3x3_2b")])
    bd = _conv(g, x, ch(448), 1, f"{name}.branch3x3dbl_1")
    bd = _conv(g, bd, ch(384), 3, f"{name}.branch3x3dbl_2")
    bd = g.concat(1, [_conv(g, bd, ch(384), (1, 3), f"{name}.branch3x3dbl_3a"),
                      _conv(g, bd, ch(384), (3, 1), f"{name}.branch3x3dbl_3b")])
    bp = _conv(g, _avgpool_same(g, x), ch(192), 1, f"{name}.branch_pool")
    return g.concat(1, [b1, b3, bd, bp])


def inception_v3(size: int = 299, channel_div: int = 1, a_pool_features=(32, 64, 64),
                 c7s=(128, 160, 160, 192), e_modules: int = 2, classes: int = 1000,
                 batch: int = 1) -> Graph:
    """Inception-v3 (Szegedy et al. 2016, as in torchvision, auxiliary head left out):
    stem (3x3/2, 3x3, 3x3, 3x3/2 max pool, 1x1, 3x3, 3x3/2 max pool), modules A (one
    per entry of ``a_pool_features``), B, C (one per entry of ``c7s``), D, E
    (``e_modules``), then the classification head. Every conv has relu.
    ``channel_div`` divides every channel count (small variants)."""
    def ch(c: int) -> int:
        return max(c // channel_div, 1)

    g = new_graph()
    x = g.new_input((batch, 3, size, size), name="x")
    t = _conv(g, x, ch(32), 3, "stem.conv1a", strides=(2, 2), padding="VALID")
    t = _conv(g, t, ch(32), 3, "stem.conv2a", padding="VALID")
    t = _conv(g, t, ch(64), 3, "stem.conv2b")
    t = g.maxpool2d(t, (3, 3), (2, 2))
    t = _conv(g, t, ch(80), 1, "stem.conv3b")
    t = _conv(g, t, ch(192), 3, "stem.conv4a", padding="VALID")
    t = g.maxpool2d(t, (3, 3), (2, 2))
    for i, pool_features in enumerate(a_pool_features, start=1):
        t = _inception_a(g, t, ch, pool_features, f"a{i}")
    t = _inception_b(g, t, ch, "b")
    for i, c7 in enumerate(c7s, start=1):
        t = _inception_c(g, t, ch, ch(c7), f"c{i}")
    t = _inception_d(g, t, ch, "d")
    for i in range(1, e_modules + 1):
        t = _inception_e(g, t, ch, f"e{i}")
    g.mark_output(_classifier(g, t, classes), "y")
    return g


def inception_v3_small() -> Graph:
    return inception_v3(size=75, channel_div=16, a_pool_features=(32,), c7s=(128,), e_modules=1,
                        classes=10)


# --- NasNet-A ------------------------------------------------------------------------------

def _separable(g: Graph, x: Tensor, kernel: int, stride: int, name: str) -> Tensor:
    """NasNet's separable_kxk_2 on an input that is already relu'd: (depth-wise kxk
    conv + 1x1 conv) twice with a relu between; only the first depth-wise conv strides."""
    f = x.dim(1)
    t = _conv(g, x, f, kernel, f"{name}.dw1", strides=(stride, stride), activation="NONE", groups=f)
    t = _conv(g, t, f, 1, f"{name}.pw1")
    t = _conv(g, t, f, kernel, f"{name}.dw2", activation="NONE", groups=f)
    return _conv(g, t, f, 1, f"{name}.pw2", activation="NONE")


def _factorized_reduction(g: Graph, x: Tensor, filters: int, name: str) -> Tensor:
    """Halve H and W without losing every other pixel: two stride-2 1x1 convs to
    filters/2 each, the second on the input shifted by one pixel (its first row and
    column cut off, zero padding at the end), concatenated. The original's 1x1
    stride-2 average pool before each conv is folded into the conv's stride."""
    a = _conv(g, x, filters // 2, 1, f"{name}.path1", strides=(2, 2), activation="NONE")
    shifted = g.split(x, 2, (1, x.dim(2) - 1))[1]
    shifted = g.split(shifted, 3, (1, x.dim(3) - 1))[1]
    b = _conv(g, shifted, filters // 2, 1, f"{name}.path2", strides=(2, 2), padding=(0, 0, 1, 1),
              activation="NONE")
    return g.concat(1, [a, b])


def _cell_inputs(g: Graph, prev: Tensor, cur: Tensor, filters: int, name: str) -> tuple[Tensor, Tensor]:
    """The cell's two hidden states at ``filters`` channels and cur's size: cur through
    relu + 1x1 conv; prev through a factorized reduction when it is larger, through
    relu + 1x1 conv when only its channels differ, else as is."""
    h = _conv(g, g.relu(cur), filters, 1, f"{name}.cur1x1", activation="NONE")
    if prev.shape[2:] != h.shape[2:]:
        p = _factorized_reduction(g, g.relu(prev), filters, f"{name}.prev")
    elif prev.dim(1) != filters:
        p = _conv(g, g.relu(prev), filters, 1, f"{name}.prev1x1", activation="NONE")
    else:
        p = prev
    return h, p


def _normal_cell(g: Graph, prev: Tensor, cur: Tensor, filters: int, name: str) -> Tensor:
    """NasNet-A normal cell: five adds of two branches each; the output concatenates
    the adjusted previous state with the five sums (6 x filters channels)."""
    h, p = _cell_inputs(g, prev, cur, filters, name)
    rh, rp = g.relu(h), g.relu(p)

    def sep(x, kernel, part):
        return _separable(g, x, kernel, 1, f"{name}.{part}")

    def pool(x):
        return _avgpool_same(g, x)

    sums = [g.add(sep(rh, 5, "comb0.left"), sep(rp, 3, "comb0.right")),
            g.add(sep(rp, 5, "comb1.left"), sep(rp, 3, "comb1.right")),
            g.add(pool(h), p),
            g.add(pool(p), pool(p)),
            g.add(sep(rh, 3, "comb4.left"), h)]
    return g.concat(1, [p] + sums)


def _reduction_cell(g: Graph, prev: Tensor, cur: Tensor, filters: int, name: str) -> Tensor:
    """NasNet-A reduction cell: branches on the cell's inputs stride 2, branches on
    sums made inside the cell do not; the output concatenates the four sums that no
    other sum uses (4 x filters channels)."""
    h, p = _cell_inputs(g, prev, cur, filters, name)
    rh, rp = g.relu(h), g.relu(p)

    def sep(x, kernel, stride, part):
        return _separable(g, x, kernel, stride, f"{name}.{part}")

    def maxpool(x):
        return g.maxpool2d(x, (3, 3), (2, 2), "SAME")

    def avgpool(x, stride):
        return g.avgpool2d(x, (3, 3), (stride, stride), "SAME")

    s0 = g.add(sep(rh, 5, 2, "comb0.left"), sep(rp, 7, 2, "comb0.right"))
    s1 = g.add(maxpool(h), sep(rp, 7, 2, "comb1.right"))
    s2 = g.add(avgpool(h, 2), sep(rp, 5, 2, "comb2.right"))
    s3 = g.add(s1, avgpool(s0, 1))
    s4 = g.add(sep(g.relu(s2), 3, 1, "comb4.left"), maxpool(h))
    return g.concat(1, [s1, s2, s3, s4])


def nasnet_a(size: int = 224, stem: int = 64, filters=(128, 256, 512), normal_cells: int = 5,
             classes: int = 1000, batch: int = 1) -> Graph:
    """NasNet-A (Zoph et al. 2018) in TASO's layout: 7x7/2 conv + 3x3/2 max pool stem,
    then per stage ``normal_cells`` normal cells with ``filters`` channels per branch
    and a reduction cell with twice as many; each cell reads the two previous cells'
    outputs (the first reads the stem's twice). Separable conv = depth-wise conv + 1x1
    conv, stacked twice as in the original; the original's per-branch relu is one relu
    per hidden state. Head: relu, global average pool, fully connected."""
    g = new_graph()
    x = g.new_input((batch, 3, size, size), name="x")
    # No relu here: every cell starts by relu-ing its inputs.
    t = _conv(g, x, stem, 7, "stem.conv", strides=(2, 2), activation="NONE")
    prev = cur = g.maxpool2d(t, (3, 3), (2, 2), "SAME")
    for s, f in enumerate(filters, start=1):
        for c in range(1, normal_cells + 1):
            prev, cur = cur, _normal_cell(g, prev, cur, f, f"stage{s}.normal{c}")
        prev, cur = cur, _reduction_cell(g, prev, cur, 2 * f, f"stage{s}.reduction")
    g.mark_output(_classifier(g, g.relu(cur), classes), "y")
    return g


def nasnet_a_small() -> Graph:
    return nasnet_a(size=64, stem=8, filters=(4, 8, 16), normal_cells=2, classes=10)


MODELS = {
    "bert": bert,
    "bert-small": bert_small,
    "nasrnn": nasrnn,
    "nasrnn-small": nasrnn_small,
    "resnext50": resnext50,
    "resnext50-small": resnext50_small,
    "resnet50": resnet50,
    "resnet50-small": resnet50_small,
    "nasnet-a": nasnet_a,
    "nasnet-a-small": nasnet_a_small,
    "inception-v3": inception_v3,
    "inception-v3-small": inception_v3_small,
    "squeezenet": squeezenet,
    "squeezenet-small": squeezenet_small,
    "vgg19": vgg19,
    "vgg19-small": vgg19_small,
}


def load_model(name: str, input_shapes=None) -> Graph:
    """A zoo model by name, else an ONNX file (``input_shapes`` fixes symbolic
    dimensions); the commands that take either call this."""
    import os

    from ..errors import TasoEggError
    from ..onnx_io.importer import load_onnx

    if name in MODELS:
        return MODELS[name]()
    if not os.path.exists(name):
        raise TasoEggError(f"{name}: neither an ONNX file nor a zoo model ({', '.join(sorted(MODELS))})")
    return load_onnx(name, input_shapes)
