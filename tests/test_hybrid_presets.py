"""The Nemotron 3 hybrid Mamba-Transformer MoE presets and their published runs (session 48).

Each preset is checked field by field against the values its ``source:`` names, written out below
with the Megatron-LM flag or Megatron-Bridge field they were read from; the runs of
``training_runs_hybrid.csv`` (Megatron-Bridge's performance summaries 26.02.01-26.08) are checked to
load, to build their preset's model, to give the layout they state as a candidate, to carry the
recipe settings they ran with, and to stay out of every calibration fit (kind ``hybrid-newer``).
Pricing them is the hybrid cost model's job: these tests do not read a predicted figure.
"""

import dataclasses

import pandas as pd
import pytest

from autoparallel import io, measured_runs, resources, validate

HYBRID_CSV = "training_runs_hybrid.csv"
NANO_PATTERN = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"
SUPER_PATTERN = "MEMEMEM*EMEMEMEM*EMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEM*EMEMEMEME"
ULTRA_PATTERN = ("MEMEMEM*EMEMEM*EMEMEMEM*EMEMEMEM*EMEMEM*EMEMEMEM*EMEMEMEM*EMEMEM*EMEMEMEM*EMEMEMEM*EMEMEM"
                 "*EMEMEMEM*EMEMEMEME")

# Fields every Nemotron 3 model shares: Megatron-Bridge 067f987df0 models/hybrid/hybrid_provider.py
# (HybridModelProvider: position_embedding_type "none", RMSNorm, add_bias_linear False, dropout 0,
# layernorm_epsilon 1e-5, untied embeddings), models/nemotronh/nemotron_h_bridge.py (squared_relu,
# sigmoid router with expert bias, fp32 router dtype) and Megatron-LM d98e8a64dd's confs
# (--squared-relu --position-embedding-type none --untie-embeddings-and-output-weights
# --disable-bias-linear --normalization RMSNorm); Mamba state 128, 8 groups, conv width 4:
# Megatron-Core's TransformerConfig / MambaMixer defaults, which no conf overrides.
COMMON = [("activation", "squared_relu"), ("normalization", "rmsnorm"), ("position_embedding_type", "none"),
          ("add_bias_linear", False), ("norm_epsilon", 1e-5), ("hidden_dropout", 0.0), ("attention_dropout", 0.0),
          ("tie_embeddings", False), ("moe_router_score_function", "sigmoid"),
          ("moe_router_enable_expert_bias", True), ("moe_router_dtype", "fp32"), ("mamba_head_dim", 64),
          ("mamba_state_dim", 128), ("mamba_num_groups", 8), ("mamba_conv_kernel", 4), ("kv_channels", 128),
          ("num_query_groups", 2), ("vocab_size", 131072), ("seq_length", 8192),
          ("tokenizer_type", "HuggingFaceTokenizer")]
# Megatron-Bridge recipes/nemotronh/h100/nemotron_3_nano.py HybridModelProvider(...) and Megatron-LM's
# NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.sh.
NANO = COMMON + [
    ("hybrid_layer_pattern", NANO_PATTERN), ("num_layers", 52), ("hidden_size", 2688), ("num_attention_heads", 32),
    ("ffn_hidden_size", 1856), ("mamba_num_heads", 64), ("num_experts", 128), ("moe_router_topk", 6),
    ("moe_ffn_hidden_size", 1856), ("moe_shared_expert_intermediate_size", 3712),
    ("moe_router_topk_scaling_factor", 2.5), ("moe_router_num_groups", 1), ("moe_router_group_topk", 1),
    ("moe_latent_size", None), ("mtp_num_layers", 0), ("global_batch_size", 512),
    ("tokenizer_model", "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"),
    ("max_position_embeddings", 262144)]  # its HF config.json (kingkong's transcription, the preset's source)
# Nano's provider plus mtp_num_layers 2 (mtp_hybrid_override_pattern "*E", repeated layer):
# nemotron_3_5_lightning_pretrain_config.
LIGHTNING = [(f, v) for f, v in NANO if f not in ("mtp_num_layers", "tokenizer_model", "max_position_embeddings")] + [
    ("mtp_num_layers", 2), ("tokenizer_model", "nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-BF16"),
    ("max_position_embeddings", None)]
