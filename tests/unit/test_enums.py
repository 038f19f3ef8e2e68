"""Typed states read as their string value on every supported Python (3.10 has no enum.StrEnum)."""

import json

from verl_cluster.enums import StrValueEnum


class Color(StrValueEnum):
    RED = "red"


def test_the_fallback_reads_as_its_value_everywhere():
    assert Color.RED == "red" and "red" == Color.RED
    assert str(Color.RED) == "red" and f"{Color.RED}" == "red" and f"{Color.RED:>5}" == "  red"
    assert json.dumps({"c": Color.RED}) == '{"c": "red"}'
    assert Color("red") is Color.RED


def test_every_state_the_product_defines_reads_as_its_value():
    """Each string enum in the package (records, JSON, exit lines and tables print them): one written as a plain
    `(str, Enum)` would print `Class.MEMBER` on Python 3.12."""
    import enum
    import importlib
    import pkgutil

    import verl_cluster

    found = {}
    for m in pkgutil.walk_packages(verl_cluster.__path__, "verl_cluster."):
        if m.name.endswith("__main__"):
            continue
        mod = importlib.import_module(m.name)
        for obj in vars(mod).values():
            if isinstance(obj, type) and issubclass(obj, enum.Enum) and issubclass(obj, str) \
                    and obj.__module__ == m.name and list(obj):
                found[f"{m.name}.{obj.__name__}"] = obj
    assert len(found) >= 8, sorted(found)  # NodeAction, RunStatus, FailureClass, ... are all seen
    bad = [f"{name}.{member.name}: {member}" for name, cls in found.items() for member in cls
           if str(member) != member.value or f"{member}" != member.value or json.dumps([member]) != json.dumps([member.value])]
    assert not bad, bad
