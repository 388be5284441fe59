"""Long round-trip soak: the test suite's stream model (tests/test_roundtrip.py) with longer streams and many more
examples, both implementations, every check of the round-trip tests (values, order per table, text/binary column
types, committed LSN after every message, relations, C == Python).

    python fuzz/soak_roundtrip.py [--examples N] [--steps MIN MAX] [--protocols pgoutput,pglogical,spock]
                                  [--database DIR]

The suite runs the model with 1-8 steps per stream and a few dozen examples; this runs 10-40 steps and hundreds of
examples per protocol (minutes). Failing examples are kept in DIR (hypothesis's example database), so a rerun
starts with them. Run it from the source tree after an in-place build (`python setup.py build_ext --inplace`).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.database import DirectoryBasedExampleDatabase  # noqa: E402

from tests import test_roundtrip as R  # noqa: E402
from tests.conftest import load_impl  # noqa: E402


@st.composite
def long_streams(draw, protocol: str, min_steps: int, max_steps: int):
    spock_version = draw(st.sampled_from([4, 5])) if protocol == "spock" else None
    model = R.StreamModel(draw, protocol, spock_version)
    return model.build(draw(st.integers(min_steps, max_steps)), protocol == "pgoutput", protocol == "pgoutput")


def soak(protocol: str, examples: int, min_steps: int, max_steps: int, database: str) -> None:
    both = (load_impl("c"), load_impl("python"))

    @settings(max_examples=examples, deadline=None, database=DirectoryBasedExampleDatabase(database),
              suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def run(data):
        R._round_trip(both, data, data.draw(long_streams(protocol, min_steps, max_steps)))

    run()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=400, help="examples per protocol (default 400)")
    parser.add_argument("--steps", type=int, nargs=2, default=(10, 40), metavar=("MIN", "MAX"),
                        help="stream steps per example (default 10 40)")
    parser.add_argument("--protocols", default="pgoutput,pglogical,spock")
    parser.add_argument("--database", default=str(ROOT / "build" / "soak-examples"),
                        help="where failing examples are kept (default build/soak-examples)")
    args = parser.parse_args(argv)
    for protocol in args.protocols.split(","):
        soak(protocol, args.examples, args.steps[0], args.steps[1], args.database)
        print(f"{protocol}: {args.examples} examples passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
