"""The training templates of causal_conv1d and mamba_causal_conv1d: their forward and their backward kernels (input,
weight and bias gradients) against the float64 truth of the reference's own autograd, on every correctness shape of
their backend (bias and none, dilation, K=1, L shorter than the padding, odd channel counts, batch 1), under the
problem's strict tolerance, at the defaults and at a tuned point of their space (threads, the vector ISA, reordered
sums); the CUDA ones build here, their checks on the GPU; and a forward search never meets them."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
import torch

from kernelloop.agent.templates import Params, discover_templates, load_template
from kernelloop.tools import compile_kernel
from kernelloop.tools.judge.checking import compare
from kernelloop.tools.problems import import_problem_module, load_problem, truth_policy
from kernelloop.tools.results import Backend, Status

CPU_TEMPLATES = {"causal_conv1d": "cpu_train_naive", "mamba_causal_conv1d": "cpu_train"}
CUDA_TEMPLATES = {"causal_conv1d": "cuda_train_naive", "mamba_causal_conv1d": "cuda_train_naive"}
TUNED = {  # a point of each CPU template's space away from its defaults: every core, the host's vector ISA
    "causal_conv1d": {"OPT": 3, "THREADS": 0, "ARCH": "native", "SIMD_SUMS": 1},
    "mamba_causal_conv1d": {"THREADS": 0, "TB": 256, "KSPEC": 1, "ARCH": "native"},
}
CPU_POINTS = [(problem, point) for problem in CPU_TEMPLATES for point in ("defaults", "tuned")]


def _build(folder: Path, problem: str, backend: Backend, name: str, params: Params | None = None) -> ModuleType:
    """A template (at its defaults, or at `params`), imported (which builds it) in a folder of its own."""
    template = next(t for t in discover_templates(problem, backend, mode="train") if t.name == name)
    path = folder / f"{name}.py"
    path.write_text(template.render({**template.default_params, **(params or {})}))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TORCH_EXTENSIONS_DIR", str(folder / "build"))
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module


class CpuBuilds:
    """Each CPU template's build at one point, made once for the module on first use."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.modules: dict[tuple[str, str], ModuleType] = {}

    def get(self, problem: str, point: str) -> ModuleType:
        if (problem, point) not in self.modules:
            params = TUNED[problem] if point == "tuned" else None
            folder = self.folder / f"{problem}-{point}"
            folder.mkdir()
            self.modules[problem, point] = _build(folder, problem, "cpu", CPU_TEMPLATES[problem], params)
        return self.modules[problem, point]


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> CpuBuilds:
    return CpuBuilds(tmp_path_factory.mktemp("train_template"))


def _forward_backward(model: torch.nn.Module, x: torch.Tensor, grad_y: torch.Tensor) -> dict[str, torch.Tensor]:
    """The output and every gradient of one forward and backward, by the tensor's name."""
    x = x.clone().requires_grad_(True)
    y = model(x)
    y.backward(grad_y)
    gradients = {"output": y.detach(), "grad x": x.grad}
    for name, parameter in model.named_parameters():
        gradients[f"grad {name.removeprefix('conv.')}"] = parameter.grad
    return gradients


def _shape_names(problem: str, backend: Backend) -> list[str]:
    return [s.name for s in load_problem(problem).correctness_shapes(backend)]


CPU_SHAPES = [(problem, point, shape) for problem, point in CPU_POINTS for shape in _shape_names(problem, "cpu")]


@pytest.mark.parametrize(("problem", "point", "shape"), CPU_SHAPES, ids=["-".join(case) for case in CPU_SHAPES])
def test_train_template_matches_the_float64_gradients_on_every_cpu_shape(
    builds: CpuBuilds, problem: str, point: str, shape: str
) -> None:
    _assert_matches_the_truth(problem, builds.get(problem, point), shape, torch.device("cpu"))


