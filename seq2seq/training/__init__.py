"""Training a run: the driver that claims the workdirs, restores and loops (`loop`), the
`Trainer` that builds the data, the model and the compiled steps (`trainer`), the pure step
functions (`steps`), what the loop does between steps: validation, checkpoints, early
stopping, the divergence check (`actions`), what it tells the user: the progress bar, train
records, the compile log (`reports`), and several seeds' runs trained as one program
(`seeds`). A new run started from a parent run's checkpoint is read where checkpoints are
(`runs.parents`).

May import: shared, runtime, data, models, runs, decoding, evaluation.
"""
