"""The GitHub workflows pass real linters: actionlint (syntax, expressions, runner and action facts) and zizmor
(workflow security: pinned actions, least permissions, no persisted credentials), both installed by the test
extra. The tiers each job selects exist (tests/conftest.py)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.lint

ROOT = Path(os.environ.get("SPOCKWIRE_SOURCE_DIR") or Path(__file__).resolve().parents[1])
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    path = BIN / name
    assert path.is_file(), f"{name} is not installed beside {sys.executable} (the test extra installs it)"
    return str(path)


def test_workflows_exist():
    assert {p.name for p in WORKFLOWS} >= {"ci.yml", "wheels.yml"}


def test_actionlint():
    proc = subprocess.run([_tool("actionlint"), "-no-color", *map(str, WORKFLOWS)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_zizmor():
    proc = subprocess.run([_tool("zizmor"), "--offline", "--no-progress", str(ROOT / ".github" / "workflows")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "No findings" in proc.stdout + proc.stderr


def test_every_tier_a_job_selects_is_defined():
    from tests.conftest import TIER_MARKERS

    known = set(TIER_MARKERS) | {"fast"}
    texts = [p.read_text() for p in WORKFLOWS] + [(ROOT / "pyproject.toml").read_text()]
    found = [expr for text in texts for expr in re.findall(r"""-m\s+['"]([^'"]+)['"]""", text)]
    assert found, "no tier selection found in the workflows and pyproject.toml"
    for text in texts:
        for expr in re.findall(r"""-m\s+['"]([^'"]+)['"]""", text):
            names = set(re.findall(r"[a-z_]+", expr)) - {"not", "and", "or"}
            assert names <= known, (expr, names - known)
