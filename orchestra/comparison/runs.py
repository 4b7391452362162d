"""A run folder read back for comparison: each (model, dataset)'s metrics and per-sample scores.

Reads only data files (``results/<model>/<dataset>.json`` and ``.details.jsonl``, and the
prediction files for the prompt excerpts of flips); nothing of a run folder is executed, so a
colleague's run can be compared as safely as one's own.  Only regular files inside the run
folder are read (:func:`read_in`): a path a results file names, or a link, that leads out of it
is not followed, and a FIFO or a device is never opened for reading (it could block for ever or
never end).  Every refusal is a :class:`~orchestra.errors.UserError`: one line at the CLI, exit 2.
"""

from __future__ import annotations

import glob
import json
import math
import os
import re
import stat
from dataclasses import dataclass, field
from typing import Any

from orchestra.errors import UserError
from orchestra.fileio import json_lines, parse_sealed
from orchestra.paths import RUN_MARKER, RunPaths
from orchestra.requests import prompt_text
from orchestra.tasks.spec import TaskSpec

_PASS_AT = re.compile(r"pass@(\d+)")
#: the longest path a results file may name (the usual PATH_MAX); a longer one is not looked at
MAX_PATH = 4096


def read_in(root: str, path: str) -> bytes | None:
    """The content of ``path`` if it is a regular file inside the run folder ``root`` (where links
    lead), else None: a path or link out of the folder, a FIFO, a device, a socket, nothing there.
    Opened without blocking, so a FIFO planted in a run folder never hangs the reader."""
    try:
        if len(path) > MAX_PATH:
            return None
        real_root, real = os.path.realpath(root), os.path.realpath(os.path.join(root, path))
        if os.path.commonpath([real_root, real]) != real_root:
            return None
        fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except (OSError, ValueError):  # ValueError: a NUL byte, a lone surrogate that is no file name
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read()
    except OSError:
        return None
    finally:
        os.close(fd)


def _sealed_hash(root: str, path: str) -> str | None:
    """The content hash of the sealed prediction file ``path`` of the run folder ``root``, or None."""
    blob = read_in(root, path)
    sealed = parse_sealed(blob) if blob is not None else None
    return sealed[0].get("hash") if sealed is not None else None


@dataclass(frozen=True)
class Sample:
    """One scored sample of one (model, dataset) of a run."""

    key: str  # the sample key: the row's content (what aligns runs)
    id: int | None  # the sample id in this run (its row index there)
    prompt_sha: str | None  # digest of what the model was sent
    prediction: Any
    scores: dict[str, float]  # metric -> this sample's score (only metrics that are per-sample means)
    choices_sha: str | None = None  # log-likelihood samples: digest of the continuations scored

    def sent_differently(self, other: Sample) -> bool:
        """Whether ``other`` (the same row in another run) was sent another prompt, or other
        answer choices (only where both runs recorded them: runs from before ``choices_sha``
        still meet)."""
        if self.prompt_sha != other.prompt_sha:
            return True
        return self.choices_sha is not None and other.choices_sha is not None and self.choices_sha != other.choices_sha


@dataclass
class Scored:
    """One (model, dataset) of a run: its metrics, which of them have per-sample scores, its samples."""

    root: str  # the run folder
    model: str
    dataset: str
    metrics: dict[str, float]  # as results/<model>/<dataset>.json has them
    samples: dict[str, Sample] = field(default_factory=dict)  # by key
    #: metric -> why it has no per-sample scores (a corpus metric, a judge's per-turn mean, ...)
    no_scores: dict[str, str] = field(default_factory=dict)


@dataclass
class RunScores:
    """What a run folder holds for comparison."""

    root: str
    scored: dict[tuple[str, str], Scored]  # (dataset, model) -> its scores
    #: (dataset, model) -> why its results file is not this run's result any more (stale)
    stale: dict[tuple[str, str], str] = field(default_factory=dict)

    def models(self) -> list[str]:
        return sorted({m for _, m in self.scored} | {m for _, m in self.stale})


def load_run(root: str) -> RunScores:
    """The results of the run folder ``root``, checked: a run folder, with results, each with
    sample keys and no NaN score."""
    if not os.path.isdir(root):
        raise UserError(f"{root}: not a folder (give run folders: <work_dir>/<timestamp>)")
    paths = RunPaths(os.path.abspath(root))
    if not os.path.isfile(paths.marker) and not os.path.isfile(paths.config):
        raise UserError(f"{root}: not a run folder of orchestra (no {RUN_MARKER} marker or config.py)")
    files = sorted(f for f in glob.glob(os.path.join(paths.root, "results", "*", "*.json")))
    scored: dict[tuple[str, str], Scored] = {}
    stale: dict[tuple[str, str], str] = {}
    planned = _planned(paths)
    hashes: dict[str, str | None] = {}  # prediction file -> its hash (read once, however often named)
    for path in files:
        got = _read_results(paths.root, path)
        if got is None:
            continue
        model, dataset, metrics, doc = got
        why = _stale(paths, os.path.relpath(path, paths.root), doc, planned, hashes)
        if why:
            stale[(dataset, model)] = why
            continue
        details_path = paths.details(model, dataset)
        details = read_in(paths.root, details_path)
        if details is None:
            raise UserError(f"{root}: {os.path.relpath(details_path, paths.root)} is missing (or not a file of "
                            "the run folder): the per-sample scores of that result (score it again: --mode eval)")
        scored[(dataset, model)] = _scored(paths.root, model, dataset, metrics, json_lines(details),
                                           os.path.relpath(details_path, paths.root))
    if not scored and not stale:
        raise UserError(f"{root}: the run has no results (results/<model>/<dataset>.json); did its eval stage run?")
    return RunScores(paths.root, scored, stale)


