"""TASO-style backtracking search over the graph IR, with the rule corpus compiled to
a graph pattern matcher and the same cost model as equality saturation."""

from .matcher import GraphIndex, Match, RuleMatcher, compile_rules, find_matches
from .rewrite import Rejected, Rewrite, apply_match
from .search import REJECT_REASONS, SearchResult, StepStats, backtracking_search

__all__ = [
           "REJECT_REASONS",
           "GraphIndex",
           "Match",
           "Rejected",
           "Rewrite",
           "RuleMatcher",
           "SearchResult",
           "StepStats",
           "apply_match",
           "backtracking_search",
           "compile_rules",
           "find_matches",
]
