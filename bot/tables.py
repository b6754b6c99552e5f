"""Reading a TOML table into a typed dataclass, strictly: the one reader of every config table.

An unknown key, or a value of the wrong type, fails naming the key (with its table's prefix)
and the type expected, before anything starts. A settings class may inherit its fields, also
from a generic base (`channels.settings`'s `PlatformSettings[int]`): a field typed by the
base's parameter is read as the type the class gives it. A `Config`'s `base_dir` is not a key.
"""

import dataclasses
import types
import typing
from typing import Any

from core.errors import ConfigError


def build_table(cls: type, data: Any, prefix: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"'{prefix.rstrip('.')}' must be a table")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name != "base_dir"}
    hints = _field_types(cls)
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key not in fields:
            raise ConfigError(f"unknown key '{prefix}{key}'; valid keys here: {', '.join(fields)}")
        values[key] = _value(hints[key], value, f"{prefix}{key}")
    return cls(**values)


def _field_types(cls: type) -> dict[str, Any]:
    """Each field's type, with the type parameters of generic bases bound to what `cls` gives
    them (`list[Id]` in a `PlatformSettings[int]` is `list[int]`)."""
    bound = _bindings(cls)
    return {name: _bind(hint, bound) for name, hint in typing.get_type_hints(cls).items()}


def _bindings(cls: type) -> dict[Any, Any]:
    """What each type parameter of `cls`'s generic bases, and of theirs, stands for in `cls`."""
    bound: dict[Any, Any] = {}
    for base in getattr(cls, "__orig_bases__", ()):
        origin = typing.get_origin(base)
        if not isinstance(origin, type) or origin is typing.Generic:
            continue
        given = dict(zip(origin.__parameters__, typing.get_args(base), strict=True))
        inherited = {param: _bind(hint, given) for param, hint in _bindings(origin).items()}
        bound |= inherited | given
    return bound


def _bind(hint: Any, bound: dict[Any, Any]) -> Any:
    if isinstance(hint, typing.TypeVar):
        return bound.get(hint, hint)
    parameters = getattr(hint, "__parameters__", ())
    return hint[tuple(bound.get(p, p) for p in parameters)] if parameters else hint


def _value(hint: Any, value: Any, key: str) -> Any:
    if dataclasses.is_dataclass(hint):
        return build_table(hint, value, f"{key}.")
    origin = typing.get_origin(hint)
    if origin is dict:
        _, item = typing.get_args(hint)
        if not isinstance(value, dict):
            raise ConfigError(f"'{key}' must be a table of tables")
        return {name: _value(item, entry, f"{key}.{name}") for name, entry in value.items()}
    if origin is list:
        (item,) = typing.get_args(hint)
        if not isinstance(value, list):
            raise ConfigError(f"'{key}' must be a list, got {_kind(value)}")
        return [_value(item, entry, f"{key}[{index}]") for index, entry in enumerate(value)]
    if origin is types.UnionType:
        return _value(typing.get_args(hint)[0], value, key)
    return _scalar(hint, value, key)


def _scalar(hint: type, value: Any, key: str) -> Any:
    if hint is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if hint is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if hint in (str, bool) and type(value) is hint:
        return value
    expected = {float: "a number", int: "an integer", str: "a string", bool: "true or false"}
    raise ConfigError(f"'{key}' must be {expected[hint]}, got {_kind(value)} {value!r}")


def _kind(value: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}.get(
        type(value), f"a {type(value).__name__}"
    )
