"""Proof records written into rule files: a rule file's text with the ``:proof`` record
of some rules replaced or added, comments and layout elsewhere kept (what
``taso-egg rules verify`` writes back).
"""

from __future__ import annotations

from taso_egg.errors import RuleError

from .ast import Rule
from .syntax import TOKEN, parse_rules


def _form_spans(text: str, filename: str) -> list[tuple[int, int]]:
    """(start, end) offsets of every top-level form of a rule file's text."""
    spans, depth, start, pos = [], 0, 0, 0
    while pos < len(text):
        m = TOKEN.match(text, pos)
        kind = m.lastgroup
        if kind == "badstr":
            raise RuleError(f"{filename}: unterminated string")
        if kind == "open":
            if depth == 0:
                start = m.start()
            depth += 1
        elif kind == "close":
            depth -= 1
            if depth == 0:
                spans.append((start, m.end()))
        pos = m.end()
    return spans


def with_proof_records(text: str, proofs: dict, filename: str = "<string>") -> str:
    """``text`` with the ``:proof`` record of each rule named in ``proofs`` (name ->
    Proof) replaced or added; comments and layout elsewhere are kept. The result is
    parsed back, and must hold the same rules with the new records (RuleError if not)."""
    before = parse_rules(text, filename)
    out, last = [], 0
    for (start, end), rule in zip(_form_spans(text, filename), before):
        out.append(text[last:start])
        form = text[start:end]
        if rule.name in proofs:
            form = _drop_proof(form, filename) + f"\n  :proof {proofs[rule.name]})"
        out.append(form)
        last = end
    out.append(text[last:])
    new_text = "".join(out)
    after = parse_rules(new_text, filename)
    expected = [_replace_proof(r, proofs.get(r.name, r.proof)) for r in before]
    if [_replace_proof(r, r.proof) for r in after] != expected:
        raise RuleError(f"{filename}: rewriting the proof records changed the rules (a bug)")
    return new_text


def _drop_proof(form: str, filename: str) -> str:
    """The form without its ``:proof`` section and without its closing parenthesis."""
    depth, pos, cut = 0, 0, None
    body_end = len(form) - 1
    while pos < len(form):
        m = TOKEN.match(form, pos)
        kind = m.lastgroup
        if kind == "open":
            depth += 1
        elif kind == "close":
            depth -= 1
            if depth == 0:
                body_end = m.start()
        elif kind == "atom" and depth == 1 and m.group() == ":proof":
            cut = m.start()
        elif kind == "atom" and depth == 1 and m.group().startswith(":") and cut is not None:
            raise RuleError(f"{filename}: :proof must be the last section of a rule to be "
                            f"rewritten")
        pos = m.end()
    return form[:cut if cut is not None else body_end].rstrip()


def _replace_proof(rule: Rule, proof) -> Rule:
    return Rule(rule.name, rule.lhs, rule.rhs, rule.guards, rule.example, rule.doc, ("", 0),
                rule.multi, proof)


__all__ = ["with_proof_records"]
