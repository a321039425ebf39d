"""``autoparallel fp8-check``: judge each FP8 recipe on numerics, not only on speed (issue 7).

The cost model says how much faster FP8 is; only a short training run says whether the recipe
can be trusted. This package trains a scaled-down proxy of the model (``proxy``) in BF16 and
under each recipe on identical data (``runner``), reduces the per-layer statistics of
``autoparallel.model.numerics`` and the loss gap to a verdict with thresholds from YAML
(``settings``, ``verdict``), searches the smallest set of layers to keep in BF16 by re-running
(``check``), writes the table and plots (``report``), and turns the verdicts into search-space
restrictions (``search_filter``).

Only ``runner``, ``check`` and ``report`` import torch / matplotlib, and only when called, so
``autoparallel search`` without ``--fp8-check`` never imports them.
"""
