"""The causal conv1d training templates: their forward and their three backward kernels (input, weight and bias
gradients) against the float64 truth of the reference's own autograd, on every correctness shape of their backend
(bias, dilation, K=1, L shorter than the padding, odd channel counts, batch 1), under the problem's strict
tolerance (the CUDA one builds here, its checks on the GPU); and a forward search never meets them."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
import torch

from kernelloop.agent.templates import discover_templates, load_template
from kernelloop.tools import compile_kernel
from kernelloop.tools.judge.checking import compare
from kernelloop.tools.problems import import_problem_module, load_problem, truth_policy
from kernelloop.tools.results import Backend, Status

PROBLEM = "causal_conv1d"
TEMPLATE = "cpu_train_naive"
CUDA_TEMPLATE = "cuda_train_naive"


def _build(folder: Path, backend: Backend, name: str) -> ModuleType:
    """A template at its defaults, imported (which builds it) in a folder of its own."""
    template = next(t for t in discover_templates(PROBLEM, backend, mode="train") if t.name == name)
    path = folder / f"{name}.py"
    path.write_text(template.render(template.default_params))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TORCH_EXTENSIONS_DIR", str(folder / "build"))
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    return _build(tmp_path_factory.mktemp("train_template"), "cpu", TEMPLATE)


def _forward_backward(model: torch.nn.Module, x: torch.Tensor, grad_y: torch.Tensor) -> dict[str, torch.Tensor]:
    """The output and every gradient of one forward and backward, by the tensor's name."""
    x = x.clone().requires_grad_(True)
    y = model(x)
    y.backward(grad_y)
    gradients = {"output": y.detach(), "grad x": x.grad}
    for name, parameter in model.named_parameters():
        gradients[f"grad {name.removeprefix('conv.')}"] = parameter.grad
    return gradients


@pytest.mark.parametrize("shape", [s.name for s in load_problem(PROBLEM).correctness_shapes("cpu")])
def test_train_template_matches_the_float64_gradients_on_every_cpu_shape(built: ModuleType, shape: str) -> None:
    _assert_matches_the_truth(built, shape, torch.device("cpu"))


@pytest.mark.scenario  # a real build of torch's headers: `make test` runs it, `make test-fast` does not
def test_cuda_train_template_builds_and_constructs_for_every_shape(workspace) -> None:
    template = next(t for t in discover_templates(PROBLEM, "cuda", mode="train") if t.name == CUDA_TEMPLATE)
    for params in template.all_params():
        result = compile_kernel(PROBLEM, template.render(params), "cuda", settings=workspace.settings)
        assert result.status == Status.passed, (params, result.message, result.log[-3000:])
        assert "b32_c64_o128_k3_d1_l131072" in result.shapes_instantiated


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
@pytest.mark.parametrize("shape", [s.name for s in load_problem(PROBLEM).correctness_shapes("cuda")])
def test_cuda_train_template_matches_the_float64_gradients_on_every_gpu_shape(tmp_path: Path, shape: str) -> None:
    _assert_matches_the_truth(_build(tmp_path, "cuda", CUDA_TEMPLATE), shape, torch.device("cuda"))


def _assert_matches_the_truth(built: ModuleType, shape: str, device: torch.device) -> None:
    """Output, input gradient and every parameter's gradient within the strict policy of the float64 truth."""
    problem = load_problem(PROBLEM)
    spec = problem.shape(shape)
    reference_module = import_problem_module(Path(problem.path))
    assert spec.input_shapes is not None
    generator = torch.Generator().manual_seed(20261205)
    x = torch.randn(spec.input_shapes[0], generator=generator)
    torch.manual_seed(7)
    reference = reference_module.Model(*spec.init_inputs).double().to(device)
    candidate = built.ModelNew(*spec.init_inputs).to(device)
    with torch.no_grad():
        candidate.weight.copy_(reference.conv.weight)
        if candidate.bias is not None:
            candidate.bias.copy_(reference.conv.bias)
    grad_y = torch.randn((x.shape[0], spec.init_inputs[1], x.shape[2]), generator=generator)
    truth = _forward_backward(reference, x.double().to(device), grad_y.double().to(device))
    got = _forward_backward(candidate, x.to(device), grad_y.to(device))
    assert set(got) == set(truth) and (("grad bias" in got) == bool(spec.init_inputs[4]))
    tolerance = truth_policy("fp32", "float32").max_rel_error
    for name, expected in truth.items():
        check = compare(got[name], expected, tolerance)
        assert check.status == Status.passed, f"{shape}, {name}: {check.message}"


def test_a_second_backward_gives_the_same_gradients_not_their_sum(built: ModuleType) -> None:
    generator = torch.Generator().manual_seed(11)
    model = built.ModelNew(5, 7, 3, 2, True)
    x = torch.randn(2, 5, 40, generator=generator)
    grad_y = torch.randn(2, 7, 40, generator=generator)
    first = _forward_backward(model, x, grad_y)
    first = {name: tensor.clone() for name, tensor in first.items()}
    model.zero_grad(set_to_none=True)
    second = _forward_backward(model, x, grad_y)
    for name in first:
        assert torch.equal(first[name], second[name]), name


def test_a_forward_search_never_meets_the_train_template() -> None:
    assert CUDA_TEMPLATE not in {t.name for t in discover_templates(PROBLEM, "cuda")}
    assert TEMPLATE not in {t.name for t in discover_templates(PROBLEM, "cpu")}
    assert TEMPLATE in {t.name for t in discover_templates(PROBLEM, "cpu", mode="train")}
    template = load_template(Path(discover_templates(PROBLEM, "cpu", mode="train")[0].path))
    assert template is not None and template.modes == ["train"]
