"""Inferencer kinds: how a dataset row becomes a request, how it is run, what is recorded.

A dataset's ``infer_cfg.inferencer`` names a kind (``dict(type='gen', max_out_len=16)``).  Each
kind is one object that knows its config keys, checks them, builds a :class:`Sample` from a
row and its prompt, and runs the sample against a model into a prediction record.  Config
validation, datasets and the engine all ask the kind; adding a kind is one class here and one
entry in :data:`INFERENCERS`.
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
import math
import numbers
import string
from typing import TYPE_CHECKING, Any, ClassVar

from orchestra.errors import ConfigError, check_known_keys
from orchestra.requests import GenRequest, LoglikRequest, Message, Prompt, Sample

if TYPE_CHECKING:
    from orchestra.models.base import BaseModel


def _serializable_prompt(prompt: Any) -> Any:
    return prompt if isinstance(prompt, (str, list)) else str(prompt)


def _text(answer: Any, sample: Sample) -> str:
    """A generation as recorded: text, or ``ValueError`` (the sample fails, nothing wrong is recorded)."""
    if not isinstance(answer, str):
        raise ValueError(f"sample {sample.id}: the model answered {type(answer).__name__}, not text")
    return answer


def _logliks(answer: Any, count: int, sample: Sample) -> list[float]:
    """One log-likelihood per continuation, each a real number (``-inf`` included: a continuation
    the model rules out), or ``ValueError``: a short list or a NaN would pick a wrong best choice."""
    if not isinstance(answer, (list, tuple)) or len(answer) != count:
        n = len(answer) if isinstance(answer, (list, tuple)) else type(answer).__name__
        raise ValueError(f"sample {sample.id}: the model answered {n} log-likelihood(s) for {count} continuations")
    for value in answer:
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or math.isnan(value) or value == math.inf:
            raise ValueError(f"sample {sample.id}: the model answered log-likelihood {value!r}, not a number "
                             "below infinity")
    return [float(v) for v in answer]


#: what a list column that holds text most likely needs (a CSV cell is text unless typed)
CSV_HINT = " (a CSV column: column_types=dict({column}='json') reads a cell such as [\"A\", \"B\"] as a list)"


def _shown(value: Any) -> str:
    """A row's value in an error line: its type and the start of its repr."""
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


class Inferencer(abc.ABC):
    """One kind of inference work."""

    name: ClassVar[str]
    #: config keys of ``infer_cfg.inferencer`` this kind accepts (``type`` included)
    keys: ClassVar[frozenset[str]]

    def check(self, cfg: dict[str, Any], where: str) -> None:
        """Raise ``ConfigError`` for an unknown key or a missing setting; ``where`` names the config."""
        check_known_keys(cfg, sorted(self.keys), where, of=f"for {self.name}")

    def columns(self, cfg: dict[str, Any]) -> list[str]:
        """Columns of a row this kind reads besides the prompt's input columns."""
        return []

    @abc.abstractmethod
    def build(self, cfg: dict[str, Any], idx: int, row: dict[str, Any], prompt: Prompt, gold: Any,
              where: str) -> Sample:
        """The sample of row ``idx`` whose filled prompt is ``prompt``."""

    @abc.abstractmethod
    async def run(self, model: BaseModel, sample: Sample) -> dict[str, Any]:
        """Run ``sample`` on ``model``; the prediction record (``id``, ``prediction``, ``gold``, ...)."""


def _gen_settings(cfg: dict[str, Any], prompt: Prompt) -> GenRequest:
    max_out_len = cfg.get("max_out_len")
    return GenRequest(
        prompt=prompt,
        max_out_len=int(max_out_len) if max_out_len is not None else None,
        stop=tuple(cfg.get("stop", ())),
        temperature=float(cfg.get("temperature", 0.0)),
        top_p=float(cfg.get("top_p", 1.0)),
        seed=cfg.get("seed"),
    )


