"""Generation measured end to end: a greedy loop over a decoder with its key/value
cache, as optimum's ``ORTModelForCausalLM`` and onnxruntime-genai run one: a prompt of
P tokens, then N new ones, each step feeding the cache the last one returned.
``python -m taso_egg.research.benchmarks --generate ORIGINAL OTHER ...`` prints the table.

A decoder is read from its interface alone: ``input_ids``, an optional
``attention_mask`` and ``position_ids``, cache inputs named ``past...`` each returned
as the output named ``present`` and the same suffix (``past.0.key`` -> ``present.0.key``,
``past_key_values.0.key`` -> ``present.0.key``), and the logits (an output named
``logits``, else the first). A model whose ``input_ids`` take one token (a decode step
exported alone) reads its prompt one token a step; one that takes a sequence reads it
in one call from an empty cache (what optimum and genai do first).

Every model after the first is fed the first's tokens (teacher forcing), so that its
logits are compared with the first's at every step; a model that would have chosen
another token is counted."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import NotADecoder, first_line


_CACHE_INPUT = re.compile(r"^past(?:_key_values)?(.*)$")


@dataclass(frozen=True)
class CacheSlot:
    """One cache tensor: fed as ``input``, returned as ``output``; ``shape`` with the
    sequence axis at ``axis`` (its size grows a token each step) and the batch at 0."""
    input: str
    output: str
    shape: tuple  # ints, or None where symbolic
    axis: int
    dtype: np.dtype


@dataclass(frozen=True)
class Decoder:
    """What a generation loop needs to know of a model's interface."""
    path: str
    ids_dtype: np.dtype
    whole_prompt: bool  # input_ids take a sequence, not one token
    mask_dtype: np.dtype | None
    positions_dtype: np.dtype | None
    logits: str
    cache: tuple[CacheSlot, ...]

    @classmethod
    def read(cls, path: str) -> "Decoder":
        import onnx
        from onnx.helper import tensor_dtype_to_np_dtype

        try:
            model = onnx.load(path, load_external_data=False)
        except Exception as e:  # onnx raises DecodeError, OSError, ...
            raise NotADecoder(f"{path}: not a readable ONNX model ({type(e).__name__})") from None
        weights = {t.name for t in model.graph.initializer}
        inputs = {i.name: i for i in model.graph.input if i.name not in weights}
        outputs = {o.name: o for o in model.graph.output}

        def dims(value) -> tuple:
            return tuple(d.dim_value if d.HasField("dim_value") else None
                         for d in value.type.tensor_type.shape.dim)

        def dtype(value):
            return np.dtype(tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type))

        head_size = _genai_head_size(Path(path).parent)
        if "input_ids" not in inputs:
            raise NotADecoder(f"{path}: no input named input_ids, so not a decoder this loop can run")
        cache, unknown = [], []
        for name, value in inputs.items():
            if name in ("input_ids", "attention_mask", "position_ids"):
                continue
            match = _CACHE_INPUT.match(name)
            output = "present" + match.group(1) if match else None
            if output not in outputs:
                unknown.append(name)
                continue
            shape = dims(value)
            growing = [a for a, d in enumerate(shape) if d is None and a > 0]
            if len(growing) > 1:  # the sequence axis is the one named otherwise in present (past -> total)
                growing = [a for a in growing if _dim_name(value, a) != _dim_name(outputs[output], a)]
            if len(shape) < 2 or len(growing) != 1:
                raise NotADecoder(f"{path}: cache input {name} has shape {_shape_text(shape)}: expected "
                                  f"one symbolic sequence axis beside the batch")
            if shape[-1] is None and growing[0] != len(shape) - 1 and head_size:
                shape = shape[:-1] + (head_size,)
            cache.append(CacheSlot(name, output, shape, growing[0], dtype(value)))
        if unknown:
            raise NotADecoder(f"{path}: inputs {', '.join(unknown)} are neither input_ids, attention_mask, "
                              f"position_ids nor a cache (past...) returned as present...")
        if not cache:
            raise NotADecoder(f"{path}: no key/value cache inputs (past...), so no generation loop to time")
        logits = "logits" if "logits" in outputs else model.graph.output[0].name
        ids_shape = dims(inputs["input_ids"])
        return cls(path=path, ids_dtype=dtype(inputs["input_ids"]),
                   whole_prompt=len(ids_shape) > 1 and ids_shape[1] != 1,
                   mask_dtype=dtype(inputs["attention_mask"]) if "attention_mask" in inputs else None,
                   positions_dtype=dtype(inputs["position_ids"]) if "position_ids" in inputs else None,
                   logits=logits, cache=tuple(cache))

    @property
    def output_names(self) -> list[str]:
        """What one call returns: the logits, then each cache slot's present."""
        return [self.logits] + [s.output for s in self.cache]

    def cache_shape(self, slot: CacheSlot, past: int) -> tuple[int, ...]:
        """``slot``'s shape at batch 1 holding ``past`` positions."""
        shape = tuple(1 if a == 0 else (past if a == slot.axis else d) for a, d in enumerate(slot.shape))
        if any(d is None for d in shape):
            raise NotADecoder(f"{self.path}: cache input {slot.input} has shape {_shape_text(slot.shape)}: "
                              f"every axis but the batch and the sequence must have a size (or, for "
                              f"onnxruntime-genai's model, a genai_config.json beside it)")
        return shape

    def empty_cache(self) -> dict[str, np.ndarray]:
        """The cache before the first token: every slot with no positions."""
        return {slot.input: np.zeros(self.cache_shape(slot, 0), slot.dtype) for slot in self.cache}

    def feeds(self, tokens: list[int], past: int, cache: dict) -> dict[str, np.ndarray]:
        """One call's inputs: ``tokens`` at positions ``past``, ``past + 1``, ... after
        ``past`` cached ones."""
        n = len(tokens)
        out = {"input_ids": np.array([tokens], self.ids_dtype), **cache}
        if self.mask_dtype is not None:
            out["attention_mask"] = np.ones((1, past + n), self.mask_dtype)
        if self.positions_dtype is not None:
            out["position_ids"] = np.arange(past, past + n, dtype=self.positions_dtype)[None]
        return out


