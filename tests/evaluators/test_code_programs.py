"""Post-processing of completions and the pass@k estimator (pure functions)."""

from __future__ import annotations

import itertools
import math
import time

import pytest

from orchestra.evaluators.code import pass_at_k
from orchestra.evaluators.programs import (
    DRIVER_NAME,
    build_program,
    build_solution,
    extract_code,
    fenced_blocks,
    sandbox_files,
)

PROMPT = 'from typing import List\n\n\ndef add(xs: List[int]) -> int:\n    """Sum of xs."""\n'


def test_plain_completion_is_kept() -> None:
    assert extract_code("    return sum(xs)\n") == "    return sum(xs)\n"


def test_fenced_block_in_a_chat_answer() -> None:
    text = "Sure! Here it is:\n```python\ndef add(xs):\n    return sum(xs)\n```\nIt sums the list.\n```\nadd([1])\n```"
    assert extract_code(text, "add") == "def add(xs):\n    return sum(xs)\n"


def test_the_block_that_defines_the_entry_point_wins() -> None:
    text = "```python\nimport math\n```\nthen\n```python\ndef add(xs):\n    return 1\n```"
    assert extract_code(text, "add") == "def add(xs):\n    return 1\n"


def test_a_prompt_that_opened_the_fence_keeps_the_code_before_the_closing_one() -> None:
    assert extract_code("    return sum(xs)\n```\nThis adds them.", "add") == "    return sum(xs)\n"
    assert extract_code("def add(xs):\n    return 0\n```\nDone", "add") == "def add(xs):\n    return 0\n"


def test_unclosed_fence_runs_to_the_end_and_crlf_is_normalised() -> None:
    assert extract_code("Here:\r\n```py\r\ndef add(xs):\r\n    return 2\r\n", "add") == "def add(xs):\n    return 2\n"


def test_a_body_stops_at_the_next_top_level_line() -> None:
    body = "    return sum(xs)\n\n\ndef unused():\n    pass\n\nprint(add([1]))\n"
    assert build_solution(body, PROMPT, "add") == PROMPT + "    return sum(xs)\n\n"


def test_a_whole_function_replaces_the_stub_and_drops_driver_code() -> None:
    completion = ("import math\n\ndef helper(x):\n    return x\n\ndef add(xs):\n    return sum(map(helper, xs))\n\n"
                  "print(add([1, 2]))\nassert add([1]) == 1\nmain()\nif __name__ == '__main__':\n    add([3])\n")
    solution = build_solution(completion, PROMPT, "add")
    assert solution.startswith(PROMPT)  # the prompt's imports stay available
    assert "def helper(x)" in solution and "import math" in solution
    for gone in ("print(", "assert", "main()", "__main__"):
        assert gone not in solution
    namespace: dict = {}
    exec(solution, namespace)
    assert namespace["add"]([1, 2, 3]) == 6


def test_a_stub_without_a_body_gets_one() -> None:
    solution = build_solution("def f(x):\n    return x + 1\n", "def f(x):\n", "f")
    namespace: dict = {}
    exec(solution, namespace)
    assert namespace["f"](1) == 2


def test_a_whole_solution_without_a_prompt_and_code_that_does_not_parse() -> None:
    assert build_solution("def f(:\n  pass\nprint(1)\n", "", "f") == "def f(:\n  pass\nprint(1)\n"
    assert "print" not in build_solution("def f():\n    return 1\nprint(f())\n", "", "f")


def test_the_program_ends_with_its_tests_and_carries_no_pass_marker() -> None:
    program = build_program("    return sum(xs)\n", "assert add([1, 2]) == 3\n", PROMPT, "add")
    assert program.index("return sum(xs)") < program.index("assert add")
    assert program.rstrip().endswith("assert add([1, 2]) == 3")  # nothing after the tests: the driver vouches
    files = sandbox_files(program)
    assert files["main.py"] == program and "def vouch" in files[DRIVER_NAME]


@pytest.mark.parametrize("n", [1, 2, 5, 7])
def test_pass_at_k_equals_the_exact_probability(n: int) -> None:
    for c in range(n + 1):
        for k in range(1, n + 1):
            draws = list(itertools.combinations(range(n), k))
            exact = sum(1 for d in draws if any(i < c for i in d)) / len(draws)
            assert math.isclose(pass_at_k(n, c, k), exact, abs_tol=1e-12)


def test_pass_at_k_refuses_impossible_counts() -> None:
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)


@pytest.mark.parametrize("code", ["-" * 100_000 + "1", "1" + "+1" * 100_000, "x = " + "not " * 100_000 + "1"])
@pytest.mark.parametrize(("prompt", "entry"), [("", None), ("", "f"), ("def f():\n", "f")])
def test_code_too_deep_for_the_parser_is_kept_as_it_is(code: str, prompt: str, entry: str | None) -> None:
    """The parser's MemoryError / RecursionError on hostile nesting is "does not parse", never an
    exception out of the post-processing (the program then fails in the sandbox)."""
    for completion in (code, f"```python\n{code}\n```"):
        program = build_program(completion, "assert True\n", prompt, entry)
        assert code in program and program.endswith("assert True\n")


@pytest.mark.parametrize("completion", [
    "Here:\n```\n" + "```" * 100_000,  # 100,000 fences on one line
    "```" + " " * 300_000,  # a fence line of 300,000 spaces
    "```" + "python" * 50_000 + "\ndef f():\n    return 1\n```",  # a 300 KB tag
])
def test_hostile_fences_take_linear_time(completion: str) -> None:
    """Post-processing runs on the eval task's event loop: the fence regular expression took
    time quadratic in these (about 75 s for the first, at 300 KB), stalling every sample."""
    started = time.monotonic()
    build_program(completion, "assert True\n", "", "f")
    assert time.monotonic() - started < 20.0  # quadratic took 75 s to minutes; linear takes milliseconds


def test_fenced_blocks_read_tags_bodies_and_unclosed_fences() -> None:
    text = "intro\n```Python extra words\nA\n```\nmid\n```\nB\n```js\n"
    assert fenced_blocks(text) == [("python", "A\n"), ("", "B\n"), ]
    assert fenced_blocks("```py\nopen to the end") == [("py", "open to the end")]
    assert fenced_blocks("``` no line after the fence") == [] and fenced_blocks("no fence") == []
