"""The `gpuopt` console script: runs the CLI binary shipped inside the wheel (gpuopt/_bin)."""

from __future__ import annotations

import os
import sys

from .errors import NotFoundError

__all__ = ["cli_path", "main"]


def cli_path() -> str:
    """Absolute path of the bundled `gpuopt` executable; NotFoundError when there is none."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", "gpuopt")
    if not os.access(path, os.X_OK):
        raise NotFoundError(f"the gpuopt CLI is not part of this installation (looked for {path})")
    return path


def main() -> None:
    """Replaces this process with the CLI, passing the arguments through (exit codes included)."""
    try:
        path = cli_path()
    except NotFoundError as error:
        print(f"gpuopt: {error}", file=sys.stderr)
        sys.exit(3)
    os.execv(path, [path, *sys.argv[1:]])
