"""YAML -> validated frozen dataclasses, once, at the boundary.

We validate ourselves first (to name the file, line and nearest valid key), then let OmegaConf's structured
config build the dataclasses. Choices live in field metadata: `field(metadata={"choices": (...)})`.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import stat
import types
import typing
from pathlib import Path
from typing import Any, BinaryIO, Optional, Union

import yaml
from omegaconf import OmegaConf

from verl_cluster.config.names import HINTS, KINDS
from verl_cluster.errors import ConfigError

Lines = dict  # tuple(path) -> 1-based line number


# Limits on input, checked before anything is built: a config is a few KB; these stop YAML bombs (aliases that
# expand exponentially, a merge key that refers to itself), deep nesting and huge files within a fraction of a second.
MAX_BYTES = 1 << 20
MAX_VALUES = 100_000  # scalars, mappings and sequences, every alias expanded
MAX_DEPTH = 64
MAX_SCALAR = 1 << 16  # characters in one value
MAX_KEY = 1024  # characters in one key (YAML's own limit for a plain key)
MAX_OVERRIDES = 1000  # key=value words on one command line
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: 20x faster, same safe constructors


def read_text_bounded(path: str | os.PathLike, what: str = "file") -> str:
    """A config/script file's text, refused (not read) when larger than MAX_BYTES."""
    p = Path(path)
    try:
        with open_regular(p) as f:
            raw = f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"{short(p)}: file not found", "check the path (relative paths are from the current directory)")
    except IsADirectoryError:
        raise ConfigError(f"{short(p)}: is a directory, expected a YAML file")
    except NotRegularFile:
        raise ConfigError(f"{short(p)}: not a regular file (a pipe, socket or device)", "save it to a file and name that")
    except OSError as e:
        raise ConfigError(f"{short(p)}: cannot read: {e.__class__.__name__}: {e.strerror or e}")
    if len(raw) > MAX_BYTES:
        raise ConfigError(f"{short(p)}: larger than {MAX_BYTES >> 20} MiB; not a {what} this tool reads",
                          "check that this is the file you meant")
    try:
        return raw.decode()
    except UnicodeDecodeError as e:
        raise ConfigError(f"{short(p)}: cannot read: not UTF-8 text (byte {e.start})")


class NotRegularFile(OSError):
    """A pipe, socket or device named where a file is wanted."""


