"""Submitted code as highlighted lines, so that a diagnostic can be shown under the line it points at.

Pygments highlights the whole file (a docstring or a C++ string spanning lines keeps its colour), and the
tokens are then cut at each newline: every line is its own piece of HTML, escaped, with Pygments' short
class names (the stylesheet comes from `stylesheet()`).
"""

from __future__ import annotations

from html import escape

from markupsafe import Markup
from pygments import lex
from pygments.formatters import HtmlFormatter
from pygments.lexers import PythonLexer
from pygments.token import STANDARD_TYPES, _TokenType

STYLE = "default"
CODE_CLASS = "code"


def highlighted_lines(source: str) -> list[Markup]:
    """One HTML fragment per line of `source` (Python, as KernelBench files are)."""
    lines: list[list[str]] = [[]]
    for token_type, text in lex(source, PythonLexer(stripnl=False, ensurenl=False)):
        css = _css_class(token_type)
        for i, piece in enumerate(text.split("\n")):
            if i:
                lines.append([])
            if piece:
                lines[-1].append(f'<span class="{css}">{escape(piece)}</span>' if css else escape(piece))
    if len(lines) > 1 and not lines[-1] and source.endswith("\n"):
        lines.pop()
    return [Markup("".join(parts)) for parts in lines]


def _css_class(token_type: _TokenType | None) -> str:
    """The class of the token's nearest kind that has one (Token itself has '')."""
    while token_type is not None and token_type not in STANDARD_TYPES:
        token_type = token_type.parent
    return STANDARD_TYPES[token_type] if token_type is not None else ""


def stylesheet() -> str:
    """The colours of the token classes, scoped to the code listings."""
    return str(HtmlFormatter(style=STYLE).get_style_defs(f".{CODE_CLASS}"))
