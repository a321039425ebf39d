"""The fields Megatron-Bridge's ``HybridModelProvider`` takes, read from the sources (session 48).

``report.hybrid_export.bridge_provider`` writes a hybrid model's provider fields into best.yaml
(``megatron_bridge_model``); every name must be a field of the provider: its own dataclass fields,
Megatron-Bridge's ``TransformerConfig``, and the Megatron-Core ``TransformerConfig`` /
``ModelParallelConfig`` it extends, at the Megatron-LM commit Megatron-Bridge pins
(``3rdparty/Megatron-LM``). The names are read with ``ast`` (nothing is imported) from bare git
mirrors; ``--write`` stores them, with the commits, in tests/fixtures/bridge_hybrid_fields.yaml,
which tests/test_hybrid.py checks the exports against without the sources.

    python benchmarks/bench_bridge_hybrid_fields.py --bridge BRIDGE_GIT --megatron MEGATRON_GIT [--write]
"""

from __future__ import annotations

import argparse
import ast
import subprocess
from pathlib import Path

import yaml

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "bridge_hybrid_fields.yaml"
# (repository, path, class)
SOURCES = [("bridge", "src/megatron/bridge/models/hybrid/hybrid_provider.py", "HybridModelProvider"),
           ("bridge", "src/megatron/bridge/models/transformer_config.py", "TransformerConfig"),
           ("megatron", "megatron/core/transformer/transformer_config.py", "TransformerConfig"),
           ("megatron", "megatron/core/model_parallel_config.py", "ModelParallelConfig")]


def show(repo: str, commit: str, path: str) -> str:
    return subprocess.run(["git", "-C", repo, "show", f"{commit}:{path}"], capture_output=True, text=True,
                          check=True).stdout


def class_fields(source: str, name: str) -> set[str]:
    """The annotated names of class ``name``'s body (a dataclass's fields)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return {s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
    raise SystemExit(f"class {name} not found")


def pinned_megatron(bridge: str, commit: str) -> str:
    """The Megatron-LM commit of Megatron-Bridge's 3rdparty/Megatron-LM submodule."""
    out = subprocess.run(["git", "-C", bridge, "ls-tree", commit, "3rdparty/Megatron-LM"], capture_output=True,
                         text=True, check=True).stdout.split()
    return out[2]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bridge", required=True, help="Megatron-Bridge git directory (read at HEAD)")
    parser.add_argument("--megatron", required=True, help="Megatron-LM git directory (must hold the pinned commit)")
    parser.add_argument("--write", action="store_true", help=f"store the names in {FIXTURE.name}")
    cli = parser.parse_args()
    bridge = subprocess.run(["git", "-C", cli.bridge, "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    megatron = pinned_megatron(cli.bridge, bridge)
    repos = {"bridge": (cli.bridge, bridge), "megatron": (cli.megatron, megatron)}
    fields: set[str] = set()
    for repo, path, name in SOURCES:
        found = class_fields(show(*repos[repo][:1], repos[repo][1], path), name)
        print(f"{repo} {path} {name}: {len(found)} fields")
        fields |= found
    print(f"{len(fields)} fields in all; hybrid ones: "
          + ", ".join(sorted(f for f in fields if "mamba" in f or "hybrid" in f or "latent" in f)))
    if cli.write:
        FIXTURE.write_text(yaml.safe_dump({
            "read_by": "benchmarks/bench_bridge_hybrid_fields.py --write",
            "sources": {"NVIDIA-NeMo/Megatron-Bridge": bridge, "NVIDIA/Megatron-LM (Bridge's 3rdparty pin)": megatron},
            "class": "megatron.bridge.models.hybrid.hybrid_provider.HybridModelProvider",
            "fields": sorted(fields)}, sort_keys=False))
        print(f"wrote {FIXTURE}")


if __name__ == "__main__":
    main()
