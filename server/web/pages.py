"""The web pages of the history, served by the service itself: problems with their leaderboards, runs, a run
with its speedup over steps (live while it runs), and an attempt with its code, diagnostics, timings and diff.

Server-rendered (Jinja2): every table reads without JavaScript. The one script is the run's plot (uPlot,
vendored under static/uplot: 50 kB, no dependencies, made for many points of numeric series; Chart.js is
four times the size for features these pages do not use). Pages send a Content-Security-Policy that allows
scripts from this service only, and data reaches the plot as a JSON block, never as inline script.
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Form, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from sqlmodel import Session

from kernelloop.contract import MAX_ID, ErrorBody, RunPublic, utcnow
from kernelloop.server.errors import error_response
from kernelloop.server.routes.deps import WEB_PAGE, AttemptId, RunId, SessionDep
from kernelloop.server.web import access, views
from kernelloop.server.web.highlight import stylesheet
from kernelloop.storage import history
from kernelloop.storage.models import Run
from kernelloop.tools.results import TolerancePolicy

HERE = Path(__file__).resolve().parent
ASSETS = "/assets"
RUNS_PER_PAGE = 50
MAX_COMPARED_RUNS = 8
LIVE_POLL_S = 2.0
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
)

templates = Jinja2Templates(directory=str(HERE / "templates"))
router = APIRouter(include_in_schema=False, tags=[WEB_PAGE], dependencies=[Depends(access.require_reader)])
login_router = APIRouter(include_in_schema=False, tags=[WEB_PAGE])


def _speedup(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}x"


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.4f}" if value < 1 else f"{value:.3f}"


def _when(value: datetime | None) -> str:
    return "–" if value is None else value.strftime("%Y-%m-%d %H:%M:%S UTC")


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {secs:02d} s" if minutes else f"{secs} s"


def _tolerance(policy: TolerancePolicy) -> str:
    """A problem's tolerance policy as people read it (e.g. "fp32: relative error ≤ 1e-05 of max|truth|")."""
    if policy.atol is not None and policy.rtol is not None:
        return f"kernelbench: allclose atol {policy.atol:g}, rtol {policy.rtol:g}, {policy.min_trials} trials"
    tf32 = ", TF32 allowed" if policy.allow_tf32 else ""
    return f"{policy.name}: relative error ≤ {policy.max_rel_error:g} of max|truth|{tf32}"


templates.env.filters.update(speedup=_speedup, ms=_ms, when=_when, duration=_duration, tolerance=_tolerance)
templates.env.globals.update(assets=ASSETS, live_poll_ms=int(LIVE_POLL_S * 1000))


def _page(request: Request, name: str, context: dict[str, Any], status_code: int = 200) -> HTMLResponse:
    response = templates.TemplateResponse(
        request, name, {"logged_in": access.logged_in(request), **context}, status_code=status_code
    )
    response.headers["Content-Security-Policy"] = CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "same-origin"
    response.headers["Cache-Control"] = "no-store"
    return response


def _not_found(request: Request, what: str) -> HTMLResponse:
    return _page(request, "error.html", {"title": "Not found", "message": what}, status_code=404)


@router.get("/", response_class=HTMLResponse)
def problems_page(request: Request, session: SessionDep) -> HTMLResponse:
    return _page(request, "problems.html", {"rows": views.problem_rows(session)})


@router.get("/runs", response_class=HTMLResponse)
def runs_page(
    request: Request, session: SessionDep, offset: Annotated[int, Query(ge=0, le=MAX_ID)] = 0
) -> HTMLResponse:
    page = history.list_runs(session, limit=RUNS_PER_PAGE, offset=offset)
    return _page(request, "runs.html", {"page": page, "now": utcnow()})


def _run(session: Session, run_id: int) -> RunPublic | None:
    run = session.get(Run, run_id)
    return history.run_public(session, run) if run is not None else None


@router.get("/runs/{run_id}", response_class=HTMLResponse)
def run_page(request: Request, run_id: RunId, session: SessionDep) -> HTMLResponse:
    run = _run(session, run_id)
    if run is None:
        return _not_found(request, f"There is no run {run_id}.")
    view = views.run_view(session, run)
    return _page(request, "run.html", {"view": view, "live": _live(view)})


@router.get("/runs/{run_id}/live", response_model=views.RunLive)
def run_live(run_id: RunId, session: SessionDep) -> Response:
    """What the run page polls while the run is running (the cookie opens it, as it opens the page)."""
    run = _run(session, run_id)
    if run is None:
        unknown = ErrorBody(
            error="unknown_run", message=f"no run {run_id}", field="path.run_id", fix="/runs lists the runs"
        )
        return error_response(404, unknown, {"Cache-Control": "no-store"})
    body = _live(views.run_view(session, run)).model_dump_json()
    return Response(body, media_type="application/json", headers={"Cache-Control": "no-store"})


def _live(view: views.RunView) -> views.RunLive:
    macros: Any = templates.env.get_template("_macros.html").module
    best = view.chart.best
    return views.RunLive(
        status=view.run.status.value,
        attempts=view.run.attempts,
        best_speedup=best.speedup if best else None,
        best_html=str(macros.best_speedup(best)),
        download_html=str(macros.best_download(best, f"download attempt {best.attempt_id} as .py" if best else "")),
        duration=_duration(view.duration_s),
        chart=view.chart,
        legend_html=str(macros.chart_legend(view.chart)),
        under_way=view.under_way,
        rows_html=str(macros.attempt_rows(view.attempts, view.chart)),
    )


