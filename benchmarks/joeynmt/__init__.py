"""This project against JoeyNMT 2.3.0 (benchmarks/joeynmt/README.md): `command` (the flags,
run by side_by_side.py), `anchor` (the timing, driving `worker` in JoeyNMT's own virtualenv),
`budget` (JoeyNMT trained at a recipe's full budget and scored), `files` (JoeyNMT's inputs,
written from ours) and `spec` (our model config as JoeyNMT builds it)."""
