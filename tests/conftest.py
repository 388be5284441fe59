"""Shared fixtures: every decoder test runs against both implementations in the same run."""
from __future__ import annotations

import importlib

import pytest

pytest_plugins = ["tests.pg_fixtures"]


def pytest_collection_modifyitems(config, items):
    """Tests in tests/test_spark*.py start a local SparkSession: they get the `spark` marker (nothing is skipped)."""
    for item in items:
        if item.path.name.startswith("test_spark"):
            item.add_marker(pytest.mark.spark)

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
