"""Behaviour fingerprint: what a refactor must leave unchanged.

Prints, per zoo model (full size, default corpus and limits): the saturated e-graph's
size and a hash of its serialization, and for each extractor the extracted cost and the
extracted graph's structural hash; then hashes of the shipped rule files, of the loaded
corpus, of the compiled egglog program, and the Z3 verdicts on a fixed sample of rules.
Run it before and after a change and diff the two outputs:

    .venv/bin/python scripts/fingerprint.py > before.txt
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time


def _sha(data) -> str:
    if not isinstance(data, bytes):
        data = data.encode()
    return hashlib.sha256(data).hexdigest()[:16]


def egraph_digest(serialized: dict, rounds: int = 4) -> str:
    """A hash of the e-graph that does not depend on e-class and e-node ids (which
    follow rule order): Weisfeiler-Lehman refinement of class labels over the
    egraph-serialize JSON (node ops, children, classes)."""
    nodes = serialized["nodes"]
    label = {n["eclass"]: "" for n in nodes.values()}
    for _ in range(rounds):
        members: dict[str, list[str]] = {}
        for n in nodes.values():
            kids = ",".join(label[nodes[c]["eclass"]] for c in n["children"])
            members.setdefault(n["eclass"], []).append(_sha(f"{n['op']}({kids})"))
        label = {c: _sha("|".join(sorted(m))) for c, m in members.items()}
    return _sha("|".join(sorted(label.values())))


def main(argv=None) -> int:
    from taso_egg.research import zoo
    from taso_egg.product.optimize_graph import extract_graph
    from taso_egg.cost import load_cost_model
    from taso_egg.egraph.language import declarations
    from taso_egg.egraph.saturate import saturate
    from taso_egg.egraph.rule_compiler import compile_rules
    from taso_egg.rules.corpus import load_corpus
    from taso_egg.rules.prove.prover import AXIOM_FILE

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=sorted(n for n in zoo.MODELS if not n.endswith("-small")))
    p.add_argument("--extractors", nargs="+", default=["greedy-dag", "ilp"])
    p.add_argument("--proofs", type=int, default=60, help="rules in the Z3 sample (0: none)")
    args = p.parse_args(argv)

    rule_dir = AXIOM_FILE.parent
    for f in sorted(rule_dir.glob("*.rules")) + sorted(rule_dir.glob("*.json")):
        print(f"file {f.name} {_sha(f.read_bytes())}")
    rules = tuple(load_corpus())
    print(f"corpus {len(rules)} rules {_sha(repr(rules).replace(str(rule_dir), ''))}")
    print(f"egglog declarations {_sha(declarations())} as a set of lines "
          f"{_sha(chr(10).join(sorted(declarations().splitlines())))}")
    print(f"egglog rules {_sha(compile_rules(rules))}")
    model = load_cost_model()
    for name in args.models:
        t0 = time.perf_counter()
        g = zoo.MODELS[name]()
        sat = saturate(g, rules=rules, count_classes=False)
        line = (f"model {name} nodes {len(g.nodes)} enodes {sat.enodes} eclasses {sat.eclasses()} "
                f"iters {len(sat.iterations)} stop {sat.stop_reason!r} egraph {egraph_digest(sat.serialized())}")
        for ex in args.extractors:
            e = extract_graph(sat, ex, model)
            line += f" | {ex} {e.dag_cost:.9g} {e.graph.structural_hash()[:16]}"
        print(line, flush=True)
        print(f"  {name}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    if args.proofs:
        from taso_egg.rules.prove.driver import verify_rules
        hand = [r for r in rules if "hand" in r.where]
        step = max(1, len(rules) // args.proofs)
        sample = list(dict.fromkeys(hand + list(rules[::step])))
        results = verify_rules(sample, timeout_s=10.0, jobs=2)
        verdicts = [(r.rule, r.status, r.axioms_used) for r in results]
        counts = {s: sum(v[1] == s for v in verdicts) for s in sorted({v[1] for v in verdicts})}
        print(f"proofs {len(sample)} rules {counts} {_sha(repr(verdicts))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
