"""Config files built on others. The files in `configs/` are not a package: ml_collections'
`config_flags` loads each by its path, and a recipe that starts from another (the former
default, the big WMT model, the published Multi30k recipe with what the comparisons found)
loads that file the same way, by `sibling`."""

import importlib.util
from pathlib import Path

import ml_collections


def sibling(config_file: str, name: str) -> ml_collections.ConfigDict:
  """`get_config()` of the config file `name` in the folder of `config_file` (the calling
  config file's `__file__`)."""
  path = Path(config_file).with_name(name)
  spec = importlib.util.spec_from_file_location(f"seq2seq_config_{path.stem}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()
