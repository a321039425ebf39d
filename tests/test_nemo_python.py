"""The NeMo 2 Python recipe export (issue 24): it runs as Python with NeMo's objects where the
YAML form has names (dtypes, the activation function, callbacks as a list), sets exactly the
fields of the YAML form, and every name it sets is one the object it lands on takes in NeMo's
and Megatron-LM's sources (tests/fixtures/nemo_fields.yaml, read there by
benchmarks/bench_nemo_fields.py with the commits it names)."""

import sys
import types
from pathlib import Path

import pytest
import yaml

from autoparallel import io
from autoparallel.report import nemo_python
from autoparallel.report.nemo import nemo2_recipe
from autoparallel.specs.plan import Plan

KNOWN = yaml.safe_load((Path(__file__).parent / "fixtures" / "nemo_fields.yaml").read_text())
CASES = [
    ("llama3-70b", Plan(tp=8, pp=2, vp=20, dp=4, gbs=128, mbs=2, sp=True, precision="fp8-delayed",
                        tp_comm_overlap=True)),
    ("gpt3-175b", Plan(tp=4, pp=8, vp=6, dp=32, gbs=1536, mbs=2, sp=True, recompute="full",
                       precision="fp8-current", fp8_bf16_edge_layers=1)),
    ("llama3-8b", Plan(tp=2, pp=1, cp=2, dp=2, gbs=128, sp=True, fsdp=True, precision="fp16")),
    ("mixtral-8x7b", Plan(tp=2, pp=4, dp=8, ep=8, gbs=256, sp=True, precision="bf16")),
    ("deepseek-v3", Plan(tp=1, pp=8, dp=128, ep=64, gbs=4096, recompute="selective", precision="fp8-blockwise")),
    ("llama2-70b", Plan(tp=8, pp=2, dp=4, gbs=128, sp=True)),  # no NeMo recipe of its own
    ("nemotron-15b", Plan(tp=4, pp=1, dp=16, gbs=512, sp=True)),  # squared ReLU
]


class Recorder:
    """Stands for the recipe: records every attribute set, by dotted path."""

    def __init__(self, path: str, log: dict):
        object.__setattr__(self, "_path", path)
        object.__setattr__(self, "_log", log)

    def __getattr__(self, name):
        return Recorder(f"{self._path}.{name}".lstrip("."), self._log)

    def __setattr__(self, name, value):
        self._log[f"{self._path}.{name}".lstrip(".")] = value

    def __iter__(self):  # the recipe's own callbacks: none here
        return iter(())


class Config:
    def __init__(self, target, **kwargs):
        self.target, self.kwargs = target, kwargs


@pytest.fixture
def nemo_stubs(monkeypatch):
    """NeMo, NeMo-Run, torch and megatron.core as far as the snippet touches them; returns the log."""
    log, calls = {}, {}
    torch = types.ModuleType("torch")
    torch.bfloat16, torch.float16 = object(), object()
    functional = types.ModuleType("torch.nn.functional")
    functional.silu, functional.gelu = (lambda x: x), (lambda x: x)
    torch.nn = types.ModuleType("torch.nn")
    torch.nn.functional = functional
    activations = types.ModuleType("megatron.core.activations")
    activations.squared_relu = lambda x: x
    distributed = types.ModuleType("megatron.core.distributed")
    distributed.DistributedDataParallelConfig = "DistributedDataParallelConfig"
    nemo_run = types.ModuleType("nemo_run")
    nemo_run.Config = Config
    nemo_run.run = lambda *a, **k: calls.setdefault("run", a)
    nemo_run.LocalExecutor = lambda **kwargs: kwargs
    lightning = types.ModuleType("nemo.lightning")
    lightning.MegatronMixedPrecision = "MegatronMixedPrecision"
    llm = types.ModuleType("nemo.collections.llm")

    class Recipes:
        def __getattr__(self, name):
            def recipe(function):
                def make(**kwargs):
                    calls["recipe"], calls["recipe_args"], calls["function"] = name, kwargs, function
                    return Recorder("", log)
                return make
            return types.SimpleNamespace(pretrain_recipe=recipe("pretrain_recipe"),
                                         finetune_recipe=recipe("finetune_recipe"))
    collections = types.ModuleType("nemo.collections")
    collections.llm = Recipes()
    nemo = types.ModuleType("nemo")
    nemo.lightning, nemo.collections = lightning, collections
    overlap = types.ModuleType("nemo.lightning.pytorch.callbacks.megatron_comm_overlap")
    overlap.MegatronCommOverlapCallback = "MegatronCommOverlapCallback"
    megatron, core = types.ModuleType("megatron"), types.ModuleType("megatron.core")
    for name, module in {"torch": torch, "torch.nn": torch.nn, "torch.nn.functional": functional,
                         "megatron": megatron, "megatron.core": core, "megatron.core.activations": activations,
                         "megatron.core.distributed": distributed, "nemo_run": nemo_run, "nemo": nemo,
                         "nemo.lightning": lightning, "nemo.collections": collections,
                         "nemo.collections.llm": llm,
                         "nemo.lightning.pytorch": types.ModuleType("nemo.lightning.pytorch"),
                         "nemo.lightning.pytorch.callbacks": types.ModuleType("nemo.lightning.pytorch.callbacks"),
                         "nemo.lightning.pytorch.callbacks.megatron_comm_overlap": overlap}.items():
        monkeypatch.setitem(sys.modules, name, module)
    return log, calls, torch


