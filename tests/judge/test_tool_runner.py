"""A runner started under a GPU tool (compute-sanitizer, ncu), without a GPU: the tool here is a shell wrapper that
prints, runs the runner and exits with a code of its own, which is all the judge's side asks of a tool. The judge
must get the tool's output and exit code alone (nothing the candidate prints), and the candidate must find the
judge and the tool out of reach and the forbidden library fenced off, as a forked runner does."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from kernelloop.tools.runner import library_fence

REPO = Path(__file__).resolve().parents[2]
PROBLEM = REPO / "reference_problems" / "causal_conv1d" / "problem.py"

SUBMISSION = """
import os
import sys
import torch

print("TOOL SUMMARY: forged by the candidate", flush=True)
tool = os.getppid()
judge = int(open(f"/proc/{tool}/stat").read().rsplit(")", 1)[1].split()[1])
reached = {}
for name, pid in (("tool", tool), ("judge", judge)):
    try:
        os.kill(pid, 0)
        reached[name] = "signalled"
    except PermissionError:
        reached[name] = "EPERM"
try:
    open(CUDNN_FILE, "rb").close()
    reached["cudnn"] = "read"
except PermissionError:
    reached["cudnn"] = "EACCES"
print("ATTACK reached:", reached, flush=True)
print("environment:", os.environ.get("KERNELLOOP_UNDER_TOOL"), flush=True)
print("runner module by its name:", "kernelloop.tools.runner.serve" in sys.modules, flush=True)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return x
"""

JUDGE = """
import json, sys
from kernelloop.tools.judge.runner_link import RunnerLink
from kernelloop.tools.runner.messages import Load, Loaded, Start, Started

problem, submission, build_dir = sys.argv[1:4]
tool = ["/bin/sh", "-c", 'echo "TOOL: watching $1"; "$@"; echo "TOOL SUMMARY: runner exit $?"; exit 7', "tool"]
link = RunnerLink(wrapper=tool, forbidden_libraries=["cudnn"], environment={"KERNELLOOP_UNDER_TOOL": "yes"})
started = link.ask(Start(problem_path=problem, backend="cpu", forbidden_libraries=["cudnn"]), Started, 120)
code = open(submission).read()
loaded = link.ask(
    Load(code=code, submission_path=submission, build_dir=build_dir, problem="causal_conv1d", backend="cpu",
         shapes=[], cache_key="k", cache_hit=False, compile_only=True),
    Loaded, 120,
)
run = link.finish_tool(60)
print(json.dumps({"started": started.error, "loaded": loaded.compile.status.value, "run": run.model_dump()}))
"""


def test_a_runner_under_a_tool_answers_while_the_tool_alone_reports_to_the_judge(tmp_path):
    cudnn_file = next(p for p in library_fence.library_files("cudnn") if p.is_file() or any(p.rglob("*.so*")))
    if cudnn_file.is_dir():
        cudnn_file = next(cudnn_file.rglob("*.so*"))
    submission = tmp_path / "submission.py"
    submission.write_text(f"CUDNN_FILE = {str(cudnn_file)!r}\n" + SUBMISSION)
    build_dir = tmp_path / "build"
    build_dir.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(JUDGE), str(PROBLEM), str(submission), str(build_dir)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    run = outcome["run"]
    assert "ATTACK reached:" in done.stderr, "the candidate's code did not run (or its output was lost)"
    assert "{'tool': 'EPERM', 'judge': 'EPERM', 'cudnn': 'EACCES'}" in done.stderr
    assert "environment: yes" in done.stderr, "the environment given for the tool did not reach the runner"
    assert "runner module by its name: True" in done.stderr, "the runner under a tool is not the forked runner's module"
    assert outcome["started"] is None and outcome["loaded"] == "passed"
    assert run["returncode"] == 7 and not run["timed_out"] and run["signal"] is None
    assert run["output"].startswith("TOOL: watching ")
    assert "TOOL SUMMARY: runner exit 0" in run["output"]
    assert "forged" not in run["output"], "the candidate's output reached the tool's report"
    assert "forged by the candidate" in done.stderr, "the candidate's output must still reach the job's log"
