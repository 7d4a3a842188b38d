"""The Z3 verifier: a rule is proved when its two sides are equal under the operator
axioms of ``rules/axioms.rules``, the way TASO's verifier proves its rules.

Modules: ``encode`` (rules, axioms and the language's guards and parameter functions
as Z3 terms), ``shape_facts`` (the operator table's shape cases as Z3 facts: what typing
says of an operator's result and asks of a left side), ``prover`` (one rule against the
axioms, and its float check), ``driver`` (many rules, in worker processes, and a rule
file rewritten with its proof records).

Encoding. Tensors are an uninterpreted sort; every operator (per input count, and per
output for ``split``) is an uninterpreted function of its parameters and then its
tensor inputs. Parameters keep their kind: integers (axes) are Z3 ints, symbols
(``RELU``, ``SAME``, dtypes) Z3 strings, int vectors (strides, kernels, split sizes,
perms, literal shapes) Z3 sequences of ints. A tensor's shape is two functions,
``rank : Tensor -> Int`` and ``dim : Tensor x Int -> Int`` (dimensions past the rank
read 0), so shape reasoning stays in uninterpreted functions and linear arithmetic,
which Z3 decides far faster than sequence equations (ranks up to 6 are modelled);
every operator function comes with a quantified axiom stating what typing fixes
about the shape of its result (enough for the guards of the axioms).

Each axiom becomes one or two quantified equations (one per side that contains all
its variables, that side being the E-matching trigger; literal and computed parameters
of the trigger are abstracted to bound variables so the pattern stays uninterpreted).
A rule's variables become constants, its guards hypotheses (``weight`` and ``before``
only schedule saturation, so they are ignored), and so is what typing requires of its
left side, which a rule only ever rewrites once matched, hence well-typed (that each
operator application there is in one of its shape cases, with the case's requirements:
a concat's operands agree off its axis, a conv's weight has rank 4; stated where the
rule's example shows they can hold with the guards); the right side's requirements are
not (that the right side is well-typed is what the rule must keep). The prover asks
whether ``lhs != rhs`` is consistent with the axioms. Model-based quantifier instantiation is
off, so Z3 answers unsat (proved), or gives up once E-matching has nothing left to
instantiate, or at the per-rule limit: wall-clock seconds, or Z3's resource count
(``rlimit``), which depends on the work alone and not on the machine's load (the
generator's, so that two runs prove the same rules). An unsat core names the axioms a
proof used.

Soundness rests on the axioms, each of which the tests check numerically through the
kernels, and on two assumptions: every term the prover reasons about is well-typed
(as every term of a real graph is), so axiom guards state only what typing does not
imply; and tensors have rank 6 at most. Reading dimensions past the rank as 0 is a
convention every asserted fact keeps, so it proves nothing real shapes do not. A rule
not proved is "refuted" only when a float counterexample exists (on the example or on
other shapes); a model over uninterpreted functions is no counterexample.
"""
