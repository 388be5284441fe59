"""`spockwire ddl-capture`: install (or remove) the DDL capture in a source database.

``spockwire ddl-capture --dsn "host=db dbname=shop user=postgres"`` installs two event triggers and the functions
they call (schema ``spockwire_ddl``): each ALTER TABLE then writes its outcome as a transactional logical message
in its own transaction, which the pipeline job reads to apply the change in place where it can
(docs/schema-changes.md). Event triggers need a superuser, once; ``--uninstall`` removes everything it installed.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

from .common import CliError
from .config import Setting, add_settings, resolve

NAME = "ddl-capture"
HELP = "install the DDL capture in a source database (event triggers; a superuser, once), or remove it"

DSN = Setting("dsn", "libpq connection string of the source database, as a superuser", metavar="DSN", required=True)
UNINSTALL = Setting("uninstall", "remove the capture instead", is_flag=True, default=False)
SETTINGS = (DSN, UNINSTALL)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(NAME, help=HELP, description=HELP + ".")
    add_settings(p, SETTINGS)
    p.set_defaults(_run=run)


def run(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    import psycopg2

    from ..connection import ddl_capture

    cfg = resolve(args, NAME)
    try:
        if cfg.uninstall:
            ddl_capture.uninstall(cfg.dsn)
            out.write("the DDL capture is removed\n")
        else:
            ddl_capture.install(cfg.dsn)
            out.write("the DDL capture is installed: each ALTER TABLE now writes a logical message with prefix "
                      f"{ddl_capture.PREFIX}\n")
    except psycopg2.errors.InsufficientPrivilege as exc:
        raise CliError(f"the DDL capture needs a superuser (event triggers): {str(exc).strip()}") from None
    except psycopg2.Error as exc:
        raise CliError(f"cannot {'remove' if cfg.uninstall else 'install'} the DDL capture: "
                       f"{str(exc).strip()}") from None
    return 0
