"""Training a run: the driver that claims the workdirs, restores and loops (`loop`), the
`Trainer` that builds the data, the model and the compiled steps (`trainer`), the pure step
functions (`steps`), what the loop does between steps: validation, checkpoints, early
stopping, the divergence check (`actions`), what it tells the user: the progress bar, train
records, the compile log (`reports`), the metrics log (`metrics_writer`), and the device mesh
and its shardings (`distributed`).

May import: shared, runtime, data, models, runs, decoding, evaluation.
"""
