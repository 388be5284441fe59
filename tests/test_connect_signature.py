"""`spockwire.connect` shows every option in its signature, its docstring and the package's .pyi (editors and type
checkers see them), and passes each on to ReplicationStream and the Decoder with their defaults."""
from __future__ import annotations

import ast
import inspect
from pathlib import Path

import spockwire
from spockwire.connection import stream as stream_module
from spockwire.connection.stream import ReplicationStream
from spockwire.wire import _decoder_py

DECODER_OPTIONS = ("types", "numeric", "on_unrepresentable", "column_types")


def test_connect_spells_out_every_option():
    sig = inspect.signature(spockwire.connect)
    kinds = {p.kind for p in sig.parameters.values()}
    assert inspect.Parameter.VAR_KEYWORD not in kinds and inspect.Parameter.VAR_POSITIONAL not in kinds
    stream_params = dict(inspect.signature(ReplicationStream.__init__).parameters)
    del stream_params["self"]
    decoder_params = inspect.signature(_decoder_py.Decoder.__init__).parameters
    assert list(sig.parameters) == [*stream_params, *DECODER_OPTIONS]
    for name, param in stream_params.items():
        assert sig.parameters[name].default == param.default, name
        assert sig.parameters[name].kind == param.kind, name
    for name in DECODER_OPTIONS:
        assert sig.parameters[name].default == decoder_params[name].default, name
        assert sig.parameters[name].kind is inspect.Parameter.KEYWORD_ONLY
    for name in sig.parameters:
        if name != "dsn":
            assert f"`{name}`" in spockwire.connect.__doc__, name
    assert spockwire.connect is stream_module.connect


def _function(path: Path, name: str) -> ast.FunctionDef:
    tree = ast.parse(path.read_text())
    found = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == name]
    assert len(found) == 1, path
    return found[0]


def _shape(fn: ast.FunctionDef) -> list[tuple[str, str, str | None, str | None]]:
    args = fn.args
    positional = args.posonlyargs + args.args
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    shape = [("positional", a.arg, ast.unparse(a.annotation) if a.annotation else None,
              ast.unparse(d) if d is not None else None) for a, d in zip(positional, defaults)]
    shape += [("keyword", a.arg, ast.unparse(a.annotation) if a.annotation else None,
               ast.unparse(d) if d is not None else None) for a, d in zip(args.kwonlyargs, args.kw_defaults)]
    assert args.vararg is None and args.kwarg is None
    return shape + [("returns", "", ast.unparse(fn.returns) if fn.returns else None, None)]


def test_the_pyi_declares_the_same_signature():
    stub = _function(Path(spockwire.__file__).with_name("__init__.pyi"), "connect")   # the installed package's
    source = _function(Path(stream_module.__file__), "connect")
    assert _shape(stub) == _shape(source)
    # and the stub's defaults are the runtime's
    sig = inspect.signature(spockwire.connect)
    for kind, name, _annotation, default in _shape(stub)[:-1]:
        if default is not None:
            assert eval(default) == sig.parameters[name].default, name  # noqa: S307 - literals from our own stub