class GenInferencer(Inferencer):
    """Generate one answer per row (``max_out_len`` unset: the model's own), or ``n`` answers
    (the prediction is then their list; with a ``seed``, answer ``i`` uses ``seed + i``)."""

    name = "gen"
    keys = frozenset({"type", "max_out_len", "stop", "temperature", "top_p", "seed", "n"})

    def check(self, cfg: dict[str, Any], where: str) -> None:
        super().check(cfg, where)
        n = cfg.get("n", 1)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"{where}.n: expected an integer >= 1 (answers per row), got {n!r}")

    def build(self, cfg: dict[str, Any], idx: int, row: dict[str, Any], prompt: Prompt, gold: Any,
              where: str) -> Sample:
        return Sample(id=idx, kind=self.name, gold=gold, gen=_gen_settings(cfg, prompt),
                      num_samples=int(cfg.get("n", 1)))

    async def run(self, model: BaseModel, sample: Sample) -> dict[str, Any]:
        if sample.gen is None:
            raise ValueError(f"sample {sample.id}: kind 'gen' without a request")
        prediction: str | list[str]
        if sample.num_samples == 1:
            prediction = _text(await model.generate(sample.gen), sample)
        else:
            req = sample.gen
            reqs = [req if req.seed is None else dataclasses.replace(req, seed=req.seed + i)
                    for i in range(sample.num_samples)]
            prediction = [_text(a, sample) for a in await asyncio.gather(*(model.generate(r) for r in reqs))]
        return {"id": sample.id, "prompt": _serializable_prompt(sample.gen.prompt), "prediction": prediction,
                "gold": sample.gold}


def _named_fields(template: str) -> set[str]:
    """The columns a ``str.format`` template names (``{tag}``, ``{tag.x}``, ``{tag[0]}`` name ``tag``);
    ``ValueError`` for a broken template or a positional field (``{}``, ``{0}``)."""
    names: set[str] = set()
    for _, field, _, _ in string.Formatter().parse(template):
        if field is None:
            continue
        name = field.split(".")[0].split("[")[0]
        if not name or name.isdigit():
            raise ValueError(f"positional field {{{field}}}: name a column or {{choice}}")
        names.add(name)
    return names


class LoglikInferencer(Inferencer):
    """Score every choice of a row as a continuation of its prompt; the prediction is the best.

    ``continuation_template`` (default ``' {choice}'``) makes each continuation from the choice
    and the row's columns; ``{choice}`` is the choice even where the row has a column of that name.
    The columns it names are checked with the data before anything runs."""

    name = "loglik"
    keys = frozenset({"type", "choices_column", "choices", "continuation_template"})
    default_template = " {choice}"

    def check(self, cfg: dict[str, Any], where: str) -> None:
        super().check(cfg, where)
        if not cfg.get("choices_column") and not cfg.get("choices"):
            raise ConfigError(f"{where}: loglik needs choices_column (a column) or choices (a list)")
        if not cfg.get("choices_column") and not isinstance(cfg["choices"], (list, tuple)):
            raise ConfigError(f"{where}.choices: expected a list such as ['A', 'B'], got {cfg['choices']!r}")
        template = cfg.get("continuation_template", self.default_template)
        if not isinstance(template, str):
            raise ConfigError(f"{where}.continuation_template: expected a string such as ' {{choice}}', "
                              f"got {template!r}")
        try:
            _named_fields(template)
        except ValueError as exc:
            raise ConfigError(f"{where}.continuation_template: {template!r}: {exc} "
                              "(write {{ and }} for a brace)") from None

    def columns(self, cfg: dict[str, Any]) -> list[str]:
        named = [cfg["choices_column"]] if cfg.get("choices_column") else []
        try:
            fields = _named_fields(str(cfg.get("continuation_template", self.default_template)))
        except ValueError:  # check() reports it
            fields = set()
        return named + sorted(fields - {"choice", *named})

    def build(self, cfg: dict[str, Any], idx: int, row: dict[str, Any], prompt: Prompt, gold: Any,
              where: str) -> Sample:
        column = cfg.get("choices_column")
        choices = row[column] if column else cfg.get("choices")
        if not isinstance(choices, (list, tuple)):  # a text would be scored letter by letter
            raise ConfigError(f"{where}: row {idx}: column {column!r} holds {_shown(choices)}, not a list of choices"
                              f"{CSV_HINT.format(column=column) if isinstance(choices, str) else ''}")
        if not choices:
            raise ConfigError(f"{where}: row {idx}: column {column!r} holds no choices")
        template = cfg.get("continuation_template", self.default_template)
        continuations = tuple(template.format_map({**row, "choice": c}) for c in choices)
        return Sample(id=idx, kind=self.name, gold=gold, choices=tuple(str(c) for c in choices),
                      loglik=LoglikRequest(context=prompt, continuations=continuations))

    async def run(self, model: BaseModel, sample: Sample) -> dict[str, Any]:
        if sample.loglik is None:
            raise ValueError(f"sample {sample.id}: kind 'loglik' without a request")
        lls = _logliks(await model.loglikelihood(sample.loglik), len(sample.loglik.continuations), sample)
        best = max(range(len(lls)), key=lls.__getitem__)
        return {"id": sample.id, "prompt": _serializable_prompt(sample.loglik.context),
                "continuations": list(sample.loglik.continuations), "choices": list(sample.choices), "logliks": lls,
                "prediction": best, "gold": sample.gold}