# Megatron-LM's NVIDIA-Nemotron-3-Super-120B-A12B-BF16.sh and nemotron3_super_release_gb200/model_config.yaml.
SUPER = COMMON + [
    ("hybrid_layer_pattern", SUPER_PATTERN), ("num_layers", 88), ("hidden_size", 4096), ("num_attention_heads", 32),
    ("ffn_hidden_size", 2688), ("mamba_num_heads", 128), ("num_experts", 512), ("moe_router_topk", 22),
    ("moe_ffn_hidden_size", 2688), ("moe_latent_size", 1024), ("moe_shared_expert_intermediate_size", 5376),
    ("moe_router_topk_scaling_factor", 5.0), ("moe_router_num_groups", None), ("mtp_num_layers", 2),
    ("global_batch_size", 512), ("tokenizer_model", "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16"),
    ("max_position_embeddings", 262144)]  # its NVFP4 checkpoint's config.json, as the preset's source cites
# Megatron-LM's NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16.sh; MTP 2 from Bridge's Ultra recipes.
ULTRA = COMMON + [
    ("hybrid_layer_pattern", ULTRA_PATTERN), ("num_layers", 108), ("hidden_size", 8192), ("num_attention_heads", 64),
    ("ffn_hidden_size", 5120), ("mamba_num_heads", 256), ("num_experts", 512), ("moe_router_topk", 22),
    ("moe_ffn_hidden_size", 5120), ("moe_latent_size", 2048), ("moe_shared_expert_intermediate_size", 10240),
    ("moe_router_topk_scaling_factor", 5.0), ("moe_router_num_groups", None), ("mtp_num_layers", 2),
    ("global_batch_size", 256), ("tokenizer_model", "nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16"),
    ("max_position_embeddings", None)]  # no source read states Ultra's
PRESETS = {"nemotron-3-nano": NANO, "nemotron-3.5-lightning": LIGHTNING, "nemotron-3-super": SUPER,
           "nemotron-3-ultra": ULTRA}
CASES = [(name, field, value) for name, fields in PRESETS.items() for field, value in fields]


