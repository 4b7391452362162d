"""``orchestra compare`` on two real runs with planted differences, checked against scipy.

Run B reads the rows from a shuffled file, so a comparison by file order would pair different
questions: every number below is computed from the planted answers per question and must match.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from planted import A_OFF, B_OFF, HOSTILE, REPO, N, Runs, expected_scores, rows, shuffled
from scipy import stats as sps
from statsmodels.stats.multitest import multipletests


def _doc(runs: Runs, *extra: str) -> dict:
    proc = runs.compare(runs.a, runs.b, "--json", *extra)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _test(doc: dict, dataset: str) -> dict:
    (t,) = [t for t in doc["tests"] if t["dataset"] == dataset]
    return t


def test_sample_ids_differ_between_the_runs_and_keys_align_them(runs: Runs) -> None:
    """The shuffled file gives B other ids for the same questions; details carry the same keys."""
    def by_question(run):
        prompts = {}
        for path in sorted((run / "predictions" / "planted").glob("sums*.jsonl")):
            for line in path.read_text().splitlines()[1:]:
                rec = json.loads(line)
                prompts[rec["id"]] = rec["prompt"].split(":")[0]
        details = [json.loads(x) for x in (run / "results" / "planted" / "sums.details.jsonl").read_text().splitlines()]
        return {prompts[d["id"]]: (d["id"], d["key"], d["prompt_sha"]) for d in details}

    a, b = by_question(runs.a), by_question(runs.b)
    assert a.keys() == b.keys() and len(a) == N
    assert sum(a[q][0] != b[q][0] for q in a) > N // 2  # ids moved
    assert all(a[q][1:] == b[q][1:] for q in a)  # key and prompt digest did not
    assert len({v[1] for v in a.values()}) == N


def test_binary_scores_mcnemar_exact_as_scipy(runs: Runs) -> None:
    doc = _doc(runs)
    t = _test(doc, "sums")
    a, _ = expected_scores(A_OFF)
    b, _ = expected_scores(B_OFF)
    fixed = sum(1 for x, y in zip(a, b) if y > x)
    broken = sum(1 for x, y in zip(a, b) if y < x)
    assert (fixed, broken) == (20, 31)  # questions 0-19 fixed; 30-59 and 150 broken
    assert t["test"] == "mcnemar-exact" and t["n"] == N
    assert (t["fixed"], t["broken"]) == (fixed, broken)
    assert t["a"]["value"] == pytest.approx(sum(a) / N) and t["b"]["value"] == pytest.approx(sum(b) / N)
    assert t["diff"] == pytest.approx((sum(b) - sum(a)) / N)
    assert t["p_value"] == pytest.approx(sps.binomtest(min(fixed, broken), fixed + broken, 0.5).pvalue, rel=1e-9)
    d = [y - x for x, y in zip(a, b)]
    half = sps.t.ppf(0.975, N - 1) * sps.sem(d)
    assert t["ci"] == pytest.approx([t["diff"] - half, t["diff"] + half], rel=1e-6)
    z = sps.norm.ppf(0.975) + sps.norm.ppf(0.80)  # 2.80
    assert t["mde"] == pytest.approx(z * math.sqrt((fixed + broken) / N / N))
    assert t["a"]["stderr"] == pytest.approx(sps.sem(a))


def test_fractional_scores_paired_t_as_scipy_and_holm_over_both(runs: Runs) -> None:
    doc = _doc(runs)
    t = _test(doc, "near")
    _, a = expected_scores(A_OFF)
    _, b = expected_scores(B_OFF)
    ref = sps.ttest_rel(b, a)
    assert t["test"] == "paired-t" and t["fixed"] is None
    assert t["diff"] == pytest.approx(sum(b) / N - sum(a) / N)
    assert t["p_value"] == pytest.approx(ref.pvalue, rel=1e-6)
    ci = ref.confidence_interval(0.95)
    assert t["ci"] == pytest.approx([ci.low, ci.high], rel=1e-6)
    assert doc["holm"] == {"tests": 2}
    ps = [x["p_value"] for x in doc["tests"]]
    holm = multipletests(ps, method="holm")[1]
    assert [x["p_holm"] for x in doc["tests"]] == pytest.approx(list(holm))


def test_text_output_states_numbers_method_and_power(runs: Runs) -> None:
    doc = _doc(runs)
    proc = runs.compare(runs.a, runs.b)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    sums = _test(doc, "sums")
    row = next(line for line in out.splitlines() if line.startswith("sums "))
    assert f"{sums['diff']:+.3f} [{sums['ci'][0]:+.3f}, {sums['ci'][1]:+.3f}]" in row
    assert f"+{sums['fixed']}/-{sums['broken']}" in row and f"{sums['mde']:.3f}" in row
    assert f"{sums['p_value']:.3f}" in row and f"{sums['p_holm']:.3f}" in row
    prose = " ".join(out.split("diff: ", 1)[1].split())  # the notes, wrapped to the terminal
    assert "McNemar's exact test" in prose and "paired t-test" in prose
    assert "Holm's correction over the 2 test(s)" in prose
    assert f"power: sums: n = {N}: smallest detectable difference (80% power, 5% significance): numeric_match " \
           f"{sums['mde']:.3f}" in out
    assert "\x1b" not in out and "flips" not in out.split("diff:")[1]  # no --flips: no listing


def test_flips_list_changed_samples_with_escaped_hostile_answers(runs: Runs) -> None:
    proc = runs.compare(runs.a, runs.b, "--flips", "100")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "\x1b" not in out and "\x07" not in out
    assert "\\x1b[H\\x1b[J\\x07<img" in out  # shown, escaped
    listed = [line for line in out.splitlines() if line.startswith("  sums / planted  key ")]
    assert len(listed) == 51  # every flip of sums: 20 fixed + 31 broken
    doc = _doc(runs, "--flips", "3")
    flips = [f for f in doc["flips"] if f["dataset"] == "sums"]
    b_ids = {row["q"].split(":")[0]: i for i, row in enumerate(shuffled(rows()))}
    assert len(flips) == 3
    for f in flips:
        q = int(f["prompt"].split(":")[0][1:])
        assert f["prompt"].startswith(f"q{q}: What is ")
        assert f["scores_a"]["numeric_match"] == expected_scores(A_OFF)[0][q]
        assert f["scores_b"]["numeric_match"] == expected_scores(B_OFF)[0][q]
        assert (f["id_a"], f["id_b"]) == (q, b_ids[f"q{q}"])  # each run's own row index
    hostile = [f for f in _doc(runs, "--flips", "100")["flips"] if f["answer_b"] == HOSTILE]
    assert len(hostile) == 2  # q150 in sums and in near: the JSON keeps the answer as it was


def test_python_api_gives_the_same_comparison(runs: Runs) -> None:
    import orchestra

    cmp = orchestra.compare([str(runs.a), str(runs.b)])
    again = orchestra.compare([str(runs.a), str(runs.b)])  # the package stays callable
    doc = _doc(runs)
    assert [t.paired.p_holm for t in cmp.tests] == pytest.approx([t["p_holm"] for t in doc["tests"]])
    assert [t.paired.diff for t in again.tests] == pytest.approx([t["diff"] for t in doc["tests"]])


def test_a_changed_prompt_is_refused_or_left_out_with_allow_changed(runs: Runs) -> None:
    changed = runs.make("changed", B_OFF, data=runs.root / "shuffled.jsonl", near_template="Q: {q}\nA:")
    proc = runs.compare(runs.a, changed)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert f"{N} sample(s) were sent a different prompt" in proc.stderr and "(near: 200)" in proc.stderr
    assert "--allow-changed" in proc.stderr
    proc = runs.compare(runs.a, changed, "--allow-changed", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["allow_changed"] is True
    assert [t["dataset"] for t in doc["tests"]] == ["sums"]
    assert _test(doc, "sums")["p_value"] == pytest.approx(_test(_doc(runs), "sums")["p_value"])
    left = {x["dataset"]: x for x in doc["left_out"]}
    assert left["near"]["changed_prompt"] == N and left["sums"]["changed_prompt"] == 0
    text = runs.compare(runs.a, changed, "--allow-changed").stdout
    assert f"left out: near / planted: {N} sample(s) with a changed prompt left out (--allow-changed)" in text
    assert "not compared: near / planted / closeness: no sample in common" in text


def _one_line_usage_error(proc, *expected: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    for text in expected:
        assert text in proc.stderr, proc.stderr


def test_bad_input_is_one_line_and_exit_2(runs: Runs, tmp_path) -> None:
    _one_line_usage_error(runs.compare(runs.a), "at least two run folders")
    _one_line_usage_error(runs.compare(runs.a, tmp_path), "not a run folder of orchestra")
    _one_line_usage_error(runs.compare(runs.a, tmp_path / "nope"), "not a folder")
    _one_line_usage_error(runs.compare(runs.a, runs.b, "--flips", "-1"), "--flips -1")
    infer_only = runs.make("infer_only", B_OFF, mode="infer")
    _one_line_usage_error(runs.compare(runs.a, infer_only), "the run has no results")
    other_metric = runs.make("other_metric", B_OFF, sums_evaluator="exact_match")
    _one_line_usage_error(runs.compare(runs.a, other_metric), "sums / planted: metric", "is missing in the")


def _copy(run, to):
    import shutil

    shutil.copytree(run, to)
    return to


def test_a_run_without_sample_keys_or_with_nan_scores_is_refused(runs: Runs, tmp_path) -> None:
    old = _copy(runs.b, tmp_path / "old")
    details = old / "results" / "planted" / "sums.details.jsonl"
    rows = [json.loads(x) for x in details.read_text().splitlines()]
    details.write_text("".join(json.dumps({k: v for k, v in r.items() if k not in ("key", "prompt_sha")}) + "\n"
                               for r in rows))
    _one_line_usage_error(runs.compare(runs.a, old), "sums.details.jsonl has no sample keys", "--mode eval")
    nan = _copy(runs.b, tmp_path / "nan")
    details = nan / "results" / "planted" / "near.details.jsonl"
    rows = [json.loads(x) for x in details.read_text().splitlines()]
    rows[5]["closeness"] = rows[5]["scores"]["closeness"] = math.nan  # an evaluator of the user's that gave NaN
    details.write_text("".join(json.dumps(r) + "\n" for r in rows))
    _one_line_usage_error(runs.compare(runs.a, nan), "near / planted / closeness: 1 sample score(s) are NaN")


def test_three_runs_each_against_the_first(runs: Runs) -> None:
    proc = runs.compare(runs.a, runs.b, runs.a, "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert [(t["run"], t["dataset"]) for t in doc["tests"]] == [(1, "near"), (1, "sums"), (2, "near"), (2, "sums")]
    same = [t for t in doc["tests"] if t["run"] == 2]
    assert all(t["diff"] == 0 and t["fixed"] in (0, None) for t in same)
    assert doc["holm"] == {"tests": 4}


def test_dry_run_states_the_power_per_dataset(runs: Runs) -> None:
    import subprocess
    import sys

    from planted import REPO

    cfg = runs.config("plan", A_OFF, data=runs.root / "rows.jsonl")
    proc = subprocess.run([sys.executable, "run.py", str(cfg), "--dry-run"], cwd=REPO, env=runs.env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    mde = (sps.norm.ppf(0.975) + sps.norm.ppf(0.80)) * math.sqrt(0.25 / N)
    assert "[power] the smallest difference each dataset's n samples can detect at 80% power and 5% significance" \
        in proc.stdout
    assert f"  near  n = {N}: {mde:.3f}" in proc.stdout and f"  sums  n = {N}: {mde:.3f}" in proc.stdout


def test_docs_name_every_json_field(runs: Runs) -> None:
    """docs/compare.md's ``--json`` table names every field the document has."""
    import re

    from planted import REPO

    doc = _doc(runs, "--flips", "1")
    page = (REPO / "docs" / "compare.md").read_text()
    table = page.split("## `--json`", 1)[1].split("\n## ", 1)[0]
    named = {part for name in re.findall(r"`([a-z_.\[\]]+)`", table) for part in name.replace("[]", "").split(".")}
    fields = set(doc) | set(doc["holm"]) | {k for t in doc["tests"] for k in t} | set(doc["tests"][0]["a"]) \
        | {k for x in doc["left_out"] for k in x} | {k for f in doc["flips"] for k in f}
    assert fields - {"tests", "flips", "left_out", "not_compared"} <= named, fields - named


