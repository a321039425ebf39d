"""Fixtures of the serving tests: presets and the fitted engines, loaded once."""

import pytest

from autoparallel import io
from autoparallel.serve.assumptions import efficiency_for, load_engine


@pytest.fixture(scope="session")
def llama2():
    return io.load_model("llama2-70b")


@pytest.fixture(scope="session")
def trtllm():
    return load_engine("tensorrt-llm")


@pytest.fixture(scope="session")
def trtllm_eff():
    return efficiency_for("tensorrt-llm")


@pytest.fixture(scope="session")
def held_out():
    """Every engine's rows with in-sample and leave-one-model-out errors (about 20 refits: once)."""
    from autoparallel.serve.validate import held_out_report
    return held_out_report()
