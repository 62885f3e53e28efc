"""What the service's commands (`serve`, `history`) share: their settings from the flags."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from kernelloop.server.settings import ServiceSettings
from kernelloop.storage.database import database_url


def service_settings(args: argparse.Namespace, **extra: Any) -> ServiceSettings:
    """The settings from the environment, overridden by --data-dir, --db and the given flags that are set."""
    overrides: dict[str, Any] = {k: v for k, v in extra.items() if v is not None}
    if getattr(args, "data_dir", None):
        overrides["data_dir"] = Path(args.data_dir)
    if getattr(args, "db", None):
        overrides["database_url"] = database_url(args.db)
    return ServiceSettings(**overrides)
