"""Data movement the extraction leaves in steps, written as one step, on an extracted
graph. No rule of the corpus joins these (TASO's split is binary and has no rule for a
reshape of a reshape), and at one token every kernel onnxruntime runs costs a few
microseconds whatever its size, so a decoder pays for each step:

- **splits**: the parts of one tensor cut along one axis by a tree of splits (the
  packed q/k/v projection cut into q and k|v, then k|v into k and v; or two splits of
  the same tensor, each read for one part) become one split whose parts are the
  pieces read. A split's part is the contiguous range of the axis its sizes put it at,
  so a part of a part is a range of the root, and pieces that do not overlap are the
  parts of one split (the ranges between them become parts no one reads);
- **reshapes**: ``reshape(reshape(x, a), b)`` becomes ``reshape(x, b)``: a reshape
  keeps the elements in row-major order, so two of them keep it too.

Every graph this pass writes is checked numerically against the input, as every
candidate is. ``classes`` (tensor -> e-class) follows the rebuilt tensors: each piece
keeps the class of the part it replaces, each reshape the class of the outer one."""

from __future__ import annotations

from ..graph import Graph, Tensor
from ..ops import INPUT, WEIGHT


def join_moves(g: Graph, classes: dict | None = None) -> Graph:
    """``g`` with split trees and reshape chains joined; ``g`` itself where none is."""
    users: dict[tuple[int, int], list[int]] = {}
    for n in g.nodes.values():
        for t in n.inputs:
            users.setdefault((t.node, t.index), []).append(n.id)
    outputs = {(t.node, t.index) for _, t in g.outputs}
    pieces, joined = _split_pieces(g, users, outputs)
    chains = {n.id for n in g.nodes.values()
              if n.op == "reshape" and g.nodes[n.inputs[0].node].op == "reshape"}
    if not pieces and not chains:
        return g
    return _rebuild(g, pieces, joined, chains, classes)


def _split_pieces(g: Graph, users, outputs) -> tuple[dict, set]:
    """root tensor -> (axis, [(start, end, part read)]) for each tensor cut by two or
    more splits along one axis whose pieces read do not overlap; and those splits."""
    def only_split_reads(key, axis) -> bool:
        readers = users.get(key, [])
        return key not in outputs and bool(readers) and all(
            g.nodes[u].op == "split" and g.nodes[u].params["axis"] == axis for u in readers)

    def place(node, tree: set):
        """(root, start) of split ``node``'s input, following parts only splits read
        (those splits added to ``tree``)."""
        tree.add(node.id)
        src, axis = node.inputs[0], node.params["axis"]
        parent = g.nodes[src.node]
        if parent.op == "split" and parent.params["axis"] == axis and only_split_reads((src.node, src.index), axis):
            root, start = place(parent, tree)
            return root, start + sum(parent.params["sizes"][:src.index])
        return (src.node, src.index), 0

    found: dict = {}
    for n in g.nodes.values():
        if n.op != "split":
            continue
        axis = n.params["axis"]
        tree: set = set()
        root, start = place(n, tree)
        for i, size in enumerate(n.params["sizes"]):
            key = (n.id, i)
            if key in users and only_split_reads(key, axis):
                continue  # cut again: its pieces are read instead
            if key not in users and key not in outputs:
                continue
            lo = start + sum(n.params["sizes"][:i])
            entry = found.setdefault(root, (axis, [], set(), set()))
            if entry[0] != axis:
                entry[3].add("axes")
            entry[1].append((lo, lo + size, key))
            entry[2].update(tree)
    pieces, joined = {}, set()
    for root, (axis, read, splits, other_axes) in found.items():
        read.sort()
        if not other_axes and len(splits) >= 2 and all(a[1] <= b[0] for a, b in zip(read, read[1:])):
            pieces[root] = (axis, read)
            joined |= splits
    return pieces, joined


def _rebuild(g: Graph, pieces: dict, joined: set, chains: set, classes: dict | None) -> Graph:
    rb = Rebuild(g, classes)

    def keep(old, t: Tensor):
        rb.keep(old, t)
        if old in pieces:
            _join(rb.new, t, pieces[old], keep)

    for n in g.topo_order():
        if n.id in joined:
            continue  # its parts read come from the root's one split
        if n.id in chains:
            inner = n.inputs[0]
            while g.nodes[inner.node].op == "reshape":
                inner = g.nodes[inner.node].inputs[0]
            outs = [rb.new.reshape(rb.of(inner), n.params["shape"])]
        else:
            outs = rb.copy(n)
        for i, t in enumerate(outs):
            keep((n.id, i), t)
    return rb.finish()


class Rebuild:
    """A pass's new graph, built node by node from ``g`` (``pack_nbits``, ``join_moves``,
    ``fuse_attention``): ``made`` maps each tensor of ``g`` to its tensor in ``new``;
    ``classes`` (tensor -> e-class, as ``convert.build_graph`` fills it) follows them,
    in place, when ``finish`` gives ``new`` the outputs of ``g``."""

    def __init__(self, g: Graph, classes: dict | None):
        self.g, self.classes = g, classes
        self.new = Graph(opset=g.opset)
        self.new.ir_version = g.ir_version
        self.made: dict[tuple[int, int], Tensor] = {}
        self._new_classes: dict = {}

    def keep(self, old: tuple[int, int], t: Tensor) -> None:
        """``t`` is what tensor ``old`` of ``g`` became, in its e-class."""
        self.made[old] = t
        if self.classes is not None and old in self.classes:
            self._new_classes[(t.node, t.index)] = self.classes[old]

    def of(self, t: Tensor) -> Tensor:
        """What tensor ``t`` of ``g`` became."""
        return self.made[(t.node, t.index)]

    def copy(self, n) -> list[Tensor]:
        """Node ``n`` of ``g`` added as it is (a weight with its data); its outputs, not
        yet kept."""
        new = self.new
        if n.op == INPUT.name:
            return [new.new_input(n.params["shape"], n.params["name"], n.params["dtype"])]
        if n.op == WEIGHT.name:
            outs = [new.new_weight(n.params["shape"], name=n.params["name"], dtype=n.params["dtype"])]
            if n.id in self.g.weight_data:
                new.weight_data[outs[0].node] = self.g.weight_data[n.id]
            return outs
        return new.add_node(n.op, [self.of(t) for t in n.inputs], n.name, **n.params)

    def finish(self) -> Graph:
        """The new graph with ``g``'s outputs, without what none of them reads."""
        for name, t in self.g.outputs:
            self.new.mark_output(self.of(t), name)
        self.new.drop_unread()
        if self.classes is not None:
            self.classes.clear()
            self.classes.update({k: c for k, c in self._new_classes.items() if k[0] in self.new.nodes})
        return self.new


def _join(new: Graph, root: Tensor, piece, keep) -> None:
    """The root's one split: a part for each piece read, one for each range between."""
    axis, read = piece
    sizes, owners, at = [], [], 0
    for lo, hi, key in read:
        if lo > at:
            sizes.append(lo - at)
            owners.append(None)
        sizes.append(hi - lo)
        owners.append(key)
        at = hi
    if at < root.shape[axis]:
        sizes.append(root.shape[axis] - at)
        owners.append(None)
    for key, t in zip(owners, new.split(root, axis, sizes)):
        if key is not None:
            keep(key, t)
