"""Typed states read as their string value on every supported Python (3.10 has no enum.StrEnum)."""

import json

from verl_cluster.enums import StrValueEnum
from verl_cluster.lifecycle.up import NodeAction


class Color(StrValueEnum):
    RED = "red"


def test_the_fallback_reads_as_its_value_everywhere():
    assert Color.RED == "red" and "red" == Color.RED
    assert str(Color.RED) == "red" and f"{Color.RED}" == "red" and f"{Color.RED:>5}" == "  red"
    assert json.dumps({"c": Color.RED}) == '{"c": "red"}'
    assert Color("red") is Color.RED


def test_the_states_in_use_read_the_same():
    member = next(iter(NodeAction))
    assert f"{member}" == member.value and json.dumps([member]) == json.dumps([member.value])
