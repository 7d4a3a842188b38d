"""Generation measured end to end (python -m taso_egg.research.benchmarks --generate): a greedy loop
over a decoder with its key/value cache, on a small onnx.helper decoder shaped as the
exports are (input_ids, attention_mask, past.* in, logits and present.* out)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from taso_egg.research import benchmarks as bench
from taso_egg.errors import NotADecoder
from taso_egg.product.generate import Decoder, generate, measure
from taso_egg.product.timing import make_session

VOCAB, HEADS, HEAD = 11, 2, 4
HIDDEN = HEADS * HEAD


def tiny_decoder(path, one_token: bool = False, vocab: int = VOCAB, cache_prefix: str = "past",
                 seed: int = 0, head=HEAD):
    """Embedding, a key per position cached, logits reading the new positions and the
    whole cache (so a wrong cache changes them). ``one_token``: input_ids [batch, 1], a
    decode step exported alone; ``head``: the cache's last dim (a name: symbolic, as
    onnxruntime-genai's builder writes it)."""
    rng = np.random.default_rng(seed)
    w = lambda name, shape: numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)  # noqa: E731
    i64 = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    nodes = [helper.make_node("Gather", ["E", "input_ids"], ["h"]),
             helper.make_node("MatMul", ["h", "Wk"], ["k0"]), helper.make_node("Reshape", ["k0", "heads"], ["k1"]),
             helper.make_node("Transpose", ["k1"], ["k2"], perm=[0, 2, 1, 3]),
             helper.make_node("Concat", [f"{cache_prefix}.0.key", "k2"], ["present.0.key"], axis=2),
             helper.make_node("ReduceSum", ["present.0.key", "all"], ["c0"], keepdims=0),
             helper.make_node("Cast", ["attention_mask"], ["m0"], to=TensorProto.FLOAT),
             helper.make_node("ReduceSum", ["m0", "one"], ["m1"], keepdims=0),
             helper.make_node("Div", ["c0", "m1"], ["c1"]),
             helper.make_node("Unsqueeze", ["c1", "bcast"], ["c2"]),
             helper.make_node("MatMul", ["h", "Wv"], ["l0"]), helper.make_node("Add", ["l0", "c2"], ["logits"])]
    past = helper.make_tensor_value_info(f"{cache_prefix}.0.key", TensorProto.FLOAT, ["batch", HEADS, "past", head])
    graph = helper.make_graph(
        nodes, "tiny",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", 1 if one_token else "sequence"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "total"]), past],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 1 if one_token else "sequence", vocab]),
         helper.make_tensor_value_info("present.0.key", TensorProto.FLOAT, ["batch", HEADS, "total", head])],
        [w("E", (vocab, HIDDEN)), w("Wk", (HIDDEN, HIDDEN)), w("Wv", (HIDDEN, vocab)),
         i64("heads", [0, 0, HEADS, HEAD]), i64("all", [1, 2, 3]), i64("one", [1]), i64("bcast", [1, 2])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return str(path)


def test_the_interface_is_read_from_names_and_shapes(tmp_path):
    whole = Decoder.read(tiny_decoder(tmp_path / "whole.onnx"))
    assert whole.whole_prompt and whole.logits == "logits" and whole.positions_dtype is None
    (slot,) = whole.cache
    assert (slot.input, slot.output, slot.axis) == ("past.0.key", "present.0.key", 2)
    assert whole.empty_cache()["past.0.key"].shape == (1, HEADS, 0, HEAD)
    assert not Decoder.read(tiny_decoder(tmp_path / "step.onnx", one_token=True)).whole_prompt
    optimum = Decoder.read(tiny_decoder(tmp_path / "optimum.onnx", cache_prefix="past_key_values"))
    assert optimum.cache[0].output == "present.0.key"


def test_a_symbolic_head_size_is_read_from_genai_config_beside_the_model(tmp_path):
    """onnxruntime-genai's builder names the cache's head size (kv_cache_dim) and writes
    its value in genai_config.json: the sequence axis is the one named otherwise in
    present (past -> total)."""
    path = tiny_decoder(tmp_path / "model.onnx", head="kv_cache_dim")
    with pytest.raises(NotADecoder, match="genai_config.json"):
        Decoder.read(path).empty_cache()
    (tmp_path / "genai_config.json").write_text('{"model": {"decoder": {"head_size": %d}}}' % HEAD)
    decoder = Decoder.read(path)
    assert decoder.cache[0].axis == 2 and decoder.empty_cache()["past.0.key"].shape == (1, HEADS, 0, HEAD)
    assert len(generate(make_session(path), decoder, [1, 2], 3).tokens) == 3


def test_a_prompt_read_at_once_or_token_by_token_gives_the_same_generation(tmp_path):
    """The loop's cache handling: a model reading its prompt in one call from an empty
    cache and the same weights fed one token a step agree at every step."""
    paths = [tiny_decoder(tmp_path / "whole.onnx"), tiny_decoder(tmp_path / "step.onnx", one_token=True)]
    runs = [generate(make_session(p), Decoder.read(p), [3, 1, 4, 1, 5], 6) for p in paths]
    assert runs[0].tokens == runs[1].tokens and len(runs[0].tokens) == 6
    assert all(np.allclose(a, b, rtol=1e-5, atol=1e-5) for a, b in zip(runs[0].logits, runs[1].logits))
    assert runs[0].first_token_s > 0 and runs[0].rest_s > 0


def test_the_table_compares_each_model_with_the_first_and_has_an_a_a_row(tmp_path, capsys):
    first = tiny_decoder(tmp_path / "a.onnx")
    other = tiny_decoder(tmp_path / "b.onnx", seed=1)  # other weights: other logits
    assert bench.main(["--generate", first, other, "--prompt-tokens", "4", "--new-tokens", "3",
                       "--rounds", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["model", "first", "token"]
    base, aa, b = (line.split() for line in lines[1:4])
    assert base[0].endswith("a.onnx") and aa[0].endswith("a.onnx") and aa[1] == "(A/A)"
    assert b[0].endswith("b.onnx")
    assert aa[-2] == "0.0e+00" and aa[-1] == "0"  # the same file: the same logits
    assert float(b[-2]) > 1e-3  # other weights are seen, at every step
    assert float(base[5]) > 0  # tokens/s of the first row (after first-token ms and its ratio [lo, hi])


def test_rows_measure_every_round_and_the_error_of_the_same_model_is_zero(tmp_path):
    path = tiny_decoder(tmp_path / "a.onnx")
    rows = measure([path, path], prompt_tokens=3, new_tokens=3, rounds=3)
    assert [len(r.tokens_per_s) for r in rows] == [3, 3, 3]
    assert rows[1].error == 0.0 and rows[2].error == 0.0 and rows[2].disagreements == 0


@pytest.mark.parametrize("problem, expected", [
    ("no_cache", "no key/value cache inputs"),
    ("vocabulary", "scores 7 tokens where the first model scores 11"),
])
def test_a_model_the_loop_cannot_compare_is_one_line(tmp_path, capsys, problem, expected):
    first = tiny_decoder(tmp_path / "a.onnx")
    if problem == "no_cache":
        other = tmp_path / "plain.onnx"
        graph = helper.make_graph([helper.make_node("Identity", ["input_ids"], ["logits"])], "g",
                                  [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "s"])],
                                  [helper.make_tensor_value_info("logits", TensorProto.INT64, ["b", "s"])])
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(other))
    else:
        other = tiny_decoder(tmp_path / "b.onnx", vocab=7)
    assert bench.main(["--generate", first, str(other), "--prompt-tokens", "2", "--new-tokens", "2",
                       "--rounds", "1"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0] and err[0].startswith("error: ")


def test_impossible_lengths_and_missing_files_are_usage_errors(tmp_path, capsys):
    first = tiny_decoder(tmp_path / "a.onnx")
    for args in (["--new-tokens", "1"], ["--rounds", "0"], ["--prompt-tokens", "0"]):
        with pytest.raises(SystemExit) as e:
            bench.main(["--generate", first, *args])
        assert e.value.code == 1 and "must be at least" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--generate", str(tmp_path / "missing.onnx")])
    assert "no such file" in capsys.readouterr().err


def test_a_step_failing_in_onnxruntime_names_the_model_and_the_step(tmp_path):
    path = tiny_decoder(tmp_path / "a.onnx")
    decoder = Decoder.read(path)
    broken = Decoder(**{**decoder.__dict__, "cache": (decoder.cache[0].__class__(
        **{**decoder.cache[0].__dict__, "shape": (None, HEADS + 1, None, HEAD)}),)})
    with pytest.raises(NotADecoder, match="fails at 0 cached and 2 new tokens"):
        generate(make_session(path), broken, [1, 2], 2)


def test_a_step_at_each_cache_length_is_timed_and_compared_with_the_first(tmp_path, capsys):
    """--step-at: one decode step on a cache of each length, every model fed the same
    token and cache (matched by slot: past.0.key and past_key_values.0.key), its logits
    compared with the first's; the A/A row is the same file."""
    first = tiny_decoder(tmp_path / "a.onnx")
    same_weights = tiny_decoder(tmp_path / "optimum.onnx", cache_prefix="past_key_values", one_token=True)
    other = tiny_decoder(tmp_path / "b.onnx", seed=1)
    assert bench.main(["--generate", first, same_weights, other, "--step-at", "0", "7", "--rounds", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:5] == ["model", "past", "0", "ms", "vs"]
    base, aa, same, b = (line.split() for line in lines[1:5])
    assert aa[1] == "(A/A)" and aa[-1] == "0.0e+00"
    assert float(same[-1]) < 1e-6  # the same weights, another interface: the same logits
    assert float(b[-1]) > 1e-3  # other weights are seen
    assert float(base[1]) > 0 and same[2].endswith("x")  # a time, then a ratio with its interval


def test_a_cache_another_model_does_not_take_is_one_line(tmp_path, capsys):
    first = tiny_decoder(tmp_path / "a.onnx")
    other = tiny_decoder(tmp_path / "b.onnx", head=HEAD + 1)
    assert bench.main(["--generate", first, other, "--step-at", "3", "--rounds", "1"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not the same model's cache" in err[0]


@pytest.mark.parametrize("step_at", [[], ["--step-at", "3"]])
def test_threads_reach_every_session_and_the_table_says_how_it_timed(tmp_path, capsys, monkeypatch, step_at):
    """--threads 2: every session of the generation (and of a step) runs 2 intra-op
    threads, as a user running the model with 2 threads would, and the table says so;
    a step is then timed in wall time (CPU time would add both threads up)."""
    from taso_egg.product import timing

    built = []
    real = timing.make_session

    def spy(model, *args, threads: int = 1, **kwargs):
        built.append(threads)
        return real(model, *args, threads=threads, **kwargs)

    monkeypatch.setattr(timing, "make_session", spy)
    first = tiny_decoder(tmp_path / "a.onnx")
    args = ["--generate", first, first, "--rounds", "1", "--threads", "2", "--prompt-tokens", "4", "--new-tokens", "3"]
    assert bench.main(args + step_at) == 0
    footer = capsys.readouterr().out.strip().splitlines()[-1]
    assert "2 threads" in footer and "wall time" in footer and "CPU time" not in footer
    # the reference run and each of the three rows' sessions; only the one-token runs that
    # read the vocabulary, timed by nobody, keep one thread
    assert built.count(2) == 4 and set(built) == {1, 2}


def test_threads_below_one_are_one_line(tmp_path, capsys):
    first = tiny_decoder(tmp_path / "a.onnx")
    with pytest.raises(SystemExit):
        bench.main(["--generate", first, "--threads", "0"])
    assert "--threads: must be at least 1" in capsys.readouterr().err


def test_the_floor_keeps_the_weight_products_packed_and_computes_what_they_do(tmp_path):
    """A step's floor: every product over a stored weight (plain, tied through a
    Transpose, dequantized, a Gemm with transB), fed one token each; q/k/v and gate/up,
    plain weights reading one activation, become one MatMul each, and every output is what
    the products compute there."""
    from taso_egg.product.step_floor import matmul_floor

    rng = np.random.default_rng(3)
    w = {"Wq": (8, 8), "Wk": (8, 4), "Wv": (8, 4), "Wg": (8, 16), "Wu": (8, 16), "E": (32, 8), "Wo": (5, 8),
         "Wb": (8, 3), "b": (3,)}
    arrays = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in w.items()}
    q8 = rng.integers(-8, 8, (8, 6)).astype(np.int8)
    inits = [numpy_helper.from_array(a, n) for n, a in arrays.items()] + [
        numpy_helper.from_array(q8, "W8"), numpy_helper.from_array(np.float32(0.05), "s8"),
        numpy_helper.from_array(np.int8(0), "z8")]
    nodes = [helper.make_node("MatMul", ["x", n], [n + ".y"]) for n in ("Wq", "Wk", "Wv")] + [
        helper.make_node("Relu", ["x"], ["y"]),
        helper.make_node("MatMul", ["y", "Wg"], ["g"]), helper.make_node("MatMul", ["y", "Wu"], ["u"]),
        helper.make_node("Transpose", ["E"], ["Et"], perm=[1, 0]), helper.make_node("MatMul", ["y", "Et"], ["head"]),
        helper.make_node("DequantizeLinear", ["W8", "s8", "z8"], ["Wd"]), helper.make_node("MatMul", ["x", "Wd"], ["d"]),
        helper.make_node("Flatten", ["x"], ["x2"]), helper.make_node("Gemm", ["x2", "Wo"], ["o"], transB=1),
        # GPT-2's Conv1D as optimum exports it: a bias of equal values deduplicated, the Identity of another's
        helper.make_node("Identity", ["b"], ["b_tied"]), helper.make_node("Gemm", ["x2", "Wb", "b_tied"], ["ob"])]
    outs = ["Wq.y", "Wk.y", "Wv.y", "g", "u", "head", "d", "o", "ob"]
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 8])],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs], inits)
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))

    floor, feeds = matmul_floor(str(path))
    ops = sorted(n.op_type for n in floor.graph.node)
    assert ops == ["DequantizeLinear", "Gemm", "Gemm", "Identity", "MatMul", "MatMul", "MatMul", "MatMul", "Transpose"]
    assert {name: a.shape for name, a in feeds.items()} == {"x": (1, 1, 8), "y": (1, 1, 8), "x2": (1, 8)}
    got = dict(zip([o.name for o in floor.graph.output], make_session(floor).run(None, feeds)))
    x, y, x2 = feeds["x"], feeds["y"], feeds["x2"]
    qkv = next(v for k, v in got.items() if k.endswith(".packed3.out"))
    gate_up = next(v for k, v in got.items() if k.endswith(".packed2.out"))
    assert np.allclose(qkv, x @ np.concatenate([arrays["Wq"], arrays["Wk"], arrays["Wv"]], 1), atol=1e-5)
    assert np.allclose(gate_up, y @ np.concatenate([arrays["Wg"], arrays["Wu"]], 1), atol=1e-5)
    assert np.allclose(got["head"], y @ arrays["E"].T, atol=1e-5)
    # onnxruntime runs an int8 weight's product with the activation quantized too: its rounding
    assert np.allclose(got["d"], x @ (q8.astype(np.float32) * 0.05), rtol=0.02, atol=0.02)
    assert np.allclose(got["o"], x2 @ arrays["Wo"].T, atol=1e-5)
    assert np.allclose(got["ob"], x2 @ arrays["Wb"] + arrays["b"], atol=1e-5)


