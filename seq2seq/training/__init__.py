"""Training a run: the driver that claims the workdirs, restores and loops (`loop`), the
`Trainer` that builds the data, the model and the compiled steps (`trainer`), the pure step
functions (`steps`), what the loop does between steps: validation, checkpoints, early
stopping, the divergence check (`actions`), what it tells the user: the progress bar, train
records, the compile log (`reports`), several seeds' runs trained as one program (`seeds`), and
a new run started from a parent run's checkpoint (`parents`).

May import: shared, runtime, data, models, runs, decoding, evaluation.
"""
