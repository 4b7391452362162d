"""lm-eval's requests of a dataset, built once per run and read by every shard.

Building the requests of a large group (MMLU: 57 subtasks, every few-shot context) runs
lm-eval's task index and ``simple_evaluate`` over the whole group, whatever slice a shard
evaluates; 20 shards of MMLU paid it 20 times.  :func:`shared_requests` builds them once in the
run folder (``<run>/shared/lmeval-<key>.jsonl``, written atomically and sealed, see
:func:`orchestra.fileio.write_sealed_jsonl`) under a lock, so that shards starting together
wait for the one that builds instead of building too; every shard then reads the slice it
evaluates.

The key is the dataset's content key as the planner computes it (:func:`lmeval_plan.content_key`:
the settings, the lm-eval version and the digests of every file the task reads), so ``-r``
after a data file changed builds the requests again instead of reading the old ones.
Runs inside tasks (``lm_eval`` imported), never in the orchestrator.
"""

from __future__ import annotations

import importlib.metadata
import os
from typing import Any

from orchestra.datasets import lmeval_plan
from orchestra.datasets.lmeval_harness import DocRequests, collect, probe
from orchestra.fileio import read_sealed_slice, write_sealed_jsonl

#: the kind in the key: a new layout of the file gets a new name
KIND = "lmeval-requests-v1"


def requests_path(folder: str, settings: dict[str, Any]) -> str:
    """Where the requests of ``settings`` are kept under the run's shared ``folder``."""
    version = importlib.metadata.version("lm_eval")
    key = lmeval_plan.content_key(KIND, version, settings, lambda: probe(settings))
    return os.path.join(folder, f"lmeval-{key}.jsonl")


def _decode(row: list[Any]) -> DocRequests:
    task, doc_id, calls = row
    return DocRequests(str(task), int(doc_id), list(calls))


def shared_requests(folder: str, settings: dict[str, Any], start: int, end: int) -> list[DocRequests]:
    """Documents ``[start, end)`` of the dataset's requests (row order, as :func:`collect`),
    read from the run's shared file; the first shard to need it builds it, the others wait."""
    from filelock import FileLock

    path = requests_path(folder, settings)
    found = read_sealed_slice(path, start, end)
    if found is None:
        os.makedirs(folder, exist_ok=True)
        with FileLock(path + ".lock"):  # held while building (minutes for a large group); freed if we die
            found = read_sealed_slice(path, start, end)
            if found is None:
                docs = collect(settings)
                write_sealed_jsonl(path, {"settings": settings},
                                   ([d.task, d.doc_id, d.calls] for d in docs))
                return docs[start:end]
    return [_decode(row) for row in found[1]]
