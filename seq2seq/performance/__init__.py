"""Measuring speed: train-step and decoding benchmarks (`benchmark`), start-up, padding,
steps per call, seeds and saves (`startup`), where an XLA program's time goes (`profile`),
the side-by-side against flax's examples/wmt at equal shapes (`side_by_side`; the one against
JoeyNMT is a reproduction outside the package, benchmarks/joeynmt); a run against itself
exported to CTranslate2 (`engines`, each engine a process running `engine_worker`; the optional
`[export]` extra).

May import: shared, runtime, data, models, runs, decoding, training, serve.
"""
