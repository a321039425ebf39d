"""Issue 29: the v4.1 H100 Mixtral Server p99 TTFTs against each system's own load (no simulation, ~1 s).

    PYTHONPATH=$PWD python benchmarks/bench_issue29_mixtral_ttft_load.py

The ten closed v4.1 H100-SXM Mixtral-8x7B Server runs (TensorRT-LLM, NVIDIA's harness) run one engine:
TP1 per replica, ``max_num_tokens`` 16,384 (inference_results_v4.1 ``closed/*/configs/mixtral-8x7b/__init__.py``),
``gpu_batch_size`` 896 or 1,024, ``kvcache_free_gpu_mem_frac`` 0.90, at 42.7-44.0 queries/s per replica. Their
p99 TTFTs span 328-1,908 ms. For each run: the rate per replica, the load ``u`` (its Server samples/s over the
same system's Offline samples/s, both from ``mlperf_inference_runs.csv``) and the p99 TTFT; Spearman's rank
correlation of the p99 with each; and the smallest mean |error| % that any prediction of the p99 from the
rate per replica alone can reach (a constant, and the best non-decreasing function of the rate, by exhaustive
search over the measured values as levels; an L1 fit in relative error is piecewise linear, so its optimum
lies on those levels).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

from autoparallel import resources
from autoparallel.serve.mlperf import DATA


def runs(path: str) -> pd.DataFrame:
    d = pd.read_csv(path)
    d = d[(d["round"] == "v4.1") & (d.division == "closed") & (d.benchmark == "mixtral-8x7b")
          & (d.gpu == "H100-SXM-80GB")]
    off = d[d.scenario == "Offline"].set_index(["submitter", "system"])["samples_per_s"]
    srv = d[d.scenario == "Server"].copy()
    key = pd.MultiIndex.from_frame(srv[["submitter", "system"]])
    srv["qps_per_replica"] = srv.samples_per_s / srv.replicas
    srv["u"] = srv.samples_per_s / off.reindex(key).to_numpy()
    return srv.sort_values("u")[["submitter", "system", "replicas", "max_batch", "qps_per_replica", "u",
                                 "ttft_p99_ms", "tpot_p99_ms"]]


def best_constant(t: np.ndarray) -> float:
    return min(np.mean(np.abs(c / t - 1)) for c in t) * 100


def best_monotone(x: np.ndarray, t: np.ndarray) -> float:
    """Smallest mean |c_i / t_i - 1| over c non-decreasing in x (ties in x share no constraint order)."""
    o = np.argsort(x, kind="stable")
    tt, levels = t[o], np.unique(t)
    best = [np.inf]

    def rec(i: int, lo: float, acc: float) -> None:
        if acc >= best[0]:
            return
        if i == len(tt):
            best[0] = acc
            return
        for c in levels:
            if c >= lo:
                rec(i + 1, c, acc + abs(c / tt[i] - 1))

    rec(0, 0.0, 0.0)
    return best[0] / len(tt) * 100


def main() -> None:
    s = runs(resources.data_file(DATA))
    print(s.to_string(index=False, float_format=lambda v: f"{v:.4f}" if v < 2 else f"{v:.1f}"))
    t = s.ttft_p99_ms.to_numpy()
    print(f"Spearman p99 TTFT vs u: {spearmanr(s.u, t)[0]:+.2f} (p {spearmanr(s.u, t)[1]:.3f}); "
          f"vs rate per replica: {spearmanr(s.qps_per_replica, t)[0]:+.2f} (p {spearmanr(s.qps_per_replica, t)[1]:.2f})")
    print(f"Spearman p99 TPOT vs u: {spearmanr(s.u, s.tpot_p99_ms)[0]:+.2f} (p {spearmanr(s.u, s.tpot_p99_ms)[1]:.3f})")
    print(f"best mean |error| of any p99 TTFT predicted from the rate per replica: constant {best_constant(t):.1f} %, "
          f"non-decreasing in the rate {best_monotone(s.qps_per_replica.to_numpy(), t):.1f} %")


if __name__ == "__main__":
    main()