class ChatInferencer(Inferencer):
    """A multi-turn conversation: one user turn per element of ``turns_column``, each sent the
    moment the previous reply arrives (no barrier across conversations)."""

    name = "chat"
    keys = frozenset({"type", "turns_column", "max_out_len", "stop", "temperature", "top_p", "seed"})

    def check(self, cfg: dict[str, Any], where: str) -> None:
        super().check(cfg, where)
        if not cfg.get("turns_column"):
            raise ConfigError(f"{where}: chat needs turns_column (a column of user turns)")

    def columns(self, cfg: dict[str, Any]) -> list[str]:
        return [cfg["turns_column"]]

    def build(self, cfg: dict[str, Any], idx: int, row: dict[str, Any], prompt: Prompt, gold: Any,
              where: str) -> Sample:
        column = cfg["turns_column"]
        turns = row[column]
        if not isinstance(turns, (list, tuple)):  # a text would be sent letter by letter
            raise ConfigError(f"{where}: row {idx}: column {column!r} holds {_shown(turns)}, not a list of user turns"
                              f"{CSV_HINT.format(column=column) if isinstance(turns, str) else ''}")
        turns = [str(t) for t in turns]
        return Sample(id=idx, kind=self.name, gold=gold, turns=turns, chat_template=_gen_settings(cfg, ""))

    async def run(self, model: BaseModel, sample: Sample) -> dict[str, Any]:
        settings = sample.chat_template or GenRequest(prompt="")
        messages: list[Message] = []
        replies: list[str] = []
        for turn in sample.turns:
            messages.append({"role": "user", "content": turn})
            req = GenRequest(prompt=list(messages), max_out_len=settings.max_out_len, stop=settings.stop,
                             temperature=settings.temperature, top_p=settings.top_p, seed=settings.seed)
            reply = _text(await model.generate(req), sample)
            messages.append({"role": "assistant", "content": reply})
            replies.append(reply)
        return {"id": sample.id, "turns": sample.turns, "prediction": replies, "gold": sample.gold}


