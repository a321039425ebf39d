"""The cost model's per-group shortcuts give what the row-by-row computation gives.

``stage_layers`` / ``stage_pattern_counts`` count a layout once per structure group; ``comm.Group``
prices several collectives over one group's shape. Each is checked here against the plain
computation on columns built to break a wrong shortcut: rows that differ in one structure column
only, with and without layouts.
"""

import numpy as np
import pytest

from autoparallel import io
from autoparallel.costmodel import comm, pipeline

DEEPSEEK_PATTERN = (0, 0, 0) + (1,) * 58  # DeepSeek-V3: 3 dense layers, then 58 MoE


def _columns():
    """Structure columns whose rows differ in one column at a time, with and without layouts."""
    rows = [  # pp, vp, first, last, embedding, loss, layout
        (4, 1, 0, 0, 0, 0, ""), (4, 2, 0, 0, 0, 0, ""), (8, 1, 0, 0, 0, 0, ""), (4, 1, 13, 0, 0, 0, ""),
        (4, 1, 0, 13, 0, 0, ""), (4, 1, 0, 0, 1, 1, ""), (1, 1, 0, 0, 0, 0, ""),
        (2, 1, 0, 0, 0, 0, "Et*30|t*31L"), (2, 1, 0, 0, 0, 0, "Et*31|t*30L"),
        (4, 1, 0, 0, 0, 0, "Et*16|t*15|t*15|t*15L"),
        (2, 2, 0, 0, 0, 0, "Et*15|t*15|t*16|t*15L"), (4, 1, 0, 0, 0, 0, ""),
    ]
    rows = rows + rows[::-1]
    cols = [np.array([r[k] for r in rows], dtype=float) for k in range(6)]
    return cols, np.array([r[6] for r in rows], dtype=object)


def test_stage_layers_and_moe_counts_per_group_equal_row_by_row():
    cols, layout = _columns()
    together = pipeline.stage_layers(61, *cols[:6], layout)
    moe = pipeline.stage_pattern_counts(DEEPSEEK_PATTERN, *cols[:6], layout)
    for i in range(len(layout)):
        row = [c[i:i + 1] for c in cols] + [layout[i:i + 1]]
        assert [s[i] for s in together] == [s[0] for s in pipeline.stage_layers(61, *row)], i
        assert [s[i] for s in moe] == [s[0] for s in pipeline.stage_pattern_counts(DEEPSEEK_PATTERN, *row)], i


def test_a_group_prices_each_collective_as_reduce_scatter_time_alone():
    hw = io.load_hardware("h100-sxm")
    size, per_node = np.array([1.0, 2.0, 8.0, 16.0, 64.0]), np.array([1.0, 2.0, 8.0, 8.0, 4.0])
    ranks = comm.group(hw, size, per_node)
    for nbytes in (np.full(5, 3.0e8), np.array([1.0, 2e6, 3e7, 4e8, 5e9])):
        got = ranks.reduce_scatter_time(nbytes)
        for i in range(5):  # NCCL's ring: (n-1)/n S at min(NVLink, g NICs); across domains tuning.cc's latency
            n, g = size[i], min(per_node[i], size[i])
            nodes = n / g
            nvlink = hw.nvlink_unidirectional_gbps * 1e9 * hw.efficiency.nvlink
            network = hw.internode_gbps * 1e9 * hw.efficiency.internode
            transfer = (n - 1) / n * nbytes[i] / (min(nvlink, g * network) if nodes > 1 else nvlink)
            simple = (8.4 + (n - nodes) * 3.4 + (nodes - 1) * 14.0) * 1e-6  # Simple: max(3.4, 3 x 1.0) a step
            ll128 = (14.0 + (n - nodes) * 1.9 + (nodes - 1) * 4.0) * 1e-6
            ll = (6.6 + (n - nodes) * 1.0 + (nodes - 1) * 2.7) * 1e-6  # LL: max(0.6, 1.0) a step
            want = 0.0 if n <= 1 else (transfer + (hw.nvlink_latency_us if g > 1 else 0) * 1e-6 if nodes == 1
                                       else min(transfer + simple, transfer / 0.92 + ll128, transfer / 0.5 + ll))
            assert got[i] == pytest.approx(want, rel=1e-12)
        assert np.array_equal(got, comm.reduce_scatter_time(hw, nbytes, size, per_node))


