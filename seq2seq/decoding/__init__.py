"""Translating with trained parameters: greedy, beam and sampling search over any model's
`decode_step` (`search`; beam search, compacting its batch as sentences end: `beam_search`;
the memory and cache of its hypotheses: `beams`; what every search scores with: `scores`),
several models decoding as one (`ensemble`, its members from the command line: `members`), and
the `Translator` that loads a run's checkpoint and turns text into text in compiled, bucketed
shapes (`translator`); the attention of a translation (`alignment`) and the word links drawn
from it (`word_alignment`); how long a translation may grow (`lengths`). `deploy` (the optional
`[export]` extra) exports a run's checkpoint as a CTranslate2 model, and `deployed` (which
imports no JAX) translates with it as the `Translator` would.

May import: shared, runtime, data, models, runs.
"""
