"""Walking user YAML with errors that name the file, the field and the fix.

Every reader of user files (study specs, search spaces) goes through ``Fields`` so
that an unknown key, a wrong type or a missing value is always one line of the form
``FILE: FIELD: problem; fix`` and nothing runs before the whole file is checked.
"""

from __future__ import annotations

import builtins
import os
import re
from pathlib import Path
from typing import Any, NoReturn

import yaml

from tuner.errors import UserError

_MISSING = object()
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def load_yaml_mapping(path: Path) -> dict:
    """Read a YAML file that must hold a mapping; any problem is a one-line UserError."""
    if not path.exists():
        raise UserError(f"{path}: no such file; check the path")
    if path.is_dir():
        raise UserError(f"{path}: is a directory; pass a YAML file")
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as err:
        raise UserError(f"{path}: cannot read ({err.strerror})") from err
    except UnicodeDecodeError as err:
        raise UserError(f"{path}: not a text file (no UTF-8 at byte {err.start}); pass a YAML file") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "somewhere"
        problem = getattr(err, "problem", None) or "invalid YAML"
        raise UserError(f"{path}: malformed YAML at {where}: {problem}; fix the syntax") from err
    if data is None:
        raise UserError(f"{path}: the file is empty; expected a mapping of fields (see studies/demo.yaml)")
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping of fields at the top level, got {type_name(data)}")
    return data


def expand_env(text: str, file: Path, field: str) -> str:
    """Expand ``${VAR}`` / ``$VAR`` so one study file serves several machines."""

    def sub(match: re.Match) -> str:
        name = match.group(1) or match.group(2)
        if name not in os.environ:
            raise UserError(
                f"{file}: {field}: environment variable ${name} is not set; export it or edit the path"
            )
        return os.environ[name]

    return _ENV_REF.sub(sub, text)


def type_name(value: Any) -> str:
    return {
        bool: "boolean",
        int: "integer",
        float: "number",
        str: "string",
        list: "list",
        dict: "mapping",
    }.get(type(value), type(value).__name__)


class Fields:
    """One mapping of a user file, read field by field; ``done()`` rejects unknown keys."""

    def __init__(self, file: Path, data: Any, prefix: str = ""):
        self.file = file
        self.prefix = prefix
        if data is None:
            data = {}
        if not isinstance(data, dict):
            self.fail("", f"expected a mapping, got {type_name(data)}")
        self.data = data
        self.seen: set[str] = set()

    def name(self, key: str) -> str:
        return f"{self.prefix}.{key}" if self.prefix else key

    def fail(self, key: str, problem: str) -> NoReturn:
        field = self.name(key) if key else (self.prefix or "(top level)")
        raise UserError(f"{self.file}: {field}: {problem}")

    def has(self, key: str) -> bool:
        return key in self.data

    def raw(self, key: str, default: Any = _MISSING) -> Any:
        self.seen.add(key)
        if key not in self.data or self.data[key] is None:
            if default is _MISSING:
                self.fail(key, "is required")
            return default
        return self.data[key]

    # Readers named for the type they read; from here on in the class, ``str`` names the reader, so annotations
    # name the type as ``builtins.str``.
    def str(self, key: str, default: Any = _MISSING) -> Any:
        value = self.raw(key, default)
        if value is default:
            return value
        if not isinstance(value, str) or not value.strip():
            self.fail(key, f"expected a non-empty string, got {type_name(value)} {value!r}")
        return value

    def int(self, key: builtins.str, default: Any = _MISSING, minimum: int | None = None) -> Any:
        value = self.raw(key, default)
        if value is default:
            return value
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(key, f"expected an integer, got {type_name(value)} {value!r}")
        if minimum is not None and value < minimum:
            self.fail(key, f"must be >= {minimum}, got {value}")
        return value

    def number(
        self,
        key: builtins.str,
        default: Any = _MISSING,
        minimum: float | None = None,
        maximum: float | None = None,
    ) -> Any:
        value = self.raw(key, default)
        if value is default:
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(key, f"expected a number, got {type_name(value)} {value!r}")
        if minimum is not None and value < minimum:
            self.fail(key, f"must be >= {minimum}, got {value}")
        if maximum is not None and value > maximum:
            self.fail(key, f"must be <= {maximum}, got {value}")
        return float(value)

    def bool(self, key: builtins.str, default: Any = _MISSING) -> Any:
        value = self.raw(key, default)
        if value is not default and not isinstance(value, bool):
            self.fail(key, f"expected true or false, got {type_name(value)} {value!r}")
        return value

    def choice(self, key: builtins.str, choices: tuple[builtins.str, ...], default: Any = _MISSING) -> Any:
        value = self.raw(key, default)
        if value is not default and value not in choices:
            self.fail(key, f"unknown value {value!r}; use one of {', '.join(choices)}")
        return value

    def list(self, key: builtins.str, default: Any = _MISSING) -> Any:
        value = self.raw(key, default)
        if value is not default and not isinstance(value, list):
            self.fail(key, f"expected a list, got {type_name(value)} {value!r}")
        return value

    def section(self, key: builtins.str) -> "Fields":
        return Fields(self.file, self.raw(key, {}), self.name(key))

    def done(self) -> None:
        unknown = sorted(set(self.data) - self.seen)
        if unknown:
            known = ", ".join(sorted(self.seen))
            self.fail(unknown[0], f"unknown field; known fields here: {known}")
