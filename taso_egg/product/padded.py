"""Decoders fed a batch as transformers' ``generate`` feeds one (``bench --generate ...
--padded``): rows of different lengths left-padded, a mask with a hole, the positions
counted over the kept tokens (1 on padding), then several new tokens at once on the
cache, then one token at a time. Every model runs on its own cache and is compared
with the first at every call, logits and present cache: where a rewrite read the mask
as lengths (GroupQueryAttention as other tools write it, onnxruntime-genai's models)
the padded rows differ; an exact one does not."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .generate import Decoder, _vocabulary

PROMPT = 8          # tokens of the prompt, padding included
PADDING = 3         # row 0: left-padded by this many
HOLE = 4            # row 1: this position masked out
ON_CACHE = 3        # tokens fed at once on the cache after the prompt
STEPS = 8           # then one token at a time


@dataclass
class Comparison:
    path: str
    logits: list[float]   # per call: largest logit difference, relative to the first model's largest
    cache: list[float]    # per call: largest present-cache difference, relative likewise
    refused: str = ""     # the call onnxruntime refused (the model then runs no further)

    @property
    def worst(self) -> tuple[float, float]:
        return max(self.logits), max(self.cache)


def _positions(mask: np.ndarray) -> np.ndarray:
    """transformers' numbering: kept tokens counted from 0, padding at 1."""
    return np.where(mask == 1, np.cumsum(mask, axis=1) - 1, 1)


def run_padded(paths: list[str], threads: int = 1, seed: int = 0) -> list[Comparison]:
    """Each model of ``paths`` through the prompt, the several tokens on the cache and
    the single steps, fed the same tokens (the first model's greedy choices), compared
    with the first."""
    import onnxruntime as ort

    decoders = [Decoder.read(p) for p in paths]
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    sessions = [ort.InferenceSession(p, options, providers=["CPUExecutionProvider"]) for p in paths]
    vocabulary = _vocabulary(decoders[0])
    rng = np.random.default_rng(seed)
    batch = 2
    mask = np.ones((batch, PROMPT), np.int64)
    mask[0, :PADDING] = 0
    mask[1, HOLE] = 0
    calls = [rng.integers(0, vocabulary, (batch, PROMPT)), rng.integers(0, vocabulary, (batch, ON_CACHE))]
    caches = [{slot.input: np.zeros((batch,) + d.cache_shape(slot, 0)[1:], slot.dtype) for slot in d.cache}
              for d in decoders]
    found = [Comparison(p, [], []) for p in paths]
    past = 0
    for step in range(2 + STEPS):
        tokens = calls[step] if step < 2 else next_tokens[:, None]
        mask = mask if step == 0 else np.concatenate([mask, np.ones((batch, tokens.shape[1]), np.int64)], axis=1)
        positions = _positions(mask)[:, past:]
        results = []
        for i, (d, s) in enumerate(zip(decoders, sessions)):
            feeds = {"input_ids": tokens.astype(d.ids_dtype), **caches[i]}
            if d.mask_dtype is not None:
                feeds["attention_mask"] = mask.astype(d.mask_dtype)
            if d.positions_dtype is not None:
                feeds["position_ids"] = positions.astype(d.positions_dtype)
            out = None
            if not found[i].refused:
                try:
                    out = s.run(d.output_names, feeds)
                except Exception as e:  # onnxruntime's own refusal, kept as it says it
                    if i == 0:
                        raise
                    found[i].refused = f"call {step + 1}: " + str(e).split("Status Message: ")[-1].splitlines()[0]
            if out is not None:
                caches[i] = {slot.input: value for slot, value in zip(d.cache, out[1:])}
            results.append(out)
        want, want_cache = results[0], caches[0]
        scale = float(np.abs(want[0]).max()) or 1.0
        cache_scale = max(float(np.abs(v).max()) for v in want_cache.values()) or 1.0
        for comparison, got, cache in zip(found, results, caches):
            if got is None:
                continue
            comparison.logits.append(float(np.abs(got[0] - want[0]).max()) / scale)
            # by the cache input each present tensor feeds: models order their outputs differently
            comparison.cache.append(max(float(np.abs(cache[name] - value).max()) for name, value in want_cache.items()
                                        if name in cache) / cache_scale)
        past = mask.shape[1]
        next_tokens = want[0][:, -1].argmax(axis=-1)
    return found


def table(found: list[Comparison]) -> str:
    lines = [f"{'model':34}{'prompt':>10}{'3 on cache':>12}{'8 steps':>10}{'cache':>10}"]
    for c in found:
        name = c.path if len(c.path) <= 33 else "..." + c.path[-30:]
        cells = [f"{v:.1e}" for v in (c.logits[:1] + c.logits[1:2] + [max(c.logits[2:], default=None)])
                 if v is not None]
        cells += ["refused"] * (3 - len(cells))
        lines.append(f"{name:34}{cells[0]:>10}{cells[1]:>12}{cells[2]:>10}{max(c.cache):>10.1e}"
                     + (f"  ({c.refused})" if c.refused else ""))
    lines.append(f"a batch of 2 fed as transformers' generate feeds it: row 0 left-padded by {PADDING} of a "
                 f"{PROMPT}-token prompt, row 1 with position {HOLE} masked out, positions counted over the kept "
                 f"tokens; then {ON_CACHE} tokens at once on the cache, then {STEPS} single steps (the first "
                 f"model's greedy tokens). Each model runs on its own cache; each column the largest logit "
                 f"difference against the first model, relative to its largest logit (cache: the present "
                 f"cache likewise, over all calls)")
    return "\n".join(lines)
