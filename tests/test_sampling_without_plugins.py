"""Sampling a checkpoint trained with a plugin's objective in a process that has not imported the
plugin: plain decoding needs no objective, so it works and gives the tokens it gives with the plugin;
register drafts need the objective's rules and say so in one line; --decode auto falls back to plain."""
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import TINY_DIGITS  # noqa: E402
from test_generation import cli_error, sample_main  # noqa: E402

from mutor2d import config  # noqa: E402
from mutor2d.engine.loop import train  # noqa: E402
from mutor2d.registry import REGISTRY  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py
PLUGIN = "mutor-2d-plugin"


@pytest.fixture(scope="module")
def plugin_run(tmp_path_factory):
    """A 2-step digits run trained with PLUGIN (MuToR-2D under a plugin's name, registered as a plugin
    module would), and a grid sampled from it while the plugin is known; the plugin is then forgotten."""
    from mutor2d.objectives.config import MuToR2DConfig

    @config.register_variant("objective", PLUGIN)
    @dataclass(frozen=True)
    class PluginObjective(MuToR2DConfig):
        """MuToR-2D's rules (its section is a RegisterSpec2D) under another name."""

    run, work = tmp_path_factory.mktemp("plugin") / "run", tmp_path_factory.mktemp("grids")
    try:
        train(config.load("digits_mutor2d.yaml", [*TINY_DIGITS, f"objective.name={PLUGIN}"]), run)
        sample_main()(["--ckpt", str(run), "--out", str(work / "with_plugin.png"), "--device", "cpu"])
    finally:
        del REGISTRY[f"objective.{PLUGIN}"]
    return run, work / "with_plugin.png"


def test_plain_and_auto_decoding_need_no_plugin(plugin_run, tmp_path, capsys):
    run, with_plugin = plugin_run
    main = sample_main()
    main(["--ckpt", str(run), "--out", str(tmp_path / "plain.png"), "--device", "cpu"])
    assert (tmp_path / "plain.png").read_bytes() == with_plugin.read_bytes()
    capsys.readouterr()
    main(["--ckpt", str(run), "--out", str(tmp_path / "auto.png"), "--device", "cpu", "--decode", "auto"])
    picked = capsys.readouterr().out.splitlines()[0]
    assert picked.startswith("--decode auto: ") and "registers" not in picked, picked   # no drafts without it
    main(["--ckpt", str(run), "--npz", str(tmp_path / "s.npz"), "--num", "4", "--classes", "0,7", "--device", "cpu"])
    assert (tmp_path / "s.npz").is_file()


def test_register_drafts_name_the_missing_plugin_in_one_line(plugin_run, capsys):
    run, _ = plugin_run
    line = cli_error(sample_main(), ["--ckpt", str(run), "--device", "cpu", "--decode", "registers"], capsys)
    assert f"objective.name={PLUGIN!r}" in line and "MUTOR2D_PLUGINS" in line, line