def test_one_model_each_meets_whatever_its_abbr(runs: Runs) -> None:
    """Checkpoint A's run and checkpoint B's, each of one model under its own name."""
    other = runs.make("other_abbr", B_OFF, data=runs.root / "shuffled.jsonl", abbr="ckpt-b")
    proc = runs.compare(runs.a, other, "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert {(t["model"], t["model_b"]) for t in doc["tests"]} == {("planted", "ckpt-b")}
    assert [t["p_value"] for t in doc["tests"]] == pytest.approx([t["p_value"] for t in _doc(runs)["tests"]])
    text = runs.compare(runs.a, other).stdout
    assert "sums     planted -> ckpt-b  numeric_match" in text


def test_help_and_usage_errors_are_short(runs: Runs) -> None:
    proc = runs.compare("-h")
    assert proc.returncode == 0 and "--allow-changed" in proc.stdout and "--flips N" in proc.stdout
    _one_line_usage_error(runs.compare(), "the following arguments are required: RUN")
    _one_line_usage_error(runs.compare(runs.a, runs.b, "--flips", "x"), "--flips: invalid int value")


def test_samples_only_one_run_has_are_left_out_and_counted(runs: Runs) -> None:
    """Run B on a data file that lost its first 50 rows and gained 10 new ones: 150 aligned."""
    data = rows()
    extra = [{"q": f"q{N + i}: What is {i} + {i}?", "answer": str(2 * i)} for i in range(10)]
    (runs.root / "cut.jsonl").write_text("".join(json.dumps(r) + "\n" for r in shuffled(data[50:] + extra)))
    cut = runs.make("cut", B_OFF, data=runs.root / "cut.jsonl")
    proc = runs.compare(runs.a, cut, "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    left = {x["dataset"]: x for x in doc["left_out"]}
    assert left["sums"] == {"run": 1, "dataset": "sums", "model": "planted", "aligned": 150, "changed_prompt": 0,
                            "only_a": 50, "only_b": 10}
    a, _ = expected_scores(A_OFF)
    b, _ = expected_scores(B_OFF)
    t = _test(doc, "sums")
    fixed = sum(1 for x, y in zip(a[50:], b[50:]) if y > x)
    broken = sum(1 for x, y in zip(a[50:], b[50:]) if y < x)
    assert (t["n"], t["fixed"], t["broken"]) == (150, fixed, broken) == (150, 0, 11)
    assert t["p_value"] == pytest.approx(sps.binomtest(0, 11, 0.5).pvalue)
    assert "left out: sums / planted: 50 only in A; 10 only in B" in runs.compare(runs.a, cut).stdout


def test_a_stale_result_is_not_compared_as_the_runs(runs: Runs, tmp_path) -> None:
    """Run B, then its config changed (the ``near`` prompt) and ``-r --mode infer`` made near's
    predictions again without scoring them: results/planted/near.json still holds the old
    scores, which the run's own table no longer shows.  ``compare`` used to show them as B's
    (n = 200, exit 0); it now leaves near out, says why, and compares sums."""
    stale = runs.make("stale", B_OFF)
    cfg = runs.config("stale", B_OFF, data=runs.root / "rows.jsonl", near_template="{q}\\nAnswer:")
    proc = subprocess.run([sys.executable, "run.py", str(cfg), "-r", "--mode", "infer"], cwd=REPO, env=runs.env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = runs.compare(runs.a, stale, "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert [t["dataset"] for t in doc["tests"]] == ["sums"]
    (note,) = doc["not_compared"]
    assert (note["dataset"], note["model"], note["metric"]) == ("near", "planted", None)
    assert "stale" in note["why"] and "predictions/planted/near.jsonl" in note["why"] and "--mode eval" in note["why"]
    assert "not compared: near / planted: run 2: stale" in runs.compare(runs.a, stale).stdout
    # a results file from before results recorded their inputs: the eval task spec of it says
    old = _copy(stale, tmp_path / "old")
    near = old / "results" / "planted" / "near.json"
    near.write_text(json.dumps({k: v for k, v in json.loads(near.read_text()).items() if k != "inputs"}))
    doc = json.loads(runs.compare(runs.a, old, "--json").stdout)
    assert [t["dataset"] for t in doc["tests"]] == ["sums"] and "stale" in doc["not_compared"][0]["why"]
    # nothing but stale results left to compare: one line, exit 2
    (old / "results" / "planted" / "sums.json").unlink()
    _one_line_usage_error(runs.compare(runs.a, old), "nothing to compare: near / planted: run 2: stale")


def test_a_result_only_one_run_has_is_named_not_dropped(runs: Runs, tmp_path) -> None:
    """A dataset whose eval failed in run B (no results file) used to vanish from the comparison
    without a word; it is now listed as not compared."""
    failed = _copy(runs.b, tmp_path / "failed")
    (failed / "results" / "planted" / "near.json").unlink()
    proc = runs.compare(runs.a, failed, "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert [t["dataset"] for t in doc["tests"]] == ["sums"]
    assert [(n["dataset"], n["why"]) for n in doc["not_compared"]] == [
        ("near", "no result in run 2 (its eval failed or did not run)")]


def test_a_hostile_run_folder_is_read_only_inside_itself_and_never_hangs(runs: Runs, tmp_path) -> None:
    """A colleague's run folder may have been made to attack ``compare``: results naming prediction
    files outside it (absolute, ``..``, a link out of it, a FIFO, a name too long or no file name at
    all), a results file or a details file that is a FIFO or a link out.  compare reads only
    regular files inside the run folder: it used to follow the links (near, made of links to
    faithful copies outside, was compared as the run's) and to block for ever opening a FIFO."""
    import os

    hostile = _copy(runs.b, tmp_path / "hostile")
    outside = tmp_path / "outside"
    outside.mkdir()
    os.mkfifo(outside / "fifo")
    preds, results = hostile / "predictions" / "planted", hostile / "results" / "planted"
    near_preds = sorted(p for p in preds.glob("near*.jsonl"))
    assert near_preds
    for p in near_preds:  # the files near's results scored, now links to copies outside the folder
        (outside / p.name).write_bytes(p.read_bytes())
        p.unlink()
        p.symlink_to(outside / p.name)
    os.mkfifo(preds / "fifo.jsonl")
    (preds / "to_fifo.jsonl").symlink_to(outside / "fifo")
    near = json.loads((results / "near.json").read_text())
    near["inputs"] = [["/etc/passwd", "x"], ["../../../etc/passwd", "x"], "junk", [1, 2], ["a", "b", "c"],
                      *near["inputs"]]
    (results / "near.json").write_text(json.dumps(near))
    sums_inputs = json.loads((results / "sums.json").read_text())["inputs"]
    planted = [[["predictions/planted/fifo.jsonl", "h"]], [["predictions/planted/to_fifo.jsonl", "h"]],
               [["x" * 100_000, "h"]], [["predictions/planted/\ud800.jsonl", "h"]],
               [["predictions/planted/\udcff\x00", "h"]], [sums_inputs[0]] * 100_000]  # the last: one file, often
    for i, inputs in enumerate(planted):  # one results file each, so that every entry is looked at
        (results / f"extra{i}.json").write_text(json.dumps({**near, "dataset": f"extra{i}", "inputs": inputs}))
        (results / f"extra{i}.details.jsonl").write_bytes((results / "near.details.jsonl").read_bytes())
    os.mkfifo(results / "fifo.json")  # a results file that is a FIFO, and an eval task spec
    os.mkfifo(hostile / "tasks" / "eval_fifo.py")
    (results / "passwd.json").symlink_to("/etc/passwd")
    proc = runs.compare(runs.a, hostile, "--json", timeout=60)  # before: blocked for ever on the first FIFO
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    doc = json.loads(proc.stdout)
    assert [t["dataset"] for t in doc["tests"]] == ["sums"]
    why = {n["dataset"]: n["why"] for n in doc["not_compared"]}
    assert "not a whole prediction file of the run folder" in why["near"], why  # before: near was compared
    assert set(why) == {"near", *(f"extra{i}" for i in range(len(planted)))}, why
    # the details of sums: a link to a FIFO outside; one line, exit 2, no hang
    (results / "sums.details.jsonl").unlink()
    (results / "sums.details.jsonl").symlink_to(outside / "fifo")
    _one_line_usage_error(runs.compare(runs.a, hostile, timeout=60), "sums.details.jsonl is missing (or not a file")


def test_names_from_a_hostile_run_folder_stay_on_one_escaped_line(runs: Runs, tmp_path) -> None:
    """Model and dataset names come from the results files of a run folder: a name with a line
    break and terminal escapes used to print a second, made-up line in compare's one-line error
    (the escapes were removed, the line break kept); the text and JSON outputs escaped them already."""
    from orchestra.paths import safe_name

    hostile = _copy(runs.b, tmp_path / "hostile")
    evil = "near\n\x1b[2Jsums / planted: no difference\x07"
    results = hostile / "results" / "planted"
    doc = json.loads((results / "near.json").read_text())
    (results / "near.json").write_text(json.dumps({**doc, "dataset": evil}))
    rows = [json.loads(x) for x in (results / "near.details.jsonl").read_text().splitlines()]
    rows[5]["closeness"] = rows[5]["scores"]["closeness"] = math.nan  # a refusal that names the dataset
    (results / f"{safe_name(evil)}.details.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = runs.compare(runs.a, hostile)
    _one_line_usage_error(proc, "near\\n\\x1b[2Jsums / planted: no difference\\x07 / planted / closeness: 1 sample")
    rows[5]["closeness"] = rows[5]["scores"]["closeness"] = 0.0
    (results / f"{safe_name(evil)}.details.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = runs.compare(runs.a, hostile)  # the table and the not-compared lines (held before)
    assert proc.returncode == 0, proc.stderr
    (line,) = [x for x in proc.stdout.splitlines() if "no difference" in x]
    assert line.startswith("not compared: near\\n\\x1b[2Jsums / planted: no difference\\x07 / planted"), line
    assert "\x1b" not in proc.stdout and "\x07" not in proc.stdout
    assert "\x1b" not in proc.stderr and "\x07" not in proc.stderr