def _planned(paths: RunPaths) -> dict[str, tuple[str, list[tuple[str, str]]]]:
    """What the run's eval task specs (``tasks/eval_*.py``, read as data, never run) say each
    result scores: results path -> (its hash, the prediction files and hashes it scores), paths
    relative to the run folder (which may have been copied or moved).  For results written
    before they recorded their ``inputs``."""
    out: dict[str, tuple[str, list[tuple[str, str]]]] = {}
    for spec_path in sorted(glob.glob(os.path.join(glob.escape(paths.root), "tasks", "eval_*.py"))):
        blob = read_in(paths.root, spec_path)
        try:
            spec = TaskSpec.parse(blob.decode("utf-8")) if blob is not None else None
        except (ValueError, SyntaxError):  # UnicodeDecodeError is a ValueError
            continue
        if spec is None:
            continue
        for unit in spec.units:
            out[os.path.relpath(unit.output, spec.run_dir)] = (
                unit.hash, [(os.path.relpath(p, spec.run_dir), h) for p, h in unit.inputs])
    return out


def _stale(paths: RunPaths, rel: str, doc: dict[str, Any],
           planned: dict[str, tuple[str, list[tuple[str, str]]]], hashes: dict[str, str | None]) -> str:
    """Why the results file ``rel`` (its JSON ``doc``) is no longer the run's result: the
    predictions it scored were made again since (a changed config or data file, then ``-r
    --mode infer``, or an eval of the new predictions that did not finish); '' when they are
    the ones in the folder, or when nothing says which it scored."""
    inputs = doc.get("inputs")
    if not isinstance(inputs, list):  # written before results recorded them: the spec of this very result
        spec = planned.get(rel)
        inputs = spec[1] if spec is not None and spec[0] == doc.get("hash") else []
    for item in inputs:
        if not (isinstance(item, (list, tuple)) and len(item) == 2 and all(isinstance(x, str) for x in item)):
            continue
        pred, digest = item
        if len(pred) > MAX_PATH or os.path.isabs(pred) or ".." in pred.split(os.sep):
            continue  # not a file of this run folder
        if pred not in hashes:
            hashes[pred] = _sealed_hash(paths.root, pred)  # None: missing, or not a regular file in the folder
        if hashes[pred] is None:
            return (f"stale: its predictions ({pred[:200]!r}) are not a whole prediction file of the run folder "
                    f"(missing, damaged, or not a regular file in it: a link out of it, a FIFO); score it again: "
                    f"-r <timestamp> --mode eval with the run's config ({rel})")
        if hashes[pred] != digest:
            return (f"stale: its predictions ({pred}) were made again since it was scored; score it again: "
                    f"-r <timestamp> --mode eval with the run's config ({rel})")
    return ""


def _read_results(root: str, path: str) -> tuple[str, str, dict[str, float], dict[str, Any]] | None:
    """A results file's model, dataset, numeric metrics and whole document; None for a file
    that is not one (or not a regular file of the run folder ``root``)."""
    blob = read_in(root, path)
    try:
        doc = json.loads(blob) if blob is not None else None
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("metrics"), dict):
        return None
    model, dataset = doc.get("model"), doc.get("dataset")
    if not isinstance(model, str) or not isinstance(dataset, str):
        return None
    metrics = {str(k): float(v) for k, v in doc["metrics"].items()
               if isinstance(v, (int, float)) and not isinstance(v, bool) and "_stderr" not in str(k)}
    return model, dataset, metrics, doc


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    return None


def _pass_at(k: int, row: dict[str, Any]) -> float | None:
    """pass@k of one sample from its ``n`` programs and ``num_passed`` (as ``code_exec`` aggregates)."""
    from orchestra.evaluators.code import pass_at_k

    n, c = row.get("n"), row.get("num_passed", 0)
    if not isinstance(n, int) or not isinstance(c, int):
        return 0.0 if "prediction_error" in row or "error" in row else None
    n = max(n, 1)
    return pass_at_k(n, min(max(c, 0), n), k) if k <= n else None


