"""The lm-eval side of :class:`~orchestra.datasets.lmeval.LmEvalDataset`; runs inside tasks.

Both stages drive lm-eval's own ``simple_evaluate`` with a stand-in for its model, so that
lm-eval builds every request and computes every metric exactly as ``lm_eval`` does:

- :func:`collect` (infer stage): a model that only records the requests lm-eval sends it
  (their prompts, few-shot contexts, stop sequences), answering placeholders; the records
  become orchestra samples, one per document.
- :func:`score` (eval stage): a model that answers each request with what orchestra's model
  answered for it (checked against the recorded request); lm-eval then applies its filters,
  ``process_results`` and (group) aggregation.

``python -m orchestra.datasets.lmeval_harness probe SETTINGS_JSON`` prints the documents per
subtask for the planner, so the orchestrator itself never imports lm-eval; ``probe-many``
answers for every lm-eval dataset of a config in one process (:func:`probe_many`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import sys
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from orchestra.datasets.digest import persist_digests
from orchestra.datasets.lmeval_index import task_manager
from orchestra.datasets.lmeval_names import check_known
from orchestra.datasets.lmeval_select import check_fewshot, samples_arg, select, task_inputs
from orchestra.datasets.torch_seed import seed_arg
from orchestra.errors import ConfigError, TaskFailedError

#: lm-eval's request types orchestra can answer; output types it cannot (none left: a
#: ``loglikelihood`` task's ``is_greedy`` is asked of models that report it, see :func:`collect`)
SUPPORTED = ("loglikelihood", "loglikelihood_rolling", "generate_until")
UNSUPPORTED_OUTPUT: dict[str, str] = {}
#: the output type whose requests need ``is_greedy`` (LAMBADA's ``acc``)
GREEDY_OUTPUT = "loglikelihood"
#: simple_evaluate's defaults for the random seeds (lm_eval's --seed 0,1234,1234,1234); torch's is
#: set when torch is first imported, not by importing it (:mod:`orchestra.datasets.torch_seed`)
SEEDS = {"random_seed": 0, "numpy_random_seed": 1234, "torch_random_seed": 1234, "fewshot_random_seed": 1234}


@dataclass
class DocRequests:
    """lm-eval's requests for one document: what one orchestra sample sends."""

    task: str
    doc_id: int
    calls: list[dict[str, Any]]  # {"type", "args", "idx"}, in lm-eval's order (repeats included)


def _quiet() -> None:
    for name in ("lm-eval", "lm_eval", "datasets", "evaluate"):
        logging.getLogger(name).setLevel(logging.WARNING)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


_MANAGERS: dict[tuple[str, ...], Any] = {}


def _task_manager(settings: dict[str, Any]) -> Any:
    """lm-eval's task index (its stock part from the cache: :mod:`orchestra.datasets.lmeval_index`), one per
    ``include_path`` in a process."""
    key = tuple(settings["include_path"])
    if key not in _MANAGERS:
        _MANAGERS[key] = task_manager(list(key))
    return _MANAGERS[key]


def probe(settings: dict[str, Any]) -> dict[str, Any]:
    """What the planner needs: ``tasks`` as ``[[name, documents in range], ...]``, each
    subtask's ``output_type`` (``output_types``: which requests it sends), and ``inputs``: the
    names the task resolves and the files it reads (its content key).  A ``num_fewshot`` lm-eval
    cannot draw is refused here, before anything runs."""
    _quiet()
    kinds: dict[str, str] = {}
    tm = _task_manager(settings)
    check_known(settings["task"], tm)
    sel = select(settings, tm, UNSUPPORTED_OUTPUT, kinds)
    check_fewshot(sel, settings)
    return {"tasks": sel.counts, "output_types": kinds, "inputs": task_inputs(sel, settings, tm)}


def _run(settings: dict[str, Any], lm: Any, bootstrap_iters: int, kinds: dict[str, str] | None = None
         ) -> tuple[dict[str, Any], list[tuple[str, int]]]:
    """simple_evaluate on ``lm`` as ``lm_eval`` runs it, on the documents in range (subtasks
    with none left out); its results and the documents per subtask in row order.  ``kinds``
    gets each subtask's ``output_type`` before lm-eval asks ``lm`` anything.  torch is not imported
    for its seed: lm-eval seeds it if it is imported, else torch is seeded when it is."""
    from lm_eval.evaluator import simple_evaluate

    tm = _task_manager(settings)
    sel = select(settings, tm, UNSUPPORTED_OUTPUT, kinds)
    if not sel.items:
        raise TaskFailedError(f"lm-eval task {settings['task']}: test_range {settings['test_range']} selects no "
                              "documents")
    with _no_env_report():
        results = simple_evaluate(
            model=lm, tasks=sel.items, num_fewshot=settings["num_fewshot"], limit=sel.limit,
            samples=samples_arg(sel, settings),  # as --samples (lm-eval numbers them 0..)
            gen_kwargs=settings["gen_kwargs"], task_manager=tm, bootstrap_iters=bootstrap_iters,
            log_samples=True, **chat_args(settings),
            **{**SEEDS, "torch_random_seed": seed_arg(SEEDS["torch_random_seed"])},
        )
    if results is None:
        raise TaskFailedError(f"lm-eval returned no results for {settings['task']}")
    counts = [(name, int(n["effective"])) for name, n in sorted(results["n-samples"].items())]
    return results, counts


