"""The layering of the code, as written in .importlinter and docs/architecture.md, holds.

A wrong arrow (a lower layer importing a higher one, the orchestrator importing an ML
framework, an import cycle between siblings) fails this test and so CI.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_import_contracts_hold() -> None:
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    assert exe, "lint-imports not found: pip install -e '.[test]' installs import-linter"
    res = subprocess.run([exe, "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert "BROKEN" not in res.stdout and "5 kept, 0 broken" in res.stdout
    assert "The runner backends never import each other KEPT" in res.stdout
