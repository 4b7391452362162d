"""``orchestra compare RUN_A RUN_B [RUN ...]``: compare run folders sample by sample.

Prints, per dataset, model and metric, both runs' scores, the paired difference with its 95%
interval and p-value (Holm-adjusted), the flips and the smallest detectable difference
(:mod:`orchestra.comparison`).  Exit codes: 0 compared; 2 bad input or usage (one line, never a
traceback); 1 the page could not be written.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from orchestra.errors import UserError
from orchestra.terminal import printable, say

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
HTML_FLIPS = 10  # flips listed on the page when --flips is not given


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line and exit 2, as for config errors
        self.exit(EXIT_USAGE, printable(f"{self.prog}: error: {message}\n"))


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="orchestra compare",
                description="Compare run folders sample by sample: each later run against the first (the baseline).")
    p.add_argument("runs", nargs="+", metavar="RUN", help="run folders (<work_dir>/<timestamp>), the baseline first")
    p.add_argument("--flips", type=int, metavar="N",
                   help="list N samples per dataset and model whose score changed (prompt excerpt, both answers)")
    p.add_argument("--json", action="store_true", help="print the comparison as one JSON document instead")
    p.add_argument("--html", metavar="PATH", help="also write a self-contained comparison page to PATH")
    p.add_argument("--allow-changed", action="store_true",
                   help="leave out (and count) samples whose prompt changed between the runs, instead of refusing")
    return p


def _finite(value: Any) -> Any:
    """``value`` with every NaN or infinity replaced by None (strict JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def main(argv: list[str]) -> int:
    """Run ``orchestra compare`` with ``argv`` (the arguments after ``compare``); the exit code."""
    args = build_parser().parse_args(argv)
    if args.flips is not None and args.flips < 0:
        say(f"orchestra compare: error: --flips {args.flips}: must be >= 0", file=sys.stderr)
        return EXIT_USAGE
    if len(args.runs) < 2:
        say("orchestra compare: error: give at least two run folders (the baseline first)", file=sys.stderr)
        return EXIT_USAGE
    from orchestra.comparison import compare
    from orchestra.comparison.text import escaped, lines

    flips = args.flips if args.flips is not None else (HTML_FLIPS if args.html else 0)
    try:
        cmp = compare(args.runs, allow_changed=args.allow_changed, flips=flips)
    except UserError as exc:  # it may quote names from a run folder: one line, its control characters escaped
        say(f"orchestra compare: error: {escaped(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    if args.html:
        from orchestra.comparison.html import write_page

        try:
            write_page(cmp, args.html)
        except OSError as exc:
            say(f"orchestra compare: error: {args.html}: {exc.strerror or exc}", file=sys.stderr)
            return EXIT_FAILED
    if args.json:
        doc = cmp.to_json()
        if args.flips is None:
            doc["flips"] = []  # the page's flips are listed only on the page
        sys.stdout.write(json.dumps(_finite(doc), indent=1, ensure_ascii=True, allow_nan=False) + "\n")
    else:
        shown = cmp if args.flips is not None else _without_flips(cmp)
        say("\n".join(lines(shown)))
    if args.html:
        say(f"comparison page: {args.html}", file=sys.stderr if args.json else sys.stdout)
    return EXIT_OK


def _without_flips(cmp: Any) -> Any:
    import dataclasses

    return dataclasses.replace(cmp, flips=[])
