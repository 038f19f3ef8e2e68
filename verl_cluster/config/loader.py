"""YAML -> validated frozen dataclasses, once, at the boundary.

We validate ourselves first (to name the file, line and nearest valid key), then let OmegaConf's structured
config build the dataclasses. Choices live in field metadata: `field(metadata={"choices": (...)})`.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import types
import typing
from pathlib import Path
from typing import Any, Union

import yaml
from omegaconf import OmegaConf

from verl_cluster.errors import ConfigError

Lines = dict  # tuple(path) -> 1-based line number


def read_yaml(path: str | os.PathLike) -> tuple[Any, Lines]:
    """Parse a YAML file; return the data and the line of every mapping key / list item."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{p}: file not found", "check the path (relative paths are from the current directory)")
    except IsADirectoryError:
        raise ConfigError(f"{p}: is a directory, expected a YAML file")
    except (PermissionError, UnicodeDecodeError, OSError) as e:
        raise ConfigError(f"{p}: cannot read: {e.__class__.__name__}: {e}")
    return parse_yaml_text(text, str(p))


def parse_yaml_text(text: str, source: str) -> tuple[Any, Lines]:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark else source
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{where}: invalid YAML: {problem}")
    except (RecursionError, ValueError, OverflowError) as e:
        raise ConfigError(f"{source}: invalid YAML: {e}")
    lines: Lines = {}
    if node is not None:
        _collect_lines(node, (), lines)
    return data, lines


def _collect_lines(node: yaml.Node, path: tuple, lines: Lines) -> None:
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            key = k.value if isinstance(k, yaml.ScalarNode) else str(k.value)
            lines[path + (key,)] = k.start_mark.line + 1
            _collect_lines(v, path + (key,), lines)
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            _collect_lines(v, path + (i,), lines)


def dotted(path: tuple) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top level)"


def where(source: str, lines: Lines, path: tuple) -> str:
    """'file:line' for the deepest part of `path` we know a line for."""
    for n in range(len(path), -1, -1):
        if path[:n] in lines:
            return f"{source}:{lines[path[:n]]}"
    return source


def _strip_optional(tp: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0], True
    return tp, False


def _type_name(tp: Any) -> str:
    tp, opt = _strip_optional(tp)
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        name = "a mapping"
    elif origin in (list, tuple):
        name = f"a list of {_type_name(typing.get_args(tp)[0])}" if typing.get_args(tp) else "a list"
    elif origin is dict or tp is dict:
        name = "a mapping"
    else:
        name = {int: "an integer", float: "a number", str: "a string", bool: "true or false", Any: "any value"}.get(
            tp, str(tp)
        )
    return name + (" or null" if opt else "")


