"""Hybrid Mamba-Transformer models (session 48): the exports (Megatron-LM's pretrain_hybrid.py
flags, Megatron-Bridge's HybridModelProvider fields), Megatron-Core's refusals as rules of the
search space, and the built-in transformer's refusal to profile a model it has no Mamba layers
for. Megatron-LM's own parser runs on the exports in benchmarks/bench_megatron_args.py
(``--only-hybrid``); the provider's fields were read from Megatron-Bridge by
benchmarks/bench_bridge_hybrid_fields.py into tests/fixtures/bridge_hybrid_fields.yaml."""

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from autoparallel import io
from autoparallel.costmodel import pipeline
from autoparallel.errors import UserError
from autoparallel.report import hybrid_export
from autoparallel.report.export import export_document, megatron_args
from autoparallel.report.launch import train_script
from autoparallel.space import SearchSpace, generate
from autoparallel.specs.model import ModelSpec
from autoparallel.specs.plan import Plan

# Nemotron 3 Nano 30B-A3B as Megatron-Bridge 067f987df builds it
# (src/megatron/bridge/recipes/nemotronh/h100/nemotron_3_nano.py); not a preset.
NANO_PATTERN = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"
NANO = dict(name="nano-test", num_layers=52, hidden_size=2688, ffn_hidden_size=1856, num_attention_heads=32,
            num_query_groups=2, kv_channels=128, vocab_size=131072, seq_length=8192, activation="squared_relu",
            normalization="rmsnorm", add_bias_linear=False, hidden_dropout=0.0, attention_dropout=0.0,
            position_embedding_type="rope", hybrid_layer_pattern=NANO_PATTERN, mamba_num_heads=64,
            mamba_head_dim=64, mamba_state_dim=128, mamba_num_groups=8, num_experts=128, moe_router_topk=6,
            moe_ffn_hidden_size=1856, moe_shared_expert_intermediate_size=3712)
BRIDGE_FIELDS = set(yaml.safe_load((Path(__file__).parent / "fixtures" / "bridge_hybrid_fields.yaml").read_text())
                    ["fields"])


def nano(**changes) -> ModelSpec:
    return ModelSpec(**{**NANO, **changes})


def flag_value(args: list[str], flag: str) -> str | None:
    return next((a.split(" ", 1)[1] if " " in a else "" for a in args if a.split(" ", 1)[0] == flag), None)


# --- Megatron-LM --------------------------------------------------------------------------------

def test_nano_exports_the_pattern_and_the_mamba_mixer():
    args = megatron_args(nano(), Plan(tp=2, pp=1, dp=4, ep=8, gbs=1024, sp=True))
    assert flag_value(args, "--hybrid-layer-pattern") == f"'{NANO_PATTERN}'"
    assert [flag_value(args, f"--mamba-{k}") for k in ("num-heads", "head-dim", "state-dim", "num-groups")] == \
        ["64", "64", "128", "8"]
    assert "--squared-relu" in args and flag_value(args, "--num-experts") == "128"
    assert flag_value(args, "--moe-latent-size") is None and flag_value(args, "--hybrid-override-pattern") is None
    latent = megatron_args(nano(moe_latent_size=1024), Plan(tp=1, pp=1, dp=8, ep=8, gbs=1024))
    assert flag_value(latent, "--moe-latent-size") == "1024"


def test_a_dense_model_gets_no_hybrid_flag():
    args = megatron_args(io.load_model("llama3-8b"), Plan(tp=1, pp=1, dp=8, gbs=128))
    assert not [a for a in args if "hybrid" in a or "mamba" in a]


@pytest.mark.parametrize("plan", [
    Plan(tp=1, pp=4, dp=2, ep=8, gbs=1024, num_layers_in_first_pipeline_stage=12,
         num_layers_in_last_pipeline_stage=12),
    Plan(tp=1, pp=2, vp=2, dp=4, ep=8, gbs=1024),
    Plan(tp=1, pp=3, dp=2, ep=8, gbs=1024, account_for_embedding_in_pipeline_split=True,
         account_for_loss_in_pipeline_split=True),
    Plan(tp=1, pp=4, dp=2, ep=8, gbs=1024)], ids=["first-last", "interleaved", "accounted", "even"])