def open_regular(path: str | os.PathLike) -> BinaryIO:
    """The file, open for reading once it is known to be a regular one: opened non-blocking and looked at before
    any read (a FIFO without a writer would hang the read, a device never end). IsADirectoryError for a folder,
    NotRegularFile for the rest, FileNotFoundError and other OSErrors as the open raised them."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise IsADirectoryError(path) if stat.S_ISDIR(mode) else NotRegularFile(path)
    return os.fdopen(fd, "rb")


def read_yaml(path: str | os.PathLike) -> tuple[Any, Lines]:
    """Parse a YAML file; return the data and the line of every mapping key / list item."""
    return parse_yaml_text(read_text_bounded(path, "YAML file"), short(path))


def _tab_hint(text: str, mark: Any) -> Optional[str]:
    """A tab where YAML wants spaces: the one mistake its message does not show (the tab is invisible)."""
    if mark is None:
        return None
    line = (text.splitlines()[mark.line:mark.line + 1] or [""])[0]
    if "\t" not in line:
        return None
    return (f"line {mark.line + 1} has a tab at column {line.index(chr(9)) + 1}: YAML indents with spaces only; "
            "replace the tab with spaces")


def parse_yaml_text(text: str, source: str) -> tuple[Any, Lines]:
    """Safe YAML within the limits above; a key written twice in one mapping is an error naming both lines."""
    if len(text) > MAX_BYTES:
        raise ConfigError(f"{source}: larger than {MAX_BYTES >> 20} MiB; not a YAML file this tool reads")
    try:
        _check_bounds(text, source)
        loader = _Loader(text)
        try:
            node = loader.get_single_node()
            lines: Lines = {}
            if node is not None:
                _collect_lines(node, (), lines, source)
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where_ = f"{source}:{mark.line + 1}" if mark else source
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{where_}: invalid YAML: {short(problem)}", _tab_hint(text, mark))
    except (RecursionError, ValueError, OverflowError, MemoryError) as e:
        raise ConfigError(f"{source}: invalid YAML: {type(e).__name__}: {short(str(e))}")
    return data, lines


def _check_bounds(text: str, source: str) -> None:
    """One pass over the parser's events (no data built): size with aliases expanded, nesting, value length."""
    open_: list[list] = []  # per open collection: [values inside so far, its anchor, is a mapping, items seen]
    sizes: dict[str, int] = {}  # anchor -> values it stands for
    total = 0
    for ev in yaml.parse(text, Loader=_Loader):
        line = getattr(ev, "start_mark", None)
        at = f"{source}:{line.line + 1}" if line else source
        if open_ and open_[-1][2] and not isinstance(ev, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            open_[-1][3] += 1
            if open_[-1][3] % 2 and isinstance(ev, yaml.ScalarEvent) and len(ev.value) > MAX_KEY:
                raise ConfigError(f"{at}: a key of {len(ev.value)} characters (at most {MAX_KEY})",
                                  "check that this is the file you meant")
        if isinstance(ev, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            open_.append([1, ev.anchor, isinstance(ev, yaml.MappingStartEvent), 0])
            if len(open_) > MAX_DEPTH:
                raise ConfigError(f"{at}: nested more than {MAX_DEPTH} levels deep", "flatten the structure")
            continue
        if isinstance(ev, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            n, anchor = open_.pop()[:2]
        elif isinstance(ev, yaml.ScalarEvent):
            n, anchor = 1, ev.anchor
            if len(ev.value) > MAX_SCALAR:
                raise ConfigError(f"{at}: a value of {len(ev.value)} characters (at most {MAX_SCALAR} are read)",
                                  "check that this is the file you meant")
        elif isinstance(ev, yaml.AliasEvent):
            if ev.anchor not in sizes:
                if any(f[1] == ev.anchor for f in open_):
                    raise ConfigError(f"{at}: alias *{short(ev.anchor)} refers to the value it is inside of "
                                      "(recursive YAML)", "write the values out")
                continue  # an unknown anchor: the composer reports it with its line
            n, anchor = sizes[ev.anchor], None
        else:
            continue
        if anchor:
            sizes[anchor] = n
        if open_:
            open_[-1][0] = min(open_[-1][0] + n, MAX_VALUES + 1)
        else:
            total += n
        if total > MAX_VALUES or (open_ and open_[-1][0] > MAX_VALUES) or n > MAX_VALUES:
            raise ConfigError(f"{at}: expands to more than {MAX_VALUES} values (YAML aliases or a huge file)",
                              "write the values out; a config needs far fewer")


def _collect_lines(node: yaml.Node, path: tuple, lines: Lines, source: str = "<yaml>") -> None:
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for k, v in node.value:
            key = k.value if isinstance(k, yaml.ScalarNode) else str(k.value)
            line = k.start_mark.line + 1
            if key != "<<" and isinstance(k, yaml.ScalarNode):
                if key in seen:
                    raise ConfigError(f"{source}:{line}: `{dotted(path + (short(key, 80),))}` is set twice, on line "
                                      f"{seen[key]} and line {line}", "keep one of them (YAML keeps only the last)")
                seen[key] = line
            lines[path + (key,)] = line
            _collect_lines(v, path + (key,), lines, source)
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            _collect_lines(v, path + (i,), lines, source)


def short(value: Any, limit: int = 200) -> str:
    """A value as it may appear in a message: one line, at most `limit` characters (control characters escaped)."""
    raw = str(value)
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in raw[:limit])
    return text if len(raw) <= limit else f"{text}... ({len(raw)} chars)"


def dotted(path: tuple) -> str:
    out = ""
    for p in path:
        p = p if isinstance(p, int) else short(p, 80)
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
                self.check(item, item_tp, path + (i,), meta)
            return
        if origin is dict or tp is dict:
            if not isinstance(value, dict):
                self.fail(path, f"`{dotted(path)}` must be a mapping, got {_describe(value)}")
            args = typing.get_args(tp)
            key_kind = (meta or {}).get("keys")
            for k, v in value.items():
                if not isinstance(k, str):
                    self.fail(path, f"`{dotted(path)}` keys must be strings, got {short(repr(k), 80)}")
                if key_kind and KINDS[key_kind](k):
                    self.fail(path + (k,), f"`{dotted(path)}` key `{short(k, 80)}` {KINDS[key_kind](k)}",
                              HINTS[key_kind])
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
        name = str(path[-1]) if path and meta is not None else ""  # a field, not a mapping's entry
        if name.endswith("_s") and ok and isinstance(value, (int, float)) and (
                value <= 0 if name.endswith("timeout_s") else value < 0):
            self.fail(path, f"`{dotted(path)}` must be {'above' if name.endswith('timeout_s') else 'at least'} 0 "
                            f"seconds, got {value}", "leave it out for the default")
        kind = (meta or {}).get("kind")
        if kind and isinstance(value, str) and KINDS[kind](value):
            self.fail(path, f"`{dotted(path)}` {short(repr(value), 80)} {KINDS[kind](value)}", HINTS[kind])
        choices = (meta or {}).get("choices")
        if choices and str(value) not in choices:
            near = difflib.get_close_matches(str(value), choices, n=1)
            hint = f"did you mean `{near[0]}`?" if near else None
            self.fail(path, f"`{dotted(path)}` must be one of {', '.join(choices)}; got {short(repr(value), 80)}", hint)

    def check_dataclass(self, value: Any, cls: type, path: tuple) -> None:
        if not isinstance(value, dict):
            self.fail(path, f"`{dotted(path)}` must be a mapping, got {_describe(value)}")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        hints = typing.get_type_hints(cls)
        for key in value:
            if key not in fields:
                near = difflib.get_close_matches(str(key)[:100], list(fields), n=1, cutoff=0.6)
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
    return short(f"{type(value).__name__} {value!r}", 80)


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
    """Apply `a.b=value` overrides (YAML-typed values, read within the same bounds as a file) to a plain dict."""
    if len(dotlist) > MAX_OVERRIDES:
        raise ConfigError(f"{source}: {len(dotlist)} key=value overrides (at most {MAX_OVERRIDES})",
                          "put them in the file instead")
    out = OmegaConf.create(data)
    for item in dotlist:
        if "=" not in item:
            raise ConfigError(f"override `{short(item)}` is not key=value",
                              "write e.g. ray.object_store_memory=209715200")
        key, _, raw = item.partition("=")
        if key.count(".") >= MAX_DEPTH or len(key) > 1000:
            raise ConfigError(f"override `{short(key, 80)}`: key nested too deep or too long")
        try:  # a value YAML cannot read (`@run1`, `a: b`, `[a,b`) is the plain string it was written as
            _check_bounds(raw, f"override `{short(key, 80)}`")
            value = yaml.load(raw, Loader=_Loader) if raw else ""
        except yaml.YAMLError:
            if len(raw) > MAX_SCALAR:
                raise ConfigError(f"override `{short(key, 80)}`: a value of {len(raw)} characters (at most "
                                  f"{MAX_SCALAR} are read)", "put it in the file instead") from None
            value = raw
        try:
            OmegaConf.update(out, key.strip(), value, merge=True, force_add=True)
        except Exception as e:  # noqa: BLE001 - OmegaConf raises many kinds for a bad key
            raise ConfigError(f"override `{short(item)}`: {short(str(e).splitlines()[0] if str(e) else type(e).__name__)}")
    return OmegaConf.to_container(out)
