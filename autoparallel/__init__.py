"""autoparallel: find the fastest parallel layout for LLM training and serving.

The package is split along the seams of one search (DESIGN.md §2): ``specs`` holds the frozen
inputs, ``space`` turns a search space into candidate plans, ``costmodel`` predicts memory and
step time without torch, ``search`` ranks, ``report`` writes tables and exports, ``model`` is the
built-in FP8 transformer that profiling jobs run.
"""

from importlib import metadata

try:
    __version__ = metadata.version("autoparallel")
except metadata.PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"