def test_pipeline_stages_are_pipe_marks_holding_the_priced_layers(plan):
    """validate_args refuses the split / interleaving flags beside --hybrid-layer-pattern: the |
    marks state the stages, each holding the layers the cost model priced there, in Megatron's
    order (virtual stage = chunk * pp + rank)."""
    model = nano()
    args = megatron_args(model, plan)
    segments = flag_value(args, "--hybrid-layer-pattern").strip("'").split("|")
    assert "".join(segments) == NANO_PATTERN and len(segments) == plan.pp * plan.vp
    assert [len(s) for s in segments] == pipeline.virtual_stage_sizes(
        52, plan.pp, plan.vp, plan.num_layers_in_first_pipeline_stage, plan.num_layers_in_last_pipeline_stage,
        plan.account_for_embedding_in_pipeline_split, plan.account_for_loss_in_pipeline_split)
    assert not [a for a in args if a.split(" ", 1)[0] in hybrid_export.PIPE_STATED]


def test_the_launch_script_runs_pretrain_hybrid_with_the_pattern_unglobbed(tmp_path):
    """The pattern's * must reach Megatron-LM as written, not as the files of the directory."""
    model, hw = nano(), io.load_hardware("h100-sxm")
    plan = Plan(tp=1, pp=2, dp=4, ep=8, gbs=1024)
    script = train_script(model, plan, hw, "test")
    assert '"$MEGATRON_LM/pretrain_hybrid.py"' in script and "pretrain_gpt.py" not in script
    assert "pretrain_gpt.py" in train_script(io.load_model("llama3-8b"), Plan(tp=1, pp=1, dp=8, gbs=128), hw, "t")
    for name in ("MEMEM-file", "x.txt"):
        (tmp_path / name).write_text("")
    printer = script.split("\ntorchrun ")[0] + '\nprintf "%s\\n" "${MODEL_ARGS[@]}"\n'
    out = subprocess.run(["bash", "-c", printer], capture_output=True, text=True, check=True, cwd=tmp_path,
                         env={"PATH": "/usr/bin:/bin", "MEGATRON_LM": "/m", "DATA_PATH": "/d",
                              "CHECKPOINT_DIR": "/c"}).stdout.split("\n")
    at = out.index("--hybrid-layer-pattern")
    assert out[at + 1] == hybrid_export.layer_pattern(model, plan) and "|" in out[at + 1]


def test_mtp_depths_follow_the_pattern_after_slashes():
    """Megatron-LM's Nemotron 3 Super release run: '<pattern>/*E/*E' with --mtp-num-layers 2."""
    model, plan = nano(mtp_num_layers=2, mtp_layer_pattern="*E"), Plan(tp=1, pp=2, dp=4, ep=8, gbs=1024)
    args = megatron_args(model, plan)
    pattern = flag_value(args, "--hybrid-layer-pattern").strip("'")
    assert pattern.endswith("/*E/*E") and pattern.split("/")[0].replace("|", "") == NANO_PATTERN
    assert flag_value(args, "--mtp-num-layers") == "2"
    assert export_document(model, plan, {})["megatron_bridge_model"]["fields"]["hybrid_layer_pattern"] == pattern


def test_a_hybrid_model_with_mtp_but_no_mtp_pattern_is_refused_not_written_without_its_mtp_layers():
    model, plan = nano(mtp_num_layers=1), Plan(tp=1, pp=1, dp=8, ep=8, gbs=1024)
    with pytest.raises(UserError, match="no mtp_layer_pattern: a hybrid model's MTP layers take their own pattern"):
        megatron_args(model, plan)
    doc = export_document(model, plan, {})
    assert "MTP" in doc["megatron_args"]["unsupported"] and "unsupported" in doc["megatron_bridge_model"]
    with pytest.raises(ValueError, match="mtp_layer_pattern"):
        nano(mtp_layer_pattern="*E")  # without mtp_num_layers
    with pytest.raises(ValueError, match="mtp_layer_pattern"):
        nano(mtp_num_layers=1, mtp_layer_pattern="*X")


def test_a_convolution_megatron_cannot_size_is_refused():
    with pytest.raises(UserError, match="d_conv"):
        megatron_args(nano(mamba_conv_kernel=3), Plan(tp=1, pp=1, dp=8, ep=8, gbs=1024))


