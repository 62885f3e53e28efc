"""Time a problem's CPU training templates against PyTorch's own CPU backward, forward+backward and backward alone.

Run from the repository root with kernelloop installed:

    python3 scripts/train_figures.py --problem causal_conv1d --reps 30

For every CPU benchmark shape of the problem it builds each template listed for the train mode at every point of
its PARAM_SPACE, and runs it and the reference `Model` in turns, round by round (one interleaved sequence, so a
load on the host falls on both): a fresh input and a fresh upstream gradient per round, the forward and the
backward each clocked with time.perf_counter. A row gives the median forward+backward and backward-alone
milliseconds, the speedup over the reference's medians, and the largest error of its output and its gradients,
max|got - truth| / max|truth|, against the float64 forward and backward of the reference on the same weights.

Exit status: 0 when every row is within the problem's tolerance, 1 when one is WRONG.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from kernelloop.agent.templates import discover_templates
from kernelloop.tools.judge.checking import relative_max_error
from kernelloop.tools.problems import ShapeSpec, import_problem_module, load_problem, verdict_policy
from kernelloop.tools.runner.candidate import copy_parameters, import_submission, model_new_class

WARMUP_ROUNDS = 3


def step(model: torch.nn.Module, x: torch.Tensor, grad_y: torch.Tensor) -> tuple[float, float, list[torch.Tensor]]:
    """One forward and backward: (forward+backward ms, backward ms, the output and every gradient)."""
    x = x.detach().requires_grad_(True)
    model.zero_grad(set_to_none=True)
    started = time.perf_counter()
    y = model(x)
    forwarded = time.perf_counter()
    y.backward(grad_y)
    finished = time.perf_counter()
    gradients = [y.detach(), x.grad, *(p.grad for p in model.parameters())]
    return (finished - started) * 1e3, (finished - forwarded) * 1e3, [g for g in gradients if g is not None]


def time_shape(problem: str, shape: ShapeSpec, reps: int, build_dir: Path) -> list[tuple[str, float, float, float]]:
    """(label, forward+backward ms, backward ms, largest error) for the reference and each template point."""
    spec = load_problem(problem)
    module = import_problem_module(Path(spec.path))
    assert shape.input_shapes is not None
    torch.manual_seed(0)
    reference = module.Model(*shape.init_inputs)
    models: dict[str, torch.nn.Module] = {"reference (PyTorch CPU backward)": reference}
    for template in discover_templates(problem, "cpu", mode="train"):
        for params in template.all_params():
            label = f"{template.name} " + " ".join(f"{k}={v}" for k, v in params.items())
            print(f"building {label} ...", file=sys.stderr, flush=True)
            model_new = model_new_class(import_submission(template.render(params), build_dir / f"{len(models)}.py"))
            assert model_new is not None
            models[label] = model_new(*shape.init_inputs)
            copy_parameters(reference, models[label])
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(shape.input_shapes[0], generator=generator)
    grad_y = torch.randn_like(reference(x), memory_format=torch.contiguous_format)
    truth = step(reference.double(), x.double(), grad_y.double())[2]
    reference.float()
    errors = {
        label: max(relative_max_error(g, t) for g, t in zip(step(m, x, grad_y)[2], truth, strict=True))
        for label, m in models.items()
    }
    samples: dict[str, list[tuple[float, float]]] = {label: [] for label in models}
    for round_index in range(WARMUP_ROUNDS + reps):
        x = torch.randn(shape.input_shapes[0], generator=generator)
        grad_y = torch.randn(grad_y.shape, generator=generator)
        for label, model in models.items():
            both, backward, _ = step(model, x, grad_y)
            if round_index >= WARMUP_ROUNDS:
                samples[label].append((both, backward))
    return [
        (
            label,
            statistics.median(s[0] for s in rounds),
            statistics.median(s[1] for s in rounds),
            errors[label],
        )
        for label, rounds in samples.items()
    ]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problem", default="causal_conv1d")
    parser.add_argument("--reps", type=int, default=30, help="timed rounds per shape (after 3 warm-up rounds)")
    args = parser.parse_args(argv)
    spec = load_problem(args.problem)
    tolerance = verdict_policy(spec, "strict").max_rel_error
    wrong = False
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, median of {args.reps} rounds\n")
    with tempfile.TemporaryDirectory() as build_dir:
        for shape in spec.benchmark_shapes("cpu"):
            rows = time_shape(args.problem, shape, args.reps, Path(build_dir))
            reference_both, reference_backward = rows[0][1], rows[0][2]
            print(f"shape {shape.name}\n")
            print("| kernel | fwd+bwd ms | speedup | bwd ms | speedup | max error |\n|---|---|---|---|---|---|")
            for label, both, backward, error in rows:
                verdict = "" if error <= tolerance else " WRONG"
                wrong |= bool(verdict)
                print(
                    f"| {label} | {both:.2f} | {reference_both / both:.2f}x | {backward:.2f} | "
                    f"{reference_backward / backward:.2f}x | {error:.1e}{verdict} |"
                )
            print()
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
