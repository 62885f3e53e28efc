"""The agent in training mode (`kernelloop agent run --mode train`): the run's mode reaches every test and
benchmark it sends and survives a resume; the built-in search proposes only templates that carry a backward and
starts from a training baseline, refusing a problem that has none; the model's prompt shows the reference's
backward and what the judge checks of it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from problem_details import problem_detail

from kernelloop.agent.models import AgentRunConfig, Outcome, ProposerDone, job_options
from kernelloop.agent.prompt import system_prompt
from kernelloop.agent.proposers.base import LoopView
from kernelloop.agent.proposers.search import SearchProposer
from kernelloop.agent.settings import AgentSettings
from kernelloop.agent.templates import discover_templates
from kernelloop.cli import build_parser
from kernelloop.cli.agent import _config
from kernelloop.tools.jobs import EvalOptions
from kernelloop.tools.results import Status

TRAIN_TEMPLATES = {
    "causal_conv1d": {"cpu": "cpu_train_naive", "cuda": "cuda_train_naive"},
    "mamba_causal_conv1d": {"cpu": "cpu_train", "cuda": "cuda_train_naive"},
}


def _config_of(*flags: str) -> AgentRunConfig:
    argv = ["agent", "run", "--problem", "causal_conv1d", "--proposer", "search", *flags]
    config = _config(build_parser().parse_args(argv), AgentSettings())
    assert isinstance(config, AgentRunConfig)
    return config


def test_a_train_run_sends_mode_train_with_every_test_and_benchmark_and_keeps_it_for_a_resume() -> None:
    plain, train = _config_of(), _config_of("--mode", "train")
    assert plain.mode == "infer" and train.mode == "train"
    assert job_options(None, plain, "evaluate") is None  # an infer run sends the options as they came
    asked = EvalOptions(seeds=4, time_budget_s=1.5)
    for tool in ("evaluate", "run_tests", "benchmark"):
        sent = job_options(asked, train, tool)
        assert sent is not None and sent.mode == "train" and (sent.seeds, sent.time_budget_s) == (4, 1.5), tool
    # a model that asked for infer in a train run is judged in train all the same
    assert job_options(EvalOptions(mode="infer"), train, "evaluate") == EvalOptions(mode="train")
    # a compile judges no forward or backward: nothing is added that the service could refuse
    assert job_options(None, train, "compile_kernel") is None
    # what `agent resume` reads back: the stored config, and an older run's (no mode) is an infer run
    stored = train.model_dump(mode="json")
    assert AgentRunConfig.model_validate(stored).mode == "train"
    assert AgentRunConfig.model_validate({k: v for k, v in stored.items() if k != "mode"}).mode == "infer"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["agent", "run", "--problem", "causal_conv1d", "--mode", "backward"])


def _train_search(problem: str, backend: str = "cpu", iterations: int = 8) -> SearchProposer:
    config = AgentRunConfig(
        problem=problem,
        backend=backend,
        proposer="search",
        iterations=iterations,
        mode="train",  # type: ignore[arg-type]
    )
    return SearchProposer(config)


@pytest.mark.parametrize("problem", sorted(TRAIN_TEMPLATES))
@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_a_train_search_starts_from_and_explores_only_the_templates_with_a_backward(problem: str, backend: str) -> None:
    search = _train_search(problem, backend)
    assert {t.name for t in search.templates} == {TRAIN_TEMPLATES[problem][backend]}
    assert search.baseline is not None and search.baseline.template == TRAIN_TEMPLATES[problem][backend]
    assert SearchProposer.unavailable_reason(search.config) is None
    # and an infer search of the same problem never meets them
    infer = SearchProposer(search.config.model_copy(update={"mode": "infer"}))
    assert not {t.name for t in infer.templates} & {TRAIN_TEMPLATES[problem][backend]}
    assert infer.baseline is not None and "MODES" not in infer.baseline.code


@pytest.mark.parametrize("problem", sorted(TRAIN_TEMPLATES))
def test_every_kernel_a_train_search_proposes_has_a_backward_and_goes_out_in_train_mode(problem: str) -> None:
    """The search driven on made-up timings (faster with more threads): each proposal is a training template's
    kernel, and the options the loop sends with it say mode train."""
    search = _train_search(problem, iterations=8)
    view = LoopView(run_id=1, step=1)
    proposals = []

    async def drive() -> None:
        for step in range(1, 9):
            proposal = await search.propose(0, view)
            if isinstance(proposal, ProposerDone):
                return
            proposals.append(proposal)
            trial = search.search_state.trials[proposal.key]  # type: ignore[index]
            threads = (trial.params or {}).get("THREADS", 1)
            speedup = 0.4 if threads == 1 else 0.7
            outcome = Outcome(
                step=step, trajectory=0, tool=proposal.tool, status=Status.passed, correct=True, speedup=speedup
            )
            await search.observe(0, proposal, outcome)

    asyncio.run(drive())
    assert len(proposals) == 8, [p.label for p in proposals]
    # the start is the template at its defaults, never proposed a second time; the rest are other points of it
    assert proposals[0].label.startswith("baseline")
    assert len({p.code for p in proposals if p.tool == "evaluate"}) == sum(p.tool == "evaluate" for p in proposals)
    for proposal in proposals:
        assert 'MODES = ["train"]' in proposal.code and "def backward(ctx" in proposal.code, proposal.label
        sent = job_options(proposal.options, search.config, proposal.tool)
        assert sent is not None and sent.mode == "train", proposal.label


def test_a_train_search_without_a_training_kernel_is_refused_saying_what_to_do(tmp_path: Path) -> None:
    """A problem folder whose only kernel is an example file (a forward with no backward of its own) has nothing a
    train search can start from; neither has a shipped problem without training templates."""
    folder = tmp_path / "toy"
    (folder / "templates").mkdir(parents=True)
    (folder / "problem.py").write_text(problem_detail("causal_conv1d").source)
    (folder / "example_cpu.py").write_text("class ModelNew: pass\n")
    (folder / "templates" / "cpu_fast.py").write_text("PARAMS = {'A': 1}\nPARAM_SPACE = {'A': [1, 2]}\n")
    for problem in (str(folder / "problem.py"), "causal_conv1d_fp32"):
        config = AgentRunConfig(problem=problem, backend="cpu", proposer="search", mode="train")
        refused = SearchProposer.unavailable_reason(config)
        assert refused is not None, problem
        assert "--mode train" in refused and "an example file has none" in refused and "--mode infer" in refused
    # the same folder searched for the forward starts from its example
    infer = AgentRunConfig(problem=str(folder / "problem.py"), backend="cpu", proposer="search")
    assert SearchProposer.unavailable_reason(infer) is None
    assert discover_templates(str(folder / "problem.py"), "cpu", mode="train") == []


@pytest.mark.parametrize(
    ("problem", "formulas"),
    [
        ("causal_conv1d", ["grad_w[o, c, k] = sum over b, t of gy[b, o, t] * xp", "F.pad: the gradient"]),
        ("mamba_causal_conv1d", ["grad_bias[o] = sum over b, t", "sigmoid(z) * (1 + z * (1 - sigmoid(z)))"]),
    ],
)
def test_the_train_prompt_shows_the_references_backward_and_what_is_checked(problem: str, formulas: list[str]) -> None:
    detail = problem_detail(problem)
    train = system_prompt(detail, "cpu", "the CPU of this host", None, "train")
    infer = system_prompt(detail, "cpu", "the CPU of this host", None)
    assert "Training mode" in train and "Training mode" not in infer and "backward" not in infer.lower()
    for formula in formulas:
        assert formula in train, formula
    assert "sigmoid" not in train or problem == "mamba_causal_conv1d"  # only the operations the reference calls
    for checked in ("the gradient of every input", "gradient of every parameter", "earlier call", "y.backward(gy)"):
        assert checked in train, checked
    assert "aten::convolution_backward are refused" in train or "aten::convolution_backward," in train
