"""Every error renders what a user needs to act on, in one readable block."""

from __future__ import annotations

import pytest

from shadowlab import errors
from shadowlab.errors import (
    CompareRefused,
    EngineCrashError,
    EngineError,
    EngineStartError,
    ImpossibleFigures,
    InfrastructureError,
    LogSourceError,
    MatrixError,
    ProtocolError,
    QualificationError,
    RunDirError,
    ShadowlabError,
    TrafficError,
)


def test_the_hierarchy_is_the_one_the_docstring_draws():
    for cls in (MatrixError, RunDirError, LogSourceError, TrafficError, CompareRefused, EngineError,
                InfrastructureError, QualificationError):
        assert cls.__bases__ == (ShadowlabError,)
        assert cls.__name__ in errors.__doc__
    for cls in (EngineStartError, EngineCrashError, ProtocolError, ImpossibleFigures):
        assert issubclass(cls, EngineError) and cls.__name__ in errors.__doc__
    assert set(errors.__all__) == {"ShadowlabError", "MatrixError", "RunDirError", "EngineError",
                                   "EngineStartError", "EngineCrashError", "ProtocolError", "ImpossibleFigures",
                                   "InfrastructureError", "QualificationError", "LogSourceError",
                                   "TrafficError", "CompareRefused"}


def test_matrix_error_without_line_or_path():
    assert str(MatrixError("no such matrix file", file="m.yaml", hint="check the path")) == (
        "m.yaml: no such matrix file\n  hint: check the path")
    assert str(MatrixError("bad", line=3)) == "<matrix>:3: bad"


def test_engine_start_error_carries_engine_cell_and_log_tail():
    err = EngineStartError("exited with status 1 before /health answered", engine="reference",
                           cell="reference.defaults.A-C", log_tail=["loading model", "error: bad flag -q"],
                           hint="run the command by hand")
    assert str(err) == (
        "engine 'reference' (cell reference.defaults.A-C): exited with status 1 before /health answered\n"
        "  last log lines:\n"
        "    loading model\n"
        "    error: bad flag -q\n"
        "  hint: run the command by hand")
    assert err.reason.startswith("exited") and err.log_tail == ("loading model", "error: bad flag -q")


def test_engine_crash_and_protocol_errors():
    crash = EngineCrashError("killed by signal 9 during turn 1", engine="llama", returncode=-9)
    assert crash.returncode == -9 and str(crash) == "engine 'llama': killed by signal 9 during turn 1"
    proto = ProtocolError("/completion answered 200 without `timings`", engine="openai", cell="x")
    assert isinstance(proto, EngineError) and "without `timings`" in str(proto)


def test_run_dir_and_qualification_errors():
    err = RunDirError("exists; pass --resume to continue it", path="reports/r1", hint="or choose another --out")
    assert str(err) == "reports/r1: exists; pass --resume to continue it\n  hint: or choose another --out"
    q = QualificationError(["identity: reference.policy0.A-C turn 1 differs", "outcome: turn 2 forced"])
    assert str(q) == ("not qualified: 2 checks failed\n"
                      "  - identity: reference.policy0.A-C turn 1 differs\n"
                      "  - outcome: turn 2 forced")
    assert str(QualificationError(["x"])).startswith("not qualified: 1 check failed")


def test_all_are_caught_as_shadowlab_errors():
    for err in (MatrixError("m"), RunDirError("r", path="p"), EngineStartError("s", engine="e"),
                QualificationError([])):
        with pytest.raises(ShadowlabError):
            raise err
