"""Shared fixtures: the tiny config, shrunk further so each run compiles few shapes."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_config(name: str):
  """`get_config()` of `configs/<name>.py`, loaded the way config_flags does."""
  spec = importlib.util.spec_from_file_location(name, ROOT / "configs" / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


@pytest.fixture
def tiny_config():
  c = load_config("tiny")
  c.data.max_train_examples = 300
  c.data.max_len = 16
  c.data.bucket_step = 16  # One padded length: one compiled train step.
  c.data.tokens_per_batch = 256
  c.eval.max_sentences = 8
  c.eval.batch_size = 8
  c.eval.max_decode_len_a = 1.0
  c.eval.max_decode_len_b = 0
  return c