@pytest.mark.parametrize("name, field, value", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_preset_states_its_source_field(name, field, value):
    assert getattr(io.load_model(name), field) == value


@pytest.mark.parametrize("name, warns", [("nemotron-3-nano", False), ("nemotron-3-super", False),
                                         ("nemotron-3-ultra", True)])
def test_infer_warns_past_the_published_context_only(name, warns):
    """The hybrid presets stated no context, so `infer` warned past their 8,192 training tokens: Nano's and
    Super's configs serve 262,144 positions (their YAML's source cites it); Ultra's is not read, so it still warns."""
    from autoparallel.serve.space import context_warning
    model = io.load_model(name)
    assert (context_warning(model, 16384, 512) is not None) is warns
    assert context_warning(model, 262144 - 512, 512) is None or warns
    if not warns:
        assert "max_position_embeddings 262144" in model.source and context_warning(model, 262144, 512)


@pytest.mark.parametrize("name, counts", [
    ("nemotron-3-nano", {"M": 23, "E": 23, "*": 6, "-": 0}),   # Bridge docs: 23 Mamba-2 and MoE layers, 6 attention
    ("nemotron-3-super", {"M": 40, "E": 40, "*": 8, "-": 0}),
    ("nemotron-3-ultra", {"M": 48, "E": 48, "*": 12, "-": 0})])
def test_the_layer_pattern_has_the_published_layer_counts(name, counts):
    assert io.load_model(name).layer_kind_counts == counts


@pytest.mark.parametrize("name, total, active", [
    # Megatron-Bridge docs/models/nemotron: Nano "3.5B active parameters and 30B parameters in total",
    # Super "12B active parameters and 120B parameters in total", Ultra "550B total / A55B active".
    ("nemotron-3-nano", 30e9, 3.5e9), ("nemotron-3-super", 120e9, 12e9), ("nemotron-3-ultra", 550e9, 55e9)])
def test_parameter_counts_are_the_published_sizes(name, total, active):
    """Within 7 %: the headline sizes are rounded (Super's 12.77B active parameters are its "A12B")."""
    model = io.load_model(name)
    assert abs(model.num_parameters / total - 1) < 0.07
    assert abs(model.num_active_parameters / active - 1) < 0.07


def bridge_hybrid_flops_per_token(model, mtp_num_layers: int) -> float:
    """Megatron-Bridge's model FLOPs per token of a hybrid model (067f987df0
    src/megatron/bridge/training/utils/flop_utils.py: hybrid_flops with its attn / mamba / moe layer
    counts; the MTP depths' "*E" blocks counted as layers, their logits as (1 + mtp) outputs): the
    count behind the summaries' "Model TFLOP / sec / GPU" column. Written out here (not the cost
    model's count) so that the published figures check the presets' shapes."""
    h, seq = model.hidden_size, model.seq_length
    pattern = model.hybrid_layer_pattern + "*E" * mtp_num_layers
    p = model.kv_channels * model.num_attention_heads / h
    attn = 4 * h * p * (h + h * model.query_groups / model.num_attention_heads) + 2 * h * p * seq
    d_in = 2 * h
    mamba = (2 * h * (2 * d_in + 2 * model.mamba_num_groups * model.mamba_state_dim + model.mamba_heads)
             + 7 * d_in * model.mamba_state_dim + 2 * d_in * h)
    latent = model.moe_latent_size
    routed = (4 * (latent or h) * model.moe_ffn_hidden_size * model.moe_router_topk
              + (4 * h * latent if latent else 0))
    moe = routed + 4 * h * (model.moe_shared_expert_intermediate_size or 0)
    forward = (pattern.count("*") * attn + pattern.count("M") * mamba + pattern.count("E") * moe
               + 2 * h * model.vocab_size * (1 + mtp_num_layers))
    return 3 * forward


@pytest.fixture(scope="module")
def hybrid_frame():
    return measured_runs.read_runs_table(resources.data_file(HYBRID_CSV), measured_runs.RUN_COLUMNS)


def test_every_published_figure_is_bridges_count_of_its_preset(hybrid_frame):
    """Model TFLOP/s over tokens/s is Bridge's FLOPs per token: within 2 % (the tables round tokens/s,
    26.06.01 on to multiples of 128) for every row with the preset's MTP depth, and at least 5 % off
    without it for the MTP models: the published figures pin the shapes, MTP included."""
    for _, row in hybrid_frame.iterrows():
        model = io.load_model(str(row["model"]))
        published = row["measured_model_tflops_per_gpu"] * 1e12 / row["measured_tokens_per_s_per_gpu"]
        assert abs(published / bridge_hybrid_flops_per_token(model, model.mtp_num_layers) - 1) < 0.02, row["id"]
        if model.mtp_num_layers:
            assert abs(published / bridge_hybrid_flops_per_token(model, 0) - 1) > 0.05, row["id"]


# Rows per model, release and GPU: every Nemotron 3 pre-training row of Megatron-Bridge 067f987df0's
# docs/performance-summary.md (26.08) and docs/performance-summary-archive.md (26.06.01 ... 26.02.01).
ROWS = {"nemotron-3-nano": 20, "nemotron-3.5-lightning": 1, "nemotron-3-super": 30, "nemotron-3-ultra": 2}
RELEASES = {"26.02.01": 4, "26.04": 12, "26.04.01": 13, "26.06": 10, "26.06.01": 6, "26.08": 8}


def test_the_hybrid_table_holds_every_published_row(hybrid_frame):
    assert hybrid_frame.id.is_unique and len(hybrid_frame) == 53
    assert hybrid_frame.model.value_counts().to_dict() == ROWS
    assert hybrid_frame.release.astype(str).value_counts().to_dict() == RELEASES
    assert HYBRID_CSV in measured_runs.VALIDATION_ONLY_RUNS and HYBRID_CSV not in measured_runs.TRAINING_RUNS
    assert hybrid_frame.source.str.startswith("NVIDIA-NeMo/Megatron-Bridge@067f987df0:docs/performance-summary").all()


ARCH_FIELDS = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "query_groups", "kv_channels",
               "vocab_size", "activation", "normalization", "position_embedding_type", "tie_embeddings",
               "num_experts", "moe_router_topk", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size",
               "moe_latent_size", "hybrid_layer_pattern", "mamba_heads", "mamba_head_dim", "mamba_state_dim",
               "mamba_num_groups", "mamba_conv_kernel", "mtp_num_layers", "moe_router_num_groups",
               "moe_router_group_topk", "add_bias_linear", "moe_router_dtype", "hidden_dropout", "attention_dropout",
               "multi_latent_attention", "num_parameters", "num_active_parameters")


