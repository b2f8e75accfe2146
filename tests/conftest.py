"""Shared test fixtures, subprocess timeouts reported as such (tests/timeouts.py), skips that name the
missing demo extra (``demo_extra``), and the cores shared out between pytest-xdist's workers."""
import os
import subprocess
import tempfile

# file hashes of provenance fingerprints (mutor2d.provenance) go to a cache of the test session, not ~/.cache
os.environ.setdefault("MUTOR2D_CACHE", tempfile.mkdtemp(prefix="mutor2d-cache-"))

if os.environ.get("PYTEST_XDIST_WORKER_COUNT") and "OMP_NUM_THREADS" not in os.environ:
    # each of N workers (and the processes its tests start) gets cores/N threads, not all the cores
    os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))

import pytest  # noqa: E402
import torch  # noqa: E402

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
    from mutor2d.engine.loop import train
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


# the longest files (minutes of subprocesses each on 2 cores) start first: under pytest-xdist
# (README: -n 2; pyproject.toml: files whole to a worker, in this order) the workers then finish
# together instead of one waiting on the README walk
FIRST_FILES = ("test_readme.py", "test_rehearsal.py", "test_fsdp.py", "test_decode_speed_paths.py")


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(FIRST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(FIRST_FILES)))    # stable: file order otherwise kept
