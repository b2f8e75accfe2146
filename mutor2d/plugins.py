"""User modules that extend mutor2d, imported by every entry script before it reads a config.

    MUTOR2D_PLUGINS=my_objective,my_pkg.backend python train.py --config ...

Each named module is imported once (it must be importable: installed, or on PYTHONPATH); importing
it runs its registrations (``@register_variant``, ``@register_backend``, ``@register_tokenizer``, ...),
so the configs, checkpoints and records that name its parts work in train.py, sample.py,
tokenizers/extract_codes.py and the eval scripts alike. Building any config imports them too
(mutor2d.config.import_parts), so Python users need no call of their own.
"""
from __future__ import annotations

import importlib
import os

from .checks import ConfigError

ENV_VAR = "MUTOR2D_PLUGINS"


class PluginError(ConfigError):
    """A module named in MUTOR2D_PLUGINS cannot be imported; the message is one line."""


def plugin_names(value: str | None = None) -> list[str]:
    """The module names of ``value`` (default: the environment variable), comma-separated."""
    value = os.environ.get(ENV_VAR, "") if value is None else value
    return [name.strip() for name in value.split(",") if name.strip()]


def load_plugins(value: str | None = None) -> list[str]:
    """Import every module named in MUTOR2D_PLUGINS (or ``value``); returns their names.
    A module that fails to import raises PluginError naming it and the cause."""
    names = plugin_names(value)
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as e:      # any failure of a user's module: one line, not a traceback
            cause = str(e).splitlines()[0] if str(e) else ""
            raise PluginError(f"{ENV_VAR}: cannot import module {name!r} ({type(e).__name__}: {cause}); "
                              f"expected an importable module name (installed, or on PYTHONPATH)") from None
    return names
