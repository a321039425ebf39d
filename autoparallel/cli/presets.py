"""``autoparallel models`` and ``autoparallel hardware``: the presets, shipped and the user's own."""

from __future__ import annotations

from autoparallel import io, resources
from autoparallel.cli.common import console
from autoparallel.specs.hardware import SCALE_UP_LINKS


def add_parser(sub) -> None:
    sub.add_parser("models", help="list model presets").set_defaults(func=lambda a: list_presets("models"))
    sub.add_parser("hardware", help="list hardware presets").set_defaults(func=lambda a: list_presets("hardware"))


def list_presets(kind: str) -> None:
    """The presets of one kind; a file that does not load is skipped with its reason below the
    table (naming it in a command reports the same error). Each name is printed whole, its aliases
    on the lines below it, so that the table reads at 80 columns; the hardware constants' source is
    named short in the table (their own fit, or the preset they are inherited from) and in full below."""
    from rich import box
    from rich.table import Table

    from autoparallel.errors import UserError
    shipped, yours = resources.SEARCH_SPACES / kind, resources.user_dir() / kind
    console.print(f"{kind.removesuffix('s')} presets: {shipped}; yours: {yours}",
                  markup=False, highlight=False)
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)
    t.add_column("name (aliases)", no_wrap=True)
    heads = (("layers", "hidden", "heads/kv", "params", "seq", "gbs") if kind == "models" else
             ("bf16 TF", "fp8 TF", "mem GiB", "HBM TB/s", "GPU link", "fitted on"))
    for c in heads:
        t.add_column(c, no_wrap=True, justify="left" if c in ("GPU link", "fitted on") else "right")
    skipped, sources = [], {}
    for name, path in io.preset_files(kind).items():
        try:
            row = _model_row(name) if kind == "models" else _hardware_row(name, sources)
        except UserError as exc:
            skipped.append(f"skipped {path.name}: {exc}")
            continue
        t.add_row(*row)
    console.print(t)
    if kind == "models" and any(cell.endswith("/MLA") for cell in t.columns[3].cells):
        console.print(MLA_NOTE, markup=False, highlight=False)
    for donor, text in sources.items():
        console.print(f"{donor}: {text}", markup=False, highlight=False)
    for line in skipped:
        console.print(line, style="dim", markup=False)


def _names(name: str, aliases) -> str:
    return "\n".join([name, *(f"  {a}" for a in aliases)])


def _model_row(name: str) -> list[str]:
    m = io.load_model(name)
    return [_names(name, m.aliases), str(m.num_layers), str(m.hidden_size),
            f"{m.num_attention_heads}/{_kv_heads(m)}", _count(m.num_parameters),
            str(m.seq_length), str(m.global_batch_size or "-")]


# Under the models table where a preset has multi-latent attention: what its "kv" says.
MLA_NOTE = "kv: key-value heads; MLA: multi-latent attention (one latent per token cached)"


def _kv_heads(m) -> str:
    """The "kv" of "heads/kv": DeepSeek-V4's one key-value head (its wkv projects the hidden state to
    one head of v_head_dim that every query head reads: config num_key_value_heads 1; it showed 64/64),
    "MLA" for multi-latent attention (a cached latent, up-projected to as many K and V heads as query
    heads: no number of KV heads says what it caches), else the query groups."""
    if m.is_dsv4:
        return "1"
    return "MLA" if m.multi_latent_attention else str(m.query_groups)


def _count(n: int) -> str:
    """Parameters in billions, or millions below one billion ('4.5M', not '0.0B')."""
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


def _hardware_row(name: str, sources: dict) -> list[str]:
    """One preset's row; ``sources`` collects the full text of each fit the rows name."""
    h = io.load_hardware(name)
    donor = h.efficiency_from or (name if h.calibrated_on else "")
    if donor:
        sources.setdefault(donor, h.calibrated_on.removeprefix(f"inherited from {donor}: "))
    return [_names(name, h.aliases), f"{h.bf16_tflops:.0f}", f"{h.fp8_tflops:.0f}" if h.fp8_tflops else "-",
            f"{h.memory_gib:.0f}", f"{h.hbm_tbps:.3g}", f"{SCALE_UP_LINKS[h.scale_up_link]} {h.nvlink_domain}",
            donor or "-"]
