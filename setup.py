"""Build the spockwire Cython extensions.

Project metadata lives in pyproject.toml; this file only describes the compiled modules and how they are built.

Environment switches (read at build time):

  SPOCKWIRE_REQUIRE_EXT=1  a missing .pyx, a Cython error or a C compiler error fails the build; without it
                           the build prints a warning and produces the pure-Python package instead.
  SPOCKWIRE_DEBUG=1        -O0 -g3, asserts on, Cython boundscheck/wraparound/initializedcheck on,
                           C macro SPOCKWIRE_DEBUG=1.
  SPOCKWIRE_SANITIZE=1     AddressSanitizer + UndefinedBehaviorSanitizer (compile and link); run the tests with
                           LD_PRELOAD=$(gcc -print-file-name=libasan.so) ASAN_OPTIONS=detect_leaks=0.
  SPOCKWIRE_ANNOTATE=1     also write Cython's HTML annotation next to the generated C (build/cython/...).

Generated C goes to build/cython/<mode>/, never next to the sources. Switching mode forces a full rebuild.

To add an extension, append an ExtSpec to EXTENSIONS below.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext as _build_ext
from setuptools.command.sdist import sdist as _sdist

ROOT = Path(__file__).resolve().parent


@dataclass(frozen=True)
class ExtSpec:
    """One compiled module: its dotted name, its sources (relative to the repository root) and link needs."""

    name: str
    sources: tuple[str, ...]
    include_dirs: tuple[str, ...] = ()
    libraries: tuple[str, ...] = ()
    define_macros: tuple[tuple[str, str], ...] = ()
    uses_numpy: bool = True
    extra_compile_args: tuple[str, ...] = field(default=())


EXTENSIONS: list[ExtSpec] = [
    # _decoder's .pxi files include "include/sw_byteorder.h" relative to spockwire/wire.
    ExtSpec("spockwire.wire._decoder", ("spockwire/wire/_decoder.pyx",), include_dirs=("spockwire/wire",)),
    # The pump links no libpq: it takes psycopg2's at run time (spockwire/connection/include/sw_libpq.h), through
    # dlopen/dlsym (libdl before glibc 2.34).
    ExtSpec(
        "spockwire.connection._pump",
        ("spockwire/connection/_pump.pyx",),
        include_dirs=("spockwire/wire/include", "spockwire/connection/include"),
        libraries=("dl",),
        uses_numpy=False,
    ),
]


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


REQUIRE_EXT = _flag("SPOCKWIRE_REQUIRE_EXT")
DEBUG = _flag("SPOCKWIRE_DEBUG")
SANITIZE = _flag("SPOCKWIRE_SANITIZE")
ANNOTATE = _flag("SPOCKWIRE_ANNOTATE")
MODE = "-".join(m for m, on in (("debug", DEBUG), ("sanitize", SANITIZE)) if on) or "release"

# Cython-generated C trips these under -Wall without telling us anything about our code.
QUIET_WARNINGS = ["-Wno-unused-function", "-Wno-unreachable-code"]
SANITIZE_FLAGS = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=undefined"]

COMPILER_DIRECTIVES = {
    "language_level": 3,
    "boundscheck": DEBUG,
    "wraparound": DEBUG,
    "initializedcheck": DEBUG,
    "cdivision": True,
    "embedsignature": True,
}


def compile_args() -> list[str]:
    args = ["-Wall", *QUIET_WARNINGS]
    if DEBUG:
        args += ["-O0", "-g3", "-UNDEBUG"]
    elif SANITIZE:
        args += ["-O1", "-g"]
    else:
        args += ["-O3"]
    if SANITIZE:
        args += SANITIZE_FLAGS
    return args


def link_args() -> list[str]:
    return list(SANITIZE_FLAGS) if SANITIZE else []


def warn(message: str) -> None:
    bar = "!" * 78
    print(f"\n{bar}\nspockwire WARNING: {message}\n{bar}\n", file=sys.stderr, flush=True)


def fail(message: str) -> None:
    raise SystemExit(f"spockwire: extension build failed and SPOCKWIRE_REQUIRE_EXT=1: {message}")


def make_extension(spec: ExtSpec) -> Extension:
    include_dirs = list(spec.include_dirs)
    libraries = list(spec.libraries)
    macros = [("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION"), *spec.define_macros]
    if DEBUG:
        macros.append(("SPOCKWIRE_DEBUG", "1"))
    ext = Extension(
        spec.name,
        sources=list(spec.sources),
        include_dirs=include_dirs,
        libraries=libraries,
        define_macros=macros,
        extra_compile_args=[*compile_args(), *spec.extra_compile_args],
        extra_link_args=link_args(),
    )
    ext._spockwire_uses_numpy = spec.uses_numpy  # read by build_ext below
    return ext


def selected_extensions() -> list[Extension]:
    """The extensions whose sources exist; a missing source is fatal only when the extension is required."""
    result = []
    for spec in EXTENSIONS:
        missing = [f"source {s}" for s in spec.sources if not (ROOT / s).is_file()]
        if missing:
            message = f"{spec.name}: missing {', '.join(missing)}"
            if REQUIRE_EXT:
                fail(message)
            warn(message + " -- building without it (pure-Python implementation only)")
            continue
        result.append(make_extension(spec))
    return result


class build_ext(_build_ext):
    """Cythonize at build time (not at import of setup.py), so that sdist ships the .pyx and not generated C."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if self.parallel is None:
            self.parallel = os.cpu_count() or 1

    def run(self) -> None:
        self._failed: set[str] = set()
        self._inplace_requested = bool(self.inplace)
        if not self.extensions:
            return
        try:
            self._cythonize(self.extensions)
        except SystemExit:
            raise
        except Exception as exc:  # Cython missing, or a Cython compile error
            if REQUIRE_EXT:
                fail(f"Cython: {exc}")
            warn(f"Cython step failed ({exc}) -- building the pure-Python package only")
            for ext in self.extensions:
                self._discard(ext)
            self.extensions = []
            return
        stamp = Path(self.build_temp) / "spockwire-build-mode"
        if not stamp.is_file() or stamp.read_text() != MODE:
            self.force = True  # objects from another mode must not be linked into this one
        super().run()
        stamp.parent.mkdir(parents=True, exist_ok=True)
        stamp.write_text(MODE)

    def _discard(self, ext: Extension) -> None:
        """Forget a module that failed to build, and delete any older build of it so it cannot be imported."""
        self._failed.add(ext.name)
        filename = self.get_ext_filename(ext.name)
        stale = [Path(self.build_lib) / filename]
        if self._inplace_requested:
            stale.append(ROOT / filename)
        for path in stale:
            path.unlink(missing_ok=True)

    def _built(self) -> list[Extension]:
        return [ext for ext in self.extensions if ext.name not in getattr(self, "_failed", ())]

    def copy_extensions_to_source(self) -> None:
        everything, self.extensions = self.extensions, self._built()
        try:
            super().copy_extensions_to_source()
        finally:
            self.extensions = everything

    def get_outputs(self) -> list[str]:
        everything, self.extensions = self.extensions, self._built()
        try:
            return super().get_outputs()
        finally:
            self.extensions = everything

    def _cythonize(self, extensions: list[Extension]) -> None:
        """Turn each extension's .pyx sources into generated C, in place (setuptools keeps state on the objects)."""
        from Cython.Build import cythonize

        for ext in extensions:
            if getattr(ext, "_spockwire_uses_numpy", False):
                import numpy

                ext.include_dirs.append(numpy.get_include())
        stamp = ROOT / "build" / "cython" / MODE / "spockwire-directives"
        directives_text = repr(sorted(COMPILER_DIRECTIVES.items()))
        force = self.force or not stamp.is_file() or stamp.read_text() != directives_text
        generated = cythonize(
            extensions,
            compiler_directives=COMPILER_DIRECTIVES,
            build_dir=str(ROOT / "build" / "cython" / MODE),
            include_path=[str(ROOT)],
            annotate=ANNOTATE,
            force=force,
            nthreads=0,
            quiet=True,
        )
        stamp.parent.mkdir(parents=True, exist_ok=True)
        stamp.write_text(directives_text)
        sources = {ext.name: ext.sources for ext in generated}
        for ext in extensions:
            ext.sources = sources[ext.name]

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # the C compiler or the linker failed
            if REQUIRE_EXT:
                fail(f"{ext.name}: {exc}")
            warn(f"{ext.name}: C build failed ({exc}) -- the pure-Python implementation will be used")
            self._discard(ext)


class sdist(_sdist):
    """Ship hand-written C, but not C that Cython generated next to a .pyx (e.g. by `cythonize -i`)."""

    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        def generated(name: str) -> bool:
            return name.endswith(".c") and Path(name).with_suffix(".pyx").exists()

        super().make_release_tree(base_dir, [f for f in files if not generated(f)])


setup(ext_modules=selected_extensions(), cmdclass={"build_ext": build_ext, "sdist": sdist})
