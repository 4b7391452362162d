"""docs/dlc.md's aliyun config file as a newcomer writes it: an unquoted value names the fix."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import run_cli


def test_an_unquoted_value_in_an_aliyun_config_says_to_quote_it(tmp_path: Path) -> None:
    """Shell-style ``key = value`` lines are refused in one line (exit 2) that says the values are
    Python literals to quote; the same file with quoted values plans (``--dry-run``)."""
    cfg = tmp_path / "my.aliyun.cfg"
    cfg.write_text("workspace_id = 12345\nresource_id = quota1\nworker_image = registry/orchestra:1\n")
    done = run_cli("configs/eval_demo.py", "--dlc", "--aliyun-cfg", cfg, "--dry-run", "-w", tmp_path / "out",
                   timeout=60)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert f"{cfg}:3:" in lines[0]  # the line that does not parse
    assert "quote text" in lines[0] and "name = 'value'" in lines[0]

    cfg.write_text("workspace_id = '12345'\nresource_id = 'quota1'\nworker_image = 'registry/orchestra:1'\n")
    done = run_cli("configs/eval_demo.py", "--dlc", "--aliyun-cfg", cfg, "--dry-run", "-w", tmp_path / "out",
                   timeout=60)
    assert done.returncode == 0, done.stderr
    assert "dlc submit" in done.stdout
