"""The ids every vocabulary reserves (SentencePiece is trained with them): the only place they
are defined, light enough for the models and decoding to import."""

PAD_ID = 0
UNK_ID = 1
BOS_ID = 2
EOS_ID = 3
