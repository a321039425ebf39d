"""A plan as a NeMo 2 Python recipe to paste: ``llm.<recipe>.pretrain_recipe(...)`` with every
field of ``report.nemo.nemo2_recipe`` set as the Python object NeMo takes.

The YAML form (``nemo2_recipe``, for NeMo-Run's command line and best.yaml) writes dtypes and the
activation as names; pasted into a recipe those strings break at run time (``activation_func``
must be a callable, ``params_dtype`` a ``torch.dtype``, callbacks a list). This module renders
the same dict as Python, so the two forms cannot disagree. The recipe, trainer, precision plugin,
callback, data and optimizer field names are those of NVIDIA/NeMo and Megatron-LM's sources;
``benchmarks/bench_nemo_fields.py`` reads them there and tests/test_nemo_python.py checks every
field written against that list.
"""

from __future__ import annotations

import math

from autoparallel.report.nemo import nemo2_recipe
from autoparallel.specs.model import ModelSpec
from autoparallel.specs.plan import Plan

# The preset's own NeMo 2 recipe module (nemo/collections/llm/recipes/<name>.py).
RECIPES = {"gpt3-175b": "gpt3_175b", "llama2-7b": "llama2_7b", "llama3-8b": "llama3_8b", "llama3-70b": "llama3_70b",
           "llama3.1-8b": "llama31_8b", "llama3.1-70b": "llama31_70b", "llama3.1-405b": "llama31_405b",
           "mixtral-8x7b": "mixtral_8x7b", "mixtral-8x22b": "mixtral_8x22b", "deepseek-v3": "deepseek_v3",
           "gpt-oss-120b": "gpt_oss_120b", "gpt-oss-20b": "gpt_oss_20b",
           "qwen3-30b-a3b": "qwen3_30b_a3b", "qwen3-235b-a22b": "qwen3_235b_a22b",
           "nemotron-15b": "nemotron4_15b", "nemotron-340b": "nemotron4_340b"}
# Without one, the recipe of the nearest architecture; every architecture field is set anyway.
FALLBACK = (("multi_latent_attention", "deepseek_v3"), ("is_moe", "mixtral_8x7b"))
# A dense gated-MLP model starts from the Llama 3 recipe of the nearest width (the recipe's
# parallelism and optimizer defaults are sized for it): Llama 2 70B from llama3_70b, not llama3_8b.
GATED_MLP_RECIPES = {"llama3_8b": 4096, "llama3_70b": 8192, "llama31_405b": 16384}
DEFAULT_RECIPE = "gpt3_175b"
# A fine-tuning run needs the module's finetune_recipe; of the presets' modules only gpt3_175b has
# none (tests/fixtures/nemo_fields.yaml lists those that have one): NeMo's Llama 3 8B's instead.
FINETUNE_FALLBACK = "llama3_8b"
DTYPES = {"torch.bfloat16", "torch.float16"}  # written as names in the YAML form
ACTIVATIONS = {"silu": "F.silu", "gelu": "F.gelu", "squared_relu": "squared_relu"}
ACTIVATION_IMPORTS = {"F.silu": "import torch.nn.functional as F", "F.gelu": "import torch.nn.functional as F",
                      "squared_relu": "from megatron.core.activations import squared_relu"}
IMPORTS = ("import nemo_run as run", "import torch",
           "from megatron.core.distributed import DistributedDataParallelConfig",
           "from nemo import lightning as nl", "from nemo.collections import llm",
           "from nemo.lightning.pytorch.callbacks.megatron_comm_overlap import MegatronCommOverlapCallback")
RECIPE_ARGS = ("name", "num_nodes", "num_gpus_per_node")  # every NeMo pretrain_recipe takes these
SECTIONS = ("model.config", "data", "optim.config")  # set field by field on the recipe

def recipe_name(model: ModelSpec) -> str:
    """The NeMo recipe module the snippet starts from."""
    if model.name in RECIPES:
        name = RECIPES[model.name]
    elif model.gated_mlp and not any(getattr(model, attr, False) for attr, _ in FALLBACK):
        name = min(GATED_MLP_RECIPES, key=lambda r: abs(math.log(GATED_MLP_RECIPES[r] / model.hidden_size)))
    else:
        name = next((name for attr, name in FALLBACK if getattr(model, attr, False)), DEFAULT_RECIPE)
    return FINETUNE_FALLBACK if model.finetune is not None and name == "gpt3_175b" else name


