"""scripts/ keeps what users run at its top and the rest in bench/, calibration/ and gpu/ (scripts/README.md names
each); every `scripts/...` path the docs, code and tests mention is a file that exists (a move updates them all)."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"
USERS_RUN = {"setup.sh", "quickstart.sh", "test.sh", "prepare_gsm8k.py", "make_tiny_model.py", "plan_factors.py",
             "verl_recipe_to_spec.py", "README.md"}


def tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    if out.returncode != 0:  # not a git checkout (a source tarball): the files on disk
        return [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file() and ".git" not in p.parts]
    return out.stdout.split()


def test_the_top_of_scripts_is_what_users_run():
    top = {p.name for p in SCRIPTS.iterdir() if p.is_file()}
    assert top == USERS_RUN
    assert {p.name for p in SCRIPTS.iterdir() if p.is_dir() and p.name != "__pycache__"} == {
        "bench", "calibration", "gpu"}


def test_a_readme_names_every_script():
    """Each script is named in scripts/README.md or its folder's README, by name or by a `prefix_*` pattern there."""
    missing = []
    for p in SCRIPTS.rglob("*"):
        if not p.is_file() or p.suffix not in (".py", ".sh") or "__pycache__" in p.parts:
            continue
        text = (SCRIPTS / "README.md").read_text() + ((p.parent / "README.md").read_text() if p.parent != SCRIPTS
                                                      and (p.parent / "README.md").exists() else "")
        globs = re.findall(r"`(\w+_)\*\.(?:py|sh)`", text)
        if f"`{p.name}`" not in text and not any(p.name.startswith(g) for g in globs):
            missing.append(str(p.relative_to(SCRIPTS)))
    assert not missing, missing


def test_every_scripts_path_mentioned_exists():
    bad = {}
    for f in tracked():
        if f.startswith("tests/fixtures/") or not (ROOT / f).is_file():
            continue
        try:
            text = (ROOT / f).read_text()
        except (UnicodeDecodeError, OSError):
            continue
        for m in re.finditer(r"(?<![\w/.])scripts/[\w./-]*\w(?![\w*])", text):
            if not (ROOT / m.group(0)).exists():
                bad.setdefault(m.group(0), f)
    assert not bad, bad
