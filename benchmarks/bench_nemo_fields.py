"""NeMo 2 exports checked field by field against NeMo's and Megatron-LM's own sources (issue 24).

Every name the NeMo 2 recipe export writes (``report.nemo.nemo2_recipe`` and its Python form,
``report.nemo_python``) must be a parameter or field of the object it lands on: the recipe
factory, ``nl.MegatronStrategy``, Megatron-Core's ``DistributedDataParallelConfig``,
``nl.MegatronMixedPrecision``, ``MegatronCommOverlapCallback``, the model config
(``TransformerConfig`` / ``MLATransformerConfig`` / ``ModelParallelConfig`` and NeMo's
``GPTConfig``), ``MockDataModule`` and ``OptimizerConfig``. The names are read from the sources
with ``ast`` (nothing is imported: NeMo needs a GPU stack), for the top plans of the same
searches ``bench_megatron_args.py`` checks, and the recipe module of each preset must exist.

    python benchmarks/bench_nemo_fields.py --nemo NEMO --megatron MEGATRON_LM [--top 3] [--write]

NEMO and MEGATRON_LM are checkouts or bare git mirrors (read at HEAD). ``--write`` stores the
names, with the commits they were read at, in tests/fixtures/nemo_fields.yaml, which
tests/test_nemo_python.py checks every export against without the sources.
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_megatron_args import SEARCHES  # noqa: E402

from autoparallel import io  # noqa: E402
from autoparallel.report.nemo_python import RECIPES, recipe_name, written_fields  # noqa: E402
from autoparallel.search import run as runs  # noqa: E402
from autoparallel.space import load_space  # noqa: E402

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "nemo_fields.yaml"
MEGATRON_CORE = "megatron/core/"
# section: (repository, path, class, method or None for a dataclass's fields)
SOURCES = {
    "pretrain_recipe": [("nemo", "nemo/collections/llm/recipes/llama3_70b.py", None, "pretrain_recipe")],
    "finetune_recipe": [("nemo", "nemo/collections/llm/recipes/llama3_70b.py", None, "finetune_recipe")],
    "peft": [("nemo", "nemo/collections/llm/peft/lora.py", "LoRA", None)],
    "trainer": [("lightning", "", "Trainer", None)],
    "trainer.strategy": [("nemo", "nemo/lightning/pytorch/strategies/megatron_strategy.py", "MegatronStrategy",
                          "__init__")],
    "trainer.strategy.ddp": [("megatron", MEGATRON_CORE + "distributed/distributed_data_parallel_config.py",
                              "DistributedDataParallelConfig", None)],
    "trainer.plugins": [("nemo", "nemo/lightning/pytorch/plugins/mixed_precision.py", "MegatronMixedPrecision",
                         "__init__")],
    "trainer.callbacks.MegatronCommOverlapCallback": [
        ("nemo", "nemo/lightning/pytorch/callbacks/megatron_comm_overlap.py", "MegatronCommOverlapCallback",
         "__init__")],
    "model.config": [("megatron", MEGATRON_CORE + "model_parallel_config.py", "ModelParallelConfig", None),
                     ("megatron", MEGATRON_CORE + "transformer/transformer_config.py", "TransformerConfig", None),
                     ("megatron", MEGATRON_CORE + "transformer/transformer_config.py", "MLATransformerConfig", None),
                     ("nemo", "nemo/collections/llm/gpt/model/base.py", "GPTConfig", None)],
    "data": [("nemo", "nemo/collections/llm/gpt/data/mock.py", "MockDataModule", "__init__")],
    "optim.config": [("megatron", MEGATRON_CORE + "optimizer/optimizer_config.py", "OptimizerConfig", None)],
}
# lightning.pytorch.Trainer is not read (a third repository for two names): its documented arguments.
LIGHTNING_TRAINER = ["num_nodes", "devices", "strategy", "plugins", "callbacks"]
RECIPE_DIR = "nemo/collections/llm/recipes"
FINETUNE_ARGS = ("name", "num_nodes", "num_gpus_per_node", "peft_scheme", "packed_sequence")


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True).stdout


def read(root: Path, path: str) -> str:
    """A file of a checkout, or of a bare mirror at HEAD."""
    return (root / path).read_text() if (root / path).exists() else _git(root, "show", f"HEAD:{path}")


def names(source: str, cls: str | None, method: str | None) -> list[str]:
    """The parameters of ``cls.method`` (or module function ``method``), or the annotated fields of ``cls``."""
    tree = ast.parse(source)
    scope = tree.body
    if cls is not None:
        scope = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    if method is None:
        return [n.target.id for n in scope if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
    fn = next(n for n in scope if isinstance(n, ast.FunctionDef) and n.name == method)
    return [a.arg for a in fn.args.args + fn.args.kwonlyargs if a.arg != "self"]


def read_fields(roots: dict[str, Path]) -> dict:
    fields = {}
    for section, sources in SOURCES.items():
        found: list[str] = []
        for repo, path, cls, method in sources:
            found += LIGHTNING_TRAINER if repo == "lightning" else names(read(roots[repo], path), cls, method)
        fields[section] = sorted(set(found))
    recipes = sorted(Path(p).stem for p in _git(roots["nemo"], "ls-tree", "--name-only", "HEAD", f"{RECIPE_DIR}/")
                     .split() if p.endswith(".py")) if not (roots["nemo"] / RECIPE_DIR).exists() else \
        sorted(p.stem for p in (roots["nemo"] / RECIPE_DIR).glob("*.py"))
    commits = {repo: _git(root, "rev-parse", "HEAD").strip() for repo, root in roots.items()}
    return {"read_by": "benchmarks/bench_nemo_fields.py --write",
            "sources": {"NVIDIA/NeMo": commits["nemo"], "NVIDIA/Megatron-LM": commits["megatron"]},
            "recipes": recipes, "finetune_recipes": finetune_recipes(roots["nemo"], recipes), "fields": fields}


def finetune_recipes(nemo: Path, recipes: list[str]) -> list[str]:
    """The recipe modules whose finetune_recipe takes what the export passes to it."""
    wanted = set(FINETUNE_ARGS)
    out = []
    for name in recipes:
        source = read(nemo, f"{RECIPE_DIR}/{name}.py")
        if "\ndef finetune_recipe(" in source and wanted <= set(names(source, None, "finetune_recipe")):
            out.append(name)
    return out


def unknown(written: dict[str, list[str]], fields: dict[str, list[str]]) -> list[str]:
    """Names written that the object they land on does not take."""
    return [f"{section}.{name}" for section, keys in written.items() for name in keys
            if name not in fields.get(section, ())]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nemo", type=Path, required=True)
    p.add_argument("--megatron", type=Path, required=True)
    p.add_argument("--top", type=int, default=3)
    p.add_argument("--write", action="store_true", help=f"store the names in {FIXTURE}")
    args = p.parse_args()
    known = read_fields({"nemo": args.nemo, "megatron": args.megatron})
    if args.write:
        FIXTURE.write_text(yaml.safe_dump(known, sort_keys=False, width=100))
    missing = sorted({name for name in RECIPES.values() if name not in known["recipes"]})
    print("| search | plan | recipe | fields | unknown |\n|---|---|---|---|---|")
    passed = failed = 0
    space = load_space()
    for name, gpus, gpu, pins in SEARCHES:
        try:
            model = io.load_model(name)
        except Exception as exc:  # noqa: BLE001 - a preset this version does not ship
            print(f"| {name} | - | - | - | not a preset here: {exc} |")
            continue
        hw, pins = io.load_hardware(gpu), dict(pins)
        gbs = pins.pop("gbs", None) or model.global_batch_size
        result = runs.search(model, hw, gpus, gbs, space.pinned(**pins))
        for rank in range(1, min(args.top, len(result.feasible)) + 1):
            written = written_fields(model, result.plan(rank), hw.gpus_per_node)
            bad = unknown(written, known["fields"])
            recipe = recipe_name(model)
            if recipe not in known["recipes"]:
                bad.append(f"recipe {recipe}")
            passed, failed = passed + (not bad), failed + bool(bad)
            label = f"{name} {gpus}x{gpu} " + " ".join(f"{k}={v}" for k, v in pins.items())
            print(f"| {label} | #{rank} | {recipe} | {sum(map(len, written.values()))} | {', '.join(bad) or 'none'} |")
    print(f"\n{passed} passed, {failed} failed" + (f"; recipes missing from NeMo: {missing}" if missing else ""))
    print(f"NeMo {known['sources']['NVIDIA/NeMo']}, Megatron-LM {known['sources']['NVIDIA/Megatron-LM']}")
    return 1 if failed or missing else 0


if __name__ == "__main__":
    sys.exit(main())
