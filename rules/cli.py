"""``taso-egg rules generate | verify | stats``: discover rules, prove them, report.

generate  enumerate graphs, fingerprint, prune, write the candidate rules (status
          ``unchecked``) and a stats file beside them (``NAME.stats.json``);
verify    prove each rule with the Z3 verifier, float-check the proved ones, and write
          the proof records back into the rule files (atomically);
stats     the table: graphs enumerated, candidates, pruned by reason, proved, rejected
          by reason, seconds.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from pathlib import Path

from taso_egg.errors import RuleError, TasoEggError
from taso_egg.files import write_atomically

from .lang import Proof, Rule, load_rule_file, parse_rules, with_proof_records

RULES_DIR = Path(__file__).parent
DEFAULT_OUTPUT = RULES_DIR / "generated.rules"
# Rule files of the corpus that `verify` and `stats` read by default (not the axioms).
DEFAULT_FILES = ("taso_hand.rules", "generated.rules")


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="rules_command", required=True)
    p = sub.add_parser("generate", help="enumerate graphs and write candidate rules")
    p.add_argument("--size", type=int, default=3, help="operators per graph (default 3)")
    p.add_argument("--menu", default=None, help="operator menu: taso (default for size <= 3), "
                   "reduced (default for size 4), matrix")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-o", "--output", default=str(DEFAULT_OUTPUT), help="rule file to write")
    p = sub.add_parser("verify", help="prove rules and write their proof records")
    p.add_argument("files", nargs="*", help=f"rule files (default: {', '.join(DEFAULT_FILES)})")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per rule (default 10)")
    p = sub.add_parser("stats", help="print the generation and verification table")
    p.add_argument("files", nargs="*", help=f"rule files (default: {', '.join(DEFAULT_FILES)})")


def run(args) -> int:
    return {"generate": _generate, "verify": _verify, "stats": _stats}[args.rules_command](args)


def _bar(total: int, desc: str):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, file=sys.stderr, leave=False, dynamic_ncols=True)


def stats_path(rule_file) -> Path:
    p = Path(rule_file)
    return p.with_name(p.name.removesuffix(".rules") + ".stats.json")


def write_text_atomically(path, text: str) -> None:
    """Write ``text`` to ``path``, all or nothing."""
    write_atomically(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"), RuleError)


# --- generate ------------------------------------------------------------------------


def generate_rules(size: int = 3, menu=None, seed: int = 0, progress_bars: bool = False):
    """Enumerate, prune and emit rules. Returns ``(rules, stats)``; every rule has a
    ``(status unchecked)`` record and has passed the numeric check on its example."""
    from .generate import MENUS, enumerate_terms
    from .prune import generalize_or_pin, prune, rules_from

    if menu is None:
        menu = MENUS["taso" if size <= 3 else "reduced"]()
    elif isinstance(menu, str):
        if menu not in MENUS:
            raise TasoEggError(f"unknown menu {menu!r}; choose from {', '.join(MENUS)}")
        menu = MENUS[menu]()
    start = time.perf_counter()
    bar = _bar(size * len(menu.ops), f"enumerating size {size}") if progress_bars else None
    e = enumerate_terms(menu, size, seed,
                        progress=(lambda d, n: bar.update(d - bar.n)) if bar else None)
    if bar:
        bar.close()
    bar = _bar(len([c for c in e.classes.values() if len(c) > 1]), "pruning") if progress_bars else None
    pruned = prune(e, progress=(lambda d, n: bar.update(d - bar.n)) if bar else None)
    if bar:
        bar.close()
    found_by = f"generator-{size}"
    rules = rules_from(e, pruned, f"gen{size}")
    bar = _bar(len(rules), "checking on other shapes") if progress_bars else None
    checked, pinned, failed = [], 0, []
    for r in rules:
        try:
            g = generalize_or_pin(r)
        except RuleError as err:  # both draws agreed, yet the float32 example does not
            failed.append(f"{r.lhs[0]} => {r.rhs[0]}: {err}")
            continue
        finally:
            if bar:
                bar.update()
        pinned += g.guards != r.guards
        checked.append(_with_proof(g, Proof("unchecked", found_by)))
    if bar:
        bar.close()
    stats = dict(e.stats)
    stats.update({
        "candidates": pruned.candidates, "multi_candidates": pruned.multi_candidates,
        "pruned": dict(pruned.dropped), "kept_candidates": len(pruned.kept),
        "rules_emitted": len(checked), "multi_rules": sum(r.multi for r in checked),
        "shapes_pinned": pinned, "failed_example_check": len(failed),
        "failed_example_check_first": failed[:5], "pruning_seconds": pruned.seconds,
        "generation_seconds": round(time.perf_counter() - start, 3),
    })
    return checked, stats


def _with_proof(rule: Rule, proof: Proof) -> Rule:
    return Rule(rule.name, rule.lhs, rule.rhs, rule.guards, rule.example, rule.doc, rule.source,
                rule.multi, proof)


def rules_text(rules, header: str) -> str:
    lines = [f"; {line}" for line in header.splitlines()]
    return "\n".join(lines) + "\n\n" + "\n\n".join(r.to_text() for r in rules) + "\n"


def _generate(args) -> int:
    rules, stats = generate_rules(args.size, args.menu, args.seed, progress_bars=True)
    command = f"taso-egg rules generate --size {args.size}" + \
        (f" --menu {args.menu}" if args.menu else "") + (f" --seed {args.seed}" if args.seed else "")
    header = (f"Generated by `{command}` (menu {stats['menu']!r}): candidate rules with\n"
              f"their proof records; `taso-egg rules verify` proves them. Only proved rules load.")
    text = rules_text(rules, header)
    parse_rules(text, args.output)  # never write a file that does not read back
    write_text_atomically(args.output, text)
    stats["command"] = command
    write_text_atomically(stats_path(args.output), json.dumps(stats, indent=2) + "\n")
    print(f"wrote {args.output}: {len(rules)} rules ({stats['multi_rules']} two-output) from "
          f"{stats['graphs_enumerated']} graphs, {stats['candidates']} candidates, in "
          f"{stats['generation_seconds']:.1f} s; stats in {stats_path(args.output)}")
    return 0


# --- verify --------------------------------------------------------------------------


def verify_file(path, timeout_s: float = 10.0, progress=None) -> list:
    """Prove every rule of ``path``, float-check the proved ones, and rewrite the
    file with the records. Returns ``[(rule, Proof)]``."""
    from .instantiate import check_rule_numerically, check_rule_on_other_shapes
    from .verify import verify_rules

    path = Path(path)
    text = path.read_text(encoding="utf-8")
    rules = parse_rules(text, str(path))
    results = verify_rules(rules, timeout_s, progress=progress)
    proofs, out = {}, []
    for rule, res in zip(rules, results):
        found_by = rule.proof.found_by if rule.proof and rule.proof.found_by else "hand"
        status, reason = res.status, res.reason
        if status == "proved":
            try:  # a proof rests on the axioms; the floats must agree as well
                check_rule_numerically(rule)
                check_rule_on_other_shapes(rule)
            except TasoEggError as err:
                status, reason = "refuted", f"proved from the axioms but the float check fails: {err}"
        proof = Proof(status, found_by, tuple(res.axioms_used), round(res.seconds, 4), reason)
        proofs[rule.name] = proof
        out.append((rule, proof))
    write_text_atomically(path, with_proof_records(text, proofs, str(path)))
    return out


def _verify(args) -> int:
    files = _files(args.files)
    total_rules = {f: len(load_rule_file(f)) for f in files}
    bar = _bar(sum(total_rules.values()), "proving")
    table = []
    for f in files:
        start = time.perf_counter()
        results = verify_file(f, args.timeout, progress=lambda i, n, r: bar.update())
        seconds = time.perf_counter() - start
        counts = Counter(p.status for _, p in results)
        table.append((f, len(results), counts, seconds))
        sp = stats_path(f)
        if sp.exists():
            stats = json.loads(sp.read_text())
            stats["verification"] = {"rules": len(results), **{k: counts.get(k, 0) for k in
                                     ("proved", "refuted", "unknown", "unsupported")},
                                     "timeout_s": args.timeout, "seconds": round(seconds, 2)}
            write_text_atomically(sp, json.dumps(stats, indent=2) + "\n")
    bar.close()
    print(f"{'file':<40}{'rules':>7}{'proved':>8}{'refuted':>9}{'unknown':>9}{'unsupp.':>9}{'seconds':>9}")
    for f, n, c, s in table:
        print(f"{str(f):<40}{n:>7}{c.get('proved', 0):>8}{c.get('refuted', 0):>9}"
              f"{c.get('unknown', 0):>9}{c.get('unsupported', 0):>9}{s:>9.1f}")
    return 0


def _files(names) -> list:
    if names:
        paths = [Path(n) for n in names]
    else:
        paths = [RULES_DIR / n for n in DEFAULT_FILES if (RULES_DIR / n).exists()]
    for p in paths:
        if not p.is_file():
            raise RuleError(f"{p}: no such rule file")
    return paths


# --- stats ---------------------------------------------------------------------------


def _reason_kind(proof: Proof) -> str:
    """The first clause of a rejection reason, for grouping."""
    text = proof.reason or "(no reason given)"
    return f"{proof.status}: " + text.split(";")[0].split(":")[0].strip()[:60]


def stats_table(files) -> str:
    rows = []
    for f in _files(files):
        rules = load_rule_file(f)
        statuses = Counter(r.proof.status if r.proof else "no record" for r in rules)
        rows.append(f"== {f}: {len(rules)} rules ({sum(r.multi for r in rules)} two-output)")
        sp = stats_path(f)
        stats = json.loads(sp.read_text()) if sp.exists() else {}
        if stats:
            rows.append(f"  generation ({stats.get('command', '?')}, menu {stats['menu']}):")
            rows.append(f"    graphs enumerated      {stats['graphs_enumerated']:>9}")
            rows.append(f"    fingerprint classes    {stats['value_classes']:>9}")
            rows.append(f"    candidates (pairs)     {stats['candidates']:>9}")
            rows.append(f"    two-output candidates  {stats['multi_candidates']:>9}")
            for reason, n in stats["pruned"].items():
                rows.append(f"    pruned: {reason:<18}{n:>9}")
            rows.append(f"    kept candidates        {stats['kept_candidates']:>9}")
            rows.append(f"    failed example check   {stats.get('failed_example_check', 0):>9}")
            rows.append(f"    rules emitted          {stats['rules_emitted']:>9}  "
                        f"({stats['multi_rules']} two-output; {stats['shapes_pinned']} with shapes pinned)")
            rows.append(f"    seconds                {stats['generation_seconds']:>9.1f}  "
                        f"(enumeration {stats['enumeration_seconds']:.1f}, pruning "
                        f"{stats['pruning_seconds']:.1f})")
        rows.append("  verification:")
        for status in ("proved", "refuted", "unknown", "unsupported", "unchecked", "no record"):
            if statuses.get(status):
                rows.append(f"    {status:<22} {statuses[status]:>9}")
        reasons = Counter(_reason_kind(r.proof) for r in rules if r.proof and not r.proved
                          and r.proof.status != "unchecked")
        for reason, n in reasons.most_common():
            rows.append(f"      {reason:<60} {n:>6}")
        seconds = sum(r.proof.seconds or 0 for r in rules if r.proof)
        if "verification" in stats:
            rows.append(f"    seconds                {stats['verification']['seconds']:>9.1f}  "
                        f"(timeout {stats['verification']['timeout_s']:g} s per rule)")
        else:
            rows.append(f"    prover seconds (sum)   {seconds:>9.1f}")
        found = Counter(r.proof.found_by for r in rules if r.proved)
        if found:
            rows.append("    proved, by origin: " + ", ".join(f"{k} {v}" for k, v in sorted(found.items())))
    return "\n".join(rows)


def _stats(args) -> int:
    print(stats_table(args.files))
    return 0