@pytest.mark.parametrize("name, plan", CASES, ids=[c[0] for c in CASES])
def test_python_recipe_sets_the_yaml_fields_as_python_objects(name, plan, nemo_stubs):
    log, calls, torch = nemo_stubs
    model = io.load_model(name)
    source = nemo_python.nemo2_python(model, plan, 8, "a title")
    exec(compile(source, "recipe.py", "exec"), {"__name__": "__main__"})
    doc = nemo2_recipe(model, plan, 8)
    assert calls["recipe"] == nemo_python.recipe_name(model) and "run" in calls
    assert calls["recipe_args"] == {"name": "autoparallel", "num_nodes": doc["trainer"]["num_nodes"],
                                    "num_gpus_per_node": doc["trainer"]["devices"]}
    dtype = torch.float16 if plan.precision == "fp16" else torch.bfloat16
    strategy = {k: v for k, v in doc["trainer"]["strategy"].items() if k != "ddp"}
    for key, value in strategy.items():
        got = log[f"trainer.strategy.{key}"]
        assert (got is dtype) if key == "pipeline_dtype" else (got == value), key
    ddp = log["trainer.strategy.ddp"]
    assert ddp.target == "DistributedDataParallelConfig" and ddp.kwargs == doc["trainer"]["strategy"]["ddp"]
    plugins = log["trainer.plugins"]
    assert plugins.target == "MegatronMixedPrecision"
    assert plugins.kwargs["params_dtype"] is dtype and plugins.kwargs["pipeline_dtype"] is dtype
    assert {k: v for k, v in plugins.kwargs.items() if not k.endswith("dtype")} == \
        {k: v for k, v in doc["trainer"]["plugins"].items() if not k.endswith("dtype")}
    callbacks = log["trainer.callbacks"]
    assert isinstance(callbacks, list) and [c.target for c in callbacks] == ["MegatronCommOverlapCallback"]
    assert callbacks[0].kwargs == doc["trainer"]["callbacks"]["MegatronCommOverlapCallback"]
    config = doc["model"]["config"]
    act = log["model.config.activation_func"]
    assert callable(act) and not isinstance(act, str)
    assert act is {"silu": sys.modules["torch.nn.functional"].silu, "gelu": sys.modules["torch.nn.functional"].gelu,
                   "squared_relu": sys.modules["megatron.core.activations"].squared_relu}[config["activation_func"]]
    for section in ("model.config", "data", "optim.config"):
        part = doc
        for key in section.split("."):
            part = part[key]
        for key, value in part.items():
            if key != "activation_func":
                assert log[f"{section}.{key}"] == value, (section, key)
    assert not [k for k in log if isinstance(log[k], str) and log[k].startswith("torch.")]


@pytest.mark.parametrize("name, plan", CASES, ids=[c[0] for c in CASES])
def test_every_name_written_is_one_nemo_takes(name, plan):
    model = io.load_model(name)
    written = nemo_python.written_fields(model, plan, 8)
    unknown = [f"{section}.{key}" for section, keys in written.items() for key in keys
               if key not in KNOWN["fields"][section]]
    assert not unknown and nemo_python.recipe_name(model) in KNOWN["recipes"]


def test_the_field_list_catches_a_wrong_name():
    """The check means something: NeMo 1.x's names are not NeMo 2's."""
    assert "activation" not in KNOWN["fields"]["model.config"]  # NeMo 1.x's key; 2.x takes activation_func
    assert "activation_func" in KNOWN["fields"]["model.config"]
    assert "ub_tp_comm_overlap" not in KNOWN["fields"]["trainer.callbacks.MegatronCommOverlapCallback"]
    assert set(KNOWN["sources"]) == {"NVIDIA/NeMo", "NVIDIA/Megatron-LM"}
    assert all(name in KNOWN["recipes"] for name in nemo_python.RECIPES.values())


# --- fine-tuning (issue 27): NeMo 2's finetune_recipe with its LoRA ---------------------------------

def _finetuned(name, mode="lora", **fields):
    import dataclasses

    from autoparallel.specs.finetune import Finetune
    return dataclasses.replace(io.load_model(name), finetune=Finetune(mode, **fields))


LORA_PLAN = Plan(tp=4, pp=1, dp=2, gbs=8, sp=True, precision="fp8-delayed", tp_comm_overlap=True)


