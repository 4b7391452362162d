"""An orchestrator process for the conformance suite's SIGKILL scenario: it builds one runner from
a JSON description and launches tasks (id -> model config) on a run folder, as ``run.py`` does for one stage; started
again on the same run folder, the runner's ``open`` meets what the killed one left (what ``-r``
hands a backend).  Usage: ``python orchestrator.py SPEC.json``; prints each task's end state."""

from __future__ import annotations

import json
import sys

from orchestra.events import EventLog
from orchestra.paths import RunPaths
from orchestra.registry import import_dotted
from orchestra.runners.base import RunContext
from orchestra.tasks.spec import TaskSpec


def main(spec_path: str) -> int:
    with open(spec_path) as f:
        spec = json.load(f)
    runner = import_dotted(spec["type"])(**spec["kwargs"])
    paths = RunPaths(spec["run"])
    paths.make_dirs()
    ctx = RunContext(paths, EventLog(paths.events))
    tasks = [TaskSpec(stage="infer", task_id=t, run_dir=paths.root, model=model, model_abbr="m", units=())
             for t, model in spec["tasks"].items()]
    results = runner.launch(tasks, ctx)
    print(json.dumps({r.task_id: [r.state.value, r.attempts] for r in results}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