class Validator:
    """Walks user data against a dataclass schema; collects the first error with file:line."""

    def __init__(self, source: str, lines: Lines):
        self.source = source
        self.lines = lines

    def fail(self, path: tuple, msg: str, hint: str | None = None) -> None:
        raise ConfigError(f"{where(self.source, self.lines, path)}: {msg}", hint)

    def check(self, value: Any, tp: Any, path: tuple, meta: typing.Mapping | None = None) -> None:
        tp, optional = _strip_optional(tp)
        if value is None:
            if optional or tp is Any:
                return
            self.fail(path, f"`{dotted(path)}` must be {_type_name(tp)}, got null")
        if dataclasses.is_dataclass(tp):
            return self.check_dataclass(value, tp, path)
        origin = typing.get_origin(tp)
        if origin in (list, tuple):
            if not isinstance(value, list):
                self.fail(path, f"`{dotted(path)}` must be {_type_name(tp)}, got {_describe(value)}")
            (item_tp,) = typing.get_args(tp)[:1] or (Any,)
            for i, item in enumerate(value):
                self.check(item, item_tp, path + (i,))
            return
        if origin is dict or tp is dict:
            if not isinstance(value, dict):
                self.fail(path, f"`{dotted(path)}` must be a mapping, got {_describe(value)}")
            args = typing.get_args(tp)
            for k, v in value.items():
                if not isinstance(k, str):
                    self.fail(path, f"`{dotted(path)}` keys must be strings, got {k!r}")
                if args:
                    self.check(v, args[1], path + (k,))
            return
        if tp is Any:
            return
        ok = {
            bool: isinstance(value, bool),
            int: isinstance(value, int) and not isinstance(value, bool),
            float: isinstance(value, (int, float)) and not isinstance(value, bool),
            str: isinstance(value, (str, int, float)) and not isinstance(value, bool),
        }.get(tp, True)
        if not ok:
            self.fail(path, f"`{dotted(path)}` must be {_type_name(tp)}, got {_describe(value)}")
        choices = (meta or {}).get("choices")
        if choices and str(value) not in choices:
            near = difflib.get_close_matches(str(value), choices, n=1)
            hint = f"did you mean `{near[0]}`?" if near else None
            self.fail(path, f"`{dotted(path)}` must be one of {', '.join(choices)}; got {value!r}", hint)

    def check_dataclass(self, value: Any, cls: type, path: tuple) -> None:
        if not isinstance(value, dict):
            self.fail(path, f"`{dotted(path)}` must be a mapping, got {_describe(value)}")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        hints = typing.get_type_hints(cls)
        for key in value:
            if key not in fields:
                near = difflib.get_close_matches(str(key), list(fields), n=1, cutoff=0.6)
                hint = f"did you mean `{near[0]}`?" if near else f"valid keys here: {', '.join(fields)}"
                self.fail(path + (key,), f"unknown key `{dotted(path + (key,))}`", hint)
        for name, f in fields.items():
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            required = required or f.default == "???"
            if name not in value:
                if required:
                    self.fail(path, f"missing required field `{dotted(path + (name,))}` ({_type_name(hints[name])})")
                continue
            self.check(value[name], hints[name], path + (name,), f.metadata)


def _describe(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    return f"{type(value).__name__} {value!r}"[:80]


def build(cls: type, data: dict, source: str = "<config>", lines: Lines | None = None):
    """Validate `data` against `cls` and return the frozen dataclass instance."""
    Validator(source, lines or {}).check_dataclass(data, cls, ())
    return construct(cls, data)


def construct(tp: Any, value: Any) -> Any:
    """Build (nested) frozen dataclasses from data the Validator accepted, coercing scalars to the field type.
    (OmegaConf's merge marks nodes of frozen dataclasses read-only mid-merge, so we build them ourselves.)"""
    tp, _ = _strip_optional(tp)
    if value is None:
        return None
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        return tp(**{f.name: construct(hints[f.name], value[f.name])
                     for f in dataclasses.fields(tp) if f.name in value})
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (list, tuple):
        return [construct(args[0] if args else Any, v) for v in value]
    if origin is dict or tp is dict:
        return {k: construct(args[1] if args else Any, v) for k, v in value.items()}
    if tp in (str, float) and not isinstance(value, tp):
        return tp(value)
    return value


def load(path: str | os.PathLike, cls: type, dotlist: list[str] | None = None, prepare=None):
    """Read a YAML file into `cls`, applying `key=value` overrides, then `prepare(data, source)` if given."""
    data, lines = read_yaml(path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}:1: expected a mapping at the top level, got {_describe(data)}")
    if dotlist:
        data = apply_dotlist(data, dotlist, str(path))
    if prepare:
        data = prepare(data, str(path))
    return build(cls, data, str(path), lines)


def apply_dotlist(data: dict, dotlist: list[str], source: str) -> dict:
    """Apply `a.b=value` overrides (YAML-typed values) to a plain dict."""
    out = OmegaConf.create(data)
    for item in dotlist:
        if "=" not in item:
            raise ConfigError(f"override `{item}` is not key=value", "write e.g. ray.object_store_memory=209715200")
        key, _, raw = item.partition("=")
        try:
            value = yaml.safe_load(raw) if raw else ""
        except yaml.YAMLError:
            value = raw
        try:
            OmegaConf.update(out, key.strip(), value, merge=True, force_add=True)
        except Exception as e:
            raise ConfigError(f"override `{item}`: {str(e).splitlines()[0]}")
    return OmegaConf.to_container(out)
