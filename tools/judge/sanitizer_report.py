"""compute-sanitizer's text output, read into findings.

The tool prefixes each of its own lines with `=========` (the program's lines come between them unprefixed, and
are skipped). A report is a block of prefixed lines ended by an empty one: a headline (`Invalid __global__ read of
size 4 bytes`, `Uninitialized __global__ memory read ...`, `Error: Race reported between Write access at ... and
Read access at ...`, `Program hit cudaErrorLaunchFailure ...`), then where (`at KERNEL+0xc0 in cuda.cu:12`), by whom
(`by thread (231,0,0) in block (3,0,0)`) and the rest (the address, the nearest allocation), then the host
backtrace, which is dropped. The run ends with a summary line: `ERROR SUMMARY: N errors` (memcheck, initcheck)
or `RACECHECK SUMMARY: N hazards displayed (E errors, W warnings)`. A line the tool prints about itself
(`Error: Target application terminated before first instrumented API call`) is kept apart: no finding, but a
run that the judge cannot read as checked.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, Field

from kernelloop.tools.results import MemoryFinding, MemoryFindingKind, MemoryTool

PREFIX = "========="
_SITE = r"(?P<kernel>.+?)\+0x[0-9a-fA-F]+(?: in (?P<location>\S+:\d+))?"
"""`KERNEL(ARGS)+0xc0 in cuda.cu:12`: the kernel, the offset of the instruction, the line where -lineinfo gave one"""
_AT = re.compile(rf"^at {_SITE}$")
_BY = re.compile(r"^by (?P<thread>thread \(\d+,\d+,\d+\) in block \(\d+,\d+,\d+\))")
_RACE = re.compile(rf"^(?P<severity>Error|Warning): Race reported between (?P<first>\w+) access at {_SITE}$")
_RACE_OTHER = re.compile(rf"^and (?P<second>\w+) access at {_SITE}")
_ERRORS = re.compile(r"^ERROR SUMMARY: (?P<n>\d+) errors?$")
_NOT_PRINTED = re.compile(r"^ERROR SUMMARY: (?P<n>\d+) errors? (?:was|were) not printed")
_RACE_SUMMARY = re.compile(
    r"^RACECHECK SUMMARY: \d+ hazards? displayed \((?P<errors>\d+) errors?, (?P<warnings>\d+) warnings?\)"
)
_BACKTRACE = ("Saved host backtrace", "Host Frame:", "Device Frame:")


class SanitizerReport(BaseModel):
    """What one run of the tool said, as read from its output."""

    findings: list[MemoryFinding] = []
    errors: int | None = Field(None, description="the summary line's error count; None: the tool printed none")
    warnings: int = 0
    not_printed: int = Field(0, description="errors beyond --print-limit, counted but not reported")
    tool_errors: list[str] = Field([], description="what the tool said went wrong with the run itself")


def parse(output: str, tool: MemoryTool) -> SanitizerReport:
    """Read compute-sanitizer's output (its own lines among the program's) into findings and its summary."""
    report = SanitizerReport()
    block: list[str] = []
    for raw in output.splitlines():
        if not raw.startswith(PREFIX):
            continue  # the program's own output
        text = raw[len(PREFIX) :].strip()
        if not text:
            _close(block, tool, report)
            block = []
        elif not _summary(text, report):
            block.append(text)
    _close(block, tool, report)
    return report


def _summary(text: str, report: SanitizerReport) -> bool:
    """Read a summary line into the report; whether the line was one."""
    if m := _NOT_PRINTED.match(text):
        report.not_printed = int(m["n"])
    elif m := _ERRORS.match(text):
        report.errors = max(report.errors or 0, int(m["n"]))
    elif m := _RACE_SUMMARY.match(text):
        report.errors = max(report.errors or 0, int(m["errors"]))
        report.warnings = int(m["warnings"])
    else:
        return False
    return True


def _close(block: list[str], tool: MemoryTool, report: SanitizerReport) -> None:
    """One block of the tool's lines: a finding, or the tool's own banner and complaints."""
    lines = [line for line in block if line != "COMPUTE-SANITIZER"]
    while lines:
        headline = lines[0]
        if headline.startswith("Error: ") and "Race reported" not in headline:
            report.tool_errors.append(headline.removeprefix("Error: "))
            lines = lines[1:]
            continue
        report.findings.append(_finding(lines, tool))
        return


def _finding(lines: list[str], tool: MemoryTool) -> MemoryFinding:
    headline, rest = lines[0], lines[1:]
    if race := _RACE.match(headline):
        return _race(race, rest, tool)
    finding = MemoryFinding(tool=tool, kind=_kind(headline), access=headline)
    detail: list[str] = []
    for line in rest:
        if line.startswith(_BACKTRACE):
            continue
        if (at := _AT.match(line)) and finding.kernel is None:
            finding.kernel, finding.location = at["kernel"], at["location"]
        elif (by := _BY.match(line)) and finding.thread is None:
            finding.thread = by["thread"]
        else:
            detail.append(line)
    finding.detail = " ".join(detail)
    return finding


def _race(race: re.Match[str], rest: list[str], tool: MemoryTool) -> MemoryFinding:
    """`Error: Race reported between Write access at K+0x100 in f.cu:9` / `and Read access at K+0x150 in f.cu:11`."""
    other = next((m for line in rest if (m := _RACE_OTHER.match(line))), None)
    access = f"race between a {race['first'].lower()} access"
    access += f" and a {other['second'].lower()} access" if other else ""
    where = f"{other['location']}" if other and other["location"] else ""
    hazards = next((line[line.rfind("[") :] for line in rest if line.endswith("hazards]")), "")
    detail = " ".join(part for part in (f"the other access at {where}" if where else "", hazards) if part)
    return MemoryFinding(
        tool=tool,
        kind="race",
        severity="error" if race["severity"] == "Error" else "warning",
        access=f"{access} on __shared__ memory",
        kernel=race["kernel"],
        location=race["location"],
        detail=detail,
    )


def _kind(headline: str) -> MemoryFindingKind:
    lowered = headline.lower()
    if "uninitialized" in lowered:
        return "uninitialized_read"
    if lowered.startswith("invalid"):
        return "invalid_access"
    if lowered.startswith("misaligned"):
        return "misaligned_access"
    if lowered.startswith("program hit"):
        return "api_error"
    return "other"
