"""Every declared requirement of a package with a known vulnerable release excludes that release."""

from pathlib import Path

import pytest
from packaging.requirements import Requirement

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parents[2]
# package -> releases the requirement must not admit (CVE-2023-47248: pyarrow 0.14.0 to 14.0.0 deserialise
# arbitrary Python objects from an IPC or Parquet file)
VULNERABLE = {"pyarrow": ("14.0.0", "13.0.0")}


def requirements() -> list[Requirement]:
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    words = list(doc["dependencies"]) + [w for ws in doc.get("optional-dependencies", {}).values() for w in ws]
    return [Requirement(w) for w in words]


def test_no_requirement_admits_a_vulnerable_release():
    found = [r for r in requirements() if r.name in VULNERABLE]
    assert found, "pyarrow is declared (the data and test extras)"
    for r in found:
        for version in VULNERABLE[r.name]:
            assert not r.specifier.contains(version), f"{r} admits {r.name} {version}"
        assert r.specifier.contains("14.0.1")