def test_squared_relu_with_biases_turns_off_the_fusion_megatron_refuses():
    """TransformerConfig: "When bias_activation_fusion is True, activation function should be
    either gelu, swiglu, or quick_geglu" (benchmarks/bench_megatron_args.py's control)."""
    plan = Plan(tp=1, pp=1, dp=8, ep=8, gbs=1024)
    assert "--no-bias-gelu-fusion" in megatron_args(nano(add_bias_linear=True), plan)
    assert "--no-bias-gelu-fusion" not in megatron_args(nano(), plan)


# --- Megatron-Bridge and NeMo -------------------------------------------------------------------

def test_bridge_provider_fields_are_hybrid_model_provider_fields():
    model, plan = nano(moe_latent_size=1024), Plan(tp=2, pp=2, dp=2, ep=8, gbs=1024, sp=True)
    doc = export_document(model, plan, {})
    provider = doc["megatron_bridge_model"]
    assert provider["class"].endswith("hybrid_provider.HybridModelProvider")
    fields = provider["fields"]
    assert set(fields) <= BRIDGE_FIELDS, set(fields) - BRIDGE_FIELDS
    assert fields["hybrid_layer_pattern"] == hybrid_export.layer_pattern(model, plan)
    assert fields["is_hybrid_model"] and fields["mamba_num_heads"] == 64 and fields["moe_latent_size"] == 1024
    assert fields["activation_func"] == "squared_relu" and fields["num_moe_experts"] == 128
    assert "moe_layer_freq" not in fields and doc["megatron_entry_script"] == "pretrain_hybrid.py"


def test_bridge_refuses_interleaving_a_hybrid_model():
    doc = export_document(nano(), Plan(tp=1, pp=2, vp=2, dp=4, ep=8, gbs=1024), {})
    assert "Virtual pipeline model parallelism is temporarily unsupported" in doc["megatron_bridge_model"]["unsupported"]
    assert "--hybrid-layer-pattern 'MEMEM*EMEMEM*|" in " ".join(doc["megatron_args"])


def test_nemo_blocks_say_why_they_are_not_written():
    doc = export_document(nano(), Plan(tp=1, pp=1, dp=8, ep=8, gbs=1024), {})
    assert "SSMConfig" in doc["nemo"]["unsupported"] and doc["nemo2"] == doc["nemo"]
    assert "megatron_bridge_model" not in export_document(io.load_model("llama3-8b"), Plan(tp=1, pp=1, dp=8, gbs=128), {})


# --- Megatron-Core's refusals as rules of the space ------------------------------------------------

BASE = dict(vp=1, mbs=1, sp=True, recompute="none", precision="bf16", ep=1, etp=1, fp8_bf16_edge_layers=0,
            tp_comm_overlap=False, distributed_optimizer=True, overlap_dp_comm=True, grad_reduce_in_fp32=True,
            flash_attention=True, memory_fraction=0.95, tp_within_nvlink_domain=False)


def _reasons(model: ModelSpec, gpus: int, **pins) -> set[str]:
    frame = generate(model, io.load_hardware("b200"), gpus, 1152, SearchSpace().pinned(**{**BASE, **pins}))
    return set(frame.reason)


# (model changes, gpus, broken pins, passing change, the Megatron message the reason quotes)
RULES = [
    (dict(num_query_groups=8, mamba_num_groups=4, mamba_num_heads=64), 8, dict(tp=8, pp=1), dict(tp=4),
     "ngroups must be evenly divisible by tp_size"),
    (dict(num_query_groups=8, mamba_num_heads=36, mamba_num_groups=4), 8, dict(tp=8, pp=1), dict(tp=4),
     "nheads must be evenly divisble by tp_size"),
    (dict(mamba_num_heads=24, mamba_num_groups=8), 16, dict(tp=1, pp=1, cp=16), dict(cp=8),
     "nheads must be evenly divisible by tp_size * cp_size"),
    (dict(mamba_num_heads=48, mamba_num_groups=6), 4, dict(tp=1, pp=1, cp=4), dict(cp=2),
     "ngroups must be evenly divisible by tp_size * cp_size"),
    (dict(mamba_num_heads=48, mamba_num_groups=3, seq_length=6144), 12, dict(tp=1, pp=1, cp=4), dict(cp=3),
     "cp_size must be evenly divisible by ngroups/tp_size"),
    (dict(mamba_num_heads=62, mamba_num_groups=2), 8, dict(tp=1, pp=1, precision="fp8-current"),
     dict(precision="bf16"), "input projection output tensor must be a multiple of 16"),
]


