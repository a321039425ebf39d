"""Search strategies over a candidate space; the grid prices every candidate with the cost model."""
