"""Fast settings for the FP8 check tests: a 4-layer proxy of width 32, 16 steps, stats every 4.

Thresholds and the layer search are the shipped YAML's, so the tests exercise the real rule;
only the run is shortened. One torch thread, as in tests/model (small tensors, shared cores).
"""

import dataclasses

import pytest

from autoparallel.fp8check.proxy import ProxyRule
from autoparallel.fp8check.settings import CheckRun, load_settings

TINY_YAML = """\
thresholds: {max_loss_gap_pct: 5.0, max_underflow_pct: 5.0, max_overflow_pct: 0.5}
run: {steps: 16, batch_size: 4, seq_length: 16, seed: 0, stats_every: 4, final_window: 4}
proxy: {hidden_size: 32, num_layers: 4, heads: 4, head_dim: 8, vocab_size: 256, seq_length: 16}
layer_search: {max_bf16_layers: 2, max_reruns: 4}
recipes: [fp8-current, fp8-blockwise]
"""


@pytest.fixture(scope="session")
def tiny_settings():
    shipped = load_settings()
    return dataclasses.replace(
        shipped, run=CheckRun(steps=16, batch_size=4, seq_length=16, stats_every=4, final_window=4),
        proxy=ProxyRule(hidden_size=32, num_layers=4, heads=4, head_dim=8, seq_length=16))


@pytest.fixture
def tiny_yaml(tmp_path):
    path = tmp_path / "fp8_check_tiny.yaml"
    path.write_text(TINY_YAML)
    return path
