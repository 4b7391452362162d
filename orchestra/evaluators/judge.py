"""``JudgeEvaluator``: a model grades the predictions (LLM-as-judge, as MT-Bench does).

Two modes:

* ``single``: the judge grades each answer from 1 to 10 (``Rating: [[7]]``), optionally
  against a reference answer (the dataset's ``output_column``, ``reference=True``).
* ``pairwise``: the judge compares each answer with a baseline answer (the dataset's
  ``output_column``) twice, once in each position; a verdict that flips with the order
  counts as a tie.

A multi-turn prediction (``chat`` inferencer: a list of replies) is judged turn by turn,
each turn with the conversation up to it.  The judge is any configured model; its calls go
through that model's own limits (host-wide connection slots, adaptive rate, retries).  A
judge answer that does not parse is recorded with its text and counted in
``judge_unparsed``; it is never scored as 0.  A missing or non-text answer gets the lowest
grade (single) or a loss (pairwise) and is counted in ``answers_missing``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from orchestra.errors import ConfigError
from orchestra.evaluators.heavy import HeavyEvaluator, Verdict
from orchestra.evaluators.judge_text import (
    FIELDS,
    FORMAT_VERSION,
    MODES,
    PAIR_MULTI_TEMPLATE,
    PAIR_TEMPLATE,
    SINGLE_MULTI_TEMPLATE,
    SINGLE_TEMPLATE,
    SYSTEM_PROMPT,
    flatten,
    lead_choice,
    lead_rating,
    neutralise,
    parse_preference,
    parse_rating,
    question_of,
    template_fields,
    transcript,
)
from orchestra.models.base import BaseModel
from orchestra.models.registry_cache import get_model
from orchestra.registry import MODELS
from orchestra.requests import GenRequest, Message

__all__ = ["SYSTEM_PROMPT", "JudgeEvaluator", "parse_preference", "parse_rating"]
_KEEP_OUTPUT = 4000


class JudgeEvaluator(HeavyEvaluator):
    """A model grades each prediction (see the module docstring).

    Args:
        judge: the judge model's config, as in ``models`` (``dict(type=OpenAIAPI, path=...,
            base_url=..., max_connections=...)``; ``abbr`` defaults to ``'judge'``).
        mode: ``'single'`` (grade 1-10) or ``'pairwise'`` (against the dataset's answer).
        prompt_template: the judge prompt (fields: ``single``: question, answer, reference,
            conversation, turn; ``pairwise``: question, answer_a, answer_b, conversation_a,
            conversation_b, turn).  Default: the built-in template of the mode (one for a
            single turn, one for later turns of a conversation).
        system_prompt: the judge's system message.
        reference: ``single`` only: show the dataset's answer as a reference.
        max_out_len: the judge's generation length.
        max_samples: samples judged at once by one task (default: twice the judge's
            concurrency).
        answer_prefix: the start of the judge's answer, written for it (``'Rating: [['``):
            the system prompt, the judge prompt and this prefix go to the judge as one text
            to continue, so a small model that does not follow the format's instructions
            only has to write the grade.  For judges that continue text: an API model with
            ``endpoint='completions'`` or a local model.  The messages are then flattened
            under role headers (:func:`flatten`), and the grade (or ``A``/``B``/``C``) is
            read right after the prefix, nowhere else.
    """

    speed_keys = frozenset({"max_samples"})
    model_keys = ("judge",)
    count_metrics = frozenset({"position_inconsistent", "judge_unparsed", "answers_missing"})

    def __init__(
        self,
        judge: dict[str, Any],
        mode: str = "single",
        prompt_template: str | None = None,
        system_prompt: str | None = SYSTEM_PROMPT,
        reference: bool = False,
        max_out_len: int = 512,
        max_samples: int | None = None,
        answer_prefix: str | None = None,
    ) -> None:
        if not isinstance(judge, dict) or "type" not in judge:
            raise ValueError(f"judge must be a model config dict with 'type', got {judge!r}")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        if reference and mode != "single":
            raise ValueError("reference=True is for mode='single' (pairwise always compares with the dataset's answer)")
        if prompt_template is not None:
            if not isinstance(prompt_template, str):
                raise ValueError(f"prompt_template must be a string, got {type(prompt_template).__name__}")
            try:
                unknown = sorted(template_fields(prompt_template) - FIELDS[mode])
            except ValueError as exc:
                raise ValueError(f"prompt_template: {exc} (write {{{{ and }}}} for a brace)") from None
            if unknown:
                raise ValueError(f"prompt_template uses unknown field {{{unknown[0]}}}; fields of mode {mode!r}: "
                                 f"{', '.join(sorted(FIELDS[mode]))}")
        if not isinstance(max_out_len, int) or max_out_len < 1:
            raise ValueError(f"max_out_len must be an integer >= 1, got {max_out_len!r}")
        if max_samples is not None and (not isinstance(max_samples, int) or max_samples < 1):
            raise ValueError(f"max_samples must be an integer >= 1, got {max_samples!r}")
        if answer_prefix is not None and (not isinstance(answer_prefix, str) or not answer_prefix.strip()):
            raise ValueError(f"answer_prefix must be a non-empty string, got {answer_prefix!r}")
        self.judge_cfg = {"abbr": "judge", **judge}
        self.mode = mode
        self.prompt_template = prompt_template
        self.system_prompt = system_prompt
        self.reference = reference
        self.max_out_len = max_out_len
        self.max_samples = max_samples
        self.answer_prefix = answer_prefix
        self.model: BaseModel | None = None

    # -- config ---------------------------------------------------------------------------
    @staticmethod
    def _model_class(judge: dict[str, Any]) -> type[BaseModel]:
        cls = MODELS.resolve(judge.get("type"), "judge")
        assert issubclass(cls, BaseModel)
        return cls

    @classmethod
    def identity(cls, cfg: dict[str, Any]) -> Any:
        ev = cls(**{k: v for k, v in cfg.items() if k != "type"})
        judge = ev.judge_cfg
        return {
            "mode": ev.mode,
            "templates": [ev.prompt_template] if ev.prompt_template else ev._default_templates(),
            "system_prompt": ev.system_prompt,
            "reference": ev.reference,
            "max_out_len": ev.max_out_len,
            "format_version": FORMAT_VERSION,
            "judge": [str(judge["type"]), cls._model_class(judge).identity(judge)],
            **({"answer_prefix": ev.answer_prefix} if ev.answer_prefix else {}),
        }

    @classmethod
    def resources(cls, cfg: dict[str, Any]) -> dict[str, int]:
        # A local judge model needs what its inference tasks would (its GPUs); an API judge, a core.
        judge = cfg.get("judge")
        if not isinstance(judge, dict) or "type" not in judge:
            return super().resources(cfg)
        needs = cls._model_class(judge).resources(judge)
        return {"num_gpus": needs["num_gpus"], "num_procs": max(1, needs["num_procs"])}

    @classmethod
    def check_config(cls, cfg: dict[str, Any], dataset: dict[str, Any], where: str) -> None:
        try:
            ev = cls(**{k: v for k, v in cfg.items() if k != "type"})
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{where}: {exc}") from None
        if (ev.mode == "pairwise" or ev.reference) and not (dataset.get("reader_cfg") or {}).get("output_column"):
            what = "the baseline answers" if ev.mode == "pairwise" else "the reference answers"
            raise ConfigError(f"{where}: mode={ev.mode!r}{' with reference' if ev.reference else ''} needs {what}: "
                              "set the dataset's reader_cfg.output_column")

    def _default_templates(self) -> list[str]:
        if self.mode == "single":
            return [SINGLE_TEMPLATE, SINGLE_MULTI_TEMPLATE]
        return [PAIR_TEMPLATE, PAIR_MULTI_TEMPLATE]

    # -- running --------------------------------------------------------------------------------
    async def start(self) -> dict[str, Any]:
        self.model = await asyncio.to_thread(get_model, self.judge_cfg)
        return {"judge": self.judge_cfg["abbr"], "judge_model": self.model.path, "mode": self.mode,
                "judge_concurrency": self.model.max_concurrency()}

    def max_concurrency(self) -> int:
        if self.max_samples:
            return self.max_samples
        conc = self.model.max_concurrency() if self.model is not None else 16
        return max(2 * conc, conc + 16)

    def snapshot(self) -> dict[str, Any]:
        if self.model is None:
            return {}
        stats = self.model.stats.as_dict()
        return {f"judge_{k}": stats.get(k, 0) for k in ("in_flight", "done", "rate_limited", "retries", "errors")}

    async def aclose(self) -> None:
        if self.model is not None:
            await self.model.aclose()

    async def _ask(self, content: str) -> str:
        assert self.model is not None, "start() first"
        messages: list[Message] = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        messages.append({"role": "user", "content": content})
        prompt: str | list[Message] = messages
        if self.answer_prefix:  # one text that ends where the judge's answer begins
            prompt = flatten(messages, self.answer_prefix)
        text = await self.model.generate(GenRequest(prompt=prompt, max_out_len=self.max_out_len))
        if not isinstance(text, str):
            raise TypeError(f"the judge model answered {type(text).__name__}, not text")
        return (self.answer_prefix or "") + text

    def _rating(self, text: str) -> float | None:
        if not self.answer_prefix:
            return parse_rating(text)
        # With a prefix the grade is what the judge wrote right after it, and nothing later:
        # a grade it quotes (from the answer, say) never replaces its own.
        return lead_rating(text[len(self.answer_prefix):])

    def _preference(self, text: str) -> str | None:
        if not self.answer_prefix:
            return parse_preference(text)
        return lead_choice(text[len(self.answer_prefix):])

    def _template(self, multi: bool) -> str:
        if self.prompt_template:
            return self.prompt_template
        return self._default_templates()[1 if multi else 0]

    @staticmethod
    def _turns(record: dict[str, Any]) -> tuple[list[str], Any, bool]:
        """User messages, the answer(s), and whether it is a multi-turn conversation."""
        pred = record.get("prediction")
        if "turns" in record and isinstance(record["turns"], list):
            return [str(t) for t in record["turns"]], pred, True
        return [question_of(record)], pred, False

    async def ajudge(self, record: dict[str, Any]) -> Verdict:
        users, pred, multi = self._turns(record)
        replies = pred if multi else [pred]
        if not isinstance(replies, list) or len(replies) != len(users) or not all(isinstance(r, str) for r in replies):
            return {"missing": True, "detail": f"the answer is {type(pred).__name__}, not "
                                               f"{'a list of ' + str(len(users)) + ' replies' if multi else 'text'}"}
        gold = record.get("gold")
        golds = (gold if isinstance(gold, list) else [gold]) if multi else [gold]
        if self.mode == "pairwise" or self.reference:
            if len(golds) != len(users) or not all(isinstance(g, str) for g in golds):
                raise ValueError(f"{'pairwise' if self.mode == 'pairwise' else 'reference'} judging needs the "
                                 f"dataset's answer as text per turn; gold is {repr(gold)[:80]}")
            golds = [neutralise(str(g)) for g in golds]
        users, replies = [neutralise(u) for u in users], [neutralise(r) for r in replies]
        turns = await asyncio.gather(*(self._judge_turn(users, replies, golds, k, multi) for k in range(len(users))))
        return {"turns": list(turns)}

    async def _judge_turn(self, users: list[str], replies: list[str], golds: list[Any], k: int,
                          multi: bool) -> dict[str, Any]:
        template = self._template(multi and k > 0)
        if self.mode == "single":
            ref = golds[k] if self.reference else None
            content = template.format(
                question=users[k], answer=replies[k], turn=k + 1,
                conversation=transcript(users[: k + 1], replies[: k + 1]),
                reference=ref or "",
                reference_block=f"\n[Reference answer]\n{ref}\n[End of the reference answer]\n" if ref else "",
                note=" Compare it with the reference answer shown." if ref else "",
            )
            text = await self._ask(content)
            rating = self._rating(text)
            out: dict[str, Any] = {"rating": rating, "judge_output": text[-_KEEP_OUTPUT:]}
            if rating is None:
                out["unparsed"] = True
            return out

        def pair_prompt(a: list[str], b: list[str]) -> str:
            return template.format(question=users[k], answer_a=a[k], answer_b=b[k], turn=k + 1,
                                   conversation_a=transcript(users[: k + 1], a[: k + 1]),
                                   conversation_b=transcript(users[: k + 1], b[: k + 1]))

        base = [str(g) for g in golds]
        first, second = await asyncio.gather(self._ask(pair_prompt(replies, base)),
                                             self._ask(pair_prompt(base, replies)))
        p1, p2 = self._preference(first), self._preference(second)
        out = {"verdicts": [p1, p2], "judge_outputs": [first[-_KEEP_OUTPUT:], second[-_KEEP_OUTPUT:]]}
        if p1 is None or p2 is None:
            out["outcome"], out["unparsed"] = None, True
            return out
        as_model = {"A": "win", "B": "loss", "C": "tie"}[p1]  # the prediction was assistant A
        swapped = {"A": "loss", "B": "win", "C": "tie"}[p2]  # ... and then assistant B
        out["outcome"] = as_model if as_model == swapped else "tie"
        out["consistent"] = as_model == swapped
        return out

    def _sample_turns(self, record: dict[str, Any], v: Mapping[str, Any]) -> list[float | None]:
        """One sample's score per turn as :meth:`aggregate` counts it (None: unparsed, left out)."""
        if "turns" not in v:  # no answer: the lowest grade, or a loss
            return [1.0 if self.mode == "single" else 0.0] * len(self._turns(record)[0])
        out: list[float | None] = []
        for turn in v["turns"]:
            if turn.get("unparsed"):
                out.append(None)
            elif self.mode == "single":
                out.append(float(turn["rating"]))
            else:
                out.append({"win": 1.0, "tie": 0.5, "loss": 0.0}[turn["outcome"]])
        return out

    def sample_scores(self, records: list[dict[str, Any]], details: list[dict[str, Any]]
                      ) -> dict[str, list[float | None]]:
        """Per sample: the mean of its turns' scores (the metric when every sample has as many
        scored turns), the tie share, and each turn's score."""
        name = "judge_score" if self.mode == "single" else "win_rate"
        turns = [self._sample_turns(rec, d) for rec, d in zip(records, details, strict=True)]

        def mean(xs: list[float]) -> float | None:
            return sum(xs) / len(xs) if xs else None

        out: dict[str, list[float | None]] = {
            name: [mean([x for x in t if x is not None]) for t in turns]}
        if self.mode != "single":
            out["tie_rate"] = [mean([float(x == 0.5) for x in t if x is not None]) for t in turns]
        most = max((len(t) for t in turns), default=0)
        if most > 1:
            for k in range(most):
                out[f"{name}_turn{k + 1}"] = [t[k] if k < len(t) else None for t in turns]
        return out

    def aggregate(self, records: list[dict[str, Any]], verdicts: Mapping[int, Verdict]) -> dict[str, float]:
        by_turn: dict[int, list[float]] = {}
        missing = unparsed = inconsistent = 0
        for rec in records:
            v = verdicts.get(int(rec["id"]), {})
            if "turns" not in v:  # no answer: the lowest grade, or a loss
                missing += 1
                users, _, _ = self._turns(rec)
                for k in range(len(users)):
                    by_turn.setdefault(k, []).append(1.0 if self.mode == "single" else 0.0)
                continue
            for k, turn in enumerate(v["turns"]):
                if turn.get("unparsed"):
                    unparsed += 1
                    continue
                if self.mode == "single":
                    by_turn.setdefault(k, []).append(float(turn["rating"]))
                else:
                    inconsistent += 0 if turn.get("consistent") else 1
                    by_turn.setdefault(k, []).append({"win": 1.0, "tie": 0.5, "loss": 0.0}[turn["outcome"]])
        scores = [s for turn in by_turn.values() for s in turn]
        mean = sum(scores) / len(scores) if scores else float("nan")
        metrics: dict[str, float] = {}
        if self.mode == "single":
            metrics["judge_score"] = mean
        else:
            metrics["win_rate"] = mean  # a tie counts half
            metrics["tie_rate"] = (sum(1 for s in scores if s == 0.5) / len(scores)) if scores else float("nan")
            metrics["position_inconsistent"] = float(inconsistent)
        if len(by_turn) > 1:
            for k in sorted(by_turn):
                turn_scores = by_turn[k]
                metrics[f"{'judge_score' if self.mode == 'single' else 'win_rate'}_turn{k + 1}"] = (
                    sum(turn_scores) / len(turn_scores))
        metrics["judge_unparsed"] = float(unparsed)
        metrics["answers_missing"] = float(missing)
        return metrics
