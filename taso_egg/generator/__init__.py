"""The rule generator, TASO's way: enumerate small graphs over an operator menu
(``enumerate``), fingerprint them on random inputs and pair up the equal ones
(``prune``), write the kept pairs as rules with their shape guards (``emit``,
``shape_guards``), drop candidates that smaller proved rules already derive by
saturation (``derive``, which is why this package sits above ``egraph``), and prove
the rest with the verifier, level by level (``pipeline``). ``cli`` is ``taso-egg rules``."""
