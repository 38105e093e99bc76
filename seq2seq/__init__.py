"""seq2seq: neural machine translation in JAX/Flax (see README.md).

The folders are layers, in the order data flows; each imports only the layers above it in
this list (tests/test_structure.py checks it, from each package's "May import:" line):

  errors.py, config.py  what every layer shares: one-line user errors, the run config,
  config_files.py       config files built on others,
  registry.py           the registries of named parts, and the run's own files that add to them
  runtime/              the process: signals, host memory, compilation
  data/                 corpora, SentencePiece, batches, text files
  models/               the Transformer and the attentional RNN behind one interface
  runs/                 a run's workdir: layout, lock, config, checkpoints, their choice
  decoding/             greedy, beam and sampling search, ensembles, the Translator
  evaluation/           sacreBLEU scores, evaluating checkpoints, pictures
  training/             the loop, the trainer, its steps, actions and metrics log
  compare/              sweeps, cached evaluations, statistics, reports
  serve/                the translation server and its attention explorer
  performance/          benchmarks, profiles, the side-by-side against flax's wmt example
  commands/             the command-line commands, one module each
"""

import time

IMPORTED = time.perf_counter()  # When the package was first imported: a process's start.
