"""The protocol verifier (docs/verifier.md): which scalar values are tried (forms,
candidates, enumeration, episodes, unroll, codegen) and how each is checked (check, run,
tables, diagnosis, counterexample)."""
