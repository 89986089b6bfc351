"""Typed YAML: a mapping validated into nested dataclasses, every problem one line naming
its key.

The generic half of the run config (draftsmith/config.py holds the sections, their
defaults and the checks between fields): `build(cls, raw, prefix)` checks each value
against its field's type (Literal choices, lists, nested dataclasses, finite floats) and
the range in its metadata (`ge`, `gt`, `le`, `lt`), suggests the nearest key for a typo,
and converts only where lossless (int -> float). `read_yaml` and the `key=value` override
parser read floats such as `3e-4` as users write them.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import sys
import types
import typing
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal

import yaml

from draftsmith.errors import ConfigError


def type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_name(a) for a in typing.get_args(tp))
    if origin is list:
        (inner,) = typing.get_args(tp)
        return f"list of {type_name(inner)}"
    if tp is type(None):
        return "null"
    if dataclasses.is_dataclass(tp):
        return "mapping"
    return getattr(tp, "__name__", str(tp))


def coerce(value: Any, tp: Any, key: str) -> Any:
    """Check `value` against type `tp`, converting where lossless (int -> float)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return coerce(value, arg, key)
            except ConfigError as e:
                errors.append(e)
        if len(errors) == 1:  # `float | None` and the like: the one type's own message is sharper
            raise errors[0]
        raise ConfigError(f"{key}: expected {type_name(tp)}, got {value!r}")
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            hint = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
            extra = f" (did you mean {hint[0]!r}?)" if hint else ""
            raise ConfigError(f"{key}: expected {type_name(tp)}, got {value!r}{extra}")
        return value
    if origin is list:
        (inner,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected {type_name(tp)}, got {value!r}")
        return [coerce(v, inner, f"{key}[{i}]") for i, v in enumerate(value)]
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return build(tp, value, key)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        if not math.isfinite(value):  # YAML reads .inf and .nan as floats
            raise ConfigError(f"{key}: expected a finite number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return value
    raise TypeError(f"unsupported config type {tp!r} at {key}")  # a schema bug, not user error


def bounds(**limits: float) -> dict:
    """A dataclass field's metadata: the bounds build() checks (ge, gt, le, lt)."""
    return {"bounds": limits}


def check_bounds(value: Any, limits: dict, key: str) -> None:
    if value is None:
        return
    ops = {
        "ge": (lambda v, b: v >= b, ">="),
        "gt": (lambda v, b: v > b, ">"),
        "le": (lambda v, b: v <= b, "<="),
        "lt": (lambda v, b: v < b, "<"),
    }
    for name, bound in limits.items():
        ok, sym = ops[name]
        if not ok(value, bound):
            raise ConfigError(f"{key}: must be {sym} {bound}, got {value!r}")


def open_sections(provider: Callable[[], dict[str, type]]) -> dict:
    """A dataclass field's metadata: an open set of sub-sections, {name: dataclass} from
    `provider` when a config is built; build() reads each `<prefix>.<name>` into the field's
    dict (an init=False field whose default already holds every section's defaults)."""
    return {"sections": provider}


def build(cls: type, raw: dict, prefix: str) -> Any:
    hints = typing.get_type_hints(cls)
    # init=False fields are filled by the code, never given by a key
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    holder = next((f for f in dataclasses.fields(cls) if "sections" in f.metadata), None)
    extra = holder.metadata["sections"]() if holder else {}  # {name: dataclass}
    raw = rename_keys(cls, raw, prefix)
    kwargs, given = {}, {}
    for name, value in raw.items():
        key = f"{prefix}.{name}" if prefix else str(name)
        if name in extra:
            given[name] = coerce(value, extra[name], key)
            continue
        if name not in fields:
            keys = [*fields, *extra]
            raise ConfigError(f"{key}: unknown key{suggest(str(name), keys, prefix)}")
        value = coerce(value, hints[name], key)
        check_bounds(value, fields[name].metadata.get("bounds", {}), key)
        kwargs[name] = value
    obj = cls(**kwargs)
    if holder:
        getattr(obj, holder.name).update(given)
    return obj


def rename_keys(cls: type, raw: dict, prefix: str) -> dict:
    """A section's renamed keys (its class's RENAMED_KEYS, old -> new, or old -> (new,
    {old value: new value}) when the values changed too) read under their new name, with a
    one-line warning on stderr; giving both names is an error."""
    out = dict(raw)
    for old, renamed in getattr(cls, "RENAMED_KEYS", {}).items():
        if old not in out:
            continue
        new, values = renamed if isinstance(renamed, tuple) else (renamed, None)
        old_key, new_key = (f"{prefix}.{k}" if prefix else k for k in (old, new))
        if new in out:
            raise ConfigError(f"{old_key}: renamed {new}; set only {new_key}")
        print(f"draftsmith: warning: {old_key} is deprecated, read as {new_key}", file=sys.stderr)
        value = out.pop(old)
        if values is not None:
            if value not in values:
                raise ConfigError(
                    f"{old_key}: must be one of {', '.join(map(str, values))}, got {value!r}"
                )
            value = values[value]
        out[new] = value
    return out


def suggest(name: str, fields: Iterable[str], prefix: str) -> str:
    hint = difflib.get_close_matches(name, list(fields), n=1, cutoff=0.5)
    if not hint:
        return f" (valid keys: {', '.join(fields)})"
    return f" (did you mean {prefix + '.' if prefix else ''}{hint[0]}?)"


class YamlLoader(yaml.SafeLoader):
    """SafeLoader that reads `3e-4` as a float (YAML 1.1 wants `3.0e-4`; users don't)."""


YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def read_yaml(path: Path) -> dict:
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        raw = yaml.load(path.read_text(), Loader=YamlLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{path}:{where}: malformed YAML: {problem}") from None
    if raw is None:
        # An empty file is far likelier a mistake (a wrong path, a failed redirect) than a
        # request for the default run, which is the full SmolLM2 pipeline (~30 minutes here).
        raise ConfigError(
            f"{path}: the config is empty; write the settings to change (e.g. `run: "
            "{output_dir: runs/mine}`), or `{}` to run every default"
        )
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    return raw


def parse_override(text: str) -> tuple[list[str], Any]:
    """`distill.lr=3e-4` -> (['distill', 'lr'], 3e-4); values are YAML scalars or lists."""
    if "=" not in text:
        raise ConfigError(f"{text}: an override must look like key=value")
    key, _, value = text.partition("=")
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(f"{key}: malformed override key")
    try:
        parsed = yaml.load(value, Loader=YamlLoader) if value.strip() else None
    except yaml.YAMLError:
        parsed = value  # keep as a string, the validator will judge it
    return parts, parsed


def apply_override(raw: dict, parts: list[str], value: Any) -> None:
    node = raw
    for i, part in enumerate(parts[:-1]):
        nxt = node.get(part)
        if nxt is None:
            nxt = node[part] = {}
        if not isinstance(nxt, dict):
            raise ConfigError(
                f"{'.'.join(parts[: i + 1])}: is not a section, cannot set {parts[-1]}"
            )
        node = nxt
    node[parts[-1]] = value
