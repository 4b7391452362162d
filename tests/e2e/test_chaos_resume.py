"""Chaos: a real run is killed at seeded moments and resumed with ``-r`` until it finishes.

orchestra promises that nothing is lost: outputs are written atomically, finished work is never
done again, a crash is resumable with ``-r``, and the resumed run's results equal an
uninterrupted run's.  This suite tests that promise at many moments instead of hand-picked ones.

One clean run of ``python run.py`` (LocalRunner, an OpenAI-compatible test server with a small
latency, three datasets of 100 rows each in tasks of 50 samples, sample checkpoints, an eval
stage) gives the reference: its results table, its files and the times of its events.  Ten kill
moments are drawn (fixed seed) one in each tenth of that run's time, each said as "once the log
has N events, D seconds later", so that it lands at the same place of a slower or faster run.
Each scenario starts the same config afresh in a new folder, kills it at one of them (and, for
some, kills the resume as well), then resumes with ``-r`` until a run ends by itself.
The ways to die:

* ``node``: every process of the run frozen (SIGSTOP) then SIGKILLed, as when a node dies;
* ``orchestrator``: the orchestrator alone SIGKILLed, its tasks left to die on their own;
* ``sigint``: Ctrl-C (SIGINT to the orchestrator's process group), which must stop within seconds.

After each kill: every process that belonged to the run ends (by PID and start time, and no
process names the work folder any more).  At the end: exit 0, the results table and the
predictions equal to the clean run's, the same outputs and no temporary file or checkpoint in
the run folder, no output finished before a kill written again (inode and mtime), and at the
server no sample finished before a kill sent again, at most the ones in flight
(``max_connections``) sent once more.  Run with ``-s`` to see, per scenario, the kill points,
the samples finished at each kill and the requests sent again after each.
"""

from __future__ import annotations

import json
import random
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.chaos import (
    Kill,
    Point,
    after_kill,
    files_of,
    kill_at,
    predictions_of,
    sealed_outputs,
    start,
    temporary_files,
    the_run,
)
from tests.e2e.chaos import kill_points as chaos_kill_points
from tests.helpers import events, server_settled, summary_rows
from tests.servers.loader import load_server_module

pytestmark = pytest.mark.slow

SEED = 20261126
DATASETS = 3
ROWS = 100
SHARD = 50
CONNECTIONS = 4  # host-wide for the model: at most this many requests are in flight at a kill
LATENCY_S = 0.02
KILLS = 10  # kill points of the first run, spread over the clean run's event log



@dataclass
class Reference:
    """The clean run: its config, results, files and length, and each dataset's prompts."""

    cfg: Path
    rows: dict[tuple[str, str], dict]
    predictions: dict[str, list[str]]
    files: set[str]
    times: list[float]  # of its events, in seconds
    prompts: set[str]


def write_config(folder: Path, base_url: str) -> tuple[Path, set[str]]:
    rng = random.Random(SEED)
    data, prompts = [], set()
    for d in range(DATASETS):
        path = folder / f"arith{d}.jsonl"
        rows = []
        for i in range(ROWS):
            a, b = rng.randint(1, 999), rng.randint(1, 999)
            rows.append({"question": f"d{d} #{i}: {a} + {b}", "answer": a + b})
            prompts.add(rows[-1]["question"])
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        data.append(str(path))
    cfg = folder / "chaos.py"
    cfg.write_text(f"""
from orchestra.datasets import JsonlDataset
from orchestra.models import OpenAIAPI
from orchestra.partitioners import NaivePartitioner, SizePartitioner
from orchestra.runners import LocalRunner
from orchestra.tasks import EvalTask, InferTask

models = [dict(type=OpenAIAPI, abbr='api', path='test-model', base_url={base_url!r},
               max_connections={CONNECTIONS}, max_out_len=16)]
datasets = [dict(type=JsonlDataset, abbr=f'arith{{d}}', path=p,
                 reader_cfg=dict(input_columns=['question'], output_column='answer'),
                 infer_cfg=dict(prompt_template='{{question}}', inferencer=dict(type='gen', max_out_len=16)),
                 eval_cfg=dict(evaluator=dict(type='numeric_match')))
            for d, p in enumerate({data!r})]
infer = dict(partitioner=dict(type=SizePartitioner, max_task_size={SHARD}, gen_task_coef=1),
             runner=dict(type=LocalRunner, max_num_workers=2, retry=0, task=dict(type=InferTask)))
eval = dict(partitioner=dict(type=NaivePartitioner),
            runner=dict(type=LocalRunner, max_num_workers=2, task=dict(type=EvalTask)))
""")
    return cfg, prompts



