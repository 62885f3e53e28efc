"""The command line the figure scripts share: a submission, the problem it answers, a backend, a data folder."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path


def submission_parser(description: str | None, backend: str) -> argparse.ArgumentParser:
    """A parser of `SUBMISSION.py --problem NAME [--backend] [--data-dir]`; a script adds its own options."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("submission", type=Path)
    parser.add_argument("--problem", required=True)
    parser.add_argument("--backend", default=backend, choices=["cuda", "cpu"])
    parser.add_argument("--data-dir", type=Path, default=None, help="default: a new folder under /var/tmp")
    return parser


def data_folder(args: argparse.Namespace, prefix: str) -> Path:
    """The folder asked for, or a new one: the figures start from an empty data folder unless told otherwise."""
    return args.data_dir or Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))
