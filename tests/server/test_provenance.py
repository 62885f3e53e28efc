"""A run keeps the version and the commit of the service that made it, and the API shows them."""

from __future__ import annotations

import subprocess
from pathlib import Path

from conftest import REPO
from sqlmodel import Session

from kernelloop.contract import RunCreate, package_version
from kernelloop.server.provenance import service_provenance
from kernelloop.storage import history, problems
from kernelloop.storage.database import database_url, open_database


def test_a_run_keeps_the_version_and_commit_of_the_service_that_made_it(tmp_path: Path) -> None:
    version, commit = service_provenance()
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    assert version == package_version()
    assert commit is not None and commit.removesuffix("+dirty") == head.stdout.strip()
    engine = open_database(database_url(str(tmp_path / "kl.sqlite3")))
    with Session(engine) as session:
        problems.sync_shipped(session)
        problem = problems.get_problem(session, "causal_conv1d")
        assert problem is not None
        run = history.create_run(
            session, problem, RunCreate(problem="causal_conv1d"), version=version, source_commit=commit
        )
        shown = history.run_public(session, run)
    engine.dispose()
    assert (shown.version, shown.source_commit) == (version, commit)
