"""Scoring translations: sacreBLEU's BLEU, chrF and TER with their signatures, and an
evaluation's files (`scores`); evaluating a run's checkpoints on a split and choosing one on
validation data (`evaluate`); what evaluation does while a run trains: its validation's
scores, and the evaluation commands' search compiled ahead (`validation`); the alignment error
rate of a run's attention against a gold alignment (`alignment_error`); heatmaps of attention
and charts (`plots`).

May import: shared, runtime, data, runs, decoding.
"""
