"""A run: its workdir and what lives in it. The layout, the lock, the saved config and
vocabulary (`workdirs`), whether they match what a command brings (`match`), the train state
a checkpoint holds (`train_state`), the checkpoints themselves (`checkpoints`, with
`full_disk` and `orbax_logs` for the faults of writing them), and which parameters decode
(`selection`: a step, an average, or the one chosen on validation data).

May import: shared, data.
"""
