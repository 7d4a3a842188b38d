"""The research side: TASO's benchmark models (``zoo``), its backtracking search over the
same rules and costs (``search/``), the comparison of saturation against it
(``compare``), pictures for the notebooks (``viz``) and the benchmark command
(``benchmarks``, run as ``python -m taso_egg.bench``)."""
