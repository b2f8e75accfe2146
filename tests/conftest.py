"""Shared test fixtures."""
import pytest
import torch


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a test module: tiny models and convolutions gain nothing from more,
    and on a busy 2-core machine they lose a lot."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