def metric_scores(metric: str, rows: list[dict[str, Any]]) -> tuple[dict[str, float], str]:
    """Each sample's score of ``metric`` by sample key, from a details file's rows; empty with a
    reason when the metric is not a mean of per-sample scores found there.

    A details row holds the score under the metric's name (``accuracy``: true or false), or,
    for lm-eval, under the name before the comma in rows of that filter (``acc,none``: ``acc`` in
    rows whose ``filter`` is ``none``); pass@k comes from each sample's ``n`` and ``num_passed``.
    A sample that failed (a row with ``error`` and no score) scores 0, as in the metric.  Where
    the eval task wrote the per-sample scores (``scores``, a metric's score per details line;
    None: not scored, left out of the mean), they are the ones used.
    """
    name, _, filt = metric.partition(",")
    pass_k = _PASS_AT.fullmatch(metric)
    out: dict[str, float] = {}
    seen = False
    for row in rows:
        key = row.get("key")
        if not isinstance(key, str):
            continue
        given = row.get("scores")
        if isinstance(given, dict) and metric in given:
            seen = True
            if given[metric] is not None:
                value = _number(given[metric])
                out[key] = math.nan if value is None else value
            continue
        if filt and row.get("filter") != filt:
            continue
        if pass_k is not None and name not in row:
            value = _pass_at(int(pass_k.group(1)), row)
        elif name in row:
            value = _number(row[name])
            if value is None and row[name] is not None:
                return {}, f"its per-sample values are not numbers ({type(row[name]).__name__}): not a per-sample mean"
            if value is None:
                value = math.nan
        elif "error" in row or "prediction_error" in row:
            value = 0.0
        else:
            continue
        if value is not None:
            seen = True
            out[key] = value
    if not seen or not out:
        return {}, "no per-sample scores in the details"
    return out, ""


def _scored(root: str, model: str, dataset: str, metrics: dict[str, float], rows: list[Any], where: str) -> Scored:
    rows = [r for r in rows if isinstance(r, dict)]
    if rows and not any(isinstance(r.get("key"), str) for r in rows):
        raise UserError(f"{root}: {where} has no sample keys (written by an orchestra before `compare`); score it "
                        "again to add them: delete its results/ folder, then run its config with -r <timestamp> "
                        "--mode eval")
    out = Scored(root, model, dataset, metrics)
    for row in rows:
        key = row.get("key")
        if isinstance(key, str) and key not in out.samples:
            sid = row.get("id")
            pred = row.get("prediction", row.get("filtered_resps", row.get("resps")))
            out.samples[key] = Sample(key, sid if isinstance(sid, int) else None,
                                      row.get("prompt_sha") if isinstance(row.get("prompt_sha"), str) else None,
                                      pred, {},
                                      row.get("choices_sha") if isinstance(row.get("choices_sha"), str) else None)
    for metric, value in metrics.items():
        scores, why = metric_scores(metric, rows)
        if not scores:
            out.no_scores[metric] = why
            continue
        nan = sum(1 for v in scores.values() if math.isnan(v))
        if nan:
            raise UserError(f"{root}: {dataset} / {model} / {metric}: {nan} sample score(s) are NaN or missing in "
                            f"{where}; a paired comparison needs a score for every sample")
        mean = math.fsum(scores.values()) / len(scores)
        if not math.isclose(mean, value, rel_tol=1e-6, abs_tol=1e-9):
            out.no_scores[metric] = (f"the mean of its per-sample scores ({mean:.6g} over {len(scores)}) is not the "
                                     f"run's {value:.6g}: not a per-sample mean")
            continue
        for key, v in scores.items():
            out.samples[key].scores[metric] = v
    return out


def prompts_of(root: str, model: str, dataset: str) -> dict[int, str]:
    """The prompt text each sample id of a (model, dataset) was sent, from the run's prediction
    files (for the excerpts of flips); {} when they are gone."""
    paths = RunPaths(root)
    single = paths.predictions(model, dataset, None)
    shards = glob.glob(glob.escape(single[: -len(".jsonl")]) + "_*.jsonl")
    prefix = len(single) - len(".jsonl") + 1
    files = [single] if os.path.isfile(single) else [p for p in shards if p[prefix:-len(".jsonl")].isdigit()]
    out: dict[int, str] = {}
    for path in files:
        blob = read_in(root, path)
        sealed = parse_sealed(blob) if blob is not None else None
        for rec in json_lines(sealed[1]) if sealed else []:
            if isinstance(rec, dict) and isinstance(rec.get("id"), int):
                out[rec["id"]] = _sent(rec)
    return out


def _sent(rec: dict[str, Any]) -> str:
    """The text a prediction record says was sent: its prompt, its user turns, or lm-eval's first context."""
    if isinstance(rec.get("prompt"), (str, list)):
        try:
            return prompt_text(rec["prompt"])
        except (KeyError, TypeError):
            return str(rec["prompt"])
    if isinstance(rec.get("turns"), list):
        return "\n\n".join(str(t) for t in rec["turns"])
    calls = rec.get("calls")
    if isinstance(calls, list) and calls and isinstance(calls[0], dict):
        args = calls[0].get("args")
        if isinstance(args, list) and args:
            return str(args[0])
    return ""