class LmEvalInferencer(Inferencer):
    """lm-eval's requests of one document (built by ``LmEvalDataset``, never from a config):
    ``loglikelihood`` pairs sharing a context go to the model as one scoring request,
    those of ``output_type: loglikelihood`` tasks (marked ``greedy``) with ``is_greedy``,
    ``loglikelihood_rolling`` texts as the model's rolling windows, ``generate_until``
    generates with lm-eval's stop sequences.  A request whose context lm-eval built as chat
    messages (``apply_chat_template``) carries them as ``chat``: they go to the model as such, to
    be read lm-eval's way (``lmeval_chat``).  The record keeps the requests and the answers in
    lm-eval's shapes (``[logprob, is_greedy]``, a logprob, a text) for lm-eval to score."""

    name = "lmeval"
    keys = frozenset({"type"})

    def check(self, cfg: dict[str, Any], where: str) -> None:
        others = ", ".join(k for k in INFERENCERS if k != self.name)
        raise ConfigError(f"{where}.type: 'lmeval' is LmEvalDataset's own kind (it builds lm-eval's requests "
                          f"itself, with no infer_cfg.inferencer); valid here: {others}")

    def build(self, cfg: dict[str, Any], idx: int, row: dict[str, Any], prompt: Prompt, gold: Any,
              where: str) -> Sample:
        raise ConfigError(f"{where}: inferencer 'lmeval' is built by LmEvalDataset only")

    @staticmethod
    def _gen(call: dict[str, Any]) -> GenRequest:
        args, chat = call["args"], call.get("chat")
        ctx, kwargs = args[0], dict(args[1] or {})
        until = kwargs.get("until") or []
        sampled = bool(kwargs.get("do_sample", False))
        return GenRequest(prompt=ctx if chat is None else list(chat), max_out_len=int(kwargs.get("max_gen_toks", 256)),
                          stop=tuple([until] if isinstance(until, str) else until),
                          temperature=float(kwargs.get("temperature", 0.0)) if sampled else 0.0,
                          top_p=float(kwargs.get("top_p", 1.0)) if sampled else 1.0, lmeval_chat=chat is not None)

    async def run(self, model: BaseModel, sample: Sample) -> dict[str, Any]:
        # (context, is_greedy asked) -> indices of its loglikelihood calls
        contexts: dict[tuple[str, bool], list[int]] = {}
        jobs: list[Any] = []
        slots: list[tuple[int, int]] = []  # (job, position in the job's answer) per call
        for i, call in enumerate(sample.calls):
            kind, args = call["type"], call["args"]
            if kind == "loglikelihood":
                contexts.setdefault((args[0], bool(call.get("greedy"))), []).append(i)
                slots.append((-1, 0))
            elif kind == "loglikelihood_rolling":
                slots.append((len(jobs), 0))
                jobs.append(_checked_rolling(model, args[0], sample))
            elif kind == "generate_until":
                slots.append((len(jobs), -1))
                jobs.append(_checked_text(model, self._gen(call), sample))
            else:
                raise ValueError(f"sample {sample.id}: lm-eval request type {kind!r} is not supported")
        for (ctx, greedy), members in contexts.items():
            conts = tuple(sample.calls[i]["args"][1] for i in members)
            for pos, i in enumerate(members):
                slots[i] = (len(jobs), pos)
            chat = sample.calls[members[0]].get("chat")  # the messages lm-eval's context stands for
            request = LoglikRequest(context=ctx if chat is None else list(chat), continuations=conts,
                                    lmeval_chat=chat is not None)
            jobs.append(_checked_greedy(model, request, sample) if greedy else _checked_logliks(model, request, sample))
        answers = await asyncio.gather(*jobs)
        responses: list[Any] = []
        for call, (job, pos) in zip(sample.calls, slots, strict=True):
            if call["type"] == "loglikelihood":
                answer = answers[job][pos]
                responses.append(list(answer) if isinstance(answer, tuple) else [answer, False])
            else:
                responses.append(answers[job])
        return {"id": sample.id, "gold": sample.gold, "calls": sample.calls, "responses": responses,
                "prediction": responses}


async def _checked_logliks(model: BaseModel, request: LoglikRequest, sample: Sample) -> list[float]:
    return _logliks(await model.loglikelihood(request), len(request.continuations), sample)


async def _checked_greedy(model: BaseModel, request: LoglikRequest, sample: Sample) -> list[tuple[float, bool]]:
    """``(log-likelihood, is greedy)`` per continuation, each checked as :func:`_logliks` checks one."""
    answer = await model.loglikelihood_greedy(request)
    if not isinstance(answer, list) or not all(isinstance(a, tuple) and len(a) == 2 for a in answer):
        raise ValueError(f"sample {sample.id}: the model answered {type(answer).__name__}, not (log-likelihood, "
                         "is greedy) pairs")
    values = _logliks([a[0] for a in answer], len(request.continuations), sample)
    return [(v, bool(a[1])) for v, a in zip(values, answer, strict=True)]


async def _checked_rolling(model: BaseModel, text: str, sample: Sample) -> float:
    request = LoglikRequest(context="", continuations=(text,))
    return _logliks(await model.loglikelihood_rolling(request), 1, sample)[0]


async def _checked_text(model: BaseModel, request: GenRequest, sample: Sample) -> str:
    return _text(await model.generate(request), sample)


INFERENCERS: dict[str, Inferencer] = {
    k.name: k for k in (GenInferencer(), LoglikInferencer(), ChatInferencer(), LmEvalInferencer())}


def inferencer_cfg(raw: Any) -> dict[str, Any]:
    """``infer_cfg.inferencer`` as a dict (a bare name ``'gen'`` is ``dict(type='gen')``)."""
    if raw is None:
        return {"type": "gen"}
    if isinstance(raw, str):
        return {"type": raw}
    return dict(raw)


def get_inferencer(name: Any, where: str) -> Inferencer:
    """The kind called ``name``; ``ConfigError`` naming ``where`` and the valid kinds if none is."""
    kind = INFERENCERS.get(name) if isinstance(name, str) else None
    if kind is None:
        raise ConfigError(f"{where}: {name!r} is not valid; valid: {', '.join(INFERENCERS)}")
    return kind
