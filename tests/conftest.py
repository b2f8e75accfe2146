"""Shared test fixtures, subprocess timeouts reported as such (tests/timeouts.py), and skips that name the
missing demo extra (``demo_extra``)."""
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


TINY_DIGITS = ["model.preset=tiny", "data.levels=5", "objective.d_max=3", "optim.warmup_steps=1",
               "train.batch_size=8", "train.max_steps=2", "train.log_every=1", "train.ckpt_every=0",
               "train.keep_ckpts=0", "train.tracker=none", "train.sample_every=0", "sample.classes=[0,7]",
               "sample.per_class=2"]


@pytest.fixture(scope="session")
def tiny_digits_run(tmp_path_factory):
    """A 2-step digits MuToR-2D run, trained once for the session; read only (tests write their
    variants into their own tmp_path)."""
    from mutor2d import config
    from mutor2d.engine import train
    out = tmp_path_factory.mktemp("tiny_digits") / "run"
    train(config.load("digits_mutor2d.yaml", TINY_DIGITS), out)
    return out


def demo_extra(module: str):
    """``module``, a package of the demo extra (gradio, gradio_client, huggingface_hub, selenium), else skip
    the test (or test module) saying which package is missing and how to install it."""
    __tracebackhide__ = True                     # the skip names the caller's line, not this one
    return pytest.importorskip(module, reason=f"{module.split('.')[0]} is not installed: it comes with the demo "
                                              "extra (pip install -e '.[demo]')")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """A subprocess that ran past its (scaled) limit fails the test in one line saying so."""
    try:
        return (yield)
    except subprocess.TimeoutExpired as e:
        message = timeout_message(e)
    pytest.fail(message, pytrace=False)                # outside the except: no chained traceback
