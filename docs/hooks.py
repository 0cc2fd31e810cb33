"""MkDocs hook: the command-line reference is generated from the CLI's own parser
(``pyqueue.cli.build_parser``), so it cannot drift from ``pyqueue --help``."""

from __future__ import annotations

import argparse
import os
from typing import Any

MARKER = "<!-- pyqueue-cli-help -->"


def cli_reference() -> str:
    os.environ["COLUMNS"] = "100"  # argparse wraps help to the terminal's width
    from pyqueue.cli import build_parser

    parser = build_parser()
    parts = ["## `pyqueue`", "", "```text", parser.format_help().rstrip(), "```", ""]
    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for action in subparsers:
        for name, sub in action.choices.items():
            parts += [f"## `pyqueue {name}`", "", "```text", sub.format_help().rstrip(), "```", ""]
            nested = [a for a in sub._actions if isinstance(a, argparse._SubParsersAction)]
            for inner in nested:
                for inner_name, inner_sub in inner.choices.items():
                    parts += [f"### `pyqueue {name} {inner_name}`", "", "```text",
                              inner_sub.format_help().rstrip(), "```", ""]
    return "\n".join(parts)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if MARKER in markdown:
        return markdown.replace(MARKER, cli_reference())
    return markdown
