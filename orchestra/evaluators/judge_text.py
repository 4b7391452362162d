"""What a judge model is shown and how its answer is read (for :mod:`orchestra.evaluators.judge`).

The built-in prompts, the parsers of a grade or a preference, and the two defences against
quoted text: :func:`neutralise` (a quoted answer cannot close its section or open the
grader's) and :func:`flatten` (chat roles kept apart under headers when the judge continues
one text).
"""

from __future__ import annotations

import re
import string
from typing import Any

from orchestra.requests import Message, prompt_text

MODES = ("single", "pairwise")
SYSTEM_PROMPT = "You are a careful and impartial grader of answers written by AI assistants."

SINGLE_TEMPLATE = """Grade the AI assistant's answer to the question below. Judge whether it is correct, \
helpful and relevant, and whether it is as detailed as the question needs; length alone earns nothing.{note}
First justify your grade in a few sentences. Then, on the last line, give a grade from 1 (very poor) \
to 10 (excellent) written exactly like this: Rating: [[5]]

[Question]
{question}
{reference_block}
[The assistant's answer]
{answer}
[End of the answer]"""

SINGLE_MULTI_TEMPLATE = """Below is a conversation between a user and an AI assistant. Grade only the \
assistant's last reply (its reply to user message {turn}), in the light of the whole conversation. \
Judge whether it is correct, helpful and relevant, and whether it is as detailed as needed; length \
alone earns nothing.{note}
First justify your grade in a few sentences. Then, on the last line, give a grade from 1 (very poor) \
to 10 (excellent) written exactly like this: Rating: [[5]]

{conversation}
{reference_block}"""

PAIR_TEMPLATE = """Two AI assistants answered the same question. Decide which answer is better: more \
correct, more helpful, more relevant. Neither the order in which they are shown nor their length may \
sway you.
First compare them in a few sentences. Then, on the last line, give your verdict written exactly as \
one of: [[A]] if assistant A is better, [[B]] if assistant B is better, [[C]] for a tie.

[Question]
{question}

[Assistant A's answer]
{answer_a}
[End of assistant A's answer]

[Assistant B's answer]
{answer_b}
[End of assistant B's answer]"""

PAIR_MULTI_TEMPLATE = """Two AI assistants had the same conversation with a user. Decide whose reply to \
user message {turn} (the last reply of each conversation) is better: more correct, more helpful, more \
relevant. Neither the order in which they are shown nor their length may sway you.
First compare them in a few sentences. Then, on the last line, give your verdict written exactly as \
one of: [[A]] if assistant A is better, [[B]] if assistant B is better, [[C]] for a tie.

[Conversation with assistant A]
{conversation_a}
[End of the conversation with assistant A]

[Conversation with assistant B]
{conversation_b}
[End of the conversation with assistant B]"""

#: the fields each mode's template may use
FIELDS = {
    "single": {"question", "answer", "reference", "reference_block", "note", "conversation", "turn"},
    "pairwise": {"question", "answer_a", "answer_b", "conversation_a", "conversation_b", "turn"},
}
_RATING = re.compile(r"\[\[\s*(\d+(?:\.\d+)?)\s*\]\]")
# One class for the gap after the colon: ``\s*\[*\s*`` took time quadratic in a run of spaces.
_RATING_LOOSE = re.compile(r"rating\s*[:=][\s\[]*(\d+(?:\.\d+)?)", re.IGNORECASE)
_LEAD_NUMBER = re.compile(r"\s*(\d+(?:\.\d+)?)(?![\d.])")
_LEAD_CHOICE = re.compile(r"\s*([ABC])\b")
_PAIR = re.compile(r"\[\[\s*(A|B|C|tie)\s*\]\]", re.IGNORECASE)
#: Bumped when what the judge is shown or how its answer is read changes (2: quoted text is
#: neutralised, role headers when flattened, a prefix's grade is read right after it).
FORMAT_VERSION = 2
#: The role headers of a conversation flattened into one text (``answer_prefix``).
ROLE_HEADERS = {"system": "### System:", "user": "### Instruction:", "assistant": "### Response:"}
# Lines of quoted text that could pass for a boundary: a role header, a [Section] label.
_LOOKALIKE = re.compile(r"^([ \t]*)(?=#{3}|\[[A-Za-z][^\[\]\n]*\][ \t]*$)", re.MULTILINE)


def neutralise(text: str) -> str:
    """Quoted text (a question, an answer, a reference) with every line that could pass for a
    boundary of the judge's prompt - a role header (``### ...``) or a section label on a line
    of its own (``[End of the answer]``) - escaped with a backslash, so it reads the same but
    can neither close the section it is quoted in nor open one of the grader's own."""
    return _LOOKALIKE.sub(lambda m: m.group(1) + "\\", text)


def flatten(messages: list[Message], answer_prefix: str) -> str:
    """Chat messages as one text to continue, each under its role's header, ending with the
    grader's own header and ``answer_prefix``: the roles stay apart for a judge that
    continues text (quoted text cannot hold a header: :func:`neutralise`)."""
    parts = [f"{ROLE_HEADERS[m['role']]}\n{m['content'].strip()}" for m in messages]
    parts.append(f"{ROLE_HEADERS['assistant']}\n{answer_prefix}")
    return "\n\n".join(parts)


def parse_rating(text: str) -> float | None:
    """The grade in a judge's answer (the last ``[[n]]``, else ``Rating: n``), if within 1..10."""
    found = _RATING.findall(text) or _RATING_LOOSE.findall(text)
    if not found:
        return None
    value = float(found[-1])
    return value if 1.0 <= value <= 10.0 else None


def parse_preference(text: str) -> str | None:
    """``'A'``, ``'B'`` or ``'C'`` (tie) from the last ``[[A]]`` / ``[[B]]`` / ``[[C]]``."""
    found = _PAIR.findall(text)
    if not found:
        return None
    last = found[-1].upper()
    return "C" if last == "TIE" else last


def template_fields(template: str) -> set[str]:
    """The names of the fields a prompt template uses."""
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}


def transcript(users: list[str], replies: list[str]) -> str:
    """A conversation as the multi-turn templates show it."""
    parts = []
    for i, (user, reply) in enumerate(zip(users, replies), start=1):
        parts.append(f"[User message {i}]\n{user}\n\n[Assistant reply {i}]\n{reply}")
    return "\n\n".join(parts)


def question_of(record: dict[str, Any]) -> str:
    """The question of a record: its prompt, or the user messages of a chat prompt."""
    prompt = record.get("prompt", "")
    if isinstance(prompt, list):
        users = [str(m.get("content", "")) for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        return "\n\n".join(users) if users else prompt_text(prompt)
    return str(prompt)


def lead_rating(continuation: str) -> float | None:
    """The grade a judge wrote right at the start of ``continuation`` (after the answer
    prefix), if within 1..10; what it writes later is never read."""
    lead = _LEAD_NUMBER.match(continuation)
    value = float(lead.group(1)) if lead else 0.0
    return value if 1.0 <= value <= 10.0 else None


def lead_choice(continuation: str) -> str | None:
    """``'A'``, ``'B'`` or ``'C'`` right at the start of ``continuation``, if there."""
    lead = _LEAD_CHOICE.match(continuation)
    return lead.group(1).upper() if lead else None
