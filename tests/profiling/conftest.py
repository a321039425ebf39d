"""A model small enough that a 2-rank profiling job takes seconds on a 2-core CI machine."""

import pytest

from autoparallel.specs.model import ModelSpec

SMALL = ModelSpec(name="prof-small", num_layers=2, hidden_size=64, ffn_hidden_size=128,
                  num_attention_heads=4, num_query_groups=2, vocab_size=128, seq_length=32,
                  activation="swiglu", normalization="rmsnorm", global_batch_size=8)

SMALL_YAML = """name: prof-small
num_layers: 2
hidden_size: 64
ffn_hidden_size: 128
num_attention_heads: 4
num_query_groups: 2
vocab_size: 128
seq_length: 32
activation: swiglu
normalization: rmsnorm
global_batch_size: 8
"""


@pytest.fixture
def small():
    return SMALL


@pytest.fixture
def small_yaml(tmp_path):
    path = tmp_path / "prof-small.yaml"
    path.write_text(SMALL_YAML)
    return path
