"""What routes take from the app: the service and a database session."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Path, Request
from sqlmodel import Session

from kernelloop.contract import MAX_ID
from kernelloop.server.service import Service


def get_service(request: Request) -> Service:
    service: Service = request.app.state.service  # set by create_app
    return service


def get_session(request: Request) -> Iterator[Session]:
    with Session(request.app.state.service.engine) as session:
        yield session


ServiceDep = Annotated[Service, Depends(get_service)]
SessionDep = Annotated[Session, Depends(get_session)]
JobId = Annotated[int, Path(ge=1, le=MAX_ID, description="a job id")]
AttemptId = Annotated[int, Path(ge=1, le=MAX_ID, description="an attempt id")]
RunId = Annotated[int, Path(ge=1, le=MAX_ID, description="a run id")]
