"""A disk that fills up during a run: every run-folder write the orchestrator makes may fail.

The CLI runs with a file size limit (``RLIMIT_FSIZE``: a write past it fails with EFBIG, as one
past a full disk fails with ENOSPC), set below the size its event log reaches, so the log
stops growing part-way while tasks still write their (smaller) outputs.  The run must go on
to its summary, say once that it lost events, and ``-r`` on a disk with room must finish it
with the results of a run that never hit the limit.
"""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
from pathlib import Path

from conftest import REPO, orchestra, summary_cells


def _config(folder: Path) -> Path:
    data = folder / "rows.jsonl"
    folder.mkdir(parents=True, exist_ok=True)
    data.write_text("".join(json.dumps({"question": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n"
                            for i in range(6)))
    cfg = folder / "cfg.py"
    cfg.write_text(f"""
from orchestra.datasets import JsonlDataset
from orchestra.models import DeterministicModel
from orchestra.partitioners import SizePartitioner
from orchestra.runners import LocalRunner

models = [dict(type=DeterministicModel, abbr='m')]
datasets = [dict(type=JsonlDataset, abbr=name, path={str(data)!r},
                 reader_cfg=dict(input_columns=['question'], output_column='answer'),
                 infer_cfg=dict(prompt_template='{{question}}', inferencer=dict(type='gen', max_out_len=8)),
                 eval_cfg=dict(evaluator='numeric_match')) for name in ('a', 'b')]
infer = dict(partitioner=dict(type=SizePartitioner, max_task_size=40, granularity=1),
             runner=dict(type=LocalRunner, max_num_workers=2))
work_dir = {str(folder / 'out')!r}
""")
    return cfg


def _limited(limit: int, *args: str | Path) -> subprocess.CompletedProcess[str]:
    def cap() -> None:  # in the child: every file it (and its tasks) writes stops at ``limit`` bytes
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    # a coverage measurement of this suite could not save its data under the limit either (and says so
    # on stderr): the limited run is left out of it
    env = {k: v for k, v in os.environ.items() if k != "COVERAGE_PROCESS_START"}
    return subprocess.run([sys.executable, "run.py", *map(str, args)], cwd=REPO, capture_output=True, text=True,
                          timeout=180, preexec_fn=cap, env=env)


def test_an_event_log_the_disk_refuses_is_a_warning_and_r_finishes_the_run(tmp_path: Path) -> None:
    ref_cfg = _config(tmp_path / "ref")
    ref = orchestra(ref_cfg)
    assert ref.returncode == 0, ref.stderr
    (ref_run,) = (tmp_path / "ref" / "out").iterdir()
    expected = summary_cells(ref_run)
    assert len(expected) == 2 and {cell[3] for cell in expected} == {"1.0"}
    full = (ref_run / "events.jsonl").stat().st_size
    for part in (4, 2):  # the event log stops at a quarter, then at half, of what the run writes
        folder = tmp_path / f"limit{part}"
        res = _limited(full // part, _config(folder))
        # Before: the loop's next event raised, and the CLI ended the run at once with
        # "orchestra: error:: File too large" (no file named), exit 1, the eval stage not run.
        assert "Traceback" not in res.stderr and "orchestra: error" not in res.stderr, res.stderr
        assert res.returncode in (0, 1), res.stderr
        refused = r"warning: cannot append to .*events\.jsonl: (?:File too large|only \d+ of \d+ bytes written)"
        assert len(re.findall(refused, res.stderr)) == 1, \
            res.stderr
        (run,) = (folder / "out").iterdir()
        # the report (far larger than the log) cannot be written either: a warning naming the file
        assert f"could not write the report: OSError: [Errno 27] File too large: '{run}/summary/report.html'" \
            in res.stderr, res.stderr
        assert (run / "events.jsonl").stat().st_size <= full // part
        again = orchestra(_config(folder), "-r")
        assert again.returncode == 0, again.stderr
        assert summary_cells(run) == expected
        assert (run / "summary" / "report.html").stat().st_size > 1000
