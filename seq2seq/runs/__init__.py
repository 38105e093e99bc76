"""A run: its workdir and what lives in it. The layout, the lock, the saved config and
vocabulary (`workdirs`), how training makes the vocabulary (`vocabulary`), whether they
match what a command brings (`match`), the train state a checkpoint holds (`train_state`),
the checkpoints themselves (`checkpoints`, with `full_disk` and `orbax_logs` for the faults
of writing them), the metrics log (`metrics_writer`: metrics.jsonl and TensorBoard events),
which parameters decode (`selection`: a step, an average, or the one chosen on validation
data), a released model (`released`: those parameters alone, read as a run), and what a new
run takes from a parent run's checkpoint (`parents`, config.train.init_from). A run's
saved config is read back checked as a training's start checks it, what its model family can
build included (`models.check_config`).

May import: shared, data, models.
"""