def test_the_floor_is_a_row_of_the_step_table(tmp_path, capsys):
    first = tiny_decoder(tmp_path / "a.onnx")
    assert bench.main(["--generate", first, "--step-at", "0", "5", "--rounds", "2", "--floor"]) == 0
    out = capsys.readouterr().out.splitlines()
    floor = next(line for line in out if line.startswith("floor: "))
    cells = floor.split()
    assert float(cells[-5]) > 0 and cells[-4].endswith("x") and cells[-1] == "-"  # ms, ratio [interval], no error
    assert "weight products alone" in out[-1]
    with pytest.raises(SystemExit):
        bench.main(["--generate", first, "--floor"])
    assert "--floor: " in capsys.readouterr().err


def test_a_padded_batch_is_compared_with_the_first_model_at_every_call(tmp_path, capsys):
    from taso_egg.product import padded

    a, other = tiny_decoder(tmp_path / "a.onnx"), tiny_decoder(tmp_path / "b.onnx", seed=1)
    found = padded.run_padded([a, a, other])
    assert [len(c.logits) for c in found] == [2 + padded.STEPS] * 3
    assert found[1].worst == (0.0, 0.0) and found[2].worst[0] > 1e-3
    # caches are compared by the input each feeds, whatever order a model declares them in
    # (onnxruntime-genai's: every layer's key, then every value)
    two = onnx.load(a)  # a second cache, the first doubled
    key = next(i for i in two.graph.input if i.name == "past.0.key")
    value = onnx.ValueInfoProto()
    value.CopyFrom(key)
    value.name = "past.0.value"
    two.graph.initializer.append(onnx.numpy_helper.from_array(np.array(2.0, np.float32), "two"))
    two.graph.node.append(onnx.helper.make_node("Mul", ["present.0.key", "two"], ["present.0.value"]))
    two.graph.output.append(onnx.helper.make_tensor_value_info("present.0.value", onnx.TensorProto.FLOAT, None))
    for name, order in (("two.onnx", [key, value]), ("two_reordered.onnx", [value, key])):
        kept = [i for i in two.graph.input if not i.name.startswith("past")]
        del two.graph.input[:]
        two.graph.input.extend(kept + order)
        onnx.save(two, tmp_path / name)
    assert padded.run_padded([str(tmp_path / "two.onnx"), str(tmp_path / "two_reordered.onnx")])[1].worst == (0, 0)
    assert bench.main(["--generate", a, other, "--padded"]) == 0
    assert "left-padded" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        bench.main(["--generate", a, other, "--padded", "--step-at", "31"])
    assert "--padded" in capsys.readouterr().err
