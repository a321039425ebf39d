"""Short profiling jobs that really run candidate layouts (DESIGN.md §7).

``memory`` (saved-tensor bytes and a forced memory cap on CPU), ``job`` (one plan: warm-up and
timed steps on every rank), ``launcher`` (local processes or Ray), ``evaluator`` (the search's
``Evaluator`` protocol over profiling jobs), ``layer`` and ``store`` (one-layer profiles cached
under results/), ``device`` (``--device auto|cpu|cuda`` and the name each measurement records),
``hardware`` (GEMM and bandwidth figures of this machine for calibration), ``commands`` (the
CLI's profiling options). Everything here imports torch when it runs (and Ray only when the Ray
launcher is used).
"""
