"""``taso-egg rules generate | verify | stats | derive``: discover rules, prove them, report
(parsing and printing; the work is the generator's pipeline and the verifier's).

generate  enumerate graphs, fingerprint, prune, then size level by size level: drop the
          candidates smaller proved rules derive, prove the rest; write them with their
          proof records, by default to ``./generated.rules`` in the working directory,
          those whose left side holds a generated constant to ``NAME-constants.rules``
          beside it (a study file: no imported model holds one), and a stats file
          (``NAME.stats.json``);
verify    prove each rule of the named files with the Z3 verifier, float-check the
          proved ones, and write the proof records back into those files (atomically);
stats     the table: graphs enumerated, candidates, pruned by reason, proved, rejected
          by reason, seconds (of the shipped corpus unless files are named).
derive    which of a rule file's proved rules the hand rules, the default corpus and the
          axioms (both ways) derive by saturation, rule by rule, with the totals.

The shipped corpus (the ``taso_egg.rules`` package's ``*.rules``) changes only when its files are named
as the output: ``-o`` for generate, the file arguments for verify.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from pathlib import Path

from taso_egg.errors import RuleError
from taso_egg.disk.files import write_atomically

from .. import rules as _rules_package
from ..rules.ast import Proof
from ..rules.corpus import load_rule_file, uses_generated_constant
from ..rules.syntax import parse_rules

# The verifier (Z3) and the pipeline load when a subcommand runs, not whenever
# `taso-egg` builds its parser.
RULES_DIR = Path(_rules_package.__file__).parent
# Rule files of the shipped corpus (not the axioms): what `stats` reads by default.
DEFAULT_FILES = ("taso_hand.rules", "generated.rules", "generated-constants.rules")
SHIPPED_GENERATED = RULES_DIR / "generated.rules"
# Where `generate` writes without -o: the working directory, never the shipped corpus.
GENERATE_OUTPUT = Path("generated.rules")


def add_arguments(parser) -> None:
    from ..rules.prove.prover import DEFAULT_RLIMIT

    sub = parser.add_subparsers(dest="rules_command", required=True)
    p = sub.add_parser("generate", help="enumerate graphs and write candidate rules")
    p.add_argument("--size", type=int, default=3, help="operators per graph (default 3)")
    p.add_argument("--menu", default=None, help="operator menu: taso (default for size <= 3), "
                   "reduced (default for size 4), matrix")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-o", "--output", default=None,
                   help=f"rule file to write, with NAME.stats.json beside it (default: "
                        f"./{GENERATE_OUTPUT} in the working directory; the shipped corpus "
                        f"changes only when named here: -o {SHIPPED_GENERATED})")
    p.add_argument("--rlimit", type=_positive, default=DEFAULT_RLIMIT,
                   help=f"Z3 resource units per proof (default {DEFAULT_RLIMIT:,}, about 2-9 s of a "
                        "failing proof here): a limit that, unlike seconds, does not depend on the "
                        "machine's load, so that runs agree")
    _jobs_argument(p)
    p = sub.add_parser("verify", help="prove rules and write their proof records")
    p.add_argument("files", nargs="*", help="rule files to prove; their proof records (and "
                   "NAME.stats.json, where there is one) are written back into them. Required: "
                   f"to re-prove the shipped corpus, name its files ({_shipped_names()})")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per rule (default 10)")
    _jobs_argument(p)
    p = sub.add_parser("stats", help="print the generation and verification table")
    p.add_argument("files", nargs="*", help=f"rule files (default: {', '.join(DEFAULT_FILES)})")
    p = sub.add_parser("derive", help="how many of a rule file's rules each corpus derives "
                       "by saturation")
    p.add_argument("file", help="rule file whose proved rules are the targets (e.g. the reference "
                   f"corpus {RULES_DIR / 'taso-reference.rules'})")
    p.add_argument("--corpus", nargs="+", default=None, metavar="NAME",
                   help="corpora to derive with: hand (the hand rules), default (hand + generated), "
                        "generated (the generated rules alone), study (default + the generated rules over "
                        "TASO's constants), axioms (the verifier's, both ways), "
                        "or a rule file (hand + its proved rules, in place of the shipped generated "
                        "ones); default: hand, default and axioms")
    p.add_argument("--orientations", default="given", help="given (as the files hold them), "
                   "shrinking (adds the reverses that do not grow a term) or both (every reverse) "
                   "for the hand and default corpora")
    p.add_argument("--iterations", type=int, default=None, help="saturation iterations per target "
                   "(default 8)")
    p.add_argument("--weights", default="kernels", help="which of the targets' tensors are built "
                   "as weights: kernels (what a conv reads as its kernel, as in an exported model; the "
                   "default), none (every tensor an activation) or all (so that every corpus rule guarded "
                   "to weights, the merges and scalars moved into weights, can apply)")


def _shipped_names() -> str:
    return " ".join(str(RULES_DIR / n) for n in DEFAULT_FILES)


def _positive(text: str) -> int:
    import argparse

    if not text.replace("_", "").isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return int(text)


def _jobs_argument(parser) -> None:
    from ..rules.workers import default_jobs

    parser.add_argument("--jobs", type=_positive, default=default_jobs(),
                        help=f"worker processes (default: the number of CPUs, {default_jobs()})")
    parser.add_argument("--ray", metavar="ADDRESS", default=None,
                        help="run the workers as Ray tasks, --jobs at a time: 'local' starts a Ray "
                             "instance of --jobs CPUs for this run, 'auto' joins the one running on "
                             "this machine, HOST:PORT or ray://HOST:PORT a cluster's (needs the ray "
                             "extra; same output as local processes, the default)")


def run(args) -> int:
    from ..rules.workers import ray_workers

    with ray_workers(getattr(args, "ray", None), getattr(args, "jobs", 1)):
        return {"generate": _generate, "verify": _verify, "stats": _stats,
                "derive": _derive}[args.rules_command](args)


def _bar(total: int, desc: str):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, file=sys.stderr, leave=False, dynamic_ncols=True)


def stats_path(rule_file) -> Path:
    p = Path(rule_file)
    return p.with_name(p.name.removesuffix(".rules") + ".stats.json")


def constants_path(rule_file) -> Path:
    """Where ``generate`` puts the rules of ``rule_file`` whose left side holds a
    generated constant: ``NAME-constants.rules`` beside it."""
    p = Path(rule_file)
    return p.with_name(p.name.removesuffix(".rules") + "-constants.rules")


def write_text_atomically(path, text: str) -> None:
    """Write ``text`` to ``path``, all or nothing."""
    write_atomically(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"), RuleError)


# --- generate ------------------------------------------------------------------------


def rules_text(rules, header: str) -> str:
    lines = [f"; {line}" for line in header.splitlines()]
    return "\n".join(lines) + "\n\n" + "\n\n".join(r.to_text() for r in rules) + "\n"


def split_texts(rules, output, header: str) -> dict:
    """``{path: text}`` of the two files ``generate`` writes for ``output``: the rules
    whose left side holds no generated constant, in order, and beside them those that
    do (``constants_path``), which can match only a graph built with
    ``Graph.constant``. Each keeps the order of ``rules``."""
    study = constants_path(output)
    main = [r for r in rules if not uses_generated_constant(r.lhs)]
    constants = [r for r in rules if uses_generated_constant(r.lhs)]
    return {
        Path(output): rules_text(main, f"{header}\nThe rules whose left side holds a generated "
                                       f"constant (const_one ...) are in\n{study.name}."),
        study: rules_text(constants, f"{header}\nThis file: the rules whose left side holds a generated "
                                     f"constant (const_one ...),\nwhich no imported or zoo model holds; "
                                     f"kept for study, loaded only by name."),
    }


def split_counts(texts: dict) -> dict:
    """What each file of :func:`split_texts` holds, for the stats file."""
    out = {}
    for path, text in texts.items():
        rules = parse_rules(text, str(path))  # never write a file that does not read back
        out[Path(path).name] = {"rules": len(rules), "proved": sum(r.proved for r in rules)}
    return out


def _generate(args) -> int:
    from .pipeline import generate_rules

    if args.output is None:
        args.output = str(GENERATE_OUTPUT)
        for path in (GENERATE_OUTPUT, constants_path(GENERATE_OUTPUT), stats_path(GENERATE_OUTPUT)):
            if _is_shipped(path):  # run from inside the package's own folder
                raise RuleError(f"./{path} is the shipped corpus's file {path.resolve()}; name it "
                                f"with -o to replace it, or run elsewhere")
    rules, stats = generate_rules(args.size, args.menu, args.seed, progress_bars=True,
                                  rlimit=args.rlimit, jobs=args.jobs)
    command = f"taso-egg rules generate --size {args.size}" + \
        (f" --menu {args.menu}" if args.menu else "") + (f" --seed {args.seed}" if args.seed else "") + \
        f" --jobs {args.jobs} --rlimit {args.rlimit}"
    header = (f"Generated by `{command}` (menu {stats['menu']!r}): the rules no smaller\n"
              f"proved rule derives, with their proof records. Only proved rules load.")
    texts = split_texts(rules, args.output, header)
    stats["files"] = split_counts(texts)
    for path, text in texts.items():
        write_text_atomically(path, text)
    stats["command"] = command
    write_text_atomically(stats_path(args.output), json.dumps(stats, indent=2) + "\n")
    study = constants_path(args.output)
    print(f"wrote {args.output} and {study} ({stats['files'][study.name]['rules']} rules over "
          f"generated constants): {len(rules)} rules ({stats['multi_rules']} two-output, "
          f"{stats['verification']['proved']} proved, {stats['pruned']['derivable']} derivable "
          f"ones dropped) from {stats['graphs_enumerated']} graphs, {stats['candidates']} "
          f"candidates, in {stats['generation_seconds']:.1f} s + "
          f"{stats['verification']['seconds']:.1f} s proving; stats in {stats_path(args.output)}")
    return 0


# --- verify --------------------------------------------------------------------------


def _verify(args) -> int:
    from ..rules.prove.driver import verify_file

    if not args.files:
        raise RuleError("rules verify writes the proof records into the files it proves: name "
                        f"the rule files (the shipped corpus is {_shipped_names()})")
    files = _files(args.files)
    total_rules = {f: len(load_rule_file(f)) for f in files}
    bar = _bar(sum(total_rules.values()), "proving")
    table = []
    for f in files:
        start = time.perf_counter()
        results = verify_file(f, args.timeout, progress=lambda i, n, r: bar.update(), jobs=args.jobs)
        seconds = time.perf_counter() - start
        counts = Counter(p.status for _, p in results)
        table.append((f, len(results), counts, seconds))
        sp = stats_path(f)
        if sp.exists():
            stats = json.loads(sp.read_text())
            stats["verification"] = {"rules": len(results), **{k: counts.get(k, 0) for k in
                                     ("proved", "refuted", "unknown", "unsupported")},
                                     "timeout_s": args.timeout, "jobs": args.jobs,
                                     "seconds": round(seconds, 2)}
            write_text_atomically(sp, json.dumps(stats, indent=2) + "\n")
    bar.close()
    print(f"{'file':<40}{'rules':>7}{'proved':>8}{'refuted':>9}{'unknown':>9}{'unsupp.':>9}{'seconds':>9}")
    for f, n, c, s in table:
        print(f"{str(f):<40}{n:>7}{c.get('proved', 0):>8}{c.get('refuted', 0):>9}"
              f"{c.get('unknown', 0):>9}{c.get('unsupported', 0):>9}{s:>9.1f}")
    return 0


def _is_shipped(path) -> bool:
    """Whether ``path`` is (or would be) a file of the shipped rules folder."""
    return Path(path).resolve().parent == RULES_DIR.resolve()


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
            if "file_holds" in stats:
                rows.append(f"    (the file holds {stats['file_holds']})")
            for name, held in stats.get("files", {}).items():
                rows.append(f"    written to {name:<28} {held['rules']:>6} rules, {held['proved']} proved")
            rows.append(f"    graphs enumerated      {stats['graphs_enumerated']:>9}")
            rows.append(f"    fingerprint classes    {stats['value_classes']:>9}")
            rows.append(f"    candidates (pairs)     {stats['candidates']:>9}")
            rows.append(f"    two-output candidates  {stats['multi_candidates']:>9}")
            for reason, n in stats["pruned"].items():
                if reason != "derivable":  # counted on rules, below
                    rows.append(f"    pruned: {reason:<18}{n:>9}")
            rows.append(f"    kept candidates        {stats['kept_candidates']:>9}")
            rows.append(f"    failed example check   {stats.get('failed_example_check', 0):>9}")
            if "candidate_rules" in stats:
                rows.append(f"    candidate rules        {stats['candidate_rules']:>9}  (both "
                            f"orientations of equal-size sides)")
                rows.append(f"    pruned: derivable      {stats['pruned']['derivable']:>9}  (rules that "
                            f"the hand rules and smaller proved rules derive)")
                for lv in stats.get("levels", ()):
                    rows.append(f"      size {lv['size']}, {lv['variables']} inputs: "
                                f"{lv['candidate_rules']} candidate rules, "
                                f"{lv['derivable']} derivable, {lv['emitted']} emitted, "
                                f"{lv['proved']} proved")
            rows.append(f"    rules emitted          {stats['rules_emitted']:>9}  "
                        f"({stats['multi_rules']} two-output; {stats['shapes_pinned']} with shapes pinned)")
            later_phases = (f", derivation {stats['derivation_seconds']:.1f}"
                            if "derivation_seconds" in stats else "")
            checks = [lv["check_seconds"] for lv in stats.get("levels", []) if "check_seconds" in lv]
            if checks:
                later_phases += f", checks on other shapes {sum(checks):.1f}"
            rows.append(f"    seconds                {stats['generation_seconds']:>9.1f}  "
                        f"(enumeration {stats['enumeration_seconds']:.1f}, pruning "
                        f"{stats['pruning_seconds']:.1f}{later_phases})")
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
            v = stats["verification"]
            limit = f"rlimit {v['rlimit']:,}" if "rlimit" in v else f"timeout {v['timeout_s']:g} s"
            rows.append(f"    seconds                {v['seconds']:>9.1f}  ({limit} "
                        f"per rule, {v.get('jobs', 1)} job(s))")
        else:
            rows.append(f"    prover seconds (sum)   {seconds:>9.1f}")
        found = Counter(r.proof.found_by for r in rules if r.proved)
        if found:
            rows.append("    proved, by origin: " + ", ".join(f"{k} {v}" for k, v in sorted(found.items())))
    return "\n".join(rows)


def _stats(args) -> int:
    print(stats_table(args.files))
    return 0


# --- derive --------------------------------------------------------------------------


def _derive(args) -> int:
    from dataclasses import replace

    from ..rules.corpus import ORIENTATIONS
    from .derive import CORPORA, DERIVE_LIMITS, NAMED_CORPORA, WEIGHT_BUILDS, derive_table, is_corpus

    corpora = tuple(args.corpus or CORPORA)
    for name in corpora:
        if not is_corpus(name):
            raise RuleError(f"unknown corpus {name!r}: neither one of {', '.join(NAMED_CORPORA)} "
                            f"nor a rule file")
    if args.orientations not in ORIENTATIONS:
        raise RuleError(f"--orientations must be one of {', '.join(ORIENTATIONS)}, got "
                        f"{args.orientations!r}")
    if args.iterations is not None and args.iterations < 1:
        raise RuleError(f"--iterations must be at least 1, got {args.iterations}")
    if args.weights not in WEIGHT_BUILDS:
        raise RuleError(f"--weights must be one of {', '.join(WEIGHT_BUILDS)}, got {args.weights!r}")
    (path,) = _files([args.file])
    rules = load_rule_file(path)
    targets = [r for r in rules if r.proved]
    limits = DERIVE_LIMITS if args.iterations is None else replace(DERIVE_LIMITS, iterations=args.iterations)
    bar = _bar(len(targets) * len(corpora), "deriving")
    table = derive_table(targets, corpora, args.orientations, limits,
                         progress=lambda name, done, n: bar.update(), weights=args.weights)
    bar.close()
    print(table.text())
    print(f"{len(targets)} proved rules of {path} ({len(rules) - len(targets)} not proved left out); "
          f"each saturated alone, {limits.iterations} iterations ({limits.multi_iterations} with the "
          f"multi-pattern rules), {limits.nodes} e-nodes at most; "
          f"'example': derived on its example shapes, not on a variant"
          + {"kernels": "; conv kernels built as weights, the other tensors as activations",
             "none": "; every tensor built as an activation",
             "all": "; every tensor built as a weight"}[args.weights])
    return 0