@pytest.mark.parametrize("changes, gpus, broken, passing, message", RULES, ids=[r[4][:30] for r in RULES])
def test_mamba_mixer_refusals_are_rules(changes, gpus, broken, passing, message):
    model = nano(**changes)
    assert any(message in r for r in _reasons(model, gpus, **broken))
    assert _reasons(model, gpus, **{**broken, **passing}) == {""}


def test_no_flexible_layout_is_offered_and_a_pinned_one_is_refused():
    model = nano()
    space = dataclasses.replace(SearchSpace(), tp=(1,), ep=(8,), pp=(8,), vp=(3,))
    frame = generate(model, io.load_hardware("b200"), 64, 1024, space)
    assert (frame.pipeline_model_parallel_layout == "").all()
    moe = dataclasses.replace(model, hybrid_layer_pattern=None, moe_layer_freq=1)  # the same as a GPT MoE
    gpt = generate(moe, io.load_hardware("b200"), 64, 1024, space)
    assert (gpt.pipeline_model_parallel_layout != "").any()  # 52 layers on 24 chunks: only a layout fits
    assert (frame.reason != "").all()
    pinned = generate(model, io.load_hardware("b200"), 64, 1024, SearchSpace().pinned(
        tp=1, ep=8, pp=2, pipeline_layout="Et*26|t*26L"))
    assert set(pinned.reason) == {hybrid_refused()}


def hybrid_refused() -> str:
    from autoparallel.space import HYBRID_LAYOUT_REFUSED
    return HYBRID_LAYOUT_REFUSED


def _model_yaml(tmp_path, **changes) -> str:
    path = tmp_path / "hybrid.yaml"
    path.write_text(yaml.safe_dump({**NANO, **changes}))
    return str(path)


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "autoparallel.cli", *args], capture_output=True, text=True)


def test_estimate_refuses_a_layout_megatron_core_refuses(tmp_path):
    model = _model_yaml(tmp_path, num_query_groups=8, mamba_num_groups=4)
    out = run_cli("estimate", "--model", model, "--gpus", "8", "--gbs", "1024", "--tp", "8", "--pp", "1", "--ep", "8")
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert "ngroups must be evenly divisible by tp_size" in out.stderr


# --- the built-in transformer -------------------------------------------------------------------

def test_the_built_in_transformer_refuses_a_hybrid_model():
    pytest.importorskip("torch")
    from autoparallel.model.transformer import check_spec
    with pytest.raises(NotImplementedError, match="no Mamba-2 layers"):
        check_spec(nano())
    from autoparallel.profiling.commands import check_runnable
    with pytest.raises(UserError, match="hybrid Mamba-Transformer"):
        check_runnable(nano(), Plan(tp=1, pp=1, dp=2, ep=2, gbs=8), "plan.yaml")


def test_profile_and_fp8_check_refuse_a_hybrid_model_with_exit_2(tmp_path):
    pytest.importorskip("torch")
    model = _model_yaml(tmp_path, num_layers=4, hybrid_layer_pattern="M*ME", num_experts=4, moe_router_topk=2,
                        hidden_size=256, ffn_hidden_size=512, moe_ffn_hidden_size=256,
                        moe_shared_expert_intermediate_size=None, num_attention_heads=4, num_query_groups=2,
                        kv_channels=64, mamba_num_heads=8, mamba_num_groups=2, seq_length=128, vocab_size=1024)
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({"tp": 1, "pp": 1, "dp": 1, "gbs": 4}))
    out = run_cli("profile", "--model", model, "--plan", str(plan), "--device", "cpu")
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert "no Mamba-2 layers" in out.stderr
    out = run_cli("fp8-check", "--model", model, "--no-save")
    assert out.returncode == 2 and "Traceback" not in out.stderr and "no Mamba-2 layers" in out.stderr, out.stderr
