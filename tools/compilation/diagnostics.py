"""Compiler and interpreter messages, pointed back at the line of the submitted file that caused them.

A submission is one Python file whose C++/CUDA lives in string literals. `load_inline` copies those
strings into generated files (`main.cpp`, `cuda.cu`) behind a few prologue lines, so nvcc and g++
report lines of files the author never wrote. An author (human or model) fixes code by the line of
their own file, so every message is mapped back to the submission by matching the generated file's
text against the submitted text; when no single submitted line fits, the line stays None rather
than pointing somewhere wrong, and the generated file and line are kept.
"""

from __future__ import annotations

import re
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from kernelloop.tools.results import Diagnostic

MAX_DIAGNOSTICS = 50
CONTEXT_LINES = 5  # non-blank lines compared on each side of the reported line
ECHO_WINDOW = 8  # log lines after a message searched for the compiler's echo of the source line
LOAD_INLINE_FILES = {"main.cpp", "cuda.cu"}  # the files load_inline writes from the submitted strings
BUILD_FAILURE_PREFIX = "Error building extension"

_ANSI = re.compile(r"\x1b\[[0-9;]*[mK]")
# g++ (and the host compiler under nvcc): /path/main.cpp:12:5: error: message
_GCC = re.compile(
    r"^(?P<file>[^\s:][^:]*):(?P<line>\d+):(?:(?P<col>\d+):)? "
    r"(?P<sev>fatal error|error|warning|note): (?P<msg>.*)$"
)
# nvcc's front end (cudafe): /path/cuda.cu(12): warning #177-D: message
_NVCC = re.compile(
    r"^(?P<file>\S.*?)\((?P<line>\d+)\): "
    r"(?P<sev>catastrophic error|error|warning|remark|note)(?: #(?P<code>[\w-]+))?: (?P<msg>.*)$"
)
_PTXAS = re.compile(r"^ptxas\s+(?P<sev>fatal|error|warning)\s*: (?P<msg>.*)$")
# ld, collect2 and nvlink name themselves; ld may also print just "main.cpp:(.text+0x5): undefined reference to"
_LINKER = re.compile(
    r"^(?:\S*/)?(?P<msg>(?:ld(?:\.\w+)?|collect2|nvlink(?: \w+)?)\s*: (?P<body>.*)"
    r"|\S+: undefined reference to .*)$"
)
_LINKER_CONTEXT = re.compile(r": in function .*:$")  # ld's "main.o: in function `f':" precedes the real message
_GCC_QUOTE = r"^\s*{line} \| ?(?P<text>.*)$"  # g++ echoes the source line as "   12 |     code"
_CARET = re.compile(r"^\s*\^[~^]*\s*$")  # nvcc echoes the source line, then a caret line under it
_SEVERITY = {"fatal error": "error", "catastrophic error": "error", "fatal": "error", "remark": "note"}


def excerpt(source: str, line: int | None) -> str | None:
    """The submitted line's text, so a reader sees the code without opening the file."""
    lines = source.splitlines()
    return lines[line - 1] if line is not None and 1 <= line <= len(lines) else None


def python_error_diagnostics(exc: BaseException, source: str, submission_path: str) -> list[Diagnostic]:
    """Diagnostics for an exception raised while importing the submission from `submission_path`.

    Syntax errors carry their own position; any other exception is placed at the innermost traceback
    frame inside the submission, the author's last line before the failure. A failed load_inline build
    is a RuntimeError holding the whole ninja log, so it becomes the compiler's own diagnostics plus
    one error at the load_inline call.
    """
    if isinstance(exc, SyntaxError) and exc.filename in (submission_path, None):
        message = f"{type(exc).__name__}: {exc.msg}"
        return [
            Diagnostic(
                severity="error",
                line=exc.lineno,
                column=exc.offset,
                message=message,
                excerpt=excerpt(source, exc.lineno),
            )
        ]
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == submission_path]
    line = frames[-1].lineno if frames else None
    text = str(exc)
    if isinstance(exc, RuntimeError) and text.startswith(BUILD_FAILURE_PREFIX):
        headline = text.split(":", 1)[0]  # "Error building extension 'name'"; the rest is the log
        return [
            *build_log_diagnostics(text, source),
            Diagnostic(
                severity="error",
                line=line,
                message=f"RuntimeError: {headline}",
                excerpt=excerpt(source, line),
                tool="torch",
            ),
        ]
    message = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return [Diagnostic(severity="error", line=line, message=message, excerpt=excerpt(source, line))]


def build_log_diagnostics(log: str, source: str) -> list[Diagnostic]:
    """Diagnostics parsed from a load_inline/ninja build log, in log order, de-duplicated, capped.

    Order is kept because the first error usually causes the rest; duplicates are dropped because
    nvcc repeats front-end messages for each target architecture; the cap keeps a template explosion from
    burying the first error. Lines naming a generated file are mapped back to the submission.
    """
    lines = _ANSI.sub("", log).splitlines()
    sources = _Sources(source.splitlines())
    seen: set[tuple[str | None, int | None, str]] = set()  # (file, line, message)
    diagnostics: list[Diagnostic] = []
    for i, text in enumerate(lines):
        diagnostic = _parse_line(text, lines[i + 1 : i + 1 + ECHO_WINDOW], sources)
        if diagnostic is None:
            continue
        key = (diagnostic.generated_file, diagnostic.generated_line, diagnostic.message)
        if key in seen:
            continue
        seen.add(key)
        diagnostics.append(diagnostic)
        if len(diagnostics) == MAX_DIAGNOSTICS:
            break
    return diagnostics


