"""The proxy rule: structure kept, sizes shrunk, layers mapped back onto the real model."""

import pytest

from autoparallel import io
from autoparallel.fp8check.proxy import ProxyRule, edge_count, proxy_spec, real_layers
from autoparallel.specs.model import ModelSpec


@pytest.mark.parametrize("name", sorted(io.preset_files("models")))
def test_proxy_keeps_structure_of_every_preset(name):
    model = io.load_model(name)
    proxy = proxy_spec(model)
    assert proxy.activation == model.activation
    assert proxy.normalization == model.normalization
    assert proxy.tie_embeddings == model.tie_embeddings
    ratio = model.num_attention_heads // model.query_groups
    assert proxy.num_attention_heads // proxy.query_groups == ratio
    ffn = model.expert_ffn_hidden_size if model.is_moe else model.ffn_hidden_size  # one expert's
    expansion = ffn / model.hidden_size
    assert abs(proxy.ffn_hidden_size / proxy.hidden_size - expansion) <= 8 / proxy.hidden_size
    assert proxy.num_layers == min(4, model.num_layers) and proxy.hidden_size == 128
    assert proxy.vocab_size == 256 and proxy.seq_length <= model.seq_length
    assert proxy.num_parameters < 2e6 < model.num_parameters


def test_rule_numbers_come_from_the_rule():
    model = io.load_model("llama3-70b")
    proxy = proxy_spec(model, ProxyRule(hidden_size=64, num_layers=6, heads=16, head_dim=4))
    assert (proxy.hidden_size, proxy.num_layers, proxy.head_dim) == (64, 6, 4)
    assert (proxy.num_attention_heads, proxy.query_groups) == (16, 2)   # GQA ratio 8 kept


def test_moe_becomes_dense_with_one_experts_ffn():
    moe = ModelSpec(name="moe", num_layers=8, hidden_size=1024, ffn_hidden_size=4096,
                    num_attention_heads=8, vocab_size=1000, seq_length=256, num_experts=8,
                    moe_ffn_hidden_size=512, activation="swiglu")
    proxy = proxy_spec(moe)
    assert not proxy.is_moe and proxy.ffn_hidden_size == 64 and "MoE" in proxy.source


def test_bad_rule_is_refused():
    with pytest.raises(ValueError, match="head_dim"):
        ProxyRule(head_dim=7)
    with pytest.raises(ValueError, match="num_layers"):
        ProxyRule(num_layers=0)


@pytest.mark.parametrize("proxy_layers,model_layers", [(4, 80), (4, 96), (3, 10), (4, 4)])
def test_real_layers_partition_the_model(proxy_layers, model_layers):
    blocks = [real_layers(i, proxy_layers, model_layers) for i in range(proxy_layers)]
    covered = [r for b in blocks for r in b]
    assert covered == list(range(model_layers))
    assert real_layers(1, 4, 80) == range(20, 40)


def test_edge_count():
    assert edge_count((), 4) == 0
    assert edge_count((0,), 4) == 1 and edge_count((3,), 4) == 1 and edge_count((0, 3), 4) == 1
    assert edge_count((1,), 4) is None          # a middle layer: not expressible as edges
    assert edge_count((1,), 6) == 2 and edge_count((0, 4), 6) == 2
    assert edge_count((2,), 6) is None
