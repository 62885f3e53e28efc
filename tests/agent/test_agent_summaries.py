"""The tool results the model reads name each status as the word the service uses (`passed`), not as Python
prints an enum member (`Status.passed`)."""

from __future__ import annotations

import random

import pytest

from kernelloop.agent.models import Outcome
from kernelloop.agent.tool_summaries import digest_outcome, summarize_outcome
from kernelloop.tools.results import Status


@pytest.mark.parametrize("status", [Status.passed, Status.compile_error, Status.wrong_output, "service_error"])
def test_a_summary_names_the_status_as_its_word(status: Status | str) -> None:
    step, attempt = random.randrange(1, 50), random.randrange(1, 10_000)
    outcome = Outcome(step=step, trajectory=0, tool="evaluate", attempt_id=attempt, status=status)
    word = status.value if isinstance(status, Status) else status
    summary, digest = summarize_outcome(outcome, "code"), digest_outcome(outcome)
    assert summary.splitlines()[0] == f"attempt #{attempt} (step {step}): evaluate -> {word}", summary
    assert digest == f"step {step}: evaluate attempt #{attempt} -> {word}", digest
