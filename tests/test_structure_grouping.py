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
        for i in range(5):  # nccl-tests: (g-1)/g S on NVLink, (nodes-1)/nodes S/g on the network
            g, nodes = min(per_node[i], size[i]), size[i] / min(per_node[i], size[i])
            nvlink = hw.nvlink_unidirectional_gbps * 1e9 * hw.efficiency.nvlink
            network = hw.internode_gbps * 1e9 * hw.efficiency.internode
            latency = ((hw.nvlink_latency_us if g > 1 else 0) + (hw.internode_latency_us if nodes > 1 else 0)) * 1e-6
            want = 0.0 if size[i] <= 1 else (
                (g - 1) / g * nbytes[i] / nvlink + (nodes - 1) / nodes * nbytes[i] / g / network + latency)
            assert got[i] == pytest.approx(want, rel=1e-12)
        assert np.array_equal(got, comm.reduce_scatter_time(hw, nbytes, size, per_node))
