"""Cycle finding and strongly connected components over e-class graphs."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence


def find_cycle(
    child_sets: Sequence[Sequence[int]], choice: Mapping[int, int], roots: Iterable[int]
) -> list[int] | None:
    """A cycle of classes (first class not repeated) among the chosen nodes reachable
    from the roots, or None. Classes without a choice are treated as leaves."""
    on_path, done = set(), set()
    for root in roots:
        if root in done or root not in choice:
            continue
        stack = [(root, iter(child_sets[choice[root]]))]
        on_path.add(root)
        while stack:
            cls, it = stack[-1]
            child = next(it, None)
            if child is None:
                stack.pop()
                on_path.discard(cls)
                done.add(cls)
            elif child in on_path:
                path = [c for c, _ in stack]
                return path[path.index(child):]
            elif child not in done and child in choice:
                stack.append((child, iter(child_sets[choice[child]])))
                on_path.add(child)
    return None


def strongly_connected(n: int, succ: Sequence[Iterable[int]]) -> list[int]:
    """Component number of each vertex 0..n-1 (iterative Tarjan)."""
    index = [-1] * n
    low = [0] * n
    comp = [-1] * n
    on_stack = [False] * n
    stack: list[int] = []
    counter = 0
    n_comp = 0
    for start in range(n):
        if index[start] >= 0:
            continue
        work = [(start, iter(succ[start]))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack[start] = True
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if index[w] < 0:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack[w] = True
                    work.append((w, iter(succ[w])))
                elif on_stack[w]:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                u = work[-1][0]
                low[u] = min(low[u], low[v])
            if low[v] == index[v]:
                while True:
                    w = stack.pop()
                    on_stack[w] = False
                    comp[w] = n_comp
                    if w == v:
                        break
                n_comp += 1
    return comp
