"""Extraction: pick one e-node per e-class from a serialized e-graph, minimizing DAG cost."""

from .choice_check import check_choice
from .egraph import EGraph, load_egraph
from .extractor import Extractor
from .registry import EXTRACTORS, extract
from .result import ExtractionResult

__all__ = ["EGraph", "EXTRACTORS", "ExtractionResult", "Extractor", "check_choice", "extract", "load_egraph"]
