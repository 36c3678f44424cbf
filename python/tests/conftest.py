import numpy as np
import pytest


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "gpu: needs a CUDA device, PyTorch with CUDA and a CUDA build of libflashattn")


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
