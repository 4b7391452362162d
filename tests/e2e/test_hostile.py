"""Regressions for the holes a hostile user found (issue 15), each through the real CLI.

Every test here failed on main 5739d93.  Helpers come from ``test_pipeline`` (the same
deterministic-model config on two small datasets).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from test_pipeline import REPO, orchestra, run_dirs, started_since_last_run, write_config


def one_line_error(res: subprocess.CompletedProcess[str], code: int = 2) -> str:
    assert res.returncode == code, res.stderr
    assert "Traceback" not in res.stderr, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    return lines[0]


# -- 1. a damaged prediction file is redone, not trusted --------------------------------------


def test_truncated_prediction_file_is_redone_and_scored(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    assert orchestra(cfg).returncode == 0
    (run,) = run_dirs(tmp_path)
    shard = sorted((run / "predictions" / "det").glob("arith*.jsonl"))[0]
    whole = shard.read_bytes()
    shard.write_bytes(whole[: len(whole) // 2])  # a copy or disk that lost the end of the file
    (run / "results" / "det" / "arith.json").unlink()
    res = orchestra(cfg, "-r")
    assert res.returncode == 0, res.stderr
    assert [t for t in started_since_last_run(run) if t.startswith("infer_")], "the damaged shard must run again"
    assert json.loads((run / "results/det/arith.json").read_text())["metrics"]["numeric_match"] == 1.0


def test_damaged_results_files_are_scored_again_and_nothing_else_runs(tmp_path: Path) -> None:
    """A results file carries its hash in a JSON document; one cut short, one that is JSON but no
    document with keys, and one that is not text at all carry none, so -r scores them again
    (without running inference again) and the table shows the scores."""
    cfg = write_config(tmp_path)
    assert orchestra(cfg).returncode == 0
    (run,) = run_dirs(tmp_path)
    for damage in (lambda b: b[: len(b) // 2], lambda b: b"[1, 2]\n", lambda b: b"\xff\xfe" + b):
        for name in ("arith", "pick"):
            path = run / "results" / "det" / f"{name}.json"
            path.write_bytes(damage(path.read_bytes()))
        res = orchestra(cfg, "-r")
        assert res.returncode == 0, res.stderr
        assert sorted(started_since_last_run(run)) == ["eval_det_arith", "eval_det_pick"]
        assert json.loads((run / "results/det/arith.json").read_text())["metrics"]["numeric_match"] == 1.0
        assert json.loads((run / "results/det/pick.json").read_text())["metrics"]["accuracy"] == 1.0


# -- 2. a torn line in events.jsonl ----------------------------------------------------------------


def test_torn_event_line_breaks_neither_summary_nor_resume(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    assert orchestra(cfg).returncode == 0
    (run,) = run_dirs(tmp_path)
    with open(run / "events.jsonl", "ab") as f:
        f.write(b'{"ts": 1.0, "event": "progr')  # a crash or a full disk mid-append
    res = orchestra(cfg, "--mode", "viz")
    assert res.returncode == 0, res.stderr
    assert "skipped 1 damaged line" in res.stderr
    res = orchestra(cfg, "-r")
    assert res.returncode == 0, res.stderr
    lines = (run / "events.jsonl").read_bytes().splitlines()
    assert lines.count(b'{"ts": 1.0, "event": "progr') == 1  # the torn bytes stay alone on their line
    assert json.loads(lines[-1])["event"] == "run_finished"


# -- 3, 6. work dirs and run folders --------------------------------------------------------------


def test_work_dir_that_is_a_file_is_a_one_line_error(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    (tmp_path / "afile").write_text("x")
    line = one_line_error(orchestra(cfg, "-w", tmp_path / "afile", timeout=30))
    assert "afile" in line and "is a file" in line


def test_reuse_refuses_a_folder_that_is_not_a_run_folder(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    other = tmp_path / "my_documents"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    line = one_line_error(orchestra(cfg, "-r", other))
    assert "not a run folder" in line
    assert sorted(p.name for p in other.iterdir()) == ["notes.txt"]
    assert orchestra(cfg).returncode == 0
    (run,) = run_dirs(tmp_path)
    res = orchestra(cfg, "-r", run)  # a real run folder, by path
    assert res.returncode == 0, res.stderr


# -- 4. file names are injective ------------------------------------------------------------------


def test_abbrs_that_used_to_share_a_file_name_get_their_own(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    text = cfg.read_text().replace("abbr='arith'", "abbr='数学'").replace("abbr='pick'", "abbr='物理'")
    cfg.write_text(text)
    res = orchestra(cfg)
    assert res.returncode == 0, res.stderr
    (run,) = run_dirs(tmp_path)
    files = sorted(p.name for p in (run / "results" / "det").glob("*.json"))
    assert len(files) == 2, files  # both used to be '_.json'
    assert "数学" in res.stdout and "物理" in res.stdout


def test_an_abbr_that_looks_like_another_datasets_shard_is_rejected(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    cfg.write_text(cfg.read_text().replace("abbr='pick'", "abbr='arith_1'"))
    line = one_line_error(orchestra(cfg))
    assert "'arith_1'" in line and "'arith'" in line


# -- 5. --cfg-options keeps what the user typed -----------------------------------------------------


def test_cfg_options_keep_spaces_and_commas(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    template = "Q:  {question} , then answer,  please\nA:"
    res = orchestra(cfg, "--cfg-options", f"datasets.0.infer_cfg.prompt_template={template}", "--dry-run")
    assert res.returncode == 0, res.stderr
    assert orchestra(cfg, "--cfg-options", f"datasets.0.infer_cfg.prompt_template={template}").returncode == 0
    (run,) = run_dirs(tmp_path)
    assert repr(template) in (run / "config.py").read_text()
    pred = (run / "predictions" / "det").glob("arith*.jsonl")
    first = json.loads(next(iter(pred)).read_text().splitlines()[1])
    assert first["prompt"].startswith("Q:  What is") and " , then answer,  please\nA:" in first["prompt"]


def test_cfg_options_bad_literal_is_one_line(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    line = one_line_error(orchestra(cfg, "--cfg-options", "infer.runner.retry=[1,"))
    assert "--cfg-options" in line and "infer.runner.retry" in line


# -- 7. the environment says no ------------------------------------------------------------------------


def test_unwritable_work_dir_is_one_line(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    res = orchestra(cfg, "-w", "/proc/orchestra-cannot-be-here")  # not writable, even for root
    line = one_line_error(res, code=1)
    assert "/proc/orchestra-cannot-be-here" in line


def test_unwritable_cache_dir_is_a_warning_only(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    env = {**os.environ, "ORCHESTRA_CACHE_DIR": "/proc/orchestra-cache"}
    res = subprocess.run([sys.executable, "run.py", str(cfg)], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "warning" in res.stderr and "ORCHESTRA_CACHE_DIR" in res.stderr


def test_invalid_utf8_in_data_names_the_line(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    with open(tmp_path / "data" / "arith.jsonl", "ab") as f:
        f.write(b'{"question": "caf\xe9", "answer": "1"}\n')
    line = one_line_error(orchestra(cfg))
    assert "arith.jsonl:61" in line and "UTF-8" in line


def test_unbalanced_brace_in_prompt_template(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    cfg.write_text(cfg.read_text().replace("prompt_template='Q: {question}", "prompt_template='Q: {question} }"))
    line = one_line_error(orchestra(cfg))
    assert "prompt_template" in line and "brace" in line


# -- 8. config errors found before any task starts ------------------------------------------------------


def test_config_errors_that_used_to_surface_inside_tasks(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    cases = [
        (["datasets.0.infer_cfg.prompt_template=42"], "prompt_template"),
        (["models.0.batch_size=0"], "batch_size"),
        (["datasets.0.infer_cfg.inferencer.type='generate'"], "inferencer.type"),
        (["datasets.0.reader_cfg.test_range='[100:200]'"], "selects no rows"),
    ]
    for options, expected in cases:
        line = one_line_error(orchestra(cfg, "--cfg-options", *options))
        assert expected in line, (options, line)
    assert not run_dirs(tmp_path), "no run folder for a rejected config"


def test_a_column_missing_in_a_later_row_is_found_at_planning(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    with open(tmp_path / "data" / "arith.jsonl", "a") as f:
        f.write(json.dumps({"question": "What is 1 + 1?"}) + "\n")  # no answer
    line = one_line_error(orchestra(cfg))
    assert "'answer'" in line and "row 60" in line


# -- 9, 10, 12. viz, pipes and signals ------------------------------------------------------------------


def test_viz_uses_the_runs_saved_config(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    assert orchestra(cfg).returncode == 0
    cfg.write_text(cfg.read_text().replace("abbr='pick'", "abbr='renamed_since'"))
    res = orchestra(cfg, "--mode", "viz")
    assert res.returncode == 0, res.stderr
    assert "pick" in res.stdout and "renamed_since" not in res.stdout


def test_a_closed_pipe_does_not_turn_a_failed_run_into_success(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, model=", fail_always=True")
    proc = subprocess.Popen([sys.executable, "run.py", str(cfg)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None
    proc.stdout.close()  # `orchestra ... | head -0`: the reader is gone before anything is printed
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err.decode()


def test_sighup_stops_the_run_with_129_and_a_summary(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, model=", delay_s=2.0")
    proc = subprocess.Popen([sys.executable, "run.py", str(cfg)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not list((tmp_path / "out").glob("*/logs/infer/*.log")):
        time.sleep(0.05)
    time.sleep(0.5)
    proc.send_signal(signal.SIGHUP)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 129, err
    assert "SIGHUP received" in err and "run folder:" in err


def test_gpus_as_a_string_and_negative_grace(tmp_path: Path) -> None:
    from orchestra.runners.local.runner import LocalRunner

    assert LocalRunner(gpus="0,1").gpus == ["0", "1"]
    cfg = write_config(tmp_path, runner=", kill_grace_s=-1")
    line = one_line_error(orchestra(cfg))
    assert "kill_grace_s" in line


def test_yaml_syntax_error_names_the_config(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("models:\n  - type: DeterministicModel\n    abbr: a: b\n")
    line = one_line_error(orchestra(bad))
    assert f"{bad}:3" in line and "YAML syntax error" in line


# -- 11. reuse keyed on content ----------------------------------------------------------------------


def test_reuse_follows_content_not_timestamps(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    assert orchestra(cfg).returncode == 0
    (run,) = run_dirs(tmp_path)
    data = tmp_path / "data" / "arith.jsonl"
    text = data.read_text()
    data.unlink()
    data.write_text(text)  # restored: same content, a new inode and mtime
    assert orchestra(cfg, "-r").returncode == 0
    assert started_since_last_run(run) == []
    data.write_text(text.replace('"answer": "3"', '"answer": "4"'))  # same size, other content
    assert orchestra(cfg, "-r").returncode == 0
    redone = started_since_last_run(run)
    assert any(t.startswith("infer_") and "arith" in t for t in redone), redone
    assert not any("pick" in t for t in redone), redone


# -- 13. secrets ----------------------------------------------------------------------------------------


def test_credentials_in_a_url_are_refused(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    cfg.write_text(cfg.read_text() + "\nmodels[0]['path'] = 'https://user:hunter2@example.com/v1'\n")
    line = one_line_error(orchestra(cfg))
    assert "credentials" in line and "hunter2" not in line
    assert not run_dirs(tmp_path)


def test_yaml_python_tags_never_run(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    bad = tmp_path / "evil.yaml"
    bad.write_text(f"work_dir: !!python/object/apply:os.system ['touch {marker}']\nmodels: []\n")
    line = one_line_error(orchestra(bad))
    assert "tag not allowed" in line
    assert not marker.exists()
