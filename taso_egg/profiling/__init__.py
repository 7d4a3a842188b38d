"""Per-operator profiling: back ends that time one operator configuration, the
profile store, and the profiler that fills it (CLI: ``taso-egg profile``)."""