@pytest.mark.scenario  # a real build of torch's headers: `make test` runs it, `make test-fast` does not
@pytest.mark.parametrize("problem", sorted(CUDA_TEMPLATES))
def test_cuda_train_template_builds_and_constructs_for_every_shape(problem: str, workspace) -> None:
    template = next(t for t in discover_templates(problem, "cuda", mode="train") if t.name == CUDA_TEMPLATES[problem])
    benchmark_shapes = {s.name for s in load_problem(problem).benchmark_shapes("cuda")}
    for params in template.all_params():
        result = compile_kernel(problem, template.render(params), "cuda", settings=workspace.settings)
        assert result.status == Status.passed, (params, result.message, result.log[-3000:])
        assert benchmark_shapes <= set(result.shapes_instantiated)


GPU_SHAPES = [(problem, shape) for problem in CUDA_TEMPLATES for shape in _shape_names(problem, "cuda")]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
@pytest.mark.parametrize(("problem", "shape"), GPU_SHAPES, ids=[f"{p}-{s}" for p, s in GPU_SHAPES])
def test_cuda_train_template_matches_the_float64_gradients_on_every_gpu_shape(
    tmp_path: Path, problem: str, shape: str
) -> None:
    module = _build(tmp_path, problem, "cuda", CUDA_TEMPLATES[problem])
    _assert_matches_the_truth(problem, module, shape, torch.device("cuda"))


def _assert_matches_the_truth(problem_name: str, built: ModuleType, shape: str, device: torch.device) -> None:
    """Output, input gradient and every parameter's gradient within the strict policy of the float64 truth."""
    problem = load_problem(problem_name)
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
        output_shape = reference(x.double().to(device)).shape
    grad_y = torch.randn(output_shape, generator=generator)
    truth = _forward_backward(reference, x.double().to(device), grad_y.double().to(device))
    got = _forward_backward(candidate, x.to(device), grad_y.to(device))
    assert set(got) == set(truth), f"{shape}: the candidate's tensors {sorted(got)}, the reference's {sorted(truth)}"
    tolerance = truth_policy("fp32", "float32").max_rel_error
    for name, expected in truth.items():
        check = compare(got[name], expected, tolerance)
        assert check.status == Status.passed, f"{problem_name} {shape}, {name}: {check.message}"


@pytest.mark.parametrize(("problem", "point"), CPU_POINTS, ids=["-".join(case) for case in CPU_POINTS])
def test_a_second_backward_gives_the_same_gradients_not_their_sum(builds: CpuBuilds, problem: str, point: str) -> None:
    module = builds.get(problem, point)
    generator = torch.Generator().manual_seed(11)
    arguments = {"causal_conv1d": (5, 7, 3, 2, True), "mamba_causal_conv1d": (7, 4, True, True)}[problem]
    model = module.ModelNew(*arguments)
    x = torch.randn(2, arguments[0], 40, generator=generator)
    grad_y = torch.randn(2, 7, 40, generator=generator)
    first = {name: tensor.clone() for name, tensor in _forward_backward(model, x, grad_y).items()}
    model.zero_grad(set_to_none=True)
    second = _forward_backward(model, x, grad_y)
    assert set(first) == {"output", "grad x", "grad weight", "grad bias"}
    for name in first:
        assert torch.equal(first[name], second[name]), name


@pytest.mark.parametrize("problem", sorted(CPU_TEMPLATES))
def test_a_forward_search_never_meets_the_train_templates(problem: str) -> None:
    assert CUDA_TEMPLATES[problem] not in {t.name for t in discover_templates(problem, "cuda")}
    assert CPU_TEMPLATES[problem] not in {t.name for t in discover_templates(problem, "cpu")}
    train = {t.name: t for t in discover_templates(problem, "cpu", mode="train")}
    assert set(train) == {CPU_TEMPLATES[problem]}
    template = load_template(Path(train[CPU_TEMPLATES[problem]].path))
    assert template is not None and template.modes == ["train"] and not template.baseline  # the search tunes it
    assert template.space_size() > 4, "a training search on 2 cores needs choices to climb through"
