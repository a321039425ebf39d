"""``autoparallel models`` and ``autoparallel hardware``: the presets, shipped and the user's own."""

from __future__ import annotations

from autoparallel import io, resources
from autoparallel.cli.common import console


def add_parser(sub) -> None:
    sub.add_parser("models", help="list model presets").set_defaults(func=lambda a: list_presets("models"))
    sub.add_parser("hardware", help="list hardware presets").set_defaults(func=lambda a: list_presets("hardware"))


def list_presets(kind: str) -> None:
    """The presets of one kind; a file that does not load is skipped with its reason below the
    table (naming it in a command reports the same error)."""
    from rich.table import Table

    from autoparallel.errors import UserError
    t = Table(title=f"{kind} presets ({resources.SEARCH_SPACES / kind}; yours: {resources.user_dir() / kind})")
    skipped = []
    if kind == "models":
        for c in ("name", "aliases", "layers", "hidden", "heads/kv", "params", "seq", "gbs"):
            t.add_column(c)
    else:
        for c in ("name", "aliases", "bf16 TF", "fp8 TF", "mem GiB", "HBM TB/s", "NVLink domain", "calibrated on"):
            t.add_column(c)
    for name, path in io.preset_files(kind).items():
        try:
            t.add_row(*(_model_row(name) if kind == "models" else _hardware_row(name)))
        except UserError as exc:
            skipped.append(f"skipped {path.name}: {exc}")
    console.print(t)
    for line in skipped:
        console.print(line, style="dim", markup=False)


def _model_row(name: str) -> list[str]:
    m = io.load_model(name)
    return [name, ", ".join(m.aliases), str(m.num_layers), str(m.hidden_size),
            f"{m.num_attention_heads}/{m.query_groups}", f"{m.num_parameters / 1e9:.1f}B",
            str(m.seq_length), str(m.global_batch_size or "-")]


def _hardware_row(name: str) -> list[str]:
    h = io.load_hardware(name)
    return [name, ", ".join(h.aliases), f"{h.bf16_tflops:.0f}", f"{h.fp8_tflops or 0:.0f}",
            f"{h.memory_gib:.0f}", f"{h.hbm_tbps}", str(h.nvlink_domain), h.calibrated_on or "-"]