def settled(server: Any) -> Counter[str]:
    """The server's requests per prompt once what was in flight is answered (``server_settled``: a
    request still in the socket buffers when its client died is counted too; looking only for
    nothing in progress missed two such once, which then looked like sends nobody counted)."""
    return Counter(server_settled(server)["per_prompt"])


@pytest.fixture(scope="module")
def server() -> Any:
    with load_server_module().ServerThread() as srv:
        srv.configure(latency_s=LATENCY_S)
        yield srv


@pytest.fixture(scope="module")
def reference(server: Any, tmp_path_factory: pytest.TempPathFactory) -> Reference:
    folder = tmp_path_factory.mktemp("chaos")
    cfg, prompts = write_config(folder, server.base_url)
    server.reset()
    proc = start(cfg, folder / "clean")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert Counter(server.stats()["per_prompt"]) == Counter(prompts)  # each once
    run = the_run(folder / "clean")
    times = [e["ts"] for e in events(run)]
    return Reference(cfg, summary_rows(run), predictions_of(run), files_of(run), times, prompts)


def kill_points(ref: Reference) -> list[Point]:
    """The seeded points, then one more: the run's last event, ``run_finished`` (the summary and
    the report are being built)."""
    return [*chaos_kill_points(ref.times, KILLS, SEED), Point(len(ref.times), 0.0)]


def check_finished(ref: Reference, work: Path, server: Any, kills: list[Kill], proc: subprocess.Popen[str]
                   ) -> list[int]:
    """The final checks; how many requests were sent again after each kill."""
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    run = the_run(work)
    assert summary_rows(run) == ref.rows
    assert predictions_of(run) == ref.predictions
    assert not temporary_files(run), f"left behind: {temporary_files(run)}"
    assert files_of(run) == ref.files, f"left behind: {sorted(files_of(run) - ref.files)}, " \
                                       f"missing: {sorted(ref.files - files_of(run))}"
    final = settled(server)
    assert set(final) == ref.prompts
    resent = []
    for i, kill in enumerate(kills):
        after = kills[i + 1].sent if i + 1 < len(kills) else final
        again = {p for p in kill.sent if after[p] > kill.sent[p]}
        assert not again & kill.done, f"finished before the kill, sent again: {sorted(again & kill.done)[:5]}"
        assert all(after[p] - kill.sent[p] == 1 for p in again)
        assert len(again) <= CONNECTIONS, f"{len(again)} sent again after one kill: {sorted(again)[:8]}"
        redone = {p for p, st in kill.sealed.items() if p in kill.sealed and sealed_outputs(run).get(p) != st}
        assert not redone, f"finished outputs written again after the {kill.how} kill at {kill.point}: {redone}"
        resent.append(len(again))
    assert sum(final.values()) == len(ref.prompts) + sum(resent)
    return resent


def scenarios() -> list[list[tuple[str, int | Point]]]:
    """Each: the kills, the first of a fresh run (at a kill point's number), the next of the resumes."""
    out: list[list[tuple[str, int | Point]]] = [[("node" if k % 2 == 0 else "orchestrator", k)]
                                                 for k in range(KILLS)]
    out.append([("node", 4), ("node", Point(6, 0.1))])  # killed twice in a row: the resume dies too
    out.append([("sigint", 6)])
    out.append([("orchestrator", 2), ("sigint", Point(5, 0.2))])
    out.append([("node", KILLS)])  # while the summary and the report are built
    return out


@pytest.mark.parametrize("kills", scenarios(), ids=lambda ks: "+".join(f"{h}@{p}" for h, p in ks))
def test_a_killed_run_resumes_to_the_clean_result(reference: Reference, server: Any, tmp_path: Path,
                                                   kills: list[tuple[str, int | Point]]) -> None:
    points = kill_points(reference)
    work = tmp_path / "out"
    server.reset()
    seen: list[Kill] = []
    proc = start(reference.cfg, work)
    for how, where in kills:
        point = points[where] if isinstance(where, int) else where
        kill = kill_at(proc, work, point, how)
        assert kill is not None, f"the run ended before the {how} kill at {point} ({len(reference.times)} events)"
        seen.append(after_kill(kill, work))
        seen[-1].sent = settled(server)
        proc = start(reference.cfg, work, "-r")
    resent = check_finished(reference, work, server, seen, proc)
    print(f"\nchaos: {', '.join(f'{k.how} at {k.point}' for k in seen)} of {len(reference.times)} events: "
          f"finished {[len(k.done) for k in seen]}, sent again {resent}")