@router.get("/compare", response_class=HTMLResponse)
def compare_page(
    request: Request, session: SessionDep, runs: Annotated[list[str] | None, Query()] = None
) -> HTMLResponse:
    """Two or more runs overlaid: /compare?runs=3&runs=5 (the runs page's checkboxes send that)."""
    chosen = _chosen_runs(session, runs or [])
    if isinstance(chosen, str):
        return _page(request, "error.html", {"title": "Cannot compare", "message": chosen}, status_code=400)
    return _page(request, "compare.html", {"view": views.compare_view(session, chosen)})


def _chosen_runs(session: Session, asked: list[str]) -> list[RunPublic] | str:
    """The runs a comparison names, each once, oldest first; or what is wrong with the choice."""
    ids: list[int] = []
    for value in asked:
        if not value.isdecimal() or not 1 <= int(value) <= MAX_ID:
            return f"runs: {value!r} is not a run id (a number from 1): choose the runs on the runs page."
        if int(value) not in ids:
            ids.append(int(value))
    if not 2 <= len(ids) <= MAX_COMPARED_RUNS:
        return (
            f"runs: {len(ids)} distinct run{'' if len(ids) == 1 else 's'} chosen; a comparison takes 2 to "
            f"{MAX_COMPARED_RUNS}: tick them on the runs page and press Compare."
        )
    ids.sort()
    found = [_run(session, run_id) for run_id in ids]
    missing = [str(run_id) for run_id, run in zip(ids, found, strict=True) if run is None]
    if missing:
        return f"runs: there is no run {', '.join(missing)}: choose the runs on the runs page."
    return [run for run in found if run is not None]


@router.get("/attempts/{attempt_id}/source.py")
def attempt_source(request: Request, attempt_id: AttemptId, session: SessionDep) -> Response:
    """An attempt's submitted file, downloaded as PROBLEM-attempt-ID.py (the run page links its best)."""
    summary = history.attempt_summary(session, attempt_id)
    code = history.attempt_code(session, attempt_id)
    if summary is None or code is None:
        return _not_found(request, f"There is no attempt {attempt_id}.")
    name = f"{re.sub(r'[^A-Za-z0-9_.-]', '_', summary.problem)}-attempt-{attempt_id}.py"
    headers = {
        "Content-Disposition": f'attachment; filename="{name}"',
        "X-Content-Type-Options": "nosniff",
        "Cache-Control": "no-store",
    }
    return Response(code, media_type="text/x-python", headers=headers)


@router.get("/attempts/{attempt_id}", response_class=HTMLResponse)
def attempt_page(
    request: Request,
    attempt_id: AttemptId,
    session: SessionDep,
    against: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
) -> HTMLResponse:
    detail = history.attempt_detail(session, attempt_id)
    if detail is None:
        return _not_found(request, f"There is no attempt {attempt_id}.")
    return _page(request, "attempt.html", {"view": views.attempt_view(session, detail, against)})


@login_router.get(f"{ASSETS}/code.css")
def code_stylesheet() -> Response:
    return Response(stylesheet(), media_type="text/css", headers={"Cache-Control": "max-age=3600"})


@login_router.get("/login", response_class=HTMLResponse)
def login_page(request: Request, next: str = "/") -> HTMLResponse:  # noqa: A002 (the query's name)
    return _page(request, "login.html", {"next": access.safe_next(next), "error": None})


@login_router.post("/login", response_class=HTMLResponse, response_model=None)
def log_in(
    request: Request,
    token: Annotated[str, Form(max_length=4096)],
    next: Annotated[str, Form(max_length=2048)] = "/",  # noqa: A002 (the form field's name)
) -> HTMLResponse | RedirectResponse:
    expected = access.token_of(request)
    client = request.client.host if request.client else "unknown"
    retry_after = request.app.state.service.limiter.acquire(client)  # the API's rate limit: no guessing
    if retry_after is not None:
        error = f"Too many attempts from {client}: wait {retry_after} s."
        return _page(request, "login.html", {"next": access.safe_next(next), "error": error}, status_code=429)
    if expected is not None and not access.matches(expected, token):
        error = "That is not this service's API token (KERNELLOOP_API_TOKEN)."
        return _page(request, "login.html", {"next": access.safe_next(next), "error": error}, status_code=401)
    response = RedirectResponse(access.safe_next(next), status_code=303)
    if expected is not None:
        response.set_cookie(
            access.COOKIE,
            access.session_value(request),
            max_age=access.COOKIE_MAX_AGE_S,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
    return response


@login_router.post("/logout")
def log_out() -> RedirectResponse:
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(access.COOKIE)
    return response


def install(app: FastAPI) -> None:
    """The pages, their assets, and the login form's detour for a page opened without the token."""

    @app.exception_handler(access.LoginRequired)
    async def _to_login(request: Request, exc: access.LoginRequired) -> RedirectResponse:
        return RedirectResponse(access.login_url(exc.next_path), status_code=303)

    app.include_router(login_router)
    app.include_router(router)
    app.mount(ASSETS, StaticFiles(directory=str(HERE / "static")), name="web-assets")
