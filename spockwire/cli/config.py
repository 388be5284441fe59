"""Configuration for the `spockwire` commands: flags, environment variables and an optional TOML file.

Each setting is declared once (`Setting`) and then read from, in this order of precedence:

1. the command-line flag (``--flush-rows 5000``),
2. the environment variable ``SPOCKWIRE_<NAME>`` (``SPOCKWIRE_FLUSH_ROWS=5000``),
3. the TOML file given by ``--config FILE`` (or ``SPOCKWIRE_CONFIG``): a key of the command's table
   (``[decode] flush_rows = 5000``) wins over the same key at the top level (``flush_rows = 5000``),
4. the setting's default.

Keys may be written with ``_`` or ``-``. A top-level key no command knows, a key of the running command's table
that it does not know, or a value of the wrong type is a usage error (exit status 2) naming the file and the key,
so typos do not pass silently. Tables of other commands are left to those commands.

A command declares its settings with `add_settings(parser, [...])` and reads them with `resolve(...)`::

    OUT = Setting("out", "staging folder to write", required=True, metavar="DIR")
    add_settings(parser, [OUT])
    ...
    cfg = resolve(args, "decode")
    cfg.out, cfg.source("out")          # value, and "flag" | "env" | "file" | "default"
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from ..errors import SpockwireError

if sys.version_info >= (3, 11):
    import tomllib as _toml
else:  # pragma: no cover - exercised on Python 3.10 only
    try:
        import tomli as _toml
    except ImportError:
        _toml = None

__all__ = ["ConfigError", "Setting", "Config", "add_settings", "resolve", "load_config_file", "ENV_PREFIX",
           "parse_bool", "parse_size", "CONFIG"]

ENV_PREFIX = "SPOCKWIRE_"
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})

# Settings known to any command, by name; filled by add_settings (validates top-level TOML keys).
_KNOWN: dict[str, "Setting"] = {}


class ConfigError(SpockwireError, ValueError):
    """A setting has a bad value or a required one is missing (a usage error: exit status 2)."""


def parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"expected one of 1/0, true/false, yes/no, on/off, got {text!r}")


_UNITS = {"": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
          "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30}


def parse_size(text: str) -> int:
    """A byte count: ``1048576``, ``512K``, ``64MiB``, ``1G`` (binary units)."""
    raw = str(text).strip().lower().replace("_", "")
    digits = raw.rstrip("abcdefghijklmnopqrstuvwxyz ")
    unit = raw[len(digits):].strip()
    if not digits or unit not in _UNITS:
        raise ValueError(f"expected a size such as 1048576, 512K or 64MiB, got {text!r}")
    value = int(float(digits) * _UNITS[unit])
    if value < 0:
        raise ValueError(f"a size cannot be negative, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    value = int(str(text).replace("_", ""))
    if value < 1:
        raise ValueError(f"expected a positive integer, got {text!r}")
    return value


positive_int = _positive_int


@dataclass(frozen=True)
class Setting:
    """One configurable value: flag ``--<name with dashes>``, env ``SPOCKWIRE_<NAME>``, TOML key ``<name>``."""

    name: str
    help: str
    type: Callable[[str], Any] = str
    default: Any = None
    choices: Sequence[Any] | None = None
    is_flag: bool = False        # a boolean: --name / --no-name
    required: bool = False
    metavar: str | None = None
    short: str | None = None     # e.g. "-n"
    env_only: bool = False       # not a command-line flag (read from the environment / file only)
    repeat: bool = False         # the flag may be given several times: its values are joined with `separator`
    separator: str = ","
    default_text: str | None = None  # the default as the help states it, when it is not a fixed value

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    def convert(self, value: Any, where: str) -> Any:
        if self.repeat and isinstance(value, (list, tuple)):
            value = self.separator.join(map(str, value))
        try:
            if self.is_flag:
                result = value if isinstance(value, bool) else parse_bool(str(value))
            elif isinstance(value, str) or self.type is str:
                result = self.type(str(value))
            elif isinstance(value, bool):
                raise ValueError(f"expected {self.metavar or 'a value'}, got a boolean")
            else:
                result = self.type(str(value)) if self.type not in (int, float) else self.type(value)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{where}: {exc}") from None
        if self.choices is not None and result not in self.choices:
            choices = ", ".join(map(str, self.choices))
            raise ConfigError(f"{where}: {result!r} is not one of {choices}")
        return result


#: --config FILE / SPOCKWIRE_CONFIG: the TOML file (global, resolved before the others).
CONFIG = Setting("config", "TOML file with settings (top-level keys, or a [<command>] table)", type=str,
                 metavar="FILE")


def add_settings(parser: argparse.ArgumentParser, settings: Iterable[Setting]) -> None:
    """Add the flags of `settings` to `parser` (help text names the environment variable and the default)."""
    declared = list(getattr(parser, "_spockwire_settings", []))
    for s in settings:
        _KNOWN.setdefault(s.name, s)
        declared.append(s)
        if s.env_only:
            continue
        extra = [f"env {s.env}"]
        if s.required:
            extra.append("required")
        elif s.default_text is not None:
            extra.append(f"default {s.default_text}")
        elif s.default is not None and not s.is_flag:
            extra.append(f"default {s.default}")
        elif s.is_flag:
            extra.append(f"default {'on' if s.default else 'off'}")
        text = f"{s.help} [{'; '.join(extra)}]".replace("%", "%%")
        names = [s.flag] + ([s.short] if s.short else [])
        if s.is_flag:
            parser.add_argument(*names, dest=s.name, action=argparse.BooleanOptionalAction, default=None, help=text)
        else:
            parser.add_argument(*names, dest=s.name, default=None, metavar=s.metavar or s.name.upper(), help=text,
                                type=str, action="append" if s.repeat else "store")
    parser._spockwire_settings = declared  # type: ignore[attr-defined]
    parser.set_defaults(_spockwire_settings=declared)


class Config:
    """Resolved settings of one command run: attribute access, plus where each value came from."""

    def __init__(self, command: str, values: dict[str, Any], sources: dict[str, str],
                 file: Path | None) -> None:
        self.command = command
        self._values = values
        self._sources = sources
        self.file = file

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["_values"][name]
        except KeyError:
            raise AttributeError(name) from None

    def get(self, name: str, default: Any = None) -> Any:
        return self._values.get(name, default)

    def source(self, name: str) -> str:
        """"flag", "env", "file" or "default"."""
        return self._sources[name]

    def as_dict(self) -> dict[str, Any]:
        return dict(self._values)

    def __repr__(self) -> str:
        return f"Config({self.command}, {self._values!r})"


def load_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse a TOML settings file (tomllib on Python 3.11+, the tomli package on 3.10)."""
    p = Path(path)
    if _toml is None:
        raise ConfigError(f"{p}: reading TOML on Python {sys.version_info.major}.{sys.version_info.minor} "
                          "needs the 'tomli' package (pip install tomli)")
    try:
        with open(p, "rb") as fh:
            return _toml.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file {p} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {p}: {exc.strerror or exc}") from None
    except _toml.TOMLDecodeError as exc:
        raise ConfigError(f"config file {p} is not valid TOML: {exc}") from None


