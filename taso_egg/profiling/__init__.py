"""Per-operator profiling: back ends that time one operator configuration, and the
profiler that fills a profile (``taso_egg.cost.store``; CLI: ``taso-egg profile``)."""
