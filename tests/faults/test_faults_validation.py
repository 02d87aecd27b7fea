"""Hostile matrices, options and records, refused before anything starts (issue 9).

Items covered, each by the real command line (`python -m shadowlab ...` in a subprocess, whose
timeout only bounds a test that would otherwise hang: nothing here measures speed):

- 2 (records half): `gate` / `report` on a run directory whose meta.json (or any other record:
  prompts, plan, environment, matrix, engine.log) is a link to /dev/zero, or a FIFO: refused
  unread, exit 2.
- 5: a matrix `name: ../../../x` (path traversal): refused at load, and a run directory is only
  ever made inside its parent.
- 7: atomically written records get the mode a plain open() gives (0666 & ~umask), through one
  function.
- 9: what `--dry-run` accepted and then hung, crashed or exhausted memory: huge token counts, a
  prompt longer than the engine's context, more cores than the machine, long names, NULs, a
  device or FIFO as the model or the matrix, a matrix file of megabytes, long free text, and
  bad `--request-timeout`, `--fault`, `--jobs` values: exit 2 naming file, line and key.
- 11: corrupt records (unknown status, meta.json a directory, wrong-typed turn fields, JSON
  nested 200,000 deep): `report` and `gate` both refuse with exit 2, naming file and field.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RECORDED_RUN = REPO / "tests" / "fixtures" / "runs" / "llama.cpp-b9093"

MATRIX = """\
version: 1
name: {name}
description: {description}
engines:
  ref:
    kind: reference
    model: {model}
    flags: [-c, 8192]
    threads: 1
configurations:
  {configuration}:
    env: {env}
    flags: {flags}
prompts:
  A: {{kind: random, tokens: {tokens}, seed: 1}}
  C: {{kind: diverge, from: A, shared: 40, tokens: 120, seed: 2}}
sequences:
  A-C: [A, C]
isolation:
  cores_per_cell: {cores}
"""
GOOD = dict(name="t", description="fine", model="{preset: tiny, seed: 0}", configuration="plain",
            env="{K: '1'}", flags="[]", tokens=100, cores=1)


def shadowlab(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shadowlab", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


def write_matrix(tmp_path: Path, **changes: object) -> Path:
    path = tmp_path / "m.yaml"
    path.write_text(MATRIX.format(**{**GOOD, **changes}))
    return path


def line_of(path: Path, needle: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if needle in line)


def refused(done: subprocess.CompletedProcess[str], *needles: str) -> str:
    """Exit 2 with one clear message (no traceback) holding every needle."""
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    text = done.stdout + done.stderr
    assert "Traceback" not in text and "internal error" not in text, text
    for needle in needles:
        assert needle in text, (needle, text)
    return text


def test_the_good_matrix_is_accepted(tmp_path):
    """The baseline every test below changes one thing of: a dry run prints its plan."""
    done = shadowlab("run", str(write_matrix(tmp_path)), "--dry-run", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "ref.plain.A-C" in done.stdout


# -------------------------------------------------------------------------------- item 5


def test_survives_a_matrix_name_that_climbs_out_of_reports(tmp_path):
    work = tmp_path / "a" / "b" / "c"
    work.mkdir(parents=True)
    path = write_matrix(work, name="../../../x")
    for args in (("--dry-run",), ()):
        done = shadowlab("run", str(path), *args, cwd=work)
        refused(done, f"{path}:{line_of(path, 'name:')}: name:", "letters, digits, '_' and '-'")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]  # no `x-<time>` anywhere
    assert not (work / "reports").exists()


def test_survives_a_run_directory_name_that_would_lead_outside(tmp_path):
    from shadowlab.errors import RunDirError
    from shadowlab.results.records import child_dir

    reports = tmp_path / "reports"
    reports.mkdir()
    assert child_dir(reports, "t-20260101T000000Z") == reports / "t-20260101T000000Z"
    (reports / "t-link").symlink_to(tmp_path)  # an existing link inside reports/
    for name in ("..", "../x", "a/b", "t-link", "x" * 256, "a\0b"):
        with pytest.raises(RunDirError):
            child_dir(reports, name)


# -------------------------------------------------------------------------------- item 7


MODE_SCRIPT = """
import os, sys
from pathlib import Path
os.umask(int(sys.argv[2], 8))
out = Path(sys.argv[1])
from shadowlab.run import prompts
from shadowlab.results import records
records.write_bytes_atomic(out / "bytes.json", b"{}")
records.write_json_atomic(out / "meta.json", {"a": 1})
prompts.save({}, out / "prompts" / "ref.json")
with open(out / "plain.log", "w") as fh:  # what engine.log gets
    fh.write("x")
