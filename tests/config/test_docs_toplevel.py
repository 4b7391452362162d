"""What the user guide's table of top-level config keys promises, checked through the real CLI."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import run_cli


def test_unknown_top_level_key_lists_every_documented_key(tmp_path: Path) -> None:
    """The one-line error for a misspelt top-level key names every key the user guide's
    table lists, ``prices`` and ``sweep`` included (``prices`` was missing from it)."""
    cfg = tmp_path / "cfg.py"
    cfg.write_text(
        "from orchestra.models import DeterministicModel\n"
        "models = [dict(type=DeterministicModel, abbr='m')]\n"
        "datasets = []\n"
        "price = dict(m=dict(per_request=1.0))\n"  # a typo of 'prices'
    )
    done = run_cli(cfg, "-w", tmp_path / "out", "--dry-run", timeout=60)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "unknown top-level key 'price'" in lines[0]
    valid = lines[0].split("valid keys: ", 1)[1]
    for key in ("models", "datasets", "infer", "eval", "work_dir", "sweep", "prices"):
        assert key in valid.replace(",", " ").split(), (key, lines[0])
