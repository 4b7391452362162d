"""``-r`` of a finished run keeps the report when nothing ran (orchestra/summary/fresh.py), and
rebuilds it when something did, when the prices change, or with ``--mode viz``."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import orchestra


def _config(folder: Path, extra: str = "", name: str = "cfg.py") -> Path:
    data = folder / "arith.jsonl"
    data.write_text("".join(json.dumps({"q": f"What is {i} + 1?", "a": str(i + 1)}) + "\n" for i in range(6)))
    cfg = folder / name
    cfg.write_text(f"""
from orchestra.datasets import JsonlDataset
from orchestra.models import DeterministicModel

models = [dict(type=DeterministicModel, abbr='det')]
datasets = [dict(type=JsonlDataset, abbr='arith', path={str(data)!r},
                 reader_cfg=dict(input_columns=['q'], output_column='a'),
                 infer_cfg=dict(prompt_template='{{q}}', inferencer=dict(type='gen', max_out_len=8)),
                 eval_cfg=dict(evaluator='numeric_match'))]
work_dir = {str(folder / 'out')!r}
{extra}
""")
    return cfg


def _report_state(run: Path) -> tuple[int, bytes]:
    report = run / "summary" / "report.html"
    return report.stat().st_mtime_ns, report.read_bytes()


def test_resume_of_a_finished_run_keeps_the_report_and_rebuilds_it_after_work(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    first = orchestra(cfg)
    assert first.returncode == 0, first.stderr
    (run,) = [p for p in (tmp_path / "out").iterdir() if p.is_dir()]
    written = _report_state(run)
    summary_mtime = (run / "summary" / "summary.csv").stat().st_mtime_ns

    again = orchestra(cfg, "-r")  # every output done: nothing the report draws changed
    assert again.returncode == 0, again.stderr
    assert again.stderr.strip().splitlines()[-1] == f"report: {run / 'summary' / 'report.html'}"
    assert "numeric_match" in again.stdout  # the table is still printed (and written)
    assert (run / "summary" / "summary.csv").stat().st_mtime_ns > summary_mtime
    assert _report_state(run) == written

    (run / "results" / "det" / "arith.json").unlink()  # the eval task runs again: a new report
    redone = orchestra(cfg, "-r")
    assert redone.returncode == 0, redone.stderr
    after_work = _report_state(run)
    assert after_work[0] != written[0]

    priced_cfg = _config(tmp_path, "prices = dict(det=dict(input_per_1m_tokens=1.0, output_per_1m_tokens=2.0))",
                         "priced.py")
    priced = orchestra(priced_cfg, "-r")
    assert priced.returncode == 0, priced.stderr
    assert _report_state(run)[0] != after_work[0]  # other prices: other costs in the report

    kept = _report_state(run)
    viz = orchestra(cfg, "-r", "--mode", "viz")
    assert viz.returncode == 0, viz.stderr
    assert _report_state(run)[0] != kept[0]  # viz always rebuilds


def test_a_damaged_stamp_or_event_line_means_a_rebuild(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    assert orchestra(cfg).returncode == 0
    (run,) = [p for p in (tmp_path / "out").iterdir() if p.is_dir()]
    stamp = run / "summary" / ".report-stamp.json"
    assert json.loads(stamp.read_text())["events_size"] > 0

    stamp.write_text("{not json")
    written = _report_state(run)
    assert orchestra(cfg, "-r").returncode == 0
    rebuilt = _report_state(run)
    assert rebuilt[0] != written[0]

    with open(run / "events.jsonl", "a") as f:
        f.write('{"torn line\n')
    assert orchestra(cfg, "-r").returncode == 0
    assert _report_state(run)[0] != rebuilt[0]
