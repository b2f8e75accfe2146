"""Shared test fixtures, and subprocess timeouts reported as such (tests/timeouts.py)."""
import subprocess

import pytest
import torch

from timeouts import timeout_message


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a test module: tiny models and convolutions gain nothing from more,
    and on a busy 2-core machine they lose a lot."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """A subprocess that ran past its (scaled) limit fails the test in one line saying so."""
    try:
        return (yield)
    except subprocess.TimeoutExpired as e:
        message = timeout_message(e)
    pytest.fail(message, pytrace=False)                # outside the except: no chained traceback
