"""Import the user's own component modules named in ``plugins`` (a module name or a ``.py`` path), so
the components they register can be named in the config. An import that fails is one ConfigError
line naming the module and the error, never a traceback from inside it."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from nemo_azr.errors import ConfigError


def import_plugins(names: list[str]) -> None:
    for name in names:
        try:
            if name.endswith(".py"):
                _import_file(Path(name))
            else:
                importlib.import_module(name)
        except ConfigError:
            raise
        except Exception as exc:  # the user's code: whatever it raises becomes one line
            raise ConfigError(f"plugins: cannot import {name!r}: {type(exc).__name__}: {exc}") from None


def _import_file(path: Path) -> None:
    if not path.is_file():
        raise ConfigError(f"plugins: {str(path)!r} is not a file")
    module_name = f"nemo_azr_plugin_{path.stem}"
    if module_name in sys.modules:  # imported already (a second load_config in the same process)
        return
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
