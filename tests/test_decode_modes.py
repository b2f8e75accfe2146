"""One registry of decoding modes for both decoders: the image decoder's ``--decode`` choices (sample.py,
the demo, ``sample.decode.name``) and the text decoder's (eval/lm_accuracy.py, ``eval.decode``,
``hf.generate``) are the ``sample.decode`` variants that run on each wing."""
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

from mutor2d.config import ConfigError
from mutor2d.registry import REGISTRY, Entry
from mutor2d.sampling.config import WINGS, DecodeConfig, decode_modes

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class BothWings(DecodeConfig):
    """A mode both decoders run (registered by the test only)."""
    wings: ClassVar[tuple[str, ...]] = WINGS


def lm_accuracy_choices() -> list[str]:
    spec = importlib.util.spec_from_file_location("lm_accuracy_choices", ROOT / "eval" / "lm_accuracy.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    action = next(a for a in module.build_parser()._actions if "--decode" in a.option_strings)
    return list(action.choices)


def test_image_and_text_decode_choices_come_from_one_registry(monkeypatch):
    assert decode_modes("image") == ["plain", "registers", "jacobi", "auto"]
    assert decode_modes("text") == ["plain", "registers", "auto"]          # the text decoder runs no jacobi
    assert lm_accuracy_choices() == decode_modes("text")
    monkeypatch.setitem(REGISTRY, "sample.decode.both-wings", Entry(BothWings, None))
    assert "both-wings" in decode_modes("image") and "both-wings" in decode_modes("text")
    assert lm_accuracy_choices() == decode_modes("text")


def test_the_text_eval_decode_takes_the_text_modes():
    from mutor2d.lm.config import LMEvalConfig
    for mode in decode_modes("text"):
        LMEvalConfig(decode=mode).check()
    with pytest.raises(ConfigError, match=r"^eval.decode: expected one of \['plain', 'registers', 'auto'\], "
                                          r"got 'jacobi'$"):
        LMEvalConfig(decode="jacobi").check()
