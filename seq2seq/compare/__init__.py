"""Comparing runs: a sweep trains the points of a grid (`sweep`); the comparison evaluates
runs on shared test sets, caching each evaluation (`evaluations`), tests the differences for
significance (`stats`) and writes the table, the charts and the attention side by side
(`comparison`, `report`).

May import: shared, runtime, data, models, runs, decoding, evaluation, training.
"""