def test_every_row_builds_its_presets_model(hybrid_frame):
    for _, row in hybrid_frame.iterrows():
        built, preset = measured_runs.model_from_row(row), io.load_model(str(row["model"]))
        assert built.is_hybrid and built.moe_router_force_load_balancing is False
        assert {f: getattr(built, f) for f in ARCH_FIELDS} == {f: getattr(preset, f) for f in ARCH_FIELDS}, row["id"]


@pytest.fixture(scope="module")
def prepared(hybrid_frame):
    assumptions, recipes = io.read_yaml(measured_runs.ASSUMPTIONS), measured_runs.recipe_settings()
    return [measured_runs.prepare_row(row, assumptions, recipes) for _, row in hybrid_frame.iterrows()]


def test_every_row_is_a_held_out_hybrid_row_with_its_layout(prepared):
    for p in prepared:
        assert p.kind == "hybrid-newer" and p.validation_only and p.model.moe_router_force_load_balancing
        assert p.metric == "tokens_per_s_per_gpu" and not p.candidates.empty
        for knob in ("tp", "pp", "cp", "ep", "mbs"):
            assert (p.candidates[knob] == int(p.row[knob])).all(), (p.id, knob)
        assert (p.candidates.fsdp == (str(p.row["model"]) == "nemotron-3-ultra")).all()


def test_every_row_runs_its_recipes_settings(prepared):
    """Each row has a recipe_settings.yaml entry citing the Megatron-Bridge tag that ran it; its knobs
    pin the candidates (flex dispatch, the recipe's recompute) and are reported as from the recipe."""
    entries = measured_runs.recipe_settings()["rows"]
    for p in prepared:
        entry = entries[p.id]
        assert "Megatron-Bridge v0." in entry["source"]
        assert (p.candidates.moe_token_dispatcher_type == "flex").all()
        assert (p.candidates.recompute == entry["recompute"]).all(), p.id
        assert p.origins["recompute"] == p.origins["moe_token_dispatcher_type"] == "recipe"
    ultra = [p for p in prepared if str(p.row["model"]) == "nemotron-3-ultra"]
    assert ultra and all((p.candidates.recompute_modules.map(str) != "").all() for p in ultra)


def test_the_hybrid_layouts_fit_as_run(prepared):
    """Every published hybrid layout is predicted to fit the GPU it ran on, priced with Mamba-2 and
    LatentMoE layers (s48h1); Ultra on 256 GB300 at TP 1 needs its HSDP (fsdp 64) to fit."""
    assert [p.id for p in prepared if not measured_runs.predict_row(p)["fits"]] == []


def test_no_fit_sees_a_hybrid_row(prepared, monkeypatch):
    """Calibration reads TRAINING_RUNS only; validate's MoE refits take the rows that are not
    validation-only, so a hybrid model's fold refits on the published MoE rows alone."""
    from types import SimpleNamespace

    from autoparallel.costmodel import calibrate
    assert all(str(path.name) != HYBRID_CSV for path in measured_runs.default_runs())
    seen = []
    monkeypatch.setattr(calibrate, "fit_moe", lambda rows: (seen.extend(r.id for r in rows), ({},))[1])
    monkeypatch.setattr(calibrate, "uncalibrated_moe", lambda efficiency: efficiency)
    monkeypatch.setattr(validate, "predict_row", lambda p, efficiency: {"id": p.id})
    published = SimpleNamespace(id="published", model=SimpleNamespace(is_moe=True), model_group="other",
                                validation_only=False, hardware=prepared[0].hardware)
    rows = [published, *prepared]
    for group in {p.model_group for p in prepared}:
        seen.clear()
        assert set(validate._refit_moe_and_predict(rows, group)) == {p.id for p in prepared if p.model_group == group}
        assert seen == ["published"]
    seen.clear()
    validate._refit_moe_and_predict(rows, "other")
    assert seen == []  # the published row's own fold: no hybrid row joins the refit


def _report(kinds_gpus):
    """A validate report of one row per (kind, gpu, source), errors 1 %, 2 %, ..."""
    rows = [{"id": f"r{i}", "kind": k, "gpu": g, "source": s, "error_pct": float(i + 1), "fits": True,
             "heldout_error_pct": float(i + 1)} for i, (k, g, s) in enumerate(kinds_gpus)]
    return pd.DataFrame(rows)


