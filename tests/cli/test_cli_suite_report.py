"""The suite's reports name every problem in full: KernelBench's names run to about 90 characters, and names the
name rule shortened share their first 119 and differ only in the digest at their end, so a name cut to a column's
width made two different problems look the same."""

from __future__ import annotations

from datetime import UTC, datetime

from conftest import REPO, load_script

from kernelloop.agent.suite import SuiteOutcome
from kernelloop.cli.suite import format_suite
from kernelloop.contract import SuiteEntryPublic, SuitePublic
from kernelloop.storage.suites import level_metrics
from kernelloop.tools.problems import problem_name

KERNELBENCH_NAME = "79_conv_transposed_1D_asymmetric_input_square_kernel___padded____strided____dilated__"
LONG_STEMS = ["5_" + "wide_" * 30 + "relu", "5_" + "wide_" * 30 + "gelu"]  # the rule shortens both


def _entry(problem: str, status: str, speedup: float | None, number: int) -> SuiteEntryPublic:
    return SuiteEntryPublic(
        problem=problem, level="level3", solution=f"{problem}.py", attempt_id=number, job_id=number,
        status=status, correct=status == "passed", speedup=speedup, message="" if speedup else "forward raised",
    )  # fmt: skip


def _suite(names: list[str]) -> SuitePublic:
    entries = [
        _entry(name, "passed" if i % 2 else "runtime_error", 1.02 if i % 2 else None, i) for i, name in enumerate(names)
    ]
    return SuitePublic(
        id=3, name=None, backend="cuda", policy=None, status="finished", created_at=datetime.now(UTC),
        levels=[level_metrics("level3", entries)], entries=entries,
    )  # fmt: skip


def test_the_suite_table_shows_every_problem_name_in_full_and_apart() -> None:
    shortened = [problem_name(stem) for stem in LONG_STEMS]
    assert shortened[0][:110] == shortened[1][:110] and shortened[0] != shortened[1]  # they differ at the end only
    names = ["1_MLP", KERNELBENCH_NAME, *shortened]

    report = format_suite(SuiteOutcome(suite=_suite(names), left_out=[], renamed={})).splitlines()

    header = next(line for line in report if line.startswith("level ") and "problem" in line)
    rows = report[report.index(header) + 1 : report.index(header) + 1 + len(names)]
    assert [row.split()[1] for row in rows] == names, rows
    status_at = header.index("status")  # the columns still line up after the longest name
    assert [row[status_at:].split()[0] for row in rows] == ["runtime_error", "passed"] * 2, rows


def test_the_null_suites_exceptions_name_every_problem_in_full() -> None:
    null_suite = load_script("null_suite")
    shortened = [problem_name(stem) for stem in LONG_STEMS]
    suite = _suite([KERNELBENCH_NAME, *shortened]).model_dump()

    lines = null_suite.table(suite, 12.0, []).splitlines()

    listed = [line.split(":")[0].strip() for line in lines[lines.index("exceptions:") + 1 :]]
    assert listed == [f"level3/{name}" for name in (KERNELBENCH_NAME, shortened[1])], lines


def test_the_suite_judges_with_the_memory_check_unless_told_not_to() -> None:
    """The null suite's solutions launch PyTorch's kernels only: it turns the memory check off, and says so."""
    from kernelloop.cli import build_parser
    from kernelloop.cli.suite import suite_options

    parser = build_parser()
    plain = suite_options(parser.parse_args(["suite", "problems", "solutions"]))
    without = suite_options(parser.parse_args(["suite", "problems", "solutions", "--no-memory-check"]))
    assert plain.memory_check and not without.memory_check
    script = (REPO / "scripts" / "null_suite.py").read_text()
    assert '"--no-memory-check"' in script


def test_the_null_suites_table_says_where_the_time_went() -> None:
    """Per level the median seconds a problem spent on lanes, then the median of every phase and step, largest
    first: what the suite's speed work starts from."""
    null_suite = load_script("null_suite")
    suite = _suite([f"{i}_Problem" for i in range(3)]).model_dump()
    for i, entry in enumerate(suite["entries"]):
        entry["seconds"] = {"compile": 2.0 + i, "test": 4.0, "test.worker_start": 3.0 + i, "benchmark": 1.0}

    lines = null_suite.table(suite, 30.0, []).splitlines()

    assert lines[1].split()[-1] == "8.0", lines  # compile 3 + test 4 + benchmark 1, the median problem
    spent = [line for line in lines if line.startswith("median seconds a problem: ")]
    assert spent == ["median seconds a problem: test 4.00, test.worker_start 4.00, compile 3.00, benchmark 1.00"]


def test_the_null_suite_in_training_mode_lists_problems_without_a_backward_apart_with_the_judges_reason() -> None:
    null_suite = load_script("null_suite")
    suite = _suite(["1_Relu", "2_Argmax", "3_Gemm"]).model_dump()
    refusal = (
        "mode train: shape default: no output of the reference carries a gradient (torch.int64 (4, 64)), so there "
        "is no backward to judge (the problem's side, not the kernel's); judge this problem with mode infer"
    )
    suite["entries"][1].update(status="sandbox_error", correct=False, speedup=None, message=refusal)
    suite["entries"][0].update(status="passed", correct=True, speedup=0.85)
    suite["entries"][2].update(status="passed", correct=True, speedup=1.02, message="")

    lines = null_suite.table(suite, 30.0, [], null_suite.CPU_SPEEDUP_BAND).splitlines()

    assert lines[1].split()[1:4] == ["2", "2", "2"], lines  # two entries counted, both in the CPU band (0.85, 1.02)
    skipped = lines[lines.index("skipped, no backward (training mode):") + 1 :]
    assert skipped == [f"  level3/2_Argmax: {suite['entries'][1]['message'][:200]}"], lines
    assert not any("2_Argmax" in line for line in lines[: lines.index(skipped[0]) - 1]), lines


def test_cpu_size_caps_a_kernelbench_files_module_level_sizes_and_leaves_the_rest() -> None:
    null_suite = load_script("null_suite")
    source = (
        "batch_size = 4096\nN = 2048 * 2  # square\nfeatures = 300\nkernel_size = 3\ninput_shape = (32768,)\n"
        "    dim = 99999\n"
    )

    assert null_suite.cpu_sized(source).splitlines() == [
        f"batch_size = {null_suite.CPU_BATCH_CAP}",
        f"N = {4096 // null_suite.CPU_SHRINK}",
        f"features = {null_suite.CPU_SIZE_FLOOR}",  # divided, but not below the floor
        "kernel_size = 3",
        "input_shape = (32768,)",
        "    dim = 99999",
    ]
