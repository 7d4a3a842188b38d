"""``check_graphs_equivalent``: any two graphs, whole (float64, tracked exponents),
and what the region check shares with it (weights by name, stand-ins for all-zero
weights)."""

from __future__ import annotations

import logging
from contextlib import contextmanager

import numpy as np

from ..errors import VerificationError
from .scaled_executor import run_scaled, scaled_error
from .tolerance import RTOL, Inconclusive, check_tolerance

log = logging.getLogger("taso_egg.check")


def check_graphs_equivalent(original, candidate, seed: int = 0, rtol: float = RTOL,
                            what: str = "optimized graph") -> float:
    """Run both graphs with our executor on the same random inputs and compare.

    Both run in float64 with a tracked exponent per tensor (``run_scaled``): some
    graphs (TASO's BERT: attention without softmax is cubic per layer) overflow or
    vanish in any fixed-range float type on almost every input, and a comparison of
    infinities proves nothing. A difference above ``rtol`` passes only within SAFETY
    times the outputs' round-off noise (BERT's grows 3x per layer: 1e-2 relative at
    32 layers). If even then the original's outputs are not finite and
    non-zero, the check fails as inconclusive rather than pass vacuously, with one
    exception: outputs that are zero because weights are (torchvision initializes
    ViT's classifier head to zeros) are checked again with random stand-ins for the
    all-zero weights, in both graphs alike. Rewrites hold for any weight values, so
    agreeing there is agreeing on the model's own weights too, and it tests the graph
    above the zeros, which the zero outputs hide."""
    from ..executor import random_inputs

    feeds = random_inputs(original, seed)
    same_inputs(candidate, feeds, what)
    share_weights(original, candidate)
    with np.errstate(all="ignore"):  # overflow is detected below, not warned about
        try:
            return _check(original, candidate, feeds, rtol, what, seed)
        except Inconclusive as e:
            zero = zero_weights(original)
            if not e.zero or not zero:
                raise VerificationError(str(e)) from None
            note_stand_ins(zero)
            with stand_ins(original, candidate, zero, seed):
                return _check(original, candidate, feeds, rtol, what + " (zero weights replaced)", seed)


def same_inputs(candidate, feeds, what: str) -> None:
    names = {n.params["name"] for n in candidate.inputs()}
    if names != set(feeds):
        raise VerificationError(f"{what}: inputs {sorted(names)} differ from the original's {sorted(feeds)}")


def _all_zero(a: np.ndarray) -> bool:
    return a.dtype.kind == "f" and a.size > 0 and not np.any(a)


def zero_weights(graph) -> list:
    return [n for n in graph.weights() if _all_zero(graph.weight_array(n))]


def note_stand_ins(zero) -> None:
    names = ", ".join(n.params["name"] for n in zero[:3]) + (" ..." if len(zero) > 3 else "")
    log.warning("note: %d all-zero weight(s) (%s) would make the check vacuous where they "
                "zero what follows; they get random stand-ins in both graphs", len(zero), names)


@contextmanager
def stand_ins(original, candidate, weights, seed: int):
    """Random data for the given all-zero weights of ``original`` and for the
    candidate's weights of the same names, put back on exit."""
    rng = np.random.default_rng(seed + 1)
    data = {n.params["name"]: rng.standard_normal(n.params["shape"]).astype(n.params["dtype"])
            for n in weights}
    saved = []
    for g in (original, candidate):
        for n in g.weights():
            if n.params["name"] in data:
                saved.append((g, n.id, g.weight_data.get(n.id)))
                g.weight_data[n.id] = data[n.params["name"]]
    try:
        yield
    finally:
        for g, node_id, old in reversed(saved):  # the same graph may come twice
            if old is None:
                g.weight_data.pop(node_id, None)
            else:
                g.weight_data[node_id] = old


def _check(original, candidate, feeds, rtol, what, seed) -> float:
    ref, got = run_scaled(original, feeds), run_scaled(candidate, feeds)
    if set(ref) != set(got):
        raise VerificationError(f"{what}: outputs {sorted(got)} differ from the original's {sorted(ref)}")
    errors = {}
    for name, (m, e) in ref.items():
        if m.dtype.kind == "f" and m.size and not (np.all(np.isfinite(m)) and np.any(m)):
            raise Inconclusive(f"{what}: inconclusive: the original's output {name!r} is "
                                f"not finite and non-zero even with tracked exponents, so "
                                f"equality cannot be checked", zero=bool(np.all(m == 0)))
        if got[name][0].shape != m.shape:
            raise VerificationError(f"{what}: output {name!r} has shape {list(got[name][0].shape)}, "
                                    f"expected {list(m.shape)}")
        errors[name] = scaled_error((m, e), got[name])
    worst = max(errors.values(), default=0.0)
    if worst > rtol:
        name = max(errors, key=errors.get)
        perturbed = run_scaled(original, feeds, perturb=np.random.default_rng(seed + 2))
        check_tolerance(worst, rtol, lambda: scaled_error(ref[name], perturbed[name]), what,
                   f"output {name!r}")
    return worst


def share_weights(original, candidate) -> None:
    """Weights are identified by name: give the candidate the original's data."""
    by_name = {n.params["name"]: n for n in original.weights()}
    for n in candidate.weights():
        src = by_name.get(n.params["name"])
        if src is not None and n.id not in candidate.weight_data:
            candidate.weight_data[n.id] = original.weight_array(src)
