"""The per-machine caches of dataset facts (``dataset_info.json``) and file digests
(``file_digests.json``), through the real command line: a cache that cannot be written costs
a warning, and an entry of another shape is read again, never trusted."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.datasets.test_jsonl import jsonl_config
from tests.helpers import jsonl, run_cli, run_dirs


def data(tmp_path: Path) -> Path:
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"question": f"Say {i}", "answer": str(i)}) + "\n" for i in range(3)))
    return path


def test_a_cache_folder_that_cannot_be_made_costs_one_warning(tmp_path: Path) -> None:
    (tmp_path / "a_file").write_text("")
    env = {**os.environ, "ORCHESTRA_CACHE_DIR": str(tmp_path / "a_file" / "cache")}
    res = run_cli(jsonl_config(tmp_path, data(tmp_path)), env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    warnings = [ln for ln in res.stderr.splitlines() if ln.startswith("orchestra: warning: dataset size cache")]
    assert len(warnings) == 1 and "Not a directory" in warnings[0] and "ORCHESTRA_CACHE_DIR" in warnings[0]
    (run,) = run_dirs(tmp_path / "out")
    assert [r["prediction"] for r in jsonl(run / "predictions/m/t.jsonl") if "id" in r] == ["0", "1", "2"]


def test_cache_entries_of_another_shape_are_read_again(tmp_path: Path) -> None:
    """An entry without ``columns`` (another version's, or a hand edit) ended the run with
    ``KeyError: 'columns'``; a digest that is not text was taken as the file's content key."""
    cache = tmp_path / "cache"
    env = {**os.environ, "ORCHESTRA_CACHE_DIR": str(cache)}
    cfg = jsonl_config(tmp_path, data(tmp_path))
    assert run_cli(cfg, env=env).returncode == 0
    infos = json.loads((cache / "dataset_info.json").read_text())
    digests = json.loads((cache / "file_digests.json").read_text())
    (key,) = infos
    good = infos[key]
    for bad in ({"num_rows": 3}, [3], {**good, "num_rows": "3"}, {**good, "columns": "question"}):
        (cache / "dataset_info.json").write_text(json.dumps({key: bad}))
        (cache / "file_digests.json").write_text(json.dumps({stamp: 42 for stamp in digests}))
        res = run_cli(cfg, "--dry-run", env=env)
        assert res.returncode == 0 and "Traceback" not in res.stderr, (bad, res.stderr[-3000:])
        assert "t[0:3]" in res.stdout, res.stdout[-2000:]
    # A real run writes the entry anew, under the same key: the digest was computed again.
    assert run_cli(cfg, env=env).returncode == 0
    assert json.loads((cache / "dataset_info.json").read_text())[key] == good