def _dim_name(value, axis: int) -> str:
    return value.type.tensor_type.shape.dim[axis].dim_param


def _genai_head_size(folder: Path) -> int | None:
    """The head size onnxruntime-genai's builder leaves symbolic in the cache
    (``kv_cache_dim``) and writes in ``genai_config.json`` beside the model."""
    import json

    try:
        return int(json.loads((folder / "genai_config.json").read_text())["model"]["decoder"]["head_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _shape_text(shape) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


@dataclass
class Generation:
    """One greedy run: the tokens chosen, each step's last-position logits, seconds to
    the first new token (the prompt read) and for the rest."""
    tokens: list[int] = field(default_factory=list)
    logits: list[np.ndarray] = field(default_factory=list)
    first_token_s: float = 0.0
    rest_s: float = 0.0

    def tokens_per_second(self) -> float:
        return (len(self.tokens) - 1) / self.rest_s if self.rest_s > 0 else float("nan")


def generate(session, decoder: Decoder, prompt: list[int], new_tokens: int,
             forced: list[int] | None = None, keep_logits: bool = True) -> Generation:
    """Greedy generation of ``new_tokens`` after ``prompt`` in an onnxruntime
    ``session``; with ``forced``, those tokens are fed instead of the chosen ones (each
    step's choice is still recorded)."""
    out = Generation()
    cache, past = decoder.empty_cache(), 0
    names = decoder.output_names

    def step(tokens: list[int]) -> np.ndarray:
        nonlocal cache, past
        try:
            results = session.run(names, decoder.feeds(tokens, past, cache))
        except Exception as e:  # onnxruntime's own exception types
            raise NotADecoder(f"{decoder.path}: fails at {past} cached and {len(tokens)} new tokens: "
                              f"{first_line(e)}") from None
        past += len(tokens)
        cache = {s.input: r for s, r in zip(decoder.cache, results[1:])}
        logits = results[0]
        return logits.reshape(-1, logits.shape[-1])[-1]  # full logits or the last position alike

    start = time.perf_counter()
    if decoder.whole_prompt:
        last = step(prompt)
    else:
        for token in prompt:
            last = step([token])
    for i in range(new_tokens):
        out.tokens.append(int(np.argmax(last)))
        if keep_logits:
            out.logits.append(np.array(last, np.float64))
        if i == 0:
            out.first_token_s = time.perf_counter() - start
            start = time.perf_counter()
        if i + 1 < new_tokens:
            last = step([forced[i] if forced else out.tokens[-1]])
    out.rest_s = time.perf_counter() - start
    return out


def logits_error(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    """The largest difference over all steps, relative to the step's largest logit."""
    return max(float(np.max(np.abs(g - w)) / max(np.max(np.abs(w)), 1e-30)) for g, w in zip(got, want))


@dataclass
class Row:
    label: str
    path: str
    first_token_s: list[float] = field(default_factory=list)
    tokens_per_s: list[float] = field(default_factory=list)
    error: float | None = None  # against the first model's logits
    disagreements: int = 0  # steps where this model would have chosen another token


def measure(paths: list[str], prompt_tokens: int = 64, new_tokens: int = 64, rounds: int = 5,
            labels: list[str] | None = None, seed: int = 0, progress=None, threads: int = 1) -> list[Row]:
    """Each model's generation timed in ``rounds`` rounds, the models in a fresh random
    order each round, a fresh session each (``threads`` intra-op threads, all onnxruntime optimizations)
    warmed by a short generation; the first model's tokens fed to all (its own greedy
    choice), and each one's logits compared with the first's at every step. The first
    model also runs as a second row, an A/A pair: the spread two identical files show."""
    from .timing import make_session, return_freed_memory, round_order

    decoders = [Decoder.read(p) for p in paths]
    labels = list(labels or paths)  # as the user named them: genai's files are all model.onnx
    rows = [Row(label, d.path) for label, d in zip(labels, decoders)]
    rows.insert(1, Row(labels[0] + " (A/A)", decoders[0].path))
    decoders.insert(1, decoders[0])
    rng = np.random.default_rng(seed)
    vocabulary = _vocabulary(decoders[0])
    for decoder in decoders[2:]:  # before any timing: a model of another vocabulary cannot be fed these tokens
        if (size := _vocabulary(decoder)) != vocabulary:
            raise NotADecoder(f"{decoder.path}: scores {size} tokens where the first model scores "
                              f"{vocabulary}: not the same model's weights")
    prompt = [int(t) for t in rng.integers(0, vocabulary, prompt_tokens)]
    reference = generate(make_session(decoders[0].path, threads=threads), decoders[0], prompt, new_tokens)
    return_freed_memory()
    for i in range(rounds):
        for k in round_order(list(range(len(rows))), rng):
            session = make_session(decoders[k].path, threads=threads)
            generate(session, decoders[k], prompt[:8], 4, keep_logits=False)  # warm-up
            run = generate(session, decoders[k], prompt, new_tokens, forced=reference.tokens, keep_logits=i == 0)
            del session
            return_freed_memory()
            rows[k].first_token_s.append(run.first_token_s)
            rows[k].tokens_per_s.append(run.tokens_per_second())
            if i == 0:
                rows[k].error = logits_error(run.logits, reference.logits)
                rows[k].disagreements = sum(a != b for a, b in zip(run.tokens, reference.tokens))
        if progress:
            progress(i + 1, rounds)
    return rows


def _vocabulary(decoder: Decoder) -> int:
    """How many tokens the model scores (the prompt is drawn below it): one token's run."""
    from .timing import make_session, return_freed_memory

    logits = generate(make_session(decoder.path), decoder, [0], 1).logits[0]
    return_freed_memory()
    return int(logits.size)


def _tail(text: str, width: int) -> str:
    return text if len(text) <= width else "..." + text[len(text) - width + 3:]


def _threads_text(threads: int) -> str:
    return "one thread" if threads == 1 else f"{threads} threads"


def table(rows: list[Row], prompt_tokens: int, new_tokens: int, threads: int = 1) -> str:
    """The rows as text: medians over rounds, and each model's ratio to the first
    round by round (median, and the range over rounds)."""
    base = rows[0]

    def ratios(row: Row, key: str, faster_is_less: bool) -> str:
        pairs = [(b / r if faster_is_less else r / b) for r, b in zip(getattr(row, key), getattr(base, key))]
        return f"{np.median(pairs):.3f}x [{min(pairs):.3f}, {max(pairs):.3f}]"

    lines = [f"{'model':<34}{'first token ms':>15}{'vs first':>27}{'tokens/s':>10}{'vs first':>27}"
             f"{'max rel err':>13}{'other token':>12}"]
    for row in rows:
        err = "-" if row is base else f"{row.error:.1e}"
        lines.append(f"{_tail(row.label, 33):<34}{1e3 * np.median(row.first_token_s):>15.1f}"
                     f"{ratios(row, 'first_token_s', True):>27}{np.median(row.tokens_per_s):>10.1f}"
                     f"{ratios(row, 'tokens_per_s', False):>27}{err:>13}{row.disagreements:>12}")
    lines.append(f"greedy generation, prompt {prompt_tokens} tokens, {new_tokens} new (batch 1): onnxruntime "
                 f"CPU, ORT_ENABLE_ALL, {_threads_text(threads)}, wall time; medians over "
                 f"{len(base.tokens_per_s)} rounds "
                 f"(models in a fresh random order each round, a fresh session each, warmed by a short "
                 f"generation); first token = the prompt read and the first token chosen; tokens/s = the "
                 f"new tokens after the first; vs first = against the first model, round by round (median "
                 f"[range]), the A/A row the same file twice; max rel err = largest logit difference at "
                 f"any step against the first model, relative to that step's largest logit (every model "
                 f"fed the first's tokens); other token = steps where the model would have chosen "
                 f"another token")
    return "\n".join(lines)


# --- one decode step at a given cache length ---------------------------------------------

@dataclass
class StepRow:
    label: str
    path: str
    seconds: dict[int, list[float]] = field(default_factory=dict)  # cache length -> one median per round
    error: float | None = None  # against the first model's logits, at every cache length


def measure_steps(paths: list[str], pasts: tuple[int, ...] = (31, 255), rounds: int = 20, runs: int = 15,
                  labels: list[str] | None = None, seed: int = 0, progress=None,
                  threads: int = 1, floor: bool = False) -> list[StepRow]:
    """One decode step (batch 1, one new token) on a cache of each length in ``pasts``,
    as a generation loop runs it for each token: the median of ``runs`` steps, in CPU
    seconds with one thread (``threads`` 1: what the step costs, least moved by load),
    else in wall seconds (CPU time would add up every thread's). With ``floor``, the first
    model's weight products alone on one token (``step_floor.matmul_floor``) run as a row
    of their own, timed the same way: what no rewrite of the step goes below. Each round the models run in a fresh random order, a fresh session
    each (all onnxruntime optimizations) warmed by one step at each length; the first
    model also runs as a second row, an A/A pair. Every model is fed the same token and
    cache (random values; slots matched by name, ``.0.key`` in ``past.0.key`` and
    ``past_key_values.0.key`` alike), and its logits are compared with the first's."""
    from .timing import make_session, return_freed_memory, round_order

    decoders = [Decoder.read(p) for p in paths]
    labels = list(labels or paths)
    rows = [StepRow(label, d.path) for label, d in zip(labels, decoders)]
    rows.insert(1, StepRow(labels[0] + " (A/A)", decoders[0].path))
    decoders.insert(1, decoders[0])
    rng = np.random.default_rng(seed)
    token = int(rng.integers(0, _vocabulary(decoders[0])))
    caches = {past: _random_cache(decoders, past, rng) for past in pasts}
    feeds = [{past: _step_feeds(d, token, past, caches[past]) for past in pasts} for d in decoders]
    names = [d.output_names for d in decoders]
    clock = time.process_time if threads == 1 else time.perf_counter
    session = make_session(decoders[0].path, threads=threads)
    reference = {past: np.array(_step(session, decoders[0], names[0], feeds[0][past], past)[0].reshape(-1),
                                np.float64) for past in pasts}
    del session
    return_freed_memory()
    floor_row = None
    if floor:
        from .step_floor import matmul_floor

        floor_model, floor_feeds = matmul_floor(decoders[0].path)
        floor_row = len(rows)
        rows.append(StepRow("floor: MatMuls alone", decoders[0].path))
    for i in range(rounds):
        for k in round_order(list(range(len(rows))), rng):
            if k == floor_row:  # it reads no cache: timed at each length all the same, after a warm-up run
                session = make_session(floor_model, threads=threads)
                session.run(None, floor_feeds)
                for past in pasts:
                    rows[k].seconds.setdefault(past, []).append(
                        _median_seconds(lambda: session.run(None, floor_feeds), runs, clock))
            else:
                decoder = decoders[k]
                session = make_session(decoder.path, threads=threads)
                for past in pasts:
                    logits = _step(session, decoder, names[k], feeds[k][past], past)[0].reshape(-1)  # the warm-up too
                    if i == 0:
                        rows[k].error = max(rows[k].error or 0.0, logits_error([logits], [reference[past]]))
                    rows[k].seconds.setdefault(past, []).append(_median_seconds(
                        lambda: _step(session, decoder, names[k], feeds[k][past], past), runs, clock))
            del session
            return_freed_memory()
        if progress:
            progress(i + 1, rounds)
    return rows


def _median_seconds(run, runs: int, clock) -> float:
    """The median of ``runs`` calls of ``run`` on ``clock``."""
    times = []
    for _ in range(runs):
        start = clock()
        run()
        times.append(clock() - start)
    return float(np.median(times))


def _step_feeds(decoder: Decoder, token: int, past: int, cache: dict) -> dict:
    """One step's inputs: ``token`` after ``past`` cached positions, ``cache`` by slot key."""
    return decoder.feeds([token], past, {s.input: cache[_slot_key(s)] for s in decoder.cache})


def _step(session, decoder: Decoder, names: list[str], feeds: dict, past: int) -> list:
    """One call of ``session``: its logits and cache (``names``: ``decoder.output_names``)."""
    try:
        return session.run(names, feeds)
    except Exception as e:  # onnxruntime's own exception types
        raise NotADecoder(f"{decoder.path}: fails at {past} cached tokens: {first_line(e)}") from None


def _slot_key(slot: CacheSlot) -> str:
    """What names a cache slot across models: the name's part after ``past`` or ``past_key_values``."""
    return _CACHE_INPUT.match(slot.input).group(1)


def _random_cache(decoders: list[Decoder], past: int, rng) -> dict[str, np.ndarray]:
    """Cache tensors of ``past`` positions for every slot of the first model, by slot key;
    the other models must take the same slots at the same shapes."""
    first = decoders[0]
    cache = {_slot_key(slot): rng.standard_normal(first.cache_shape(slot, past)).astype(slot.dtype)
             for slot in first.cache}
    for decoder in decoders[1:]:
        for slot in decoder.cache:
            want = cache.get(_slot_key(slot))
            if want is None or want.shape != decoder.cache_shape(slot, past):
                raise NotADecoder(f"{decoder.path}: cache input {slot.input} {_shape_text(slot.shape)} has no slot "
                                  f"of that shape in {first.path}: not the same model's cache")
    return cache


def step_table(rows: list[StepRow], pasts: tuple[int, ...], threads: int = 1) -> str:
    """The rows as text: each cache length's median step time over rounds, and the
    speedup over the first model from the paired rounds (the guard's signed-rank
    interval, 95 %)."""
    from .guard import compare

    base = rows[0]
    header = f"{'model':<34}" + "".join(f"{f'past {p} ms':>13}{'vs first':>27}" for p in pasts) + f"{'max rel err':>13}"
    lines = [header]
    for row in rows:
        cells = []
        for p in pasts:
            if row is base:
                ratio = "-"
            else:
                c = compare(base.seconds[p], row.seconds[p])
                ratio = f"{c.ratio:.3f}x [{c.low:.3f}, {c.high:.3f}]"
            cells.append(f"{1e3 * np.median(row.seconds[p]):>13.3f}{ratio:>27}")
        err = "-" if row is base or row.error is None else f"{row.error:.1e}"
        lines.append(f"{_tail(row.label, 33):<34}" + "".join(cells) + f"{err:>13}")
    lines.append(f"one decode step (batch 1, one new token on a cache of the given length): onnxruntime CPU, "
                 f"ORT_ENABLE_ALL, {_threads_text(threads)}, {'CPU' if threads == 1 else 'wall'} time, the median "
                 f"of each round's runs over "
                 f"{len(base.seconds[pasts[0]])} rounds (models in a fresh random order each round, a fresh "
                 f"session each); vs first = speedup over the first model from the paired rounds, with the "
                 f"signed-rank 95 % interval (the A/A row is the same file twice); max rel err = largest logit "
                 f"difference against the first model, relative to its largest logit, at any cache length "
                 f"(every model fed the same token and cache)" +
                 ("; floor = the first model's weight products alone (MatMul, Gemm, MatMulNBits; "
                  "q/k/v and gate/up packed) on one token" if rows[-1].label.startswith("floor: ") else ""))
    return "\n".join(lines)
