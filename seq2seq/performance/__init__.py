"""Measuring speed: train-step and decoding benchmarks (`benchmark`), start-up, padding,
steps per call, seeds and saves (`startup`), where an XLA program's time goes (`profile`),
and the side-by-sides against flax's examples/wmt at equal shapes (`side_by_side`) and against
JoeyNMT on a recipe's data (`anchor_joeynmt`, driving `joeynmt_worker` in JoeyNMT's own
virtualenv on the files `joeynmt_files` writes); a run against itself exported to
CTranslate2 (`engines`, each engine a process running `engine_worker`; the optional
`[export]` extra).

May import: shared, runtime, data, models, runs, decoding, training, serve.
"""
