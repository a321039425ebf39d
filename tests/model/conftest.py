"""One intra-op thread per test: the tensors here are small, and a second thread makes them
several times slower whenever another process shares the machine's two cores."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
