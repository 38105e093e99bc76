"""Comparing runs: a sweep trains the points of a grid (`sweep`); the comparison scores
runs on shared test sets (`scoring`), caching each evaluation (`evaluations`) or reading a
run's record instead (`recorded`), tests the differences for significance (`stats`), reads
each run's training record (`records`) and writes the table,
the charts and the attention side by side (`comparison`, `report`), replacing an earlier
comparison whole or not at all (`output`).

May import: shared, runtime, data, models, runs, decoding, evaluation, training.
"""
