"""The judge starts the candidate's runner before it imports torch, so the two imports overlap."""

import subprocess
import sys


def test_the_judge_starts_its_runner_before_importing_torch() -> None:
    # what tools/worker.py imports before it creates the RunnerLink
    code = (
        "import sys\n"
        "import kernelloop.tools.worker\n"
        "from kernelloop.tools.runner_link import RunnerLink\n"
        "print('torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False", "torch is imported before the runner starts: the start-up is serial"
