"""The benchmark zoo: every model builds and validates; full-size models have the
architecture's shapes, operator counts and parameter counts; small variants keep the
structure, run in our executor and agree with their ONNX export in onnxruntime; the
`taso-egg zoo` command writes them."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest

from taso_egg.research import zoo
from taso_egg.cli import main

from conftest import check_against_ort

NAMES = ["bert", "nasrnn", "resnext50", "resnet50", "nasnet-a", "inception-v3", "squeezenet", "vgg19"]
SMALL = [f"{n}-small" for n in NAMES]


@pytest.fixture(scope="module")
def full():
    """Full-size graphs, built once (weights stay lazy, so this is cheap)."""
    return {name: zoo.MODELS[name]() for name in NAMES}


def params(g) -> int:
    return sum(int(np.prod(n.params["shape"])) for n in g.weights())


def weight_shape(g, t):
    return g.nodes[t.node].params["shape"]


def convs(g):
    return [n for n in g.nodes.values() if n.op == "conv2d"]


def conv_groups(g, n) -> int:
    return n.inputs[0].shape[1] // weight_shape(g, n.inputs[1])[1]


def kernel_counts(g) -> Counter:
    return Counter(tuple(weight_shape(g, n.inputs[1])[2:]) for n in convs(g))


def only(g, op):
    (node,) = [n for n in g.nodes.values() if n.op == op]
    return node


def test_registry_names():
    assert set(zoo.MODELS) == set(NAMES) | set(SMALL)


@pytest.mark.parametrize("name", NAMES + SMALL)
def test_builds_and_validates(name):
    g = zoo.MODELS[name]()
    g.validate()
    assert len(g.outputs) == 1
    names = [n.params["name"] for n in g.weights()]
    assert len(names) == len(set(names))


FULL_OUTPUT = {
    "bert": (1024, 1024),
    "nasrnn": (1, 512),
    "resnext50": (1, 1000),
    "resnet50": (1, 2048, 7, 7),       # TASO's cut: no stem, no head
    "nasnet-a": (1, 1000),
    "inception-v3": (1, 1000),
    "squeezenet": (1, 1000),
    "vgg19": (1, 1000),
}


@pytest.mark.parametrize("name", NAMES)
def test_full_output_shape(full, name):
    ((_, y),) = full[name].outputs
    assert y.shape == FULL_OUTPUT[name]


# Operator histograms, counted from the architectures:
# ResNet-50: 16 bottlenecks x 3 convs + a projection in the first block of each of the
#   4 stages (channels or stride change); one add and one relu per block.
# ResNeXt-50: the same stages plus the 7x7 stem conv, its max pool, and the head.
# VGG-19: 2+2+4+4+4 convs, a max pool per stage, flatten, 3 fully connected.
# SqueezeNet 1.1: conv1 + 8 fires x 3 + conv10; a concat per fire; 3 max pools.
# Inception-v3: stem 5 + A 7x3 + B 4 + C 10x4 + D 6 + E 9x2 = 94 convs; concats
#   A 3 + B 1 + C 4 + D 1 + E 3x2 = 15; an avg pool in each A, C, E = 9; max pools:
#   stem 2 + B + D = 4.
# NasNet-A: 15 normal + 3 reduction cells. Each cell: 1x1 conv on its current input,
#   one 1x1 on the previous (a two-conv factorized reduction in the first cell of stages
#   2 and 3), 5 separable branches x 4 convs; plus the stem conv: 1+18+20+360 = 399.
#   Avg pools 3 per normal, 2 per reduction = 51; max pools 2 per reduction + stem = 7;
#   5 adds per cell = 90; concats 18 cells + 2 factorized = 20; 2 splits per factorized
#   reduction = 4; relus: 4 per normal cell, 5 per reduction, 1 before the head = 76.
HEAD = {"global_avgpool": 1, "reshape": 1, "matmul": 1}
FULL_OPS = {
    "bert": {"relu": 1, "matmul": 8 * 6, "reshape": 8 * 4, "transpose": 8 * 4},
    "nasrnn": {"matmul": 5 * 16, "ewadd": 5 * 11, "ewmul": 5 * 4, "relu": 5 * 2,
               "sigmoid": 5 * 5, "tanh": 5 * 8},
    "resnet50": {"conv2d": 16 * 3 + 4, "ewadd": 16, "relu": 16},
    "resnext50": {"conv2d": 1 + 16 * 3 + 4, "ewadd": 16, "relu": 16, "maxpool2d": 1, **HEAD},
    "vgg19": {"conv2d": 16, "maxpool2d": 5, "reshape": 1, "matmul": 3},
    "squeezenet": {"conv2d": 1 + 8 * 3 + 1, "concat": 8, "maxpool2d": 3, "global_avgpool": 1,
                   "reshape": 1},
    "inception-v3": {"conv2d": 5 + 7 * 3 + 4 + 10 * 4 + 6 + 9 * 2, "concat": 3 + 1 + 4 + 1 + 3 * 2,
                     "avgpool2d": 3 + 4 + 2, "maxpool2d": 2 + 1 + 1, **HEAD},
    "nasnet-a": {"conv2d": 1 + 18 + 20 + 18 * 5 * 4, "avgpool2d": 15 * 3 + 3 * 2,
                 "maxpool2d": 1 + 3 * 2, "ewadd": 18 * 5, "concat": 18 + 2, "split": 4,
                 "relu": 15 * 4 + 3 * 5 + 1, **HEAD},
}


@pytest.mark.parametrize("name", NAMES)
def test_full_op_histogram(full, name):
    assert full[name].op_counts() == Counter(FULL_OPS[name])


# Weights of the published architectures (torchvision's parameter counts less batchnorm,
# biases, and what the zoo's cut leaves out): ResNet-50's four stages (of 25,557,032),
# ResNeXt-50 32x4d (25,028,904), VGG-19 (143,667,240), SqueezeNet 1.1 (1,235,496),
# Inception-v3 without its auxiliary head (27,161,264 with it).
PUBLISHED_WEIGHTS = {
    "resnet50": 23_445_504,
    "resnext50": 24_959_680,
    "vgg19": 143_652_544,
    "squeezenet": 1_231_552,
    "inception-v3": 23_799_136,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_WEIGHTS))
def test_full_parameter_count_matches_published(full, name):
    assert params(full[name]) == PUBLISHED_WEIGHTS[name]


def test_resnet50_stages(full):
    g = full["resnet50"]
    assert next(n for n in g.inputs()).params["shape"] == (1, 64, 56, 56)
    # Stage outputs: 256 channels at 56, then 512/28, 1024/14, 2048/7.
    block_outs = Counter(n.outputs[0].shape for n in g.nodes.values() if n.op == "relu")
    assert block_outs == {(1, 256, 56, 56): 3, (1, 512, 28, 28): 4, (1, 1024, 14, 14): 6,
                          (1, 2048, 7, 7): 3}
    # The stride sits on the 3x3 conv and on the projection, never on a 1x1 conv1/conv3.
    strided = [n for n in convs(g) if n.params["strides"] == (2, 2)]
    assert sorted(weight_shape(g, n.inputs[1])[2:] for n in strided) == [(1, 1)] * 3 + [(3, 3)] * 3


def test_resnext50_grouped_convs(full):
    g = full["resnext50"]
    grouped = [n for n in convs(g) if conv_groups(g, n) > 1]
    assert len(grouped) == 16
    assert {conv_groups(g, n) for n in grouped} == {32}
    assert sorted({n.outputs[0].shape[1] for n in grouped}) == [128, 256, 512, 1024]
    assert only(g, "global_avgpool").inputs[0].shape == (1, 2048, 7, 7)


def test_vgg19_layers(full):
    g = full["vgg19"]
    assert kernel_counts(g) == {(3, 3): 16}
    assert only(g, "reshape").inputs[0].shape == (1, 512, 7, 7)
    fcs = [weight_shape(g, n.inputs[1]) for n in g.topo_order() if n.op == "matmul"]
    assert fcs == [(25088, 4096), (4096, 4096), (4096, 1000)]


def test_squeezenet_fires(full):
    g = full["squeezenet"]
    concat_channels = [n.outputs[0].shape[1] for n in g.topo_order() if n.op == "concat"]
    assert concat_channels == [128, 128, 256, 256, 384, 384, 512, 512]
    assert only(g, "global_avgpool").inputs[0].shape == (1, 1000, 13, 13)


def test_inception_v3_modules(full):
    g = full["inception-v3"]
    # Module outputs (the outer concats) in order: A x3, B, C x4, D, E x2.
    outer = [n.outputs[0].shape[1:] for n in g.topo_order()
             if n.op == "concat" and len(n.inputs) in (3, 4) and n.outputs[0].shape[1] > 200]
    assert outer == [(256, 35, 35), (288, 35, 35), (288, 35, 35), (768, 17, 17)] \
        + [(768, 17, 17)] * 4 + [(1280, 8, 8), (2048, 8, 8), (2048, 8, 8)]
    # Factorized convs: C has three 1x7 and three 7x1, D one each; E two 1x3 and two 3x1.
    k = kernel_counts(g)
    assert (k[(1, 7)], k[(7, 1)], k[(1, 3)], k[(3, 1)], k[(5, 5)]) == (13, 13, 4, 4, 3)
    assert all(n.params["activation"] == "RELU" for n in convs(g))


def test_nasnet_a_cells(full):
    g = full["nasnet-a"]
    depthwise = [n for n in convs(g) if weight_shape(g, n.inputs[1])[1] == 1]
    # 5 separable branches per cell, each two depth-wise convs; kernels: normal cells
    # 3x3 x3 and 5x5 x2, reduction cells 3x3 x1, 5x5 x2 and 7x7 x2.
    assert len(depthwise) == 18 * 5 * 2
    assert Counter(weight_shape(g, n.inputs[1])[2] for n in depthwise) == {
        3: 2 * (15 * 3 + 3), 5: 2 * (15 * 2 + 3 * 2), 7: 2 * 3 * 2}
    cell_outs = Counter(n.outputs[0].shape[1:] for n in g.nodes.values()
                        if n.op == "concat" and len(n.inputs) > 2)
    # Normal cells concatenate 6 states of F channels, reductions 4 of 2F.
    assert cell_outs == {(768, 56, 56): 5, (1024, 28, 28): 1, (1536, 28, 28): 5,
                         (2048, 14, 14): 1, (3072, 14, 14): 5, (4096, 7, 7): 1}


@pytest.mark.parametrize("name", NAMES)
def test_small_variant_keeps_the_structure(full, name):
    small = zoo.MODELS[f"{name}-small"]()
    assert set(small.op_counts()) == set(full[name].op_counts())
    assert len(small.nodes) <= len(full[name].nodes)


@pytest.mark.parametrize("name", SMALL)
def test_small_runs_and_matches_onnxruntime(name):
    ours, _ = check_against_ort(zoo.MODELS[name]())
    assert all(np.isfinite(v).all() and np.abs(v).max() > 0 for v in ours.values())


@pytest.mark.parametrize("name", SMALL + ["squeezenet"])
def test_cli_writes_model(tmp_path, capsys, name):
    path = tmp_path / "model.onnx"
    assert main(["zoo", name, "-o", str(path)]) == 0
    model = onnx.load(str(path))
    onnx.checker.check_model(model)
    graph = zoo.MODELS[name]()
    assert len(model.graph.output) == 1
    dims = [d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim]
    assert tuple(dims) == graph.outputs[0][1].shape
    assert "wrote" in capsys.readouterr().out


def test_cli_unknown_model(tmp_path, capsys):
    assert main(["zoo", "resnet-51", "-o", str(tmp_path / "x.onnx")]) == 1
    err = capsys.readouterr().err
    assert "resnet-51" in err and "inception-v3" in err
