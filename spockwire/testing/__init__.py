"""Test support: a throwaway PostgreSQL cluster for the tests, the benchmarks and `spockwire demo`; a throwaway Spark
standalone cluster (`SparkCluster`)."""
from __future__ import annotations

from .pgserver import PostgresCluster, PostgresNotFound, embedded_bindir, find_bindir
from .spark_cluster import SparkCluster, SparkClusterError

__all__ = ["PostgresCluster", "PostgresNotFound", "embedded_bindir", "find_bindir", "SparkCluster", "SparkClusterError"]
