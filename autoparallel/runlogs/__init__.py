"""Read the user's own Megatron-LM and Megatron-Bridge training logs.

Every Megatron-LM job prints what a calibration needs: the full argument list at start-up
(``_print_args`` in ``megatron/training/arguments.py``), one line per logging interval with the
iteration time and the TFLOP/s (``training_log`` in ``megatron/training/training.py``) and the
peak memory of each pipeline / tensor rank (``report_memory`` in ``megatron/training/utils.py``).
Megatron-Bridge (NeMo's Megatron-Core trainer) prints its configuration as YAML instead and the
same interval lines. This package turns such a log into a row of the runs CSV
(``autoparallel/data/training_runs.csv`` columns, plus the layout knobs the log states), so that
``calibrate`` can fit a cluster's constants to it and ``estimate --from-log`` can put the
prediction beside the measurement.

    arguments.py  the printed arguments (Megatron-LM) or configuration (Bridge), as Megatron names
    metrics.py    iteration times, logged TFLOP/s, timers, peak memory, world size
    runrow.py     one log -> one runs row (model, layout, precision, what was measured)
    runsfile.py   append rows to the user's runs CSV without duplicates
    compare.py    ``estimate --from-log``: the prediction beside the measurement, term by term
"""
