"""The documentation site builds without a warning: `mkdocs build --strict` over mkdocs.yml (the Material theme,
mkdocstrings' API reference from the docstrings and the .pyi stubs), so a broken link, a missing page or anchor, or
an API name the reference cannot find fails here. The README's links and images lead somewhere."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

# the source tree's documents: a check of the checkout, not of an installed wheel
pytestmark = pytest.mark.lint

ROOT = Path(os.environ.get("SPOCKWIRE_SOURCE_DIR") or Path(__file__).resolve().parents[1])


def test_mkdocs_build_strict(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(ROOT / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    warnings = [line for line in output.splitlines() if re.match(r"\s*(WARNING|ERROR)\b", line)]
    assert not warnings, "\n".join(warnings)
    # the API reference was generated, from the stubs too (Decoder is described only by wire/_decoder.pyi)
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    ids = set(re.findall(r'id="([\w.]+)"', api))
    for name in ("Decoder.feed_frames", "Decoder.drain", "CopyBinaryDecoder.feed", "spockwire.connect",
                 "spockwire.read_table", "spockwire.ChangeBatch.to_arrow"):
        assert any(i == name or i.endswith("." + name) for i in ids), name


def test_readme_links_and_images_exist():
    """README.md is not part of the site: its links into the docs and its pictures are checked here."""
    readme = (ROOT / "README.md").read_text()
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", readme)
    assert any(p.endswith("flow.svg") for p in images) and any("bench_" in p for p in images), \
        "README.md shows the flow and the headline benchmark chart"
    links = [link for link in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme) if "://" not in link]
    missing = [p for p in links if not (ROOT / p).exists()]
    assert not missing, missing
