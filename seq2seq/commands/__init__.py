"""The command-line commands, one module per command: its usage (the module docstring, which
`--help` prints), its flags and `main(argv)`. `main` runs them (the `seq2seq-*` console
scripts and scripts/*.py call it): it sets up the process before a command module is
imported, since importing one imports JAX. `cli` holds what the commands share: flag
helpers, the config file and its overrides, user errors as one line.

Each command module defines its flags on absl's global `FLAGS` when imported, as absl programs
do, so a process imports one command (two that share a flag name would collide).

May import: shared, runtime, data, models, runs, decoding, evaluation, training, compare,
serve, performance.
"""
