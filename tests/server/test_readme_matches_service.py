"""The README says what the service does: every `/v1/...` route it names is one the API has, with the
query parameters it names; docker compose is shown with the token it needs; `make`'s apt install is said.
"""

from __future__ import annotations

import re
import subprocess

from conftest import REPO
from fastapi import FastAPI

from kernelloop.server.routes import history, jobs, meta, problems, suites, tools

README = (REPO / "README.md").read_text()
COMPOSE = (REPO / "docker-compose.yml").read_text()


def _api_paths() -> dict[str, set[str]]:
    """Each path template of the API, with the query parameters of its operations."""
    app = FastAPI()
    for router in (tools.router, jobs.router, problems.router, suites.router, history.router, meta.router):
        app.include_router(router)
    return {
        template: {p["name"] for op in operations.values() for p in op.get("parameters", []) if p["in"] == "query"}
        for template, operations in app.openapi()["paths"].items()
    }


def test_every_route_the_readme_names_exists_with_its_query() -> None:
    paths = _api_paths()
    named = sorted(set(re.findall(r"`(?:[A-Z]+ )?(/v1/[^`\s]*)`", README)))
    assert len(named) > 10, named
    for route in named:
        path, _, query = route.partition("?")
        shape = re.sub(r"\{[^}/]+\}", "{}", path)
        matches = [t for t in paths if re.sub(r"\{[^}/]+\}", "{}", t) == shape]
        assert matches, f"the README names {route}, which the API does not have"
        for name in re.findall(r"([a-z_]+)=", query):
            assert name in paths[matches[0]], f"the README names ?{name}= on {path}; it takes {paths[matches[0]]}"


def test_docker_compose_is_shown_with_its_required_token() -> None:
    assert "${KERNELLOOP_API_TOKEN:?" in COMPOSE  # compose refuses to start without it
    for line in (m.group(0) for m in re.finditer(r"[^\n]*docker compose[^\n]* up\b[^\n]*", README)):
        assert "KERNELLOOP_API_TOKEN" in line, f"the README runs compose without the token it needs: {line}"


def test_the_readme_says_make_installs_bubblewrap_as_root() -> None:
    makefile = (REPO / "Makefile").read_text()
    assert "apt-get install" in makefile and "bubblewrap" in makefile
    two_commands = README[README.index("## The two commands") : README.index("## The tools")]
    assert "apt-get install bubblewrap" in two_commands and "root" in two_commands, two_commands


def test_make_run_installs_what_the_agent_uses_and_make_test_adds_the_test_extras(tmp_path) -> None:
    def planned(target: str) -> str:
        dry = subprocess.run(
            ["make", "-n", target, f"VENV={tmp_path / 'venv'}"], cwd=REPO, capture_output=True, text=True
        )
        assert dry.returncode == 0, dry.stderr
        return dry.stdout

    run, test = planned("run"), planned("test")
    assert "pip install -q -e .\n" in run and "[test]" not in run, run  # no ray, playwright, schemathesis, mypy
    assert "pip install -q -e '.[test]'" in test, test
    two_commands = README[README.index("## The two commands") : README.index("## The tools")]
    assert "test extras" in two_commands and "about 2 minutes on a 2-core CPU" not in two_commands


def test_the_agent_section_says_what_each_stop_leaves_and_what_resume_does() -> None:
    agent = README.split("## The agent", 1)[1].split("\n## ", 1)[0]
    stopping = agent.split("**Stopping and resuming**", 1)[-1].split("\n- **", 1)[0]
    for way in ("*Ctrl-C*", "*kill -9 of the agent*", "*a lost service*", "*resume*"):
        assert way in stopping, f"the README's agent section does not say what {way} leaves or does"
    assert "adopted" in stopping and "evaluated twice" in stopping, stopping