def _norm(key: str) -> str:
    return key.replace("-", "_")


def _file_values(data: Mapping[str, Any], command: str, path: Path,
                 mine: Mapping[str, Setting]) -> dict[str, Any]:
    """Settings for `command` from the parsed file: top-level keys, overridden by the [command] table."""
    values: dict[str, Any] = {}
    for key, value in data.items():
        name = _norm(key)
        if isinstance(value, dict):
            continue  # another command's table: checked when that command runs
        if name not in _KNOWN or name == CONFIG.name:
            raise ConfigError(f"{path}: unknown setting {key!r}")
        if name in mine:
            values[name] = value
    table = data.get(command)
    if isinstance(table, dict):
        for key, value in table.items():
            name = _norm(key)
            if name not in mine or name == CONFIG.name:
                raise ConfigError(f"{path}: unknown setting {key!r} in [{command}]")
            values[name] = value
    return values


def resolve(args: argparse.Namespace, command: str, *, environ: Mapping[str, str] | None = None) -> Config:
    """Resolve the settings declared for `command` (flag > env > file > default)."""
    env = os.environ if environ is None else environ
    settings: list[Setting] = list(getattr(args, "_spockwire_settings", []))
    mine = {s.name: s for s in settings}
    config_path = getattr(args, CONFIG.name, None) or env.get(CONFIG.env) or None
    file_data: dict[str, Any] = {}
    path = Path(config_path) if config_path else None
    if path is not None:
        file_data = _file_values(load_config_file(path), command, path, mine)
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for s in settings:
        flag_value = getattr(args, s.name, None)
        if flag_value is not None:
            values[s.name] = s.convert(flag_value, f"{s.flag}")
            sources[s.name] = "flag"
        elif s.env in env and env[s.env] != "":
            values[s.name] = s.convert(env[s.env], f"{s.env}")
            sources[s.name] = "env"
        elif s.name in file_data:
            values[s.name] = s.convert(file_data[s.name], f"{path}: {s.name}")
            sources[s.name] = "file"
        elif s.required:
            raise ConfigError(f"{command}: {s.flag} is required (or set {s.env}, or {s.name} in a --config file)")
        else:
            values[s.name] = s.default
            sources[s.name] = "default"
    return Config(command, values, sources, path)