def _search_rows(name: str, gpus: int, n: int = 6000):
    """A sample of a search's valid rows as the cost model's columns, their labels, and their
    ``Structures`` as the grid's evaluator makes them (from ``space.generate_with_sources``)."""
    from autoparallel.costmodel.candidates import structure, structures
    from autoparallel.search.evaluators import CostModelEvaluator
    from autoparallel.space import generate_with_sources, load_space, source_labels
    from autoparallel.specs.plan import Plan

    model, hw, space = io.load_model(name), io.load_hardware("h100-sxm"), load_space()
    frame, sources = generate_with_sources(model, hw, gpus, model.global_batch_size, space)
    cols = {k: frame[k].to_numpy() for k in Plan.field_names()}
    valid = np.flatnonzero(frame["reason"].to_numpy(dtype=object) == "")
    at = np.concatenate([valid[len(valid) // 2:][:n], valid[::97]])  # a chunk's run of rows, and rows spread over all
    short, of_row = CostModelEvaluator(model, hw, 1.0)._structure_columns(cols, sources)
    every = structure(model, hw, short | {"dp": np.maximum(short["dp"], 1)})  # rejected structures: dp 0
    return model, hw, {k: v[at] for k, v in cols.items()}, source_labels(sources, at), structures(every, of_row[at])


def _same(a, b) -> bool:
    """Bit for bit (NaN where NaN), shapes broadcast alike; a dict (a ``comm.Group``'s latencies per
    protocol) key by key."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    a, b = np.broadcast_arrays(np.asarray(a), np.asarray(b))
    return a.dtype == b.dtype and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")


@pytest.mark.parametrize("name,gpus", [("gpt3-175b", 128), ("deepseek-v3", 256), ("nemotron-3-nano", 64)])
def test_pricing_per_structure_is_bit_identical_to_row_by_row(name, gpus):
    """``candidates.Structures``: the structure's fields computed once per structure and gathered
    (``by_structure``, the schedule's peaks laid out from the structures' groups) price every row
    as the row-by-row computation does, every metric bit for bit, on another GPU too
    (``on_hardware``), and so do the evenly loaded candidates."""
    from autoparallel.costmodel.candidates import Structure, candidates, on_hardware
    from autoparallel.costmodel.estimate import estimate_candidates, estimate_columns

    model, hw, cols, labels, known = _search_rows(name, gpus)
    assert len(known.each.t) < len(cols["tp"]) / 2  # structures of several rows each
    plain = estimate_columns(model, hw, cols, 1.0, labels)
    shortcut = estimate_columns(model, hw, cols, 1.0, labels, known)
    assert plain.keys() == shortcut.keys()
    for key in plain:
        assert _same(plain[key], shortcut[key]), key
    rows, gathered = candidates(model, hw, cols, labels), candidates(model, hw, cols, labels, known)
    for field in [f for f in Structure.__dataclass_fields__ if f != "peaks"] + ["held"]:
        a, b = getattr(rows, field), getattr(gathered, field)
        if field == "held":
            assert all(_same(p, q) for position, other in zip(a, b) for p, q in zip(position, other)), field
        elif isinstance(a, np.ndarray):
            assert _same(a, b), field
    for group in ("tp_ranks", "dp_ranks", "edp_ranks"):
        a, b = getattr(rows, group), getattr(gathered, group)
        assert all(_same(getattr(a, f), getattr(b, f)) for f in a.__dataclass_fields__), group
    from autoparallel.costmodel.layer_time import layer_params, layers
    priced, alone = layers(rows), layer_params(rows)  # the parameters priced per structure are the layers'
    for kind in ("dense", "moe"):
        for key, values in getattr(alone, kind).items():
            assert _same(getattr(priced, kind)[key], values), (kind, key)
    even = rows.evenly_loaded(), gathered.evenly_loaded()
    assert _same(even[0].by_structure(lambda s: s.imbalance), even[1].by_structure(lambda s: s.imbalance))
    other = io.load_hardware("gb200")
    a, b = estimate_candidates(on_hardware(rows, other)), estimate_candidates(on_hardware(gathered, other))
    assert all(_same(a[key], b[key]) for key in a)