@contextlib.contextmanager
def _no_env_report() -> Iterator[None]:
    """Leave out the environment report ``simple_evaluate`` adds to its results: torch's
    ``collect_env`` (``pip list``, gcc, cmake, ... as subprocesses: ~1 s and a ``pip list`` in each
    infer and eval task).  orchestra keeps no part of it; every number is computed before it."""
    from lm_eval import evaluator

    def versions_only(storage: dict[str, Any]) -> None:
        storage["pretty_env_info"] = "not collected (orchestra)"

    real = evaluator.add_env_info
    evaluator.add_env_info = versions_only
    try:
        yield
    finally:
        evaluator.add_env_info = real


def chat_args(settings: dict[str, Any]) -> dict[str, Any]:
    """simple_evaluate's chat arguments for these settings (lm-eval's defaults when unset)."""
    return {"apply_chat_template": bool(settings.get("apply_chat_template", False)),
            "fewshot_as_multiturn": bool(settings.get("fewshot_as_multiturn", False)),
            "system_instruction": settings.get("system_instruction")}


def chat_context(messages: list[dict[str, str]]) -> str:
    """What lm-eval's context is when it builds chat messages for orchestra: the messages as
    JSON (as lm-eval's API models make them); each model reads the messages themselves."""
    return json.dumps(messages, ensure_ascii=False)


def _lm_class() -> type:
    from lm_eval.api.model import LM

    class _Scripted(LM):
        """lm-eval's model interface answered by ``answer(kind, instances)``; the chat messages
        lm-eval builds (``apply_chat_template``) are kept by the context they became."""

        def __init__(self, answer: Any) -> None:
            super().__init__()
            self.answer = answer
            self.chats: dict[str, list[dict[str, str]]] = {}

        @property
        def tokenizer_name(self) -> str:
            return ""  # a part of lm-eval's request cache key, which orchestra does not use

        def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
            # add_generation_prompt is lm-eval's "no gen_prefix", i.e. the last message is not the
            # assistant's: the messages say it, and each model renders them from that
            messages = [{"role": str(m["role"]), "content": str(m["content"])} for m in chat_history]
            context = chat_context(messages)
            self.chats[context] = messages
            return context

        def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[Any]:
            return list(self.answer("loglikelihood", requests))

        def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[Any]:
            return list(self.answer("loglikelihood_rolling", requests))

        def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[Any]:
            return list(self.answer("generate_until", requests))

    return _Scripted


_PLACEHOLDER = {"loglikelihood": (0.0, False), "loglikelihood_rolling": 0.0, "generate_until": ""}
_COLLECTED: dict[str, list[DocRequests]] = {}


def collect(settings: dict[str, Any]) -> list[DocRequests]:
    """Every document's requests, in row order (subtasks by name, documents in order); once
    per process for the same settings."""
    key = json.dumps(settings, sort_keys=True)
    if key in _COLLECTED:
        return _COLLECTED[key]
    _quiet()
    seen: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    kinds: dict[str, str] = {}

    def record(kind: str, instances: list[Any]) -> list[Any]:
        for inst in instances:
            call = {"type": kind, "args": json.loads(json.dumps(list(inst.args))), "idx": int(inst.idx)}
            if kind == "loglikelihood" and kinds.get(inst.task_name) == GREEDY_OUTPUT:
                call["greedy"] = True  # its metric reads is_greedy: ask the model for it
            chat = lm.chats.get(inst.args[0]) if kind != "loglikelihood_rolling" else None
            if chat is not None:
                call["chat"] = chat
            seen[(inst.task_name, int(inst.doc_id))].append(call)
        return [_PLACEHOLDER[kind]] * len(instances)

    lm = _lm_class()(record)
    _, counts = _run(settings, lm, bootstrap_iters=0, kinds=kinds)
    docs: list[DocRequests] = []
    for name, n in counts:
        for doc_id in range(n):
            calls = sorted(seen.get((name, doc_id), []), key=lambda c: c["idx"])
            docs.append(DocRequests(name, doc_id, calls))
    _COLLECTED[key] = docs
    return docs


