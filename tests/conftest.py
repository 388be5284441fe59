"""Shared fixtures: every decoder test runs against both implementations in the same run."""
from __future__ import annotations

import importlib

import pytest

pytest_plugins = ["tests.pg_fixtures", "tests.typed_dataset"]


# The test tiers, defined here and nowhere else (README, "Development"; the workflows and the wheel builds select
# them with -m). Markers are set at collection; nothing is ever skipped:
#   pg     needs PostgreSQL: uses a server fixture (tests/pg_fixtures.py, or one a module names in SERVER_FIXTURES
#          because it reaches a server through request.getfixturevalue) or starts clusters of its own
#   spark  starts a local SparkSession (tests/test_spark*.py and tests using the `spark` fixture)
#   fuzz   needs the sanitizer build (clang, atheris): uses the `sanitized` fixture of tests/test_fuzz_short.py
#   slow   heavy (millions of rows, kill -9 campaigns): marked in the test module
#   lint   checks of the source tree: the workflow linters over .github/workflows (tests/test_workflows.py),
#          figures quoted from BENCHMARKS.md (test_doc_figures.py), the constants the C kernels share with the
#          twin (test_kernel_constants.py), the import layers of docs/architecture.md (test_layers.py)
#   fast   none of the above: golden vectors, malformed input, round trips, differential, both implementations;
#          what the wheel builds run (pyproject.toml, [tool.cibuildwheel] test-command)
TIER_MARKERS = ("pg", "spark", "fuzz", "slow", "lint")


def pytest_ignore_collect(collection_path, config):
    """Under `-m fast` alone (the wheel builds, which have no PySpark) the Spark modules are not imported: every
    test in them is `spark`, so none would be selected, and they import pyspark at module level."""
    if collection_path.name.startswith("test_spark") and config.getoption("markexpr") == "fast":
        return True
    return None


def _starts_clusters(module) -> bool:
    return module is not None and getattr(module, "PostgresCluster", None) is not None


@pytest.hookimpl(tryfirst=True)  # before -m deselects anything
def pytest_collection_modifyitems(config, items):
    from tests.pg_fixtures import PG_FIXTURES

    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if item.path.name.startswith("test_spark") or "spark" in names:
            item.add_marker(pytest.mark.spark)
        if "sanitized" in names:
            item.add_marker(pytest.mark.fuzz)
        module = getattr(item, "module", None)
        if (PG_FIXTURES | getattr(module, "SERVER_FIXTURES", frozenset())) & names or _starts_clusters(module):
            item.add_marker(pytest.mark.pg)
        if not any(item.get_closest_marker(m) for m in TIER_MARKERS):
            item.add_marker(pytest.mark.fast)
    # The longest modules (marked `slow`) first: with the suite spread over workers (pytest-xdist, a module per work
    # unit) they start at once instead of ending the run alone. A stable sort: the order within each group stays.
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_collection_finish(session):
    """The local Spark driver's class archive (spockwire.spark.jvm_archive) is made once, before any test starts
    Spark, when the selected tests include Spark's: a job a test starts then never makes it (and never prints the
    line that says so among the output the test reads). Under pytest-xdist each worker waits for the one making it."""
    if any(item.get_closest_marker("spark") for item in session.items):
        from spockwire.spark.job import LOCAL_DRIVER_JAVA_OPTIONS
        from spockwire.spark.jvm_archive import archive_path, make_archive

        path = archive_path(LOCAL_DRIVER_JAVA_OPTIONS)
        if path is not None:
            make_archive(path, LOCAL_DRIVER_JAVA_OPTIONS, wait=True)


IMPLEMENTATIONS = ("c", "python")


def load_impl(name: str):
    """The decoder module of one implementation: spockwire.wire._decoder (C) or spockwire.wire._decoder_py."""
    if name == "c":
        return importlib.import_module("spockwire.wire._decoder")
    return importlib.import_module("spockwire.wire._decoder_py")


@pytest.fixture(params=IMPLEMENTATIONS)
def impl(request):
    """The decoder module under test; `impl.Decoder(protocol=...)`."""
    return load_impl(request.param)


@pytest.fixture
def both_impls():
    """Both decoder modules at once, for differential tests: (c_module, python_module)."""
    return load_impl("c"), load_impl("python")
