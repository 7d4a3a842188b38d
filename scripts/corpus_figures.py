"""The corpus's figures, printed from the files themselves, so that no document types
them (docs/architecture.md refers here):

    .venv/bin/python scripts/corpus_figures.py

- per rule file of the package: its rules, how many are proved, whether the default
  corpus (``load_corpus()``) reads it or it is a study file loaded only by name;
- the axioms the verifier proves from, and the operators of the table;
- the shipped generated corpus's run (``rules/generated.stats.json``): its command,
  graphs enumerated, candidates, why candidates were pruned, rules emitted and proved,
  and its seconds on the machine that ran it.
"""

from __future__ import annotations

import json
from importlib.resources import files

from taso_egg.ops import OPS
from taso_egg.rules.corpus import STUDY_FILES, corpus_files, load_corpus, load_rule_file
from taso_egg.rules.prove.prover import load_axioms


def _row(label: str, value) -> str:
    return f"  {label:<44} {value:>12,}" if isinstance(value, int) else f"  {label:<44} {value:>12}"


def rule_files() -> list[str]:
    lines = ["rule files (rules/*.rules)"]
    for f in corpus_files():
        rules = load_rule_file(f)
        where = "study file (by name)" if f.name in STUDY_FILES else "default corpus"
        proved = sum(r.proved for r in rules)
        lines.append(f"  {f.name:<28} {len(rules):>6,} rules, {proved:>6,} proved   {where}")
    default, study = load_corpus(), load_corpus(study=True)
    lines += [_row("load_corpus(): proved rules loaded", len(default)),
              _row("load_corpus(study=True)", len(study)),
              _row("axioms (rules/axioms.rules)", len(load_axioms())),
              _row("operators in the table (ops.OPS)", len(OPS)),
              _row("  of them usable in rules (in_rules)", sum(s.in_rules for s in OPS.values()))]
    return lines


def generation_run() -> list[str]:
    stats = json.loads(files("taso_egg.rules").joinpath("generated.stats.json").read_text())
    verification = stats.get("verification", {})
    lines = [f"the generated corpus's run (rules/generated.stats.json): `{stats.get('command', '?')}`",
             _row("menu, size", f"{stats['menu']}, {stats['size']}"),
             _row("graphs enumerated", stats["graphs_enumerated"]),
             _row("candidate pairs", stats["candidates"]),
             _row("kept candidates", stats["kept_candidates"]),
             _row("rules emitted", stats["rules_emitted"]),
             _row("proved", verification.get("proved", "?")),
             _row("unknown (not proved)", verification.get("unknown", "?")),
             _row("refuted", verification.get("refuted", "?"))]
    lines += [_row(f"pruned: {reason}", count) for reason, count in stats["pruned"].items() if count]
    for name, counts in stats.get("files", {}).items():
        lines.append(_row(f"written to {name}", counts["rules"]))
    seconds = {k: stats[k] for k in ("enumeration_seconds", "pruning_seconds", "derivation_seconds",
                                     "generation_seconds") if k in stats}
    seconds["proving_seconds"] = verification.get("seconds")
    lines += [_row(k.replace("_", " "), f"{v:,.0f} s") for k, v in seconds.items() if v is not None]
    return lines


def main() -> None:
    print("\n".join(rule_files() + [""] + generation_run()))


if __name__ == "__main__":
    main()
