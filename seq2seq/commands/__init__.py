"""The command-line commands, one module per command: its usage (the module docstring, which
`--help` prints), its flags and `main(argv)`.

`seq2seq.main` runs them (the `seq2seq-*` console scripts and scripts/*.py): it sets up the
process before a command module is imported, since importing one imports JAX. Each module
defines its flags on absl's global `FLAGS` when imported, as absl programs do, so a process
imports one command (two that share a flag name would collide).
"""
