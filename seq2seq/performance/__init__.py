"""Measuring speed: train-step and decoding benchmarks (`benchmark`), start-up, padding,
steps per call, seeds and saves (`startup`), where an XLA program's time goes (`profile`),
and the side-by-side against flax's examples/wmt at equal shapes (`side_by_side`); a run
against itself exported to CTranslate2 (`engines`, the optional `[export]` extra).

May import: shared, runtime, data, models, runs, decoding, training, serve.
"""
