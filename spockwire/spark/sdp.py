"""``spark-pipelines`` (Spark Declarative Pipelines) with PySpark 4.3's exit code after a completed run put right.

    python -m spockwire.spark.sdp run --spec examples/declarative-pipeline/spark-pipeline.yml

In PySpark 4.3 a pipeline run that reads a Python data source (such as ``spockwire``) ends with exit code 1 after
``Run is COMPLETED``: the client fails on a response it does not know, the accumulator updates of the Python
source (``[UNKNOWN_RESPONSE] Unknown response: Plan observed(__python_accumulator__=...)``), once everything is
written. This runner passes its arguments to ``spark-pipelines``, shows its output as it comes, and turns exit code
1 into 0 only when the output says ``Run is COMPLETED`` and the run's one error is exactly that response; any
other failure keeps its exit code.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from typing import Mapping, Sequence

__all__ = ["PipelineRun", "run_pipeline", "known_completed_failure", "main"]

COMPLETED = "Run is COMPLETED."
_JVM_NOTE = re.compile(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d (INFO|WARN) ")
#: the exception line PySpark 4.3's client ends a completed run with
ACCUMULATOR_RESPONSE = ("pyspark.errors.exceptions.base.PySparkValueError: [UNKNOWN_RESPONSE] Unknown response: "
                        "Plan observed(__python_accumulator__=")


@dataclass
class PipelineRun:
    """A finished ``spark-pipelines`` run."""

    returncode: int            #: spark-pipelines' own exit code
    output: str                #: its output (stdout and stderr together)

    @property
    def completed(self) -> bool:
        """The run completed: exit code 0, or 1 with nothing wrong but PySpark 4.3's accumulator response."""
        return self.returncode == 0 or (self.returncode == 1 and known_completed_failure(self.output))

    @property
    def exit_code(self) -> int:
        return 0 if self.completed else (self.returncode or 1)


def known_completed_failure(output: str) -> bool:
    """Whether `output` is a run that completed and then failed only on the accumulator response: ``Run is
    COMPLETED`` with no flow or run failure, and after it exactly one traceback, ending in that response."""
    lines = output.splitlines()
    done = [i for i, line in enumerate(lines) if line.rstrip().endswith(COMPLETED)]
    if not done or any(" has FAILED" in line or "Run is FAILED" in line or "Run is CANCELED" in line
                       for line in lines):
        return False
    after = lines[done[-1] + 1:]
    tracebacks = [i for i, line in enumerate(after) if line.startswith("Traceback (most recent call last):")]
    if len(tracebacks) != 1 or any(line.startswith("Traceback") for line in lines[:done[-1]]):
        return False
    # the traceback's unindented lines: the exception line, then the rest of the response it prints
    rest = [line for line in after[tracebacks[0] + 1:] if line.strip() and not line[0].isspace()]
    if not rest or not rest[0].startswith(ACCUMULATOR_RESPONSE):
        return False
    return all(line.startswith((", binary: ", "]).")) or _JVM_NOTE.match(line) is not None for line in rest[1:])


def _command() -> list[str]:
    from .environment import spark_home

    return [str(spark_home() / "bin" / "spark-pipelines")]


def run_pipeline(args: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | None = None,
                 echo: bool = True, timeout: float | None = None) -> PipelineRun:
    """Run ``spark-pipelines ARGS`` (its Python: this interpreter) and collect its output, echoed as it comes."""
    from .environment import spark_home

    environ = dict(os.environ, SPARK_HOME=str(spark_home()), PYSPARK_PYTHON=sys.executable,
                   PYSPARK_DRIVER_PYTHON=sys.executable, **dict(env or {}))
    proc = subprocess.Popen(_command() + list(args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=environ,
                            cwd=cwd, text=True, errors="replace", start_new_session=True)
    out = []
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            out.append(line)
            if echo:
                sys.stdout.write(line)
                sys.stdout.flush()
        code = proc.wait(timeout)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return PipelineRun(code, "".join(out))


def main(argv: Sequence[str] | None = None) -> int:
    run = run_pipeline(list(sys.argv[1:] if argv is None else argv))
    if run.completed and run.returncode != 0:
        print("spockwire: the run completed; spark-pipelines' exit code 1 came from PySpark 4.3's unknown "
              "accumulator response after it (__python_accumulator__), not from the pipeline", file=sys.stderr)
    return run.exit_code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
