"""The --help of every entry point (train.py, sample.py, eval/, bench/, tokenizers/, ``python -m``
modules): one formatter, so that every option shows its default the same way, and ``check_choice``
for choices listed only after parsing."""
from __future__ import annotations

import argparse


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Descriptions as written (line breaks kept); each option's help ends with "(default: X)" unless
    the help already names its default or the default is None / False / empty (the help then says
    what happens without the option)."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if "default" in text or default is None or default is False or default is argparse.SUPPRESS or default == []:
            return text
        return super()._get_help_string(action)

    def _fill_text(self, text, width, indent):
        """A one-paragraph description is wrapped; text with line breaks is kept as written."""
        if "\n" in text.strip():
            return super()._fill_text(text, width, indent)
        return argparse.HelpFormatter._fill_text(self, text, width, indent)


def check_choice(parser: argparse.ArgumentParser, flag: str, value, choices: list) -> None:
    """argparse's check of ``choices=``, made after parsing, with its message (usage, exit status 2): for
    choices that take a heavy import to list (a registry of torch modules), so that --help and the
    checks of the other flags come before it. ``value`` None (the flag not given) passes."""
    if value is not None and value not in choices:
        parser.error(f"argument {flag}: invalid choice: {value!r} (choose from {', '.join(map(repr, choices))})")


GRID_TOKENS_LIMIT = 256 * 256     # tokens of a grid: a 4096-px image under a VQ-16 tokenizer


def grid_arg(text: str) -> tuple[int, int]:
    """argparse type for an 'HxW' grid (H, W >= 1, H * W <= GRID_TOKENS_LIMIT)."""
    try:
        h, w = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--grid {text!r}: expected HxW, e.g. 16x16 (1xN for 1D)") from None
    if h < 1 or w < 1:
        raise argparse.ArgumentTypeError(f"--grid {text!r}: expected H, W >= 1")
    if h * w > GRID_TOKENS_LIMIT:
        raise argparse.ArgumentTypeError(f"--grid {text!r}: {h * w} tokens; expected at most {GRID_TOKENS_LIMIT}")
    return h, w
