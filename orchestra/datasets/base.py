"""Datasets: rows from a file, turned into samples the inference engine can run.

A dataset config is shaped as OpenCompass users know it::

    dict(type=JsonlDataset, abbr='plus_one', path='data/plus_one.jsonl',
         reader_cfg=dict(input_columns=['question'], output_column='answer', test_range='[0:100]'),
         infer_cfg=dict(prompt_template='{question}',
                        inferencer=dict(type='gen', max_out_len=16)),
         eval_cfg=dict(evaluator=dict(type='numeric_match')))

``inferencer.type`` is ``gen`` (one generation per row), ``loglik`` (score every choice of
a row as a continuation of the prompt) or ``chat`` (a multi-turn conversation: one user
turn per element of ``turns_column``, each sent when the previous reply arrives).
"""

from __future__ import annotations

import abc
import os
import re
import string
from collections.abc import Callable
from typing import Any

from orchestra.datasets.digest import files_stamp, row_keys, stamped_key
from orchestra.errors import ConfigError
from orchestra.fileio import stable_hash
from orchestra.inferencers import get_inferencer, inferencer_cfg
from orchestra.registry import DATASETS
from orchestra.requests import Message, Prompt, Sample, prompt_text


def parse_range(test_range: Any, where: str) -> tuple[int | None, int | None]:
    """Turn ``'[0:100]'``, ``'[:50]'``, ``(0, 100)`` or ``None`` into slice bounds."""
    if test_range is None or test_range == "":
        return None, None
    if isinstance(test_range, (list, tuple)) and len(test_range) == 2:
        lo, hi = test_range
        if all(v is None or isinstance(v, int) for v in (lo, hi)):
            return lo, hi
    if isinstance(test_range, str):
        m = re.fullmatch(r"\s*\[?\s*(-?\d*)\s*:\s*(-?\d*)\s*\]?\s*", test_range)
        if m:
            lo_s, hi_s = m.groups()
            return (int(lo_s) if lo_s else None, int(hi_s) if hi_s else None)
    raise ConfigError(
        f"{where}: test_range={test_range!r} is not valid; use '[start:end]' or (start, end)"
    )


def template_fields(template: Any) -> set[str]:
    """Names of the ``{fields}`` a prompt template (string or list of messages) uses."""
    texts: list[str] = []
    if isinstance(template, str):
        texts = [template]
    elif isinstance(template, (list, tuple)):
        texts = [str(m.get("content", "")) for m in template if isinstance(m, dict)]
    names: set[str] = set()
    for text in texts:
        for _, name, _, _ in string.Formatter().parse(text):
            if name:
                names.add(name.split(".")[0].split("[")[0])
    return names


def fill_prompt(template: Any, row: dict[str, Any]) -> Prompt:
    """Fill a string template, or every message of a chat template, with a row's columns."""
    if isinstance(template, str):
        return template.format(**row)
    messages: list[Message] = []
    for msg in template:
        messages.append({"role": msg["role"], "content": str(msg["content"]).format(**row)})
    return messages


