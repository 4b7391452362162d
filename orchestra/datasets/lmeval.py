"""lm-evaluation-harness tasks as orchestra datasets: lm-eval's prompts, orchestra's engine.

``dict(type=LmEvalDataset, abbr='arc_c', task='arc_challenge', num_fewshot=0,
test_range='[0:100]')`` evaluates lm-eval's own task definition: lm-eval builds every
request (its prompt templates, its few-shot selection and seed, its stop sequences), the
infer stage runs them on any orchestra model with the usual checkpoints, and the eval stage
scores the answers with lm-eval's own ``process_results``, filters and (group) aggregation,
under lm-eval's metric names.  A group (``task='mmlu'``) is one dataset whose rows are the
documents of all its subtasks, in subtask-name order; ``test_range`` applies to each subtask
(as lm-eval's ``--limit`` does).

This module is what the orchestrator imports: it never imports ``lm_eval`` (whose import and
task index cost seconds).  Row counts for planning come from a probe subprocess
(``python -m orchestra.datasets.lmeval_harness probe``, run without the orchestrator's secrets;
one ``probe-many`` subprocess for all the lm-eval datasets of a config, see :meth:`LmEvalDataset.plan_together`),
cached by the planner under a key of the settings, the lm-eval version and every file the task
reads (:mod:`orchestra.datasets.lmeval_plan`).  Everything that needs
lm-eval runs inside tasks (:mod:`orchestra.datasets.lmeval_harness`).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from orchestra.datasets import lmeval_plan
from orchestra.datasets.base import BaseDataset, parse_range
from orchestra.datasets.digest import persisting
from orchestra.errors import ConfigError
from orchestra.requests import Sample

INSTALL_HINT = "install it with `pip install 'orchestra[lmeval]'`"
#: lm-eval output types whose requests are scored by prompt log-probabilities
LOGLIK_OUTPUTS = frozenset({"multiple_choice", "loglikelihood", "loglikelihood_rolling"})
#: lm-eval's chat options among the settings (present only when one is set)
CHAT_KEYS = ("apply_chat_template", "fewshot_as_multiturn", "system_instruction")
#: probe answers of this process, by settings (the config check and the planner share one probe)
_PROBED: dict[str, dict[str, Any]] = {}
#: the one line each failed probe of :meth:`LmEvalDataset.plan_together` ended with, by settings
_FAILED: dict[str, str] = {}


def lmeval_version(where: str) -> str:
    """The installed lm-eval version; ``ConfigError`` naming ``where`` if it is not installed."""
    if importlib.util.find_spec("lm_eval") is None:
        raise ConfigError(f"{where}: LmEvalDataset needs the lm_eval package; {INSTALL_HINT}")
    return importlib.metadata.version("lm_eval")


def _chat_settings(where: str, apply_chat_template: Any, fewshot_as_multiturn: Any,
                   system_instruction: Any) -> dict[str, Any]:
    """lm-eval's chat options as settings, checked as ``lm_eval`` checks them; none when all
    are unset (so the content keys of configs without them stay what they were)."""
    for key, value in (("apply_chat_template", apply_chat_template), ("fewshot_as_multiturn", fewshot_as_multiturn)):
        if value is not None and not isinstance(value, bool) or (key == "apply_chat_template" and value is None):
            raise ConfigError(f"{where}: {key}={value!r}: expected True or False"
                              + (" or None" if key == "fewshot_as_multiturn" else ""))
    if system_instruction is not None and not isinstance(system_instruction, str):
        raise ConfigError(f"{where}: system_instruction={system_instruction!r}: expected a string or None")
    if fewshot_as_multiturn and not apply_chat_template:
        raise ConfigError(f"{where}: fewshot_as_multiturn=True needs apply_chat_template=True (as in lm-eval)")
    if not apply_chat_template and system_instruction is None:
        return {}
    multiturn = bool(apply_chat_template) if fewshot_as_multiturn is None else fewshot_as_multiturn
    return {"apply_chat_template": bool(apply_chat_template), "fewshot_as_multiturn": multiturn,
            "system_instruction": system_instruction}


class LmEvalDataset(BaseDataset):
    """An lm-eval task or group, run by orchestra and scored by lm-eval.

    Args:
        task: an lm-eval task or group name (``'arc_easy'``, ``'mmlu'``), as ``lm_eval --tasks``.
        abbr: short name, used in file names and the summary table; the task's name when not given.
        num_fewshot: as ``--num_fewshot`` (None: the task's own, else 0); a task whose YAML
            sets 0 keeps 0, as in lm-eval.
        include_path: a folder (or list) of the user's task YAMLs, as ``--include_path``;
            its tasks override lm-eval's of the same name.
        test_range: the documents of each subtask, ``'[0:100]'`` (as ``--limit 100``) or
            ``'[100:200]'`` (as ``--samples`` with those indices).
        gen_kwargs: as ``--gen_kwargs`` (``'max_gen_toks=64'`` or a dict): updates the
            generation settings of ``generate_until`` tasks.
        bootstrap_iters: as ``--bootstrap_iters`` (stderr of non-mean metrics).
        apply_chat_template: as ``--apply_chat_template``: lm-eval builds each context as chat
            messages, which each model reads through its chat template (HFCausalLM, VLLMModel)
            or sends as they are (a chat endpoint); see docs/lm-eval.md.
        fewshot_as_multiturn: as ``--fewshot_as_multiturn``: the few-shot examples as
            alternating user / assistant turns (None: True with ``apply_chat_template``, as
            lm-eval; True needs ``apply_chat_template``).
        system_instruction: as ``--system_instruction``: a system message first (with
            ``apply_chat_template``), else text before the prompt.
        reader_cfg, infer_cfg, eval_cfg: accepted for the usual shape, and must stay empty:
            lm-eval's task defines prompts and scoring.
    """

    scores_failed_samples = False  # lm-eval's metrics have no missing answer
    path_keys = ("path", "include_path")

    @classmethod
    def default_abbr(cls, cfg: dict[str, Any]) -> str | None:
        """Without an ``abbr``, the dataset is named after its task (``task='mmlu'``: ``mmlu``)."""
        task = cfg.get("task")
        return task if isinstance(task, str) and task else None

    def __init__(
        self,
        task: str,
        abbr: str = "",
        num_fewshot: int | None = None,
        include_path: str | list[str] | None = None,
        test_range: Any = None,
        gen_kwargs: str | dict[str, Any] | None = None,
        bootstrap_iters: int = 100000,
        apply_chat_template: bool = False,
        fewshot_as_multiturn: bool | None = None,
        system_instruction: str | None = None,
        path: str = "",
        reader_cfg: dict[str, Any] | None = None,
        infer_cfg: dict[str, Any] | None = None,
        eval_cfg: dict[str, Any] | None = None,
    ) -> None:
        abbr = abbr or (task if isinstance(task, str) else "")
        where = f"dataset {abbr}"
        if not isinstance(task, str) or not task:
            raise ConfigError(f"{where}: task={task!r}: expected an lm-eval task or group name such as 'arc_easy'")
        for key, value in (("reader_cfg", reader_cfg), ("infer_cfg", infer_cfg), ("eval_cfg", eval_cfg)):
            if value:
                raise ConfigError(f"{where}: {key} is not used by LmEvalDataset (lm-eval's task defines prompts and "
                                  "scoring); use task, num_fewshot, test_range, gen_kwargs")
        chat = _chat_settings(where, apply_chat_template, fewshot_as_multiturn, system_instruction)
        if num_fewshot is not None and (isinstance(num_fewshot, bool) or not isinstance(num_fewshot, int)
                                        or num_fewshot < 0):
            raise ConfigError(f"{where}: num_fewshot={num_fewshot!r}: expected an integer >= 0 or None")
        if gen_kwargs is not None and not isinstance(gen_kwargs, (str, dict)):
            raise ConfigError(f"{where}: gen_kwargs={gen_kwargs!r}: expected 'key=value,...' or a dict")
        paths = [include_path] if isinstance(include_path, str) else list(include_path or [])
        for p in paths:
            if not os.path.isdir(os.path.expanduser(p)):
                raise ConfigError(f"{where}: include_path {p!r} is not a folder")
        self.range = parse_range(test_range, where)
        super().__init__(abbr, path or task, {}, {}, {})
        self.task = task
        self._shared_dir: str | None = None  # the run's folder for the requests all shards share (bind_run)
        self.settings: dict[str, Any] = {
            "task": task, "num_fewshot": num_fewshot,
            "include_path": [os.path.abspath(os.path.expanduser(p)) for p in paths],
            "test_range": list(self.range), "gen_kwargs": gen_kwargs, "bootstrap_iters": int(bootstrap_iters),
            **chat,
        }

    @classmethod
    def uses_chat_template(cls, cfg: dict[str, Any]) -> bool:
        """Whether this dataset's contexts are chat messages for each model's chat template."""
        return cfg.get("apply_chat_template") is True

    # -- planning (no lm_eval import) ---------------------------------------------------------
    @property
    def inferencer(self) -> dict[str, Any]:
        return {"type": "lmeval"}

    def needed_columns(self) -> list[str]:
        return []

    def check(self, columns: list[str], where: str) -> None:
        """Nothing to check against columns: lm-eval's task checked itself in the probe."""

    def content_key(self) -> str:
        """Settings, lm-eval version and every file the task reads (see :mod:`.lmeval_plan`)."""
        version = lmeval_version(f"dataset {self.abbr}")
        return lmeval_plan.content_key(type(self).__name__, version, self.settings, self._probe)

    def load_rows(self) -> list[dict[str, Any]]:
        """One row per document under evaluation (``task``, ``doc``), from a probe subprocess;
        a ``test_range`` that selects no document of any subtask is a ``ConfigError``."""
        counts = self._probe()["tasks"]
        if counts and not any(count for _name, count in counts):
            lo, hi = self.settings["test_range"]
            raise ConfigError(f"dataset {self.abbr}: test_range='[{'' if lo is None else lo}:"
                              f"{'' if hi is None else hi}]' selects no document of lm-eval task {self.task!r} "
                              "(it applies to each subtask); widen it or drop the dataset")
        return [{"task": name, "doc": i} for name, count in counts for i in range(count)]

    def output_types(self) -> dict[str, str]:
        """Each subtask's lm-eval ``output_type`` (``multiple_choice``, ``generate_until``, ...)."""
        return dict(self._probe().get("output_types", {}))

    @classmethod
    def needs_loglik(cls, cfg: dict[str, Any]) -> str | None:
        """What in this dataset needs prompt log-probabilities (``"lm-eval task 'arc_easy'
        (output_type 'multiple_choice')"``), or None: it only generates.  Runs the probe (seconds),
        so the config check asks only when a model cannot score log-likelihoods."""
        ds = cls(**{k: v for k, v in cfg.items() if k != "type"})
        for name, kind in sorted(ds.output_types().items()):
            if kind in LOGLIK_OUTPUTS:
                return f"lm-eval task {name!r} (output_type {kind!r})"
        return None

    @classmethod
    def needs_greedy(cls, cfg: dict[str, Any]) -> str | None:
        """The first subtask of ``output_type: loglikelihood`` (its metric reads ``is_greedy``:
        LAMBADA's ``acc``), or None.  From the cached manifest of the task's files; the probe
        runs only when they changed (its answer is kept for planning)."""
        ds = cls(**{k: v for k, v in cfg.items() if k != "type"})
        ds.content_key()  # the manifest (a probe only when its files changed) records the output types
        kinds = lmeval_plan.output_kinds(lmeval_version(f"dataset {ds.abbr}"), ds.settings)
        for name, kind in sorted((ds.output_types() if kinds is None else kinds).items()):
            if kind == "loglikelihood":
                return f"lm-eval task {name!r} (output_type 'loglikelihood': its acc reads is_greedy)"
        return None

    def _probe_settings(self) -> tuple[str, dict[str, Any]]:
        """The settings the probe answers for, and their key in :data:`_PROBED`."""
        # the chat options change no count, kind or input: one probe serves a task with and without them
        settings = {k: v for k, v in self.settings.items() if k not in CHAT_KEYS}
        return json.dumps(settings, sort_keys=True), settings

    @classmethod
    def plan_together(cls, datasets: list[BaseDataset], known: Callable[[str], bool]) -> None:
        """Probe, in one subprocess, every dataset here whose facts the planner does not have yet
        (no current manifest of its files, or its content key not ``known`` to the size cache);
        each dataset's :meth:`_probe` then reads its answer (or raises its error)."""
        todo: dict[str, dict[str, Any]] = {}
        for ds in datasets:
            if not isinstance(ds, LmEvalDataset):
                continue
            try:
                version = lmeval_version(f"dataset {ds.abbr}")
                if lmeval_plan.manifest_current(version, ds.settings) and known(ds.content_key()):
                    continue
            except ConfigError:
                return  # each dataset reports it when it is asked
            key, settings = ds._probe_settings()
            if key not in _PROBED:
                todo[key] = settings
        if len(todo) < 2:
            return  # one probe is one probe: the dataset runs its own
        argv = [sys.executable, "-m", "orchestra.datasets.lmeval_harness", "probe-many"]
        argv += [] if persisting() else ["--dry-run"]  # a dry run's probe writes no cache either
        proc = subprocess.run(argv, input=json.dumps(list(todo.values())), capture_output=True, text=True,
                              check=False, env=lmeval_plan.probe_env())
        try:
            answers = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else []
        except (ValueError, IndexError):
            answers = []
        if not isinstance(answers, list) or len(answers) != len(todo):
            return  # each dataset probes alone, and reports what went wrong as it always did
        for key, got in zip(todo, answers, strict=True):
            _FAILED.pop(key, None)
            if isinstance(got, dict) and isinstance(got.get("answer"), dict):
                _PROBED[key] = got["answer"]
            elif isinstance(got, dict) and isinstance(got.get("error"), str):
                _FAILED[key] = got["error"]

    def _probe(self) -> dict[str, Any]:
        """The probe subprocess's answer for these settings (once per process; from
        :meth:`plan_together`'s one subprocess when the planner asked it first)."""
        lmeval_version(f"dataset {self.abbr}")
        key, settings = self._probe_settings()
        if key in _FAILED:  # told once: a later plan in this process probes again
            raise ConfigError(f"dataset {self.abbr}: lm-eval could not load task {self.task!r}: {_FAILED.pop(key)}")
        if key not in _PROBED:
            argv = [sys.executable, "-m", "orchestra.datasets.lmeval_harness", "probe", json.dumps(settings)]
            argv += [] if persisting() else ["--dry-run"]  # a dry run's probe writes no cache either
            proc = subprocess.run(argv, capture_output=True, text=True, check=False, env=lmeval_plan.probe_env())
            if proc.returncode != 0:
                lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
                raise ConfigError(f"dataset {self.abbr}: lm-eval could not load task {self.task!r}: "
                                  f"{lines[-1] if lines else 'exit ' + str(proc.returncode)}")
            _PROBED[key] = json.loads(proc.stdout.strip().splitlines()[-1])
        return _PROBED[key]

    def sample_keys(self) -> list[str] | None:
        return None  # lm-eval's details carry them: its own hash of each document (lmeval_harness.score)

    def rows(self) -> list[dict[str, Any]]:
        return self.all_rows()  # test_range is applied per subtask by the probe

    # -- inside tasks (lm_eval imported there) ------------------------------------------------
    def bind_run(self, shared_dir: str) -> None:
        self._shared_dir = shared_dir

    def build_samples(self, start: int, end: int) -> list[Sample]:
        """Samples for documents ``[start, end)``: lm-eval's requests of each document, built
        once per run for all shards when the task bound a run folder (:mod:`.lmeval_shared`)."""
        from orchestra.datasets.lmeval_harness import collect
        from orchestra.datasets.lmeval_shared import shared_requests

        shared = self._shared_dir
        docs = shared_requests(shared, self.settings, start, end) if shared else collect(self.settings)[start:end]
        return [Sample(id=i, kind="lmeval", gold={"task": d.task, "doc_id": d.doc_id}, calls=d.calls)
                for i, d in enumerate(docs, start=start)]

    def score(self, records: list[dict[str, Any]]) -> tuple[dict[str, float], list[dict[str, Any]], dict[str, Any]]:
        """lm-eval's metrics for the recorded answers (see :func:`lmeval_harness.score`)."""
        from orchestra.datasets.lmeval_harness import score

        return score(self.settings, records)
