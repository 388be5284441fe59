"""Test support: a throwaway PostgreSQL cluster for the tests, the benchmarks and `spockwire demo`."""
from __future__ import annotations

from .pgserver import PostgresCluster, PostgresNotFound, find_bindir

__all__ = ["PostgresCluster", "PostgresNotFound", "find_bindir"]