@dataclass
class _Sources:
    """The submission's lines, and the lines of each file load_inline wrote from it (read once, when a message
    names it)."""

    submitted: list[str]
    generated: dict[str, list[str] | None] = field(default_factory=dict)

    def generated_lines(self, path: str) -> list[str] | None:
        if path not in self.generated:
            self.generated[path] = _read_lines(path)
        return self.generated[path]


def _parse_line(text: str, following: list[str], sources: _Sources) -> Diagnostic | None:
    """One log line as a diagnostic, or None for commands, context lines and source echoes."""
    if m := _GCC.match(text) or _NVCC.match(text):
        fields = m.groupdict()
        path, line = fields["file"], int(fields["line"])
        message = f"{fields['msg']} [#{fields['code']}]" if fields.get("code") else fields["msg"]
        column = int(fields["col"]) if fields.get("col") else None
        tool = "nvcc" if path.endswith((".cu", ".cuh")) else "gcc"
        said = Diagnostic(
            severity=_SEVERITY.get(fields["sev"], fields["sev"]),
            column=column,
            message=message,
            tool=tool,
            generated_file=Path(path).name,
            generated_line=line,
        )
        return _located(said, path, _quoted_source(line, following), sources)
    if m := _PTXAS.match(text):
        return Diagnostic(
            severity=_SEVERITY.get(m["sev"], m["sev"]), line=None, message=f"ptxas: {m['msg']}", tool="nvcc"
        )
    if (m := _LINKER.match(text)) and not _LINKER_CONTEXT.search(text):
        severity = "warning" if (m["body"] or "").startswith("warning:") else "error"
        return Diagnostic(severity=severity, line=None, message=m["msg"], tool="linker")
    return None


def _quoted_source(line: int, following: list[str]) -> str | None:
    """The source line a compiler echoed after its message (g++ "  12 | code", nvcc's line above a caret)."""
    gcc_quote = re.compile(_GCC_QUOTE.format(line=line))
    for i, text in enumerate(following):
        if _GCC.match(text) or _NVCC.match(text):
            return None
        if m := gcc_quote.match(text):
            return m["text"]
        if i > 0 and _CARET.match(text):
            return following[i - 1]
    return None


def _located(said: Diagnostic, path: str, quoted: str | None, sources: _Sources) -> Diagnostic:
    """A compiler's diagnostic on line `said.generated_line` of the file at `path` (which may have echoed that line,
    `quoted`), with its line mapped to the submission when the file is one load_inline wrote."""
    generated_line, column, submitted = said.generated_line or 0, said.column, sources.submitted
    line, generated_text = None, quoted
    if said.generated_file in LOAD_INLINE_FILES:
        file_lines = sources.generated_lines(path)
        if file_lines is not None and 1 <= generated_line <= len(file_lines):
            generated_text = file_lines[generated_line - 1]
            line = _align(file_lines, generated_line, submitted)
        elif quoted is not None:
            line = _unique_match(quoted, submitted)
    text = submitted[line - 1] if line is not None else None
    if text is not None and column is not None and generated_text is not None:
        column += _indent(text) - _indent(generated_text)  # the string may have been dedented
    return said.model_copy(update={"line": line, "column": column, "excerpt": text})


def submitted_line(generated_path: str, generated_line: int, source: str) -> int | None:
    """The submitted line that line `generated_line` of a file load_inline wrote (cuda.cu, main.cpp) was copied
    from, or None where it is not one of those files or no single submitted line fits."""
    if Path(generated_path).name not in LOAD_INLINE_FILES:
        return None
    file_lines = _read_lines(generated_path)
    if file_lines is None or not 1 <= generated_line <= len(file_lines):
        return None
    return _align(file_lines, generated_line, source.splitlines())


def _read_lines(path: str) -> list[str] | None:
    try:
        return Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return None


def _align(generated: list[str], n: int, submitted: list[str]) -> int | None:
    """The submitted line that generated line `n` (1-based) was copied from, or None if not one clear winner.

    Every submitted line with the same text is a candidate; each candidate's offset is scored by how
    many of the surrounding non-blank generated lines also reappear at that offset. Text is compared
    stripped, since a submission may dedent its strings. A line with context but no matching context
    is rejected: it is likely generated code (the pybind block's "}") that merely looks like user code.
    """
    target = generated[n - 1].strip()
    context = _context(generated, n)
    scores: dict[int, int] = {}
    for m, text in enumerate(submitted, start=1):
        if text.strip() == target:
            offset = m - n
            scores[m] = sum(
                1 <= g + offset <= len(submitted) and submitted[g + offset - 1].strip() == generated[g - 1].strip()
                for g in context
            )
    if not scores:
        return None
    best = max(scores.values())
    winners = [m for m, score in scores.items() if score == best]
    if len(winners) > 1 or (context and best == 0):
        return None
    return winners[0]


def _context(generated: list[str], n: int) -> list[int]:
    """Up to CONTEXT_LINES non-blank line numbers on each side of line `n`."""
    before = [g for g in range(n - 1, 0, -1) if generated[g - 1].strip()][:CONTEXT_LINES]
    after = [g for g in range(n + 1, len(generated) + 1) if generated[g - 1].strip()][:CONTEXT_LINES]
    return before + after


def _unique_match(quoted: str, submitted: list[str]) -> int | None:
    """The one submitted line whose text is the compiler's echo of the source, if exactly one is."""
    matches = [m for m, text in enumerate(submitted, start=1) if text.strip() == quoted.strip()]
    return matches[0] if len(matches) == 1 and quoted.strip() else None


def _indent(text: str) -> int:
    return len(text) - len(text.lstrip())