def python_value(key: str, value) -> str:
    """``value`` as Python source: dtypes as ``torch`` objects, the activation as the function."""
    if key == "activation_func":
        return ACTIVATIONS[value]
    if isinstance(value, str) and value in DTYPES:
        return value
    return repr(value)


def _kwargs(fields: dict) -> str:
    return ", ".join(f"{k}={python_value(k, v)}" for k, v in fields.items())


def _section(doc: dict, dotted: str) -> dict:
    for key in dotted.split("."):
        doc = doc[key]
    return doc


def written_fields(model: ModelSpec, plan: Plan, gpus_per_node: int = 8) -> dict[str, list[str]]:
    """The names the export sets, by the object they land on (``benchmarks/bench_nemo_fields.py``
    and tests/test_nemo_python.py check them against NeMo's and Megatron-LM's sources)."""
    doc = nemo2_recipe(model, plan, gpus_per_node)
    trainer = doc["trainer"]
    out = {"pretrain_recipe": list(RECIPE_ARGS), "trainer": [k for k in trainer if k not in ("num_nodes", "devices")],
           "trainer.strategy": list(trainer["strategy"]), "trainer.strategy.ddp": list(trainer["strategy"]["ddp"]),
           "trainer.plugins": list(trainer["plugins"])}
    out.update({f"trainer.callbacks.{name}": list(fields) for name, fields in trainer["callbacks"].items()})
    out.update({section: list(_section(doc, section)) for section in SECTIONS})
    if "finetune_recipe" in doc:
        out["finetune_recipe"] = out.pop("pretrain_recipe") + list(doc["finetune_recipe"])
    if "peft" in doc:
        out["peft"] = list(doc["peft"])
    return out


def nemo2_python(model: ModelSpec, plan: Plan, gpus_per_node: int = 8, title: str = "") -> str:
    """The runnable recipe snippet for ``plan`` (``title`` heads it as a comment)."""
    doc = nemo2_recipe(model, plan, gpus_per_node)
    trainer, name = doc["trainer"], recipe_name(model)
    strategy = dict(trainer["strategy"])
    ddp = strategy.pop("ddp")
    finetune = doc.get("finetune_recipe")
    kind = "pre-training" if finetune is None else f"fine-tuning ({finetune['peft_scheme']})"
    lines = [f"# {title}" if title else f"# {model.name}: a layout chosen by autoparallel",
             f"# NeMo 2 {kind} recipe; run it as a script, or import `recipe` and pass it to nemo_run."]
    if model.name not in RECIPES:
        lines.append(f"# NeMo has no recipe for {model.name}: starting from {name}'s, every architecture field set below.")
    activation = python_value("activation_func", doc["model"]["config"]["activation_func"])
    extra = "".join(f", {k}={v!r}" for k, v in (finetune or {}).items())
    lines += [*IMPORTS, ACTIVATION_IMPORTS[activation], "",
              f"recipe = llm.{name}.{'pretrain' if finetune is None else 'finetune'}_recipe(name={'autoparallel'!r}, "
              f"num_nodes={trainer['num_nodes']}, num_gpus_per_node={trainer['devices']}{extra})"]  # RECIPE_ARGS
    lines += [f"recipe.trainer.strategy.{k} = {python_value(k, v)}" for k, v in strategy.items()]
    lines.append(f"recipe.trainer.strategy.ddp = run.Config(DistributedDataParallelConfig, {_kwargs(ddp)})")
    lines.append(f"recipe.trainer.plugins = run.Config(nl.MegatronMixedPrecision, {_kwargs(trainer['plugins'])})")
    for callback, fields in trainer["callbacks"].items():
        lines.append(f"recipe.trainer.callbacks = [*(recipe.trainer.callbacks or []), "
                     f"run.Config({callback}, {_kwargs(fields)})]")
    for section in SECTIONS + (("peft",) if "peft" in doc else ()):
        lines += [f"recipe.{section}.{k} = {python_value(k, v)}" for k, v in _section(doc, section).items()]
    lines += ["", 'if __name__ == "__main__":',
              f"    run.run(recipe, executor=run.LocalExecutor(ntasks_per_node={trainer['devices']}, "
              f"launcher={'torchrun'!r}))"]
    return "\n".join(lines) + "\n"
