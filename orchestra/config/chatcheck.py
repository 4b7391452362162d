"""The config check of datasets whose requests go through each model's chat template.

A dataset that says so (``BaseDataset.uses_chat_template``: LmEvalDataset with
``apply_chat_template=True``) runs only on models that can read its chat messages as lm-eval
does (``BaseModel.chat_template_problem``): a local model's tokenizer must have a template
(``lm_eval`` refuses one without), and where the dataset scores log-likelihoods the model
must be able to score a rendered conversation (a chat endpoint cannot).  A mismatch is one
line naming both entries, before anything runs.
"""

from __future__ import annotations

from typing import Any

from orchestra.datasets.base import BaseDataset
from orchestra.errors import ConfigError
from orchestra.models.base import BaseModel
from orchestra.registry import DATASETS, MODELS


def check_chat_templates(models: list[dict[str, Any]], datasets: list[dict[str, Any]], source: str) -> None:
    """Refuse a (model, chat-template dataset) pair the model cannot run; whether the dataset
    needs log-likelihoods (its ``needs_loglik``: lm-eval's probe, seconds) is asked only when a
    model could run it only without them."""
    for j, d in enumerate(datasets):
        cls: type[BaseDataset] = DATASETS.resolve(d["type"], f"{source}: datasets[{j}]")
        if not cls.uses_chat_template(d):
            continue
        scoring: str | None | bool = False
        for i, m in enumerate(models):
            model_cls: type[BaseModel] = MODELS.resolve(m["type"], f"{source}: models[{i}]")
            where = (f"{source}: models[{i}] ({m.get('abbr')!r}) cannot run datasets[{j}] ({d.get('abbr')!r}) "
                     "with apply_chat_template=True")
            problem = model_cls.chat_template_problem(m, scoring=False)
            if problem:
                raise ConfigError(f"{where}: {problem}")
            problem = model_cls.chat_template_problem(m, scoring=True)
            if not problem:
                continue
            if scoring is False:
                needs = getattr(cls, "needs_loglik", None)
                scoring = needs(d) if callable(needs) else None
            if scoring:
                raise ConfigError(f"{where}: its {scoring} needs log-likelihoods, and {problem}")
