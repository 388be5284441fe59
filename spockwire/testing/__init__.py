"""Test support: a throwaway PostgreSQL cluster for the tests, the benchmarks and `spockwire demo`."""
from __future__ import annotations

from .pgserver import PostgresCluster, PostgresNotFound, embedded_bindir, find_bindir

__all__ = ["PostgresCluster", "PostgresNotFound", "embedded_bindir", "find_bindir"]
