"""Shared fixtures: presets are loaded once per session (they are frozen)."""

import pytest

from autoparallel import io


@pytest.fixture(scope="session")
def gpt175b():
    return io.load_model("175b")


@pytest.fixture(scope="session")
def h100():
    return io.load_hardware("h100-sxm")


@pytest.fixture(scope="session")
def a100():
    return io.load_hardware("a100-sxm-80g")
