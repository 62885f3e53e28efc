"""A composed kernel (`kernelloop.agent.dispatch`): each shape runs on the variant that won it, every other call on
the fallback, all on one set of weights; and the judge takes the composed file as any submission."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import torch
from server_fixtures import python_conv

from kernelloop.agent.dispatch import compose
from kernelloop.reference_problems.causal_conv1d.problem import Model
from kernelloop.tools import api
from kernelloop.tools.jobs import EvalOptions
from kernelloop.tools.problems import load_problem
from kernelloop.tools.results import Status
from kernelloop.tools.runner.candidate import copy_parameters
from kernelloop.tools.settings import SandboxSettings

PROBLEM = "causal_conv1d"


def variant(mark: str) -> str:
    """A correct causal conv1d in plain PyTorch (no build), marked by its MARK."""
    return python_conv(prelude=f"MARK = {mark!r}")


def _composed_module(source: str, tmp_path: Path) -> types.ModuleType:
    path = tmp_path / "composed.py"
    path.write_text(source)
    module = types.ModuleType("composed_under_test")
    sys.modules[module.__name__] = module
    exec(compile(source, str(path), "exec"), module.__dict__)
    return module


def _mark(model: torch.nn.Module, index: int) -> str:
    return sys.modules[type(model.variants[index]).__module__].MARK


def test_each_shape_runs_on_its_winner_and_any_other_on_the_fallback_with_one_set_of_weights(tmp_path: Path) -> None:
    problem = load_problem(PROBLEM)
    small, bias = problem.shape("small"), problem.shape("bias")
    source = compose([(small, variant("small's")), (bias, variant("bias'"))],
                     fallback=variant("the best overall"))  # fmt: skip
    composed = _composed_module(source, tmp_path)

    for shape, mark in ((small, "small's"), (bias, "bias'"), (problem.shape("odd"), "the best overall")):
        torch.manual_seed(1)
        reference = Model(*shape.init_inputs)
        model = composed.ModelNew(*shape.init_inputs)
        copied = copy_parameters(reference, model)
        x = torch.randn(*shape.input_shapes[0])

        assert _mark(model, model.route(x)) == mark, shape.name
        assert len(list(model.parameters())) == len(list(reference.parameters())), copied
        torch.testing.assert_close(model(x), reference(x), rtol=1e-4, atol=1e-4)
        other = (model.route(x) + 1) % len(model.variants)  # the same weights in every variant
        torch.testing.assert_close(model.variants[other](x), reference(x), rtol=1e-4, atol=1e-4)


def test_the_judge_takes_a_composed_kernel_as_any_submission(session_root: Path) -> None:
    problem = load_problem(PROBLEM)
    source = compose([(problem.shape("small"), variant("a"))], fallback=variant("b"))
    settings = SandboxSettings(data_dir=session_root / "dispatch-data")

    result = api.run_tests(PROBLEM, source, "cpu", EvalOptions(seeds=1), settings=settings)

    assert result.status == Status.passed, result.message
    assert {"small", "bias", "odd"} <= {c.shape for c in result.checks}
