"""The text a model learns from, up to the batches it sees: corpora from files, TFDS or the
bundled Multi30k (`corpus`), the joint SentencePiece vocabulary (`tokenizer`) and the ids it
reserves (`special_ids`), bucketed or packed batches (`batching`), the training text
resegmented at each epoch (`subword_sampling`), and text files of one sentence per line,
written whole or not at all (`textio`).

May import: shared, runtime.
"""
