"""Where a job's cgroup goes and what is written there, for each layout a host may have: a unified v2 tree, v1's
hierarchies per controller, and a v1 host's hybrid `unified` mount (the one this machine has is exercised for
real by test_hostile.py and test_freezer.py; the others are laid out in a folder as the kernel shows them, so the
service's own cgroup and the files it reads are the test's). The kernel's own files of a new cgroup (its
`cgroup.freeze`) do not appear in a plain folder, so no freezer is found there: what is checked is the layout."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from kernelloop.tools.sandbox import cgroups
from kernelloop.tools.sandbox.cgroups import JobCgroup

OWN = "/system.slice/kernelloop.service"


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cgroup mount point, the service's own cgroup OWN in every hierarchy."""
    monkeypatch.setattr(cgroups, "ROOT", tmp_path)
    monkeypatch.setattr(cgroups, "_own", lambda controller: OWN)
    return tmp_path


def unified_tree(at: Path, delegated: str) -> Path:
    own = at / OWN.lstrip("/")
    own.mkdir(parents=True)
    (at / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (own / "cgroup.subtree_control").write_text(delegated + "\n")
    return own


def test_a_unified_tree_gets_the_job_below_the_services_own_cgroup_with_both_caps(root: Path) -> None:
    own = unified_tree(root, "cpu memory pids")
    processes, memory = random.randint(16, 4096), random.randint(1, 64) << 30

    job = JobCgroup.create("kernelloop-job", processes, memory)

    assert job is not None and job.dirs == [own / "kernelloop-job"]
    assert (own / "kernelloop-job" / "pids.max").read_text() == str(processes)
    assert (own / "kernelloop-job" / "memory.max").read_text() == str(memory)
    assert job.freezer is None  # a plain folder has no cgroup.freeze: no freezer claimed where none works


def test_a_unified_tree_without_memory_delegated_caps_processes_alone(root: Path) -> None:
    own = unified_tree(root, "pids")

    job = JobCgroup.create("kernelloop-job", 64, 1 << 30)

    assert job is not None and (own / "kernelloop-job" / "pids.max").read_text() == "64"
    assert not (own / "kernelloop-job" / "memory.max").exists()


def test_a_unified_tree_that_delegates_no_process_cap_gives_the_job_no_cgroup(root: Path) -> None:
    own = unified_tree(root, "cpu memory")

    assert JobCgroup.create("kernelloop-job", 64, 1 << 30) is None
    assert not (own / "kernelloop-job").exists()  # nothing half made


def test_v1_hierarchies_get_a_cgroup_in_each_and_a_hybrid_mount_holds_the_freezer(root: Path) -> None:
    for controller in ("pids", "memory"):
        (root / controller / OWN.lstrip("/")).mkdir(parents=True)
    hybrid_own = root / "unified" / OWN.lstrip("/")
    hybrid_own.mkdir(parents=True)
    (root / "unified" / "cgroup.controllers").write_text("\n")
    memory = random.randint(1, 64) << 30

    job = JobCgroup.create("kernelloop-job", 128, memory)

    pids_dir, memory_dir = (root / c / OWN.lstrip("/") / "kernelloop-job" for c in ("pids", "memory"))
    assert job is not None and job.dirs == [pids_dir, memory_dir]
    assert (pids_dir / "pids.max").read_text() == "128"
    assert (memory_dir / "memory.limit_in_bytes").read_text() == str(memory)
    assert (hybrid_own / "kernelloop-job-candidate").is_dir()  # where the freezer goes, beside the job's own
    assert job.freezer is None


def test_no_writable_hierarchy_gives_no_cgroup(root: Path) -> None:
    assert JobCgroup.create("kernelloop-job", 64, None) is None


@pytest.mark.parametrize(
    ("file", "content", "capped"),
    [
        ("memory.events", "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n", True),
        ("memory.events", "low 0\nhigh 0\nmax 3\noom 0\noom_kill 1\n", False),  # a host-wide OOM kill
        ("memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n", True),
        ("memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n", False),
    ],
)
def test_the_jobs_own_memory_cap_is_told_from_a_kill_from_outside(
    tmp_path: Path, file: str, content: str, capped: bool
) -> None:
    (tmp_path / file).write_text(content)

    assert JobCgroup([tmp_path]).memory_cap_reached() is capped


def test_removal_removes_the_freezer_before_the_job_cgroup_it_is_below(tmp_path: Path) -> None:
    job_dir = tmp_path / "job"
    freezer = job_dir / "candidate"  # as in a unified tree: a cgroup with a child cannot be removed
    freezer.mkdir(parents=True)

    JobCgroup([job_dir], freezer=freezer).kill_and_remove()

    assert not job_dir.exists() and not freezer.exists()
