"""`StrEnum` for Python 3.10 as well: members are their value as a string (JSON, f-strings and comparisons with
plain strings read the same), as `enum.StrEnum` does from 3.11."""

from __future__ import annotations

import enum


class StrValueEnum(str, enum.Enum):
    """What `enum.StrEnum` does, for Pythons without it (a `str` mixin alone formats as `Class.MEMBER`)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


StrEnum = getattr(enum, "StrEnum", StrValueEnum)