class BaseDataset(abc.ABC):
    """A dataset: its rows, the prompts made from them, and how they are scored.

    Args:
        abbr: short name, used in file names and the summary table.
        path: the data file (or an identifier the subclass understands).
        reader_cfg: ``input_columns``, ``output_column``, optional ``test_range``.
        infer_cfg: ``prompt_template`` (string or chat messages), ``inferencer``, and
            optional ``fewshot`` (``dict(k=N)``: the first N rows before ``test_range``
            become worked examples: each row's prompt and its answer, or ``fewshot_template``
            filled with the row, which may use the ``output_column``).
        eval_cfg: ``evaluator`` (a name such as ``'accuracy'`` or a dict with ``type``) and
            optional ``cluster_key`` (a column whose equal values form a cluster: the metrics'
            standard errors are then clustered, docs/statistics.md).
    """

    #: whether its scoring counts a sample that failed in inference (kept by ``InferTask``'s
    #: ``error_tolerance``) as wrong; a dataset that cannot is a config error with a tolerance
    scores_failed_samples = True
    #: arguments that name files or folders: a relative one is looked up from the working
    #: folder, then from the config file's folder and those above it (config validation)
    path_keys: tuple[str, ...] = ("path",)

    @classmethod
    def default_abbr(cls, cfg: dict[str, Any]) -> str | None:
        """The ``abbr`` a config without one gets (config validation fills it in), or None:
        ``abbr`` is required.  ``LmEvalDataset`` names a dataset after its lm-eval task."""
        return None

    @classmethod
    def needs_greedy(cls, cfg: dict[str, Any]) -> str | None:
        """What in the dataset ``cfg`` needs a model's ``is_greedy`` (``BaseModel.scores_greedy``),
        or None.  Asked at config time only when a model cannot report it."""
        return None

    @classmethod
    def plan_together(cls, datasets: list[BaseDataset], known: Callable[[str], bool]) -> None:
        """Gather, at once, what the planner will ask ``datasets`` (those of a config whose type is
        this class) one by one; ``known(content_key)``: whether the size cache has a dataset's
        facts.  Nothing by default; an lm-eval dataset probes all of a config's in one process."""

    def __init__(
        self,
        abbr: str,
        path: str,
        reader_cfg: dict[str, Any],
        infer_cfg: dict[str, Any],
        eval_cfg: dict[str, Any] | None = None,
    ) -> None:
        self.abbr = abbr
        self.path = path
        self.reader_cfg = dict(reader_cfg)
        self.infer_cfg = dict(infer_cfg)
        self.eval_cfg = dict(eval_cfg or {})
        self._rows: list[dict[str, Any]] | None = None

    # -- what a subclass provides -------------------------------------------------------
    @abc.abstractmethod
    def load_rows(self) -> list[dict[str, Any]]:
        """Read every row of the underlying data, before ``test_range``."""

    def content_key(self) -> str:
        """A key of the data's content and the reader settings: it changes exactly when the
        rows may have changed (a copied or restored file keeps it, an edit changes it)."""
        return stamped_key(type(self).__name__, files_stamp([os.path.expanduser(self.path)]), self.reader_cfg)

    # -- shared behaviour ---------------------------------------------------------------
    @property
    def inferencer(self) -> dict[str, Any]:
        """``infer_cfg.inferencer`` as a dict with its ``type`` (default ``gen``)."""
        inf = inferencer_cfg(self.infer_cfg.get("inferencer"))
        inf.setdefault("type", "gen")
        return inf

    def all_rows(self) -> list[dict[str, Any]]:
        if self._rows is None:
            self._rows = self.load_rows()
        return self._rows

    def rows(self) -> list[dict[str, Any]]:
        """The rows under evaluation (``test_range`` applied)."""
        lo, hi = parse_range(self.reader_cfg.get("test_range"), f"dataset {self.abbr}: reader_cfg")
        return self.all_rows()[lo:hi]

    def columns(self) -> list[str]:
        rows = self.all_rows()
        return sorted(rows[0].keys()) if rows else []

    def needed_columns(self) -> list[str]:
        """Columns every row must have: inputs, the answer, and what the inferencer kind reads."""
        inputs = list(self.reader_cfg.get("input_columns", []))
        if self.reader_cfg.get("output_column") is not None:
            inputs.append(self.reader_cfg["output_column"])
        inf = self.inferencer
        return inputs + get_inferencer(inf["type"], f"dataset {self.abbr}: infer_cfg.inferencer.type").columns(inf)

    def check(self, columns: list[str], where: str) -> None:
        """Raise ``ConfigError`` if the reader or prompt settings do not fit the data's columns."""
        cols = set(columns)
        missing = [c for c in self.needed_columns() if c not in cols]
        if missing:
            raise ConfigError(
                f"{where}: column {missing[0]!r} not in {self.path}; columns are: {', '.join(sorted(cols))}"
            )
        cluster = self.eval_cfg.get("cluster_key")
        if isinstance(cluster, str) and cluster not in cols:
            raise ConfigError(f"{where}: eval_cfg.cluster_key={cluster!r} is not a column of {self.path}; "
                              f"columns are: {', '.join(sorted(cols))}")
        allowed = set(self.reader_cfg.get("input_columns", [])) or cols
        allowed |= {"choice"}
        answer = self.reader_cfg.get("output_column")
        for key in ("prompt_template", "fewshot_template"):
            try:
                used = template_fields(self.infer_cfg.get(key, ""))
            except ValueError as exc:
                raise ConfigError(f"{where}: infer_cfg.{key}: {exc} (write {{{{ and }}}} for a brace)") from None
            # A worked example shows its answer: the few-shot template may use the output column.
            unknown = sorted(used - allowed - ({answer} if key == "fewshot_template" and answer else set()))
            if unknown:
                raise ConfigError(
                    f"{where}: infer_cfg.{key} uses unknown field {{{unknown[0]}}}; "
                    f"input_columns are: {', '.join(sorted(allowed - {'choice'}))}"
                )
        self._check_fewshot(where)

    def _check_fewshot(self, where: str) -> None:
        """Raise ``ConfigError`` now (while planning) for a ``fewshot`` setting that would fail
        every infer task of the dataset."""
        few = self.infer_cfg.get("fewshot")
        if not few:
            return
        k = few.get("k", 0)
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ConfigError(f"{where}: infer_cfg.fewshot.k={k!r} is not valid; give an integer >= 0")
        if few.get("source", "head") != "head":
            raise ConfigError(f"{where}: infer_cfg.fewshot.source={few['source']!r} is not valid; valid: 'head' "
                              "(the rows before reader_cfg.test_range)")
        if not isinstance(few.get("separator", ""), str):
            raise ConfigError(f"{where}: infer_cfg.fewshot.separator={few['separator']!r} is not valid; give a string")
        lo, _ = parse_range(self.reader_cfg.get("test_range"), f"{where}: reader_cfg")
        if k and (lo is None or 0 <= lo < k):
            raise ConfigError(f"{where}: infer_cfg.fewshot k={k} takes its examples from the rows before "
                              f"reader_cfg.test_range, which starts at row {lo or 0}; start it at row {k} or "
                              f"later (test_range='[{k}:]')")

    def score(self, records: list[dict[str, Any]]) -> tuple[dict[str, float], list[dict[str, Any]], dict[str, Any]]:
        """Score predictions with the dataset's own scorer (metrics, details, extra result
        fields), for a dataset that brings one (lm-eval tasks); ``NotImplementedError`` means
        ``eval_cfg.evaluator`` scores it."""
        raise NotImplementedError

    @classmethod
    def uses_chat_template(cls, cfg: dict[str, Any]) -> bool:
        """Whether this dataset's requests (config ``cfg``) are chat messages each model must read
        through its chat template (LmEvalDataset's ``apply_chat_template``); the config check
        then asks every model (``BaseModel.chat_template_problem``).  Default: False."""
        return False

    def sample_keys(self) -> list[str] | None:
        """The sample key of each row under evaluation, by sample id (:func:`digest.row_keys`):
        what ``orchestra compare`` aligns runs by.  None for a dataset whose own scorer writes
        the keys into its details (lm-eval tasks)."""
        return row_keys(self.rows())

    def gold(self, row: dict[str, Any]) -> Any:
        col = self.reader_cfg.get("output_column")
        return row.get(col) if col else None

    def _fewshot_prefix(self) -> str:
        few = self.infer_cfg.get("fewshot")
        if not few:
            return ""
        k = int(few.get("k", 0))
        lo, _ = parse_range(self.reader_cfg.get("test_range"), f"dataset {self.abbr}: reader_cfg")
        pool = self.all_rows()[: lo or 0] if few.get("source", "head") == "head" else []
        if len(pool) < k:
            raise ConfigError(
                f"dataset {self.abbr}: infer_cfg.fewshot k={k} needs {k} rows before test_range, "
                f"found {len(pool)}"
            )
        if k == 0:
            return ""
        own = self.infer_cfg.get("fewshot_template")
        examples = []
        for row in pool[:k]:
            if own:
                examples.append(prompt_text(fill_prompt(own, row)))
            else:  # the prompt, answered as the model would continue it
                prompt = fill_prompt(self._prompt_template(), row)
                examples.append(prompt_text(prompt) + self._worked_answer(row, prompt))
        sep = few.get("separator", "\n\n")
        return sep.join(examples) + sep

    def _worked_answer(self, row: dict[str, Any], prompt: Prompt) -> str:
        """The answer of a worked example: for ``loglik``, the continuation of the gold choice
        (when the gold is its index), else a space and the gold."""
        gold = self.gold(row)
        inf = self.inferencer
        if inf["type"] == "loglik" and isinstance(gold, int) and not isinstance(gold, bool):
            kind = get_inferencer("loglik", f"dataset {self.abbr}: infer_cfg.inferencer.type")
            request = kind.build(inf, 0, row, prompt, gold, f"dataset {self.abbr}").loglik
            if request is not None and 0 <= gold < len(request.continuations):
                return request.continuations[gold]
        return "" if gold is None else f" {gold}"

    def _prompt_template(self) -> Any:
        default = " ".join("{" + c + "}" for c in self.reader_cfg.get("input_columns", []))
        return self.infer_cfg.get("prompt_template", default)

    def bind_run(self, shared_dir: str) -> None:
        """Called by the infer task before :meth:`build_samples`: a folder of the run where the
        shards of this dataset may keep what they would each build alike (``LmEvalDataset``:
        lm-eval's requests).  Default: nothing."""

    def build_samples(self, start: int, end: int) -> list[Sample]:
        """Samples for rows ``[start, end)`` of :meth:`rows` (ids are row indices)."""
        rows = self.rows()
        template = self._prompt_template()
        prefix = self._fewshot_prefix()
        inf = self.inferencer
        where = f"dataset {self.abbr}"
        kind = get_inferencer(inf["type"], f"{where}: infer_cfg.inferencer.type")
        samples: list[Sample] = []
        for idx in range(start, min(end, len(rows))):
            row = rows[idx]
            prompt = fill_prompt(template, row)
            if prefix:
                if isinstance(prompt, str):
                    prompt = prefix + prompt
                else:
                    prompt = [dict(prompt[0], content=prefix + prompt[0]["content"]), *prompt[1:]]
            samples.append(kind.build(inf, idx, row, prompt, self.gold(row), where))
        return samples


_BUILT: dict[str, BaseDataset] = {}


def build_dataset(cfg: dict[str, Any]) -> BaseDataset:
    """The dataset object a config dict describes, one per config in a process.

    Construction reads nothing; rows are read on first use and then kept, so the shards of
    one dataset in a task (or in a warm worker) read the file once.
    """
    key = stable_hash(cfg)
    if key not in _BUILT:
        cls = DATASETS.resolve(cfg["type"], f"dataset {cfg.get('abbr')}")
        kwargs = {k: v for k, v in cfg.items() if k != "type"}
        try:
            ds = cls(**kwargs)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"dataset {cfg.get('abbr')}: {exc}") from None
        assert isinstance(ds, BaseDataset)
        _BUILT[key] = ds
    return _BUILT[key]