@pytest.mark.parametrize("name", ["llama3-70b", "llama2-70b", "gpt3-175b"])
def test_a_lora_run_starts_from_finetune_recipe_and_sets_its_peft(name, nemo_stubs):
    log, calls, _ = nemo_stubs
    model = _finetuned(name, lora_rank=16, lora_targets=("linear_qkv", "linear_proj"), packed_sequence=True)
    source = nemo_python.nemo2_python(model, LORA_PLAN, 8)
    exec(compile(source, "recipe.py", "exec"), {"__name__": "__main__"})
    assert calls["function"] == "finetune_recipe" and calls["recipe"] in KNOWN["finetune_recipes"]
    assert calls["recipe_args"] == {"name": "autoparallel", "num_nodes": 1, "num_gpus_per_node": 8,
                                    "peft_scheme": "lora", "packed_sequence": True}
    assert log["peft.dim"] == 16 and log["peft.target_modules"] == ["linear_qkv", "linear_proj"]
    assert log["peft.dropout"] == 0.0 and log["peft.a2a_experimental"] is False  # Bridge's and NeMo's defaults
    written = nemo_python.written_fields(model, LORA_PLAN, 8)
    assert "pretrain_recipe" not in written
    unknown = [f"{section}.{key}" for section, keys in written.items() for key in keys
               if key not in KNOWN["fields"][section]]
    assert not unknown


def test_full_sft_has_no_peft(nemo_stubs):
    log, calls, _ = nemo_stubs
    doc = nemo2_recipe(_finetuned("llama3-8b", "full"), LORA_PLAN, 8)
    assert doc["finetune_recipe"] == {"peft_scheme": "none", "packed_sequence": False} and "peft" not in doc
    exec(compile(nemo_python.nemo2_python(_finetuned("llama3-8b", "full"), LORA_PLAN, 8), "r.py", "exec"),
         {"__name__": "__main__"})
    assert calls["recipe_args"]["peft_scheme"] == "none" and not [k for k in log if k.startswith("peft")]


def test_every_preset_recipe_that_a_finetune_starts_from_has_a_finetune_recipe():
    for name in nemo_python.RECIPES:
        assert nemo_python.recipe_name(_finetuned(name, "full")) in KNOWN["finetune_recipes"], name


def test_a_preset_whose_nemo_recipe_exists_starts_from_it():
    """A preset named as a NeMo recipe module is (gpt-oss-20b started from mixtral_8x7b's, its export
    saying "NeMo has no recipe for gpt-oss-20b", though NeMo has gpt_oss_20b)."""
    for name in io.preset_files("models", shipped_only=True):
        module = name.replace("-", "_").replace(".", "")
        if module in KNOWN["recipes"]:
            assert nemo_python.recipe_name(io.load_model(name)) == module, name


def test_a_dense_model_without_a_recipe_starts_from_the_llama_recipe_of_its_width():
    """Llama 2 70B has no NeMo 2 recipe; llama3_70b's defaults are sized for it, llama3_8b's are not."""
    assert nemo_python.recipe_name(io.load_model("llama2-70b")) == "llama3_70b"
    assert nemo_python.recipe_name(io.load_model("llama2-13b")) == "llama3_8b"
    assert all(r in KNOWN["recipes"] and r in KNOWN["finetune_recipes"] for r in nemo_python.GATED_MLP_RECIPES)


@pytest.mark.parametrize("precision, transposed, expected", [
    ("fp8-delayed", True, True), ("fp8-delayed", False, None), ("bf16", True, None)])
def test_the_per_micro_batch_fp8_transpose_is_written_as_megatron_core_names_it(precision, transposed, expected,
                                                                               nemo_stubs):
    """--fp8-transpose-per-microbatch (MLPerf's LoRA runs: the frozen FP8 base's transpose made in every
    micro-batch, not cached) is Megatron-Core's TransformerConfig.disable_parameter_transpose_cache
    (Megatron-LM d98e8a64dd transformer_config.py; TE then gets no is_first_microbatch,
    extensions/transformer_engine.py), which NeMo 2's GPTConfig inherits and Megatron-Bridge's recipes
    set as cfg.model.disable_parameter_transpose_cache: written on the model config under an FP8
    recipe, nowhere else (a BF16 weight has no FP8 transpose to cache)."""
    import dataclasses
    log, calls, _ = nemo_stubs
    model = _finetuned("llama2-70b", lora_rank=16, lora_targets=("linear_qkv", "linear_proj"),
                       fp8_transpose_per_microbatch=transposed)
    plan = dataclasses.replace(LORA_PLAN, precision=precision)
    assert nemo2_recipe(model, plan, 8)["model"]["config"].get("disable_parameter_transpose_cache") is expected
    exec(compile(nemo_python.nemo2_python(model, plan, 8), "recipe.py", "exec"), {"__name__": "__main__"})
    assert log.get("model.config.disable_parameter_transpose_cache") is expected
    written = nemo_python.written_fields(model, plan, 8)
    assert all(key in KNOWN["fields"][section] for section, keys in written.items() for key in keys)