try:
    from shadowlab.engines.llama_server.gguf_model import write_gguf
except ImportError:
    pass
else:
    write_gguf("tiny", 0, out / "m.gguf")
"""


@pytest.mark.parametrize("umask", ["022", "027", "002"])
def test_survives_a_umask_records_get_the_mode_of_a_plain_open(tmp_path, umask):
    subprocess.run([sys.executable, "-c", MODE_SCRIPT, str(tmp_path), umask], check=True, timeout=300)
    expected = 0o666 & ~int(umask, 8)
    files = sorted(p for p in tmp_path.rglob("*") if p.is_file())
    assert {p.name for p in files} >= {"bytes.json", "meta.json", "ref.json", "plain.log"}
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == expected, (path.name, oct(path.stat().st_mode))
    assert not [p for p in tmp_path.rglob(".*.tmp")]  # no temp file left behind


def test_every_atomic_writer_goes_through_one_function():
    """mkstemp (0600) or a hand-made temp + os.replace outside files.atomic_path (re-exported as
    records.atomic_path) would bring back item 7 in that writer."""
    offenders = []
    for path in sorted((REPO / "shadowlab").rglob("*.py")):
        text = path.read_text()
        for needle in ("mkstemp", "NamedTemporaryFile", "os.replace("):
            if needle in text and path.relative_to(REPO).as_posix() != "shadowlab/results/files.py":
                offenders.append(f"{path.relative_to(REPO)}: {needle}")
    # isolation.py's core claims are lock files (their own temp name and os.replace, mode from
    # the umask already); exitcodes.py's mkstemp is a traceback file in /tmp, private on purpose;
    # merge.py's os.replace renames a whole staged run directory into place (no file written).
    allowed = {"shadowlab/run/isolation.py: os.replace(", "shadowlab/exitcodes.py: mkstemp",
               "shadowlab/results/merge.py: os.replace("}
    assert set(offenders) <= allowed, offenders


# -------------------------------------------------------------------------------- item 9


@pytest.mark.parametrize("tokens, needle", [
    (10**31, "a 32-digit number is too large (at most 1048576)"),  # hung before
    (10_000_000, "10000000 is too large (at most 1048576)"),  # 67 s, 1.4 GB, then HTTP 400
])
def test_survives_a_huge_token_count(tmp_path, tokens, needle):
    path = write_matrix(tmp_path, tokens=tokens)
    done = shadowlab("run", str(path), "--dry-run", cwd=tmp_path)
    refused(done, f"{path}:{line_of(path, '  A:')}: prompts.A.tokens:", needle)


def test_survives_a_prompt_longer_than_the_engine_context(tmp_path):
    path = write_matrix(tmp_path, tokens=8190)  # + n_predict 16 > -c 8192
    done = shadowlab("run", str(path), "--dry-run", cwd=tmp_path)
    refused(done, f"{path}:{line_of(path, '  A:')}: prompts.A:", "needs 8206 tokens of context",
            "has 8192 (-c 8192)", "--ctx-size")
    # A configuration's -c comes after the engine's and wins, as it does on the engine's argv.
    path = write_matrix(tmp_path, tokens=8190, flags="[-c, 16384]")
    assert shadowlab("run", str(path), "--dry-run", cwd=tmp_path).returncode == 0


def test_survives_more_cores_per_cell_than_the_machine(tmp_path):
    cores = len(os.sched_getaffinity(0)) + 1
    path = write_matrix(tmp_path, cores=cores)
    where = f"{path}:{line_of(path, 'cores_per_cell')}: isolation.cores_per_cell:"
    done = shadowlab("run", str(path), "--out", str(tmp_path / "run"), cwd=tmp_path)
    refused(done, where, f"{cores} cores per cell", "hint:")
    assert not (tmp_path / "run").exists()  # nothing started, nothing written
    dry = shadowlab("run", str(path), "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0 and "ref.plain.A-C" in dry.stdout  # the plan is still shown
    assert "warning" in dry.stderr and where in dry.stderr


def test_survives_a_configuration_name_too_long_for_a_directory(tmp_path):
    path = write_matrix(tmp_path, configuration="c" * 300)  # ENAMETOOLONG before
    done = shadowlab("run", str(path), "--dry-run", cwd=tmp_path)
    refused(done, f"{path}:{line_of(path, 'c' * 300)}: configurations.{'c' * 300}:",
            "300 characters long; at most 48")


@pytest.mark.parametrize("change, key", [
    (dict(env='{K: "a\\0b"}'), "configurations.plain.env.K:"),
    (dict(flags='["--x\\0"]'), "configurations.plain.flags[0]:"),
])
def test_survives_a_nul_in_env_or_flags(tmp_path, change, key):
    path = write_matrix(tmp_path, **change)
    done = shadowlab("run", str(path), "--dry-run", cwd=tmp_path)
    refused(done, f"{path}:", key, "NUL")


def test_survives_a_device_or_fifo_as_the_model(tmp_path):
    fifo = tmp_path / "model.fifo"
    os.mkfifo(fifo)
    for model in ("/dev/zero", str(fifo)):
        path = write_matrix(tmp_path, model=f"{{path: {model}}}")
        done = shadowlab("run", str(path), "--dry-run", cwd=tmp_path, timeout=60)
        refused(done, f"{path}:{line_of(path, 'model:')}: engines.ref.model.path:", "not a regular file")


def test_survives_a_device_or_fifo_as_the_matrix(tmp_path):
    fifo = tmp_path / "m.fifo"
    os.mkfifo(fifo)
    for path in ("/dev/zero", str(fifo)):
        done = shadowlab("run", path, "--dry-run", cwd=tmp_path, timeout=60)
        refused(done, f"shadowlab: {path}: cannot read the matrix file: not a regular file")


def test_survives_megabytes_of_unknown_keys(tmp_path):
    from shadowlab.matrix import MAX_MATRIX_BYTES

    good = write_matrix(tmp_path).read_text()
    path = tmp_path / "big.yaml"
    with path.open("w") as fh:  # 50 MB took 50 s and 3.3 GB before the first error
        fh.write(good)
        while fh.tell() <= MAX_MATRIX_BYTES:
            fh.write("".join(f"unknown_{i}: {i}\n" for i in range(1000)))
    done = shadowlab("run", str(path), "--dry-run", cwd=tmp_path)
    refused(done, f"{path}: cannot read the matrix file:", "more than the 1 MiB")
    # Under the cap, the first unknown key is the error.
    path.write_text(good + "unknown_0: 0\nunknown_1: 1\n")
    refused(shadowlab("run", str(path), "--dry-run", cwd=tmp_path), "unknown key 'unknown_0'")


def test_survives_a_huge_description(tmp_path):
    path = write_matrix(tmp_path, description="x" * 5000)  # 50 MB made a 52 MB report
    done = shadowlab("run", str(path), "--dry-run", cwd=tmp_path)
    refused(done, f"{path}:{line_of(path, 'description:')}: description:", "at most 4096")


@pytest.mark.parametrize("value", ["-5", "nan", "0", "inf", "1e300", "soon"])
def test_survives_a_bad_request_timeout(tmp_path, value):
    path = write_matrix(tmp_path)
    done = shadowlab("run", str(path), "--dry-run", f"--request-timeout={value}", cwd=tmp_path)
    refused(done, "usage:", "argument --request-timeout")


def test_survives_an_unknown_fault(tmp_path):
    path = write_matrix(tmp_path)
    done = shadowlab("run", str(path), "--out", str(tmp_path / "run"), "--fault", "bogus", cwd=tmp_path)
    refused(done, "argument --fault", "unknown fault 'bogus'", "stale-restore", "crash-after-requests")
    assert not (tmp_path / "run").exists()
    done = shadowlab("run", str(path), "--dry-run", "--fault", "crash-after-requests=x", cwd=tmp_path)
    refused(done, "argument --fault", "is not a number")
    assert shadowlab("run", str(path), "--dry-run", "--fault", "crash-after-requests=2",
                     cwd=tmp_path).returncode == 0


@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_survives_a_bad_jobs_count(tmp_path, value):
    path = write_matrix(tmp_path)
    done = shadowlab("run", str(path), "--dry-run", f"--jobs={value}", cwd=tmp_path)
    refused(done, "usage:", "argument --jobs")


# -------------------------------------------------------------------------- items 11 and 2


@pytest.fixture
def run_dir(tmp_path) -> Path:
    """A recorded run (a real llama-server's records), copied so it can be damaged."""
    run = tmp_path / "run"
    shutil.copytree(RECORDED_RUN, run)
    return run


META = "cells/old.cram0.A-C/meta.json"


def judged_both_ways(run: Path) -> tuple[str, str]:
    """`report` and `gate` on the same directory: the messages, after checking both exit 2."""
    gate = refused(shadowlab("gate", str(run), cwd=run.parent, timeout=120))
    report = refused(shadowlab("report", str(run), cwd=run.parent, timeout=120))
    return gate, report


def test_the_recorded_run_is_judged(run_dir):
    """Undamaged, the run directory is judged (not refused): the damage below is what refuses."""
    assert shadowlab("gate", str(run_dir), cwd=run_dir.parent).returncode in (0, 1)
    assert shadowlab("report", str(run_dir), cwd=run_dir.parent).returncode == 0


def damage(run: Path, change) -> None:
    path = run / META
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("change, field", [
    (lambda d: d.update(status="exploded"), "status: the string 'exploded' is not one of ok"),
    (lambda d: d["turns"][1].update(prompt_tokens="many"), "turns[1].prompt_tokens: expected an integer"),
    (lambda d: d["turns"][0].update(log_offsets={"a": 1}), "turns[0].log_offsets: expected a list"),
    (lambda d: d["turns"][0]["completion"].update(tokens=[1, None]),
     "turns[0].completion.tokens[1]: missing or null"),
    (lambda d: d.update(turns=7), "turns: expected a list, got the number 7"),
], ids=["unknown-status", "turn-field-type", "offsets-type", "token-null", "turns-type"])
def test_survives_a_corrupt_record(run_dir, change, field):
    damage(run_dir, change)
    for text in judged_both_ways(run_dir):
        assert str(run_dir / META) in text and field in text, text


def test_survives_a_meta_json_that_is_a_directory(run_dir):
    path = run_dir / META
    path.unlink()
    path.mkdir()
    for text in judged_both_ways(run_dir):
        assert f"{path}: cannot read: not a regular file (a directory)" in text, text


def test_survives_json_nested_200000_deep(run_dir):
    (run_dir / META).write_text("[" * 200_000 + "]" * 200_000)  # RecursionError before
    for text in judged_both_ways(run_dir):
        assert f"{run_dir / META}: JSON nested deeper than 100 levels" in text, text


@pytest.mark.parametrize("kind", ["dev-zero", "fifo"])
@pytest.mark.parametrize("record", [META, "prompts/old.json", "plan.json", "environment.json",
                                    "matrix.yaml", "cells/old.cram0.A-C/engine.log"])
def test_survives_a_record_that_never_ends(run_dir, record, kind):
    """Item 2: a meta.json linked to /dev/zero OOM-killed `gate` (exit -9) and `report` never
    ended; prompts/<engine>.json likewise (verdicts read it whole). Every record file of a run
    directory is refused unread."""
    path = run_dir / record
    path.unlink()
    if kind == "dev-zero":
        path.symlink_to("/dev/zero")
    else:
        os.mkfifo(path)
    for text in judged_both_ways(run_dir):
        assert str(path) in text and "not a regular file" in text, text


def test_survives_a_plan_json_of_the_wrong_shape(run_dir):
    (run_dir / "plan.json").write_text(json.dumps({"cells": [{"id": ["x"]}]}))
    for text in judged_both_ways(run_dir):
        assert "plan.json: cells[0].id: expected a string" in text, text


def test_survives_a_record_whose_cell_id_leads_elsewhere(run_dir):
    damage(run_dir, lambda d: d.update(cell_id="../../../etc"))
    for text in judged_both_ways(run_dir):
        assert "cell_id: '../../../etc' is not the name of its directory" in text, text
