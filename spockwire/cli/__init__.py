"""The `spockwire` command line (also `python -m spockwire`).

Commands live one per module and are listed in COMMANDS; each module has `NAME`, `register(subparsers)` (which
declares its settings with `config.add_settings` and sets `_run`) and `run(args) -> int`. Settings come from flags,
`SPOCKWIRE_<NAME>` environment variables and an optional TOML file (see `spockwire.cli.config`).

Exit status: 0 success, 2 usage error (bad flag or setting), 1 any other error, reported as one line on stderr.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from ..errors import ProtocolError, SpockwireError
from . import capture_cmd, ddl_capture_cmd, decode_cmd, demo_cmd, ingest_cmd, inspect_cmd, main_cmd, pipeline_cmd, \
    snapshot_cmd
from .common import CliError, format_lsn
from .config import ConfigError

__all__ = ["main", "build_parser", "COMMANDS"]

COMMANDS = (main_cmd, demo_cmd, ingest_cmd, pipeline_cmd, snapshot_cmd, capture_cmd, inspect_cmd, decode_cmd,
            ddl_capture_cmd)

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = argparse.ArgumentParser(
        prog="spockwire",
        description="Decode PostgreSQL logical-replication streams (pgoutput, pglogical, Spock) into Arrow "
                    "batches and Parquet staging. Settings: flags, SPOCKWIRE_<FLAG> environment variables, "
                    "or a TOML file (--config FILE, top-level keys or a [<command>] table).",
    )
    parser.add_argument("--version", action="version", version=f"spockwire {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        command.register(sub)
    return parser


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, ProtocolError):
        lsn = getattr(exc, "spockwire_lsn", None)
        where = f" (message at LSN {format_lsn(lsn)})" if lsn is not None else ""
        frame = getattr(exc, "frame_offset", None)
        if frame is not None and lsn is None:
            where = f" (frame record at byte {frame} of the body)"
        return f"{type(exc).__name__}: {exc}{where}"
    return str(exc)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "_run", None) is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return int(args._run(args) or 0)
    except ConfigError as exc:
        print(f"spockwire {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (CliError, SpockwireError, OSError) as exc:
        if isinstance(exc, BrokenPipeError):
            return _broken_pipe()
        # one line: a server error's DETAIL/CONTEXT lines are joined to it
        text = "; ".join(line.strip() for line in _error_text(exc).splitlines() if line.strip())
        print(f"spockwire {args.command}: error: {text}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print(f"spockwire {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - a command line reports every failure as one line
        if os.environ.get("SPOCKWIRE_TRACEBACK") == "1":
            raise
        text = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        print(f"spockwire {args.command}: error: {type(exc).__name__}: {text} "
              "(set SPOCKWIRE_TRACEBACK=1 for the traceback)", file=sys.stderr)
        return EXIT_ERROR


def _broken_pipe() -> int:
    """The reader of our output went away (`spockwire inspect f | head`): stop quietly."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except OSError:
        pass
    return EXIT_OK