def _answers(records: list[dict[str, Any]]) -> Any:
    """The scripted model's answer function: each request gets orchestra's recorded answer."""
    table: dict[tuple[str, int, int], list[tuple[dict[str, Any], Any]]] = defaultdict(list)
    for rec in records:
        if rec.get("error") is not None:
            raise TaskFailedError(f"sample {rec['id']} ({rec.get('gold')}) failed in inference: {rec['error']}")
        gold = rec["gold"]
        for call, resp in zip(rec["calls"], rec["responses"], strict=True):
            table[(gold["task"], int(gold["doc_id"]), int(call["idx"]))].append((call, resp))

    def answer(kind: str, instances: list[Any]) -> list[Any]:
        out = []
        for inst in instances:
            key = (inst.task_name, int(inst.doc_id), int(inst.idx))
            if not table.get(key):
                raise TaskFailedError(f"no recorded answer for {key[0]} document {key[1]} request {key[2]}")
            call, resp = table[key].pop(0)
            if call["type"] != kind or call["args"] != json.loads(json.dumps(list(inst.args))):
                raise TaskFailedError(f"{key[0]} document {key[1]}: the predictions were made for other requests "
                                      "(lm-eval's task or settings changed); run infer again")
            out.append((float(resp[0]), bool(resp[1])) if kind == "loglikelihood" else resp)
        return out

    return answer


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _doc_keys(task: str, logged: list[dict[str, Any]]) -> dict[int, str]:
    """Each document's sample key (what ``orchestra compare`` aligns runs by): the task's name
    and lm-eval's own hash of the document's content, ``~k`` appended to the k-th repeat of an
    identical document (k >= 2)."""
    first: dict[int, str] = {}
    for s in logged:
        first.setdefault(int(s["doc_id"]), str(s.get("doc_hash") or json.dumps(s.get("doc"), sort_keys=True))[:16])
    seen: dict[str, int] = {}
    keys: dict[int, str] = {}
    for doc_id in sorted(first):
        base = f"{task}:{first[doc_id]}"
        seen[base] = seen.get(base, 0) + 1
        keys[doc_id] = base if seen[base] == 1 else f"{base}~{seen[base]}"
    return keys


def score(settings: dict[str, Any], records: list[dict[str, Any]]
          ) -> tuple[dict[str, float], list[dict[str, Any]], dict[str, Any]]:
    """lm-eval's metrics for orchestra's answers: the task's (or group's aggregate) metrics
    under lm-eval's names (``acc,none``, ``exact_match,strict-match``), values before
    stderrs; per-document details as lm-eval logs them; and lm-eval's own results table
    (``lmeval``: every subtask and subgroup)."""
    _quiet()
    from lm_eval.utils import handle_non_serializable

    results, _ = _run(settings, _lm_class()(_answers(records)), bootstrap_iters=settings["bootstrap_iters"])
    table = json.loads(json.dumps(results["results"], default=handle_non_serializable))
    top = settings["task"]
    metrics: dict[str, float] = {}
    values = table.get(top, {})
    for key in sorted(values, key=lambda k: ("_stderr" in k, k)):
        v = _number(values[key])
        if v is not None and "," in key and not math.isnan(v):
            metrics[key] = v
    ids = {(r["gold"]["task"], int(r["gold"]["doc_id"])): int(r["id"]) for r in records}
    details: list[dict[str, Any]] = []
    for name, logged in sorted(results.get("samples", {}).items()):
        logged = json.loads(json.dumps(logged, default=handle_non_serializable))
        keys = _doc_keys(name, logged)
        for s in logged:
            row = {"id": ids.get((name, int(s["doc_id"]))), "key": keys[int(s["doc_id"])], "task": name}
            if "prompt_hash" in s:
                row["prompt_sha"] = str(s["prompt_hash"])[:16]
            row.update({k: s[k] for k in ("doc_id", "filter", "target", "resps", "filtered_resps") if k in s})
            row.update({m: s[m] for m in s.get("metrics", []) if m in s})
            details.append(row)
    extra = {"lmeval": {"results": table, "groups": json.loads(json.dumps(results.get("groups", {}),
                                                                           default=handle_non_serializable)),
                        "n-samples": results.get("n-samples", {}), "version": results.get("versions", {})}}
    return metrics, details, extra


def probe_many(settings_list: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """:func:`probe` for each settings in one process (one lm-eval import, one stock index):
    ``{"answer": ...}``, ``{"error": LINE}`` (the one line a probe of these settings alone
    would end with), or ``{"again": True}``: an unexpected failure, which the planner's own
    probe of these settings alone then reports as it always did."""
    out: list[dict[str, Any]] = []
    for settings in settings_list:
        try:
            out.append({"answer": probe(settings)})
        except ConfigError as exc:
            lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
            out.append({"error": lines[-1] if lines else "exit 2"})
        except Exception:  # noqa: BLE001 - reported by the probe of these settings alone
            out.append({"again": True})
    return out


USAGE = ("usage: python -m orchestra.datasets.lmeval_harness probe SETTINGS_JSON [--dry-run]\n"
         "       python -m orchestra.datasets.lmeval_harness probe-many [--dry-run] < SETTINGS_LIST_JSON")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["probe-many"] and args[1:] in ([], ["--dry-run"]):
        persist_digests(not args[1:])  # planning a --dry-run: no cache is written
        print(json.dumps(probe_many(json.load(sys.stdin))))
        return 0
    if len(args) not in (2, 3) or args[0] != "probe" or args[2:] not in ([], ["--dry-run"]):
        print(USAGE, file=sys.stderr)
        return 2
    persist_digests(not args[2:])  # planning a --dry-run: no cache is written
    try:
        print(json.dumps(probe(json.loads(args[1]))))
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
