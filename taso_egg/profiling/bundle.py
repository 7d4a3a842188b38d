"""The device bundle: what a GPU run needs, made here where egglog, Z3 and HiGHS are
installed, and read there where they are not (``profiling.prepare`` writes it,
``profiling.gpu_run`` reads it). Reading it needs the operator table and NumPy alone.

A bundle is a folder of two JSON files:

- ``configs.json``, the configuration list (also what ``taso-egg profile
  --list-configs`` writes)::

      {"format": "taso-egg-configs", "version": 1, "meta": {...},
       "configs": [{"key", "stage", "models", "op", "params", "inputs"}, ...]}

  ``stage`` orders the work (``STAGES``): the calibration first, then what the
  bundle's graphs run, then the models and what the extractors chose (as built and
  as exported), then every other e-node's.
- ``graphs.json``, per model its original and optimized graph as deployed (exported
  and read back: weight-only work folded, as the cost model prices it), each in our
  IR as JSON with no weight data (weights are drawn again where they run; VGG-19's
  alone are 0.57 GB), and its cost inputs: each configuration key it runs and how
  many nodes run it, so a prediction is a sum over a profile.

Why our IR and not ONNX without initializers: the graph read back is the graph
written (``structural_hash`` equal; an ONNX import would re-map nodes), the executor
runs it directly, and the configuration keys the prediction sums are exactly the
nodes the executor runs.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..cost import OpConfig
from ..cost.config import jsonable
from ..errors import ProfileError, TasoEggError
from ..disk.files import write_atomically
from ..graph import Graph, new_graph
from ..ops import INPUT, OPAQUE, WEIGHT
from .profiler import configuration_counts

CONFIGS_FORMAT, GRAPHS_FORMAT, VERSION = "taso-egg-configs", "taso-egg-graphs", 1
CONFIGS_FILE, GRAPHS_FILE = "configs.json", "graphs.json"
STAGES = ("calibration", "run", "graphs", "egraph")


# --- graphs ----------------------------------------------------------------------------

def graph_to_json(graph: Graph) -> dict:
    """The structure of ``graph`` (no weight data), nodes in topological order."""
    index: dict[int, int] = {}
    nodes = []
    for n in graph.topo_order():
        if n.op == OPAQUE.name:
            raise ProfileError(f"{n.label()}: an opaque ONNX node cannot be carried in a bundle "
                               f"(its attributes are serialized protos); the zoo has none")
        index[n.id] = len(nodes)
        nodes.append({"op": n.op, "name": n.name, "params": {k: jsonable(v) for k, v in n.params.items()},
                      "inputs": [[index[t.node], t.index] for t in n.inputs]})
    return {"opset": graph.opset, "nodes": nodes,
            "outputs": [[name, index[t.node], t.index] for name, t in graph.outputs]}


def graph_from_json(data: dict) -> Graph:
    """The graph ``graph_to_json`` wrote; weights get data when they are placed."""
    try:
        g = new_graph()
        g.opset = data["opset"]
        made = []
        for node in data["nodes"]:
            p = node["params"]
            if node["op"] == INPUT.name:
                t = [g.new_input(p["shape"], p["name"], p["dtype"])]
            elif node["op"] == WEIGHT.name:
                t = [g.new_weight(p["shape"], name=p["name"], dtype=p["dtype"])]
            else:
                t = g.add_node(node["op"], [made[i][k] for i, k in node["inputs"]], node["name"], **p)
            made.append(t)
        for name, i, k in data["outputs"]:
            g.mark_output(made[i][k], name)
    except (KeyError, IndexError, TypeError, ValueError) as e:
        raise ProfileError(f"not a bundled graph ({e!r})") from None
    except TasoEggError as e:
        raise ProfileError(f"bundled graph does not rebuild: {e}") from None
    return g


def cost_inputs(graph: Graph) -> list[list]:
    """[configuration key, nodes running it] for every configuration ``graph`` runs."""
    return [[config.key, count] for config, count in configuration_counts(graph)]


def predict(inputs: list[list], configs: dict[str, OpConfig], model, run_overhead_s: float = 0.0):
    """Seconds a graph is predicted to take under ``model`` from its cost inputs, plus
    the profile's fixed cost of one whole-graph run; and the lookups (measured /
    estimated) when the model counts them."""
    if hasattr(model, "reset_counts"):
        model.reset_counts()
    total = run_overhead_s + sum(count * model.cost(configs[key]) for key, count in inputs)
    return total, (model.lookups() if hasattr(model, "lookups") else None)


# --- the configuration list ------------------------------------------------------------

def config_list(staged: dict[str, list[tuple[OpConfig, str]]], meta: dict) -> dict:
    """The configuration list from (config, stage) pairs per model: each configuration
    once, at its earliest stage, with the models that need it; in stage order."""
    entries: dict[str, dict] = {}
    for model, pairs in staged.items():
        for config, stage in pairs:
            if stage not in STAGES:
                raise ProfileError(f"unknown stage {stage!r}; expected one of {STAGES}")
            e = entries.setdefault(config.key, {"key": config.key, "stage": stage, "models": [],
                                                **config.to_json()})
            if STAGES.index(stage) < STAGES.index(e["stage"]):
                e["stage"] = stage
            if model and model not in e["models"]:
                e["models"].append(model)
    ordered = sorted(entries.values(), key=lambda e: STAGES.index(e["stage"]))
    counts = {s: sum(e["stage"] == s for e in ordered) for s in STAGES}
    return {"format": CONFIGS_FORMAT, "version": VERSION, "meta": {**meta, "counts": counts},
            "configs": ordered}


def read_configs(data: dict, where: str = "configuration list") -> list[tuple[OpConfig, dict]]:
    """(config, its entry) for every entry, each checked to read back as its key."""
    _check_format(data, CONFIGS_FORMAT, where)
    return [(OpConfig.from_json(e, e.get("key")), e) for e in data["configs"]]


# --- files ---------------------------------------------------------------------------

def write_json(path, data: dict) -> None:
    def write(tmp):
        with open(tmp, "w") as f:
            json.dump(data, f, separators=(",", ":"))
            f.write("\n")

    write_atomically(path, write, ProfileError)


def read_json(path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ProfileError(f"{path}: no such file (build the bundle with scripts/gpu_prepare.sh)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ProfileError(f"{path}: cannot read ({e})") from None


def load_bundle(folder) -> tuple[dict, dict]:
    """The bundle's configuration list and graphs file, their formats checked."""
    folder = Path(folder)
    configs, graphs = read_json(folder / CONFIGS_FILE), read_json(folder / GRAPHS_FILE)
    _check_format(configs, CONFIGS_FORMAT, str(folder / CONFIGS_FILE))
    _check_format(graphs, GRAPHS_FORMAT, str(folder / GRAPHS_FILE))
    return configs, graphs


def _check_format(data, fmt: str, where: str) -> None:
    if not isinstance(data, dict) or data.get("format") != fmt:
        raise ProfileError(f"{where}: not a {fmt} file")
    if data.get("version") != VERSION:
        raise ProfileError(f"{where}: {fmt} version {data.get('version')!r}; this taso-egg reads "
                           f"version {VERSION} (build the bundle again)")
