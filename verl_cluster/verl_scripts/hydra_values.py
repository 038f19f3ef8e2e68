"""Values in Hydra's override grammar, both ways: `to_hydra` writes a Python value as an override's right-hand
side (submit's argv), `from_hydra` reads one back (importing a verl script's key=value words)."""

from __future__ import annotations

import re
from typing import Any

_PLAIN = re.compile(r"^[A-Za-z0-9_./:@+\-]+$")
_INT = re.compile(r"[+-]?\d+")
_FLOAT = re.compile(r"[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?|[+-]?(inf|nan)", re.I)


def to_hydra(v: Any) -> str:
    """A value in Hydra's override grammar: lists as [a,b], strings quoted when they need it."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(to_hydra(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ",".join(f"{k}:{to_hydra(x)}" for k, x in v.items()) + "}"
    s = str(v)
    if _PLAIN.match(s) and s.lower() not in ("true", "false", "null"):
        return s
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


def from_hydra(raw: str) -> Any:
    """A Hydra override value as Python: [a,b] lists, {k:v} dicts, quoted strings, numbers, booleans, null."""
    s = raw.strip()
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "'\"":
        return s[1:-1].replace("\\" + s[0], s[0])
    if s[:1] in "[{" and s[-1:] in "]}":
        items = [x for x in _split_top(s[1:-1]) if x.strip()]
        if s[0] == "[":
            return [from_hydra(x) for x in items]
        pairs = [x.split(":", 1) for x in items]
        if all(len(p) == 2 for p in pairs):
            return {k.strip().strip("'\""): from_hydra(v) for k, v in pairs}
        return s
    low = s.lower()
    if low in ("true", "false"):
        return low == "true"
    if low == "null":
        return None
    if _INT.fullmatch(s):
        return int(s)
    if _FLOAT.fullmatch(s):
        return float(s)
    return raw


def _split_top(s: str) -> list[str]:
    """Split at commas outside brackets and quotes."""
    out, depth, cur, quote = [], 0, "", ""
    for c in s:
        if quote:
            quote = "" if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c in "[{(":
            depth += 1
        elif c in "]})":
            depth -= 1
        elif c == "," and depth == 0:
            out.append(cur)
            cur = ""
            continue
        cur += c
    return out + [cur]