def test_the_hybrid_rows_are_summarized_apart():
    """A hybrid row joins its kind's group and a "hybrid gpu" group, never a source or GPU group of
    the transformer rows (whose figures stay what they were)."""
    report = _report([("moe-newer", "gb300", "bridge 26.08"), ("hybrid-newer", "gb300", "bridge 26.08"),
                      ("hybrid-newer", "b200", "bridge 26.04")])
    s = validate.summary(report).set_index(["by", "group"])
    assert s.loc[("kind", "hybrid-newer"), "rows"] == 2
    assert s.loc[("source", "bridge 26.08"), "rows"] == 1 and s.loc[("gpu", "gb300"), "mean_abs_error_pct"] == 1.0
    assert ("source", "bridge 26.04") not in s.index and ("gpu", "b200") not in s.index
    assert s.loc[("hybrid gpu", "gb300"), "rows"] == 1 and s.loc[("hybrid gpu", "b200"), "mean_abs_error_pct"] == 3.0
    without = validate.summary(report[report.kind != "hybrid-newer"])
    kept = s.drop(index=[i for i in s.index if i[0] == "hybrid gpu" or i[1] == "hybrid-newer"]).reset_index()
    pd.testing.assert_frame_equal(kept, without, check_like=True)


def test_the_hybrid_rows_give_the_hybrid_tie_band_only():
    """The held-out hybrid rows leave the dense and MoE bands as they were and give the hybrid
    models' own: pooled and per family, which a hybrid model's search reads."""
    from autoparallel.report.tables import PredictionError
    report = _report([("dense", "h100-sxm", "nemo 25.11"), ("moe", "h100-sxm", "nemo 25.11"),
                      ("hybrid-newer", "h100-sxm", "bridge 26.06"), ("hybrid-newer", "b200", "bridge 26.06")])
    bands = validate.tie_bands(report)
    without = validate.tie_bands(report[report.kind != "hybrid-newer"])
    assert bands["step_time_relative_error"] == without["step_time_relative_error"] == 0.01
    assert bands["moe_step_time_relative_error"] == without["moe_step_time_relative_error"] == 0.02
    assert bands["hybrid_step_time_relative_error"] == 0.035  # rows of 3 % and 4 %
    assert bands["by_family"]["h100-sxm"]["hybrid-newer"] == 0.03 and "hybrid-newer" not in without["by_family"]["h100-sxm"]
    error = PredictionError(source="test", **bands)
    h100, b300 = io.load_hardware("h100-sxm"), io.load_hardware("b300")
    assert error.for_hardware(h100, moe=True, hybrid=True).step_time_relative_error == 0.03
    assert error.for_hardware(h100, moe=True).step_time_relative_error == 0.02
    b300_band = error.for_hardware(b300, moe=True, hybrid=True).step_time_relative_error
    assert b300_band == (0.04 if (b300.efficiency_from or "b300") == "b200" else 0.035)


def test_published_layouts_yaml_lists_every_hybrid_layout(hybrid_frame):
    """Each distinct published layout of a Nemotron 3 model is an entry of published_layouts.yaml (the
    default space offering it and the cost model predicting it to fit is test_published_layouts.py's)."""
    layouts = io.read_yaml(io.SEARCH_SPACES / "published_layouts.yaml")
    keys = ("gpu", "tp", "pp", "cp", "vp", "ep", "mbs", "gbs", "precision")
    for model in ROWS:
        rows = hybrid_frame[hybrid_frame.model == model]
        published = {(int(r.num_gpus), *(str(getattr(r, k)) for k in keys), pd.notna(r.fsdp))
                     for r in rows.itertuples()}
        listed = {(e["gpus"], *(str(e[k]) for k in keys), bool(e.get("fsdp", False))) for e in layouts[model]}
        assert listed == published, model


def test_mtp_with_no_position_embedding_is_accepted_as_megatron_accepts_it():
    """Megatron-LM d98e8a64dd megatron/training/arguments.py: MTP needs "rope" or "none" positions."""
    nano = io.load_model("nemotron-3-nano")
    assert dataclasses.replace(nano, mtp_num_layers=2).mtp_num_layers == 2
    with pytest.raises(ValueError, match="Multi-Token Prediction"):
        dataclasses.replace(nano, mtp_num_layers=2, position_embedding_type="learned_absolute")
