"""From a model's completion to the Python program that is run against the tests.

The rules (``docs/scoring.md`` lists them with examples):

1. Line endings become ``\\n``.
2. Markdown: if the completion has a code fence, the code is

   * the text before the first fence, when that text is code on its own (the prompt
     opened the fence, as in ``Here is the function:\\n```python\\n``, and the model closed
     it);
   * else the first fenced block that defines the entry point, else the first block
     tagged ``python``/``py``/``python3`` or untagged, else the first block; an unclosed
     fence runs to the end.
3. A completion that defines the entry point at the top level is a whole solution: top-level
   test and driver code is dropped (``assert`` statements, calls of plain functions such as
   ``print(...)`` or ``main()``, and ``if __name__ == "__main__":`` blocks), and it is put
   after the prompt (so helpers and imports the prompt defines stay available; the prompt's
   own stub of the function is redefined).
4. Otherwise the completion continues the prompt (a function body): it stops before the
   first line after its first one that starts at column 0 (the next top-level ``def``,
   ``class``, ``if``, ``print``, comment, ...).
5. The tests follow.  The program is run by :mod:`orchestra.evaluators.sandbox_driver`,
   which prints this run's secret verdict token only when the program ran to its end: a
   program passes when it exits 0 *and* the token is in its output, so code that calls
   ``exit(0)`` before the tests ran, or prints whatever it likes, fails.
"""

from __future__ import annotations

import ast
import functools
import os
import re

#: the name of the driver (:mod:`orchestra.evaluators.sandbox_driver`) in the sandbox
DRIVER_NAME = "orchestra_driver.py"
#: the name of the program (solution and tests) in the sandbox
PROGRAM_NAME = "main.py"
_DRIVER_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_driver.py")
_TAG = re.compile(r"[ \t]*([A-Za-z0-9_+-]*)")
_PYTHON_TAGS = ("python", "py", "python3", "")


def parse(code: str) -> ast.Module | None:
    """The syntax tree of ``code``, or None when it does not parse: a syntax error, a NUL
    byte, or nesting too deep for the parser (``MemoryError`` / ``RecursionError`` on a
    completion such as a hundred thousand ``-`` signs, which must fail as a program, not
    stop the scoring)."""
    try:
        return ast.parse(code)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None


def _parses(code: str) -> bool:
    return parse(code) is not None


def defines(code: str, name: str) -> bool:
    """Whether ``code`` defines function ``name`` at its top level (syntax errors: a regex)."""
    tree = parse(code)
    if tree is None:
        return re.search(rf"^(async\s+)?def\s+{re.escape(name)}\s*\(", code, re.M) is not None
    return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name for n in tree.body)


def _is_code(text: str) -> bool:
    """Code on its own: a function body (indented) or definitions, not prose."""
    if text.lstrip("\n")[:1] in (" ", "\t"):
        return _parses("def _body():\n" + text.lstrip("\n"))
    return _parses(text) and re.search(r"^(async\s+def|def|class|import|from)\b", text, re.M) is not None


def fenced_blocks(text: str, start: int = 0) -> list[tuple[str, str]]:
    """``(tag, body)`` of each fenced block of ``text`` from ``start``: a fence opens at a
    ```` ``` ```` followed by the rest of its line (the tag is that line's first word, lower-cased)
    and runs to the next ```` ``` ```` or the end.  One pass over the text (a regular expression
    took time quadratic in a completion of many fences or a long fence line)."""
    blocks: list[tuple[str, str]] = []
    pos = start
    while True:
        opening = text.find("```", pos)
        line_end = text.find("\n", opening) if opening >= 0 else -1
        if line_end < 0:
            return blocks
        tag = _TAG.match(text, opening + 3, line_end)
        closing = text.find("```", line_end + 1)
        blocks.append(((tag.group(1) if tag else "").lower(), text[line_end + 1:closing if closing >= 0 else None]))
        if closing < 0:
            return blocks
        pos = closing + 3


def extract_code(text: str, entry_point: str | None = None) -> str:
    """Rules 1 and 2: the code in a completion."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    first = text.find("```")
    if first < 0:
        return text
    head = text[:first]
    if head.strip() and _is_code(head):
        return head
    blocks = fenced_blocks(text, first)
    if not blocks:
        return head
    if entry_point:
        for _, body in blocks:
            if defines(body, entry_point):
                return body
    for tag, body in blocks:
        if tag in _PYTHON_TAGS:
            return body
    return blocks[0][1]


def _is_main_guard(node: ast.stmt) -> bool:
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__"
            and len(test.comparators) == 1 and isinstance(test.comparators[0], ast.Constant)
            and test.comparators[0].value == "__main__")


def _is_driver(node: ast.stmt) -> bool:
    if isinstance(node, ast.Assert) or _is_main_guard(node):
        return True
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name)


def strip_driver_code(code: str) -> str:
    """Rule 3: drop top-level asserts, calls of plain functions and the ``__main__`` block
    (code that does not parse is returned as it is: running it reports the syntax error)."""
    tree = parse(code)
    if tree is None:
        return code
    lines = code.split("\n")
    drop: set[int] = set()
    for node in tree.body:
        if _is_driver(node) and node.end_lineno is not None:
            drop.update(range(node.lineno - 1, node.end_lineno))
    return "\n".join(line for i, line in enumerate(lines) if i not in drop)


def continue_body(code: str) -> str:
    """Rule 4: a function body, up to the next line (after its first) at column 0."""
    lines = code.split("\n")
    for i, line in enumerate(lines[1:], start=1):
        if line.strip() and not line[0].isspace():
            return "\n".join(lines[:i])
    return code


def _prompt_prefix(prompt: str) -> str:
    """The prompt as code that runs on its own: a stub without a body gets ``pass``."""
    if not prompt.strip() or _parses(prompt):
        return prompt
    patched = prompt.rstrip("\n") + "\n    pass\n"
    if _parses(patched):
        return patched
    # Keep only its imports (the prompt is not code; the solution must stand alone).
    return "\n".join(ln for ln in prompt.split("\n") if re.match(r"(import|from)\s", ln))


def build_solution(completion: str, prompt: str = "", entry_point: str | None = None) -> str:
    """Rules 1 to 4: the code under test, without the tests."""
    code = extract_code(completion, entry_point)
    if not prompt.strip():
        return strip_driver_code(code)
    if entry_point and defines(code, entry_point):
        return _prompt_prefix(prompt).rstrip("\n") + "\n\n\n" + strip_driver_code(code)
    return prompt + continue_body(code)


def build_program(completion: str, test: str, prompt: str = "", entry_point: str | None = None) -> str:
    """The whole program: the solution, then the tests (rule 5: the driver runs it)."""
    solution = build_solution(completion, prompt, entry_point)
    return f"{solution.rstrip()}\n\n\n{test.rstrip()}\n"


@functools.lru_cache(maxsize=1)
def driver_source() -> str:
    """The text of the driver that runs a program in the sandbox and vouches for its end."""
    with open(_DRIVER_PATH, encoding="utf-8") as f:
        return f.read()


def sandbox_files(program: str) -> dict[str, str]:
    """The files of one run: the program and the driver (started as ``python DRIVER_NAME``,
    with the verdict token on its standard input)."""
    return {PROGRAM_NAME: program, DRIVER_NAME: driver_source()}
