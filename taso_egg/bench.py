"""Optimization benchmark: saturation and extraction time, e-graph size and cost for
the builder-made zoo models. Prints a table; timings are this machine's, this run's."""

from __future__ import annotations

import argparse
import sys
import time


def main(argv=None) -> int:
    from . import zoo
    from .api import optimize
    from .cli_args import add_limit_arguments, limits_from_args

    p = argparse.ArgumentParser(prog="python -m taso_egg.bench", description=__doc__)
    p.add_argument("--models", nargs="+", default=["bert", "nasrnn"], choices=sorted(zoo.MODELS))
    p.add_argument("--extractors", nargs="+", default=["greedy-dag", "ilp"])
    add_limit_arguments(p)
    p.add_argument("--profile", default="cpu-ort", help="cost profile name or path, or 'analytic'")
    args = p.parse_args(argv)
    limits = limits_from_args(args)
    header = (f"{'model':<13}{'extractor':<11}{'nodes':>6}{'e-nodes':>9}{'e-classes':>10}{'iters':>6}"
              f"{'sat s':>8}{'ext s':>8}{'check s':>8}{'total s':>9}{'cost before':>13}{'cost after':>12}"
              f"{'speedup':>9}  stop")
    print(header)
    for name in args.models:
        for extractor in args.extractors:
            g = zoo.MODELS[name]()
            t0 = time.perf_counter()
            r = optimize(g, limits=limits, extractor=extractor, profile=args.profile)
            total = time.perf_counter() - t0
            st = r.stats
            print(f"{name:<13}{extractor:<11}{len(g.nodes):>6}{st.enodes:>9}{st.eclasses:>10}"
                  f"{st.iterations:>6}{st.saturation_seconds:>8.2f}{st.extraction_seconds:>8.2f}"
                  f"{st.check_seconds:>8.2f}{total:>9.2f}{r.cost_before * 1e3:>11.3f}ms"
                  f"{r.cost_after * 1e3:>10.3f}ms{r.speedup:>8.3f}x  {st.stop_reason}", flush=True)
    print(f"costs: {r.cost_model}; total s = graph -> e-graph conversion + saturation + extraction "
          f"+ the numerical check of the result (check s) + its check in onnxruntime")
    return 0


if __name__ == "__main__":
    sys.exit(main())
