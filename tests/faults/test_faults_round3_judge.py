"""Faults survived by the judging commands: compare, simulate, gate and report (issue 21).

Items covered:
   2. figures the plausibility rules reject are never shown as results: `compare` refuses a run
      with such a cell (exit 3, naming it; text and --json), the report's budgets and decision
      record do not judge it, `simulate RUN/cells/CELL` refuses it; an edited verdicts.json is
      re-judged on read;
   3. `simulate` bounds every policy parameter (declared with it), --prefill-tps and the trace
      fields it reads (times, lengths, hash ids, session, server and slot ids);
   4. checks that need engine.log do not pass without it (ERROR naming the file), and a verdicts.json
      without the records it was computed from is marked unverified in every output;
  11. one bounded JSON reader for every JSON input (a 100k-deep trace line is exit 2, not a
      RecursionError), and every writer of derived files maps a full disk to one line, exit 3;
  12. compare checks prompts like with like: a run and its records-only copy are the same prompts.

Runs are real: the reference engine through `python -m shadowlab run` on small matrices, and
tests/shadowlab/hostile_engine.py (an engine that reports impossible figures on demand).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from test_faults_runner import HOSTILE, shadowlab, tmpfs  # noqa: F401 - tmpfs: the small real filesystem fixture

# ---------------------------------------------------------------- runs


HOSTILE_MATRIX = """\
version: 1
name: hostile-judge
engines:
  bad:
    kind: llama-server
    binary: {python}
    model: {{path: {script}}}
    command: ['{{binary}}', {script}, --port, '{{port}}'{modes}]
    log_family: llama.cpp
    ready_timeout_s: 20
    threads: 1
configurations:
{configurations}
prompts:
  A: {{kind: random, tokens: 620, seed: 1}}
  C: {{kind: diverge, from: A, shared: 300, tokens: 620, seed: 2}}
sequences:
  A-C: [A, C]
generation: {{n_predict: 4, temperature: 0}}
isolation: {{cores_per_cell: 1}}
{tail}
"""

REFERENCE_ENGINE = """\
engines:
  reference:
    kind: reference
    model: {preset: tiny, seed: 0}
    flags: [-c, 4096, -b, 256, -ub, 64, --kv-unified, --ctx-checkpoints, 64, -cram, 0, -np, 1]
    threads: 1
"""

REFERENCE_MATRIX = "version: 1\nname: small-ckpt\n" + REFERENCE_ENGINE + """\
configurations:
  defaults: {}
prompts:
  A: {kind: random, tokens: 600, seed: 1}
  C: {kind: diverge, from: A, shared: 300, tokens: 650, seed: 2}
  B: {kind: unrelated, tokens: 40, seed: 3, unrelated_to: [A, C]}
sequences:
  A-C: [A, C]
  A-B-C: [A, B, C]
generation: {n_predict: 4, temperature: 0}
isolation: {cores_per_cell: 1, jobs: 2}
identity: {control: false}
"""

# The placement of the reference engine on A (600 tokens, -ub 64): L-4-ub and L-4, pos_max 531, 595.
DECLARED = """\
expectations:
  - {sequence: A-C, turn: A, checkpoints_created_at: [531, 595]}
  - {sequence: A-C, turn: C, outcome: forced, cascade: true}
"""

TRAFFIC_MATRIX = "version: 1\nname: small-traffic\n" + REFERENCE_ENGINE + """\
configurations:
  baseline: {}
sequences:
  traffic:
    kind: traffic
    shape: {seed: 3, conversations: 2, turns: 2, concurrent: 2, system_tokens: [100, 150],
            turn_tokens: [200, 300], volatile_tokens: 16, user_tokens: [10, 20], interloper_share: 0.0}
generation: {n_predict: 4, temperature: 0}
isolation: {cores_per_cell: 1}
identity: {control: false}
"""


def assert_no_crash(proc: subprocess.CompletedProcess[str]) -> None:
    text = proc.stdout + proc.stderr
    assert "Traceback" not in text and "internal error" not in text, text[-3000:]


def hostile_run(where: Path, configurations: str = "  default: {}", modes: tuple[str, ...] = (),
                tail: str = "") -> Path:
    where.mkdir(parents=True, exist_ok=True)
    matrix = where / "m.yaml"
    matrix.write_text(HOSTILE_MATRIX.format(
        python=json.dumps(sys.executable), script=json.dumps(str(HOSTILE)),
        modes="".join(f", --mode, {m}" for m in modes), configurations=configurations, tail=tail))
    out = where / "run"
    proc = shadowlab("run", matrix, "--out", out, "--request-timeout", "20")
    assert_no_crash(proc)
    assert proc.returncode in (0, 1, 3) and (out / "verdicts.json").is_file(), proc.stderr[-3000:]
    return out


def reference_run(where: Path, matrix_text: str, *faults: str) -> tuple[Path, subprocess.CompletedProcess[str]]:
    where.mkdir(parents=True, exist_ok=True)
    matrix = where / "m.yaml"
    matrix.write_text(matrix_text)
    out = where / "run"
    proc = shadowlab("run", matrix, "--out", out, *(f"--fault={f}" for f in faults))
    assert_no_crash(proc)
    assert (out / "verdicts.json").is_file(), proc.stderr[-3000:]
    return out, proc


def records_only_copy(run: Path, where: Path) -> Path:
    """What is left of a run reduced to its derived records: no cells/, no prompts/."""
    where.mkdir(parents=True)
    for name in ("matrix.yaml", "plan.json", "environment.json", "verdicts.json"):
        shutil.copy(run / name, where / name)
    return where


@pytest.fixture(scope="module")
def honest_and_liar(tmp_path_factory) -> tuple[Path, Path]:
    """The same matrix on an honest engine and on one that says it reused 3× each prompt
    (1,860 of 620 tokens) in a negative time (issue 21 item 2's figures)."""
    root = tmp_path_factory.mktemp("hostile")
    return hostile_run(root / "honest"), hostile_run(root / "liar", modes=("lie-reuse", "negative-timing"))


# ---------------------------------------------------------------- item 2: impossible figures are no results


def test_compare_refuses_a_run_whose_engine_reported_impossible_figures(honest_and_liar):
    honest, liar = honest_and_liar
    assert shadowlab("gate", liar).returncode == 3  # the gate refuses it: the control
    for extra in ((), ("--json",)):
        proc = shadowlab("compare", honest, liar, *extra)
        assert_no_crash(proc)
        assert proc.returncode == 3, proc.stdout + proc.stderr
        assert proc.stdout == "", proc.stdout  # no figure of it is shown, in text or JSON
        assert "bad.default.A-C" in proc.stderr and "impossible" in proc.stderr, proc.stderr
        assert "1,860 tokens reused of a 620-token prompt" in proc.stderr, proc.stderr
    # an honest run against itself is compared as before
    assert shadowlab("compare", honest, honest).returncode == 0


def test_compare_can_leave_out_impossible_cells_and_says_which(tmp_path):
    run = hostile_run(tmp_path, configurations="  honest: {}\n  liar: {flags: [--mode, lie-reuse]}")
    args = ("compare", run, run, "--baseline-config", "honest", "--candidate-config", "liar")
    refused = shadowlab(*args)
    assert refused.returncode == 3 and "bad.liar.A-C" in refused.stderr, refused.stderr
    proc = shadowlab(*args, "--exclude-impossible", "--json")
    # the one warm cell of the candidate is left out: nothing is left to compare (refused, exit 2)
    assert proc.returncode == 2 and "bad.liar.A-C" in proc.stderr and "impossible" in proc.stderr, proc.stderr


def test_budgets_and_the_decision_record_do_not_judge_impossible_figures(tmp_path):
    tail = "baseline: honest\nbudgets: [{max_created_per_turn: 10, description: cheap enough}]\n"
    run = hostile_run(tmp_path, configurations="  honest: {}\n  liar: {flags: [--mode, lie-reuse]}", tail=tail)
    proc = shadowlab("gate", run)
    assert proc.returncode == 3, proc.stdout
    budget = [line for line in proc.stdout.splitlines() if " budget " in line]
    assert budget and all("ERROR" in line and "impossible" in line for line in budget), proc.stdout
    md = (run / "report.md").read_text(encoding="utf-8")
    decision = md.split("### Decision", 1)[1].split("###", 1)[0]
    assert "not judged" in decision and "impossible" in decision, decision
    assert "reuses +" not in decision, decision  # no gain of the liar's is stated
    html = (run / "report.html").read_text(encoding="utf-8")
    section = html.split('id="decision"', 1)[1].split("<h2", 1)[0]
    assert "not judged" in section and "impossible" in section and "reuses +" not in section


def test_the_report_counts_no_impossible_reuse_as_reused(honest_and_liar):
    _, liar = honest_and_liar
    html = (liar / "report.html").read_text(encoding="utf-8")
    kpis = html.split('<div class="kpis">', 1)[1].split("</div>", 1)[0]
    assert "1,860" not in kpis and "3,720" not in kpis, kpis
    assert "impossible" in kpis, kpis


def test_an_edited_verdicts_json_is_rejudged_by_the_plausibility_rules(honest_and_liar, tmp_path):
    _, liar = honest_and_liar
    bare = records_only_copy(liar, tmp_path / "bare")
    data = json.loads((bare / "verdicts.json").read_text(encoding="utf-8"))
    for cell in data["cells"]:
        for turn in cell["turns"]:
            turn["implausible"] = []  # someone cleared the verdicts' own record of the lie
    (bare / "verdicts.json").write_text(json.dumps(data), encoding="utf-8")
    proc = shadowlab("gate", bare)
    assert proc.returncode == 3 and "1,860 tokens reused of a 620-token prompt" in proc.stdout, proc.stdout


def _traffic_run(tmp_path: Path) -> Path:
    run, proc = reference_run(tmp_path, TRAFFIC_MATRIX)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    return run


def test_simulate_refuses_a_run_cell_with_impossible_figures(tmp_path):
    run = _traffic_run(tmp_path)
    cell = run / "cells" / "reference.baseline.traffic"
    assert shadowlab("simulate", cell, "--policy", "baseline").returncode == 0  # the control
    meta = json.loads((cell / "meta.json").read_text(encoding="utf-8"))
    turn = meta["turns"][1]
    turn["reused_tokens"] = 3 * turn["prompt_tokens"]  # a hostile record: reuse beyond the prompt
    turn["timings"]["cache_n"] = turn["reused_tokens"]
    (cell / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    proc = shadowlab("simulate", cell, "--policy", "baseline")
    assert_no_crash(proc)
    assert proc.returncode == 3 and proc.stdout == "", proc.stdout + proc.stderr
    assert "impossible" in proc.stderr and "turn 1" in proc.stderr, proc.stderr


# ---------------------------------------------------------------- item 3: simulate's numbers are bounded


@pytest.mark.parametrize("policy, key", [
    ("policy0:restore_ms=-100000", "restore_ms"),
    ("policy0:checkpoint_mib=-1000", "checkpoint_mib"),
    ("policy0:create_ms=1e300", "create_ms"),
    ("baseline:slots=100000", "slots"),
    ("baseline:similarity=2", "similarity"),
    ("baseline:n_ctx=0", "n_ctx"),
    ("baseline:kv_mib_per_token=-1", "kv_mib_per_token"),
    ("llama-1slot:cache_ram_mib=-5", "cache_ram_mib"),
])
def test_simulate_refuses_a_policy_parameter_out_of_its_bounds(tmp_path, policy, key):
    proc = shadowlab("simulate", "shape:case-study", "--policy", "baseline", "--policy", policy)
    assert_no_crash(proc)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout[-2000:]
    value = policy.rpartition("=")[2]
    assert key in proc.stderr and value in proc.stderr and "outside" in proc.stderr, proc.stderr


@pytest.mark.parametrize("value", ["1e300", "0", "-5", "nan"])
def test_simulate_refuses_a_prefill_rate_out_of_its_bounds(value):
    proc = shadowlab("simulate", "shape:case-study", "--policy", "baseline", f"--prefill-tps={value}")
    assert_no_crash(proc)
    assert proc.returncode == 2 and "--prefill-tps" in proc.stderr and repr(float(value)) in proc.stderr, proc.stderr


MOONCAKE_OK = {"timestamp": 0, "input_length": 1024, "output_length": 4, "hash_ids": [1, 2]}


@pytest.mark.parametrize("field, value, words", [
    ("timestamp", 1e300, "'timestamp'"),
    ("hash_ids", [-5, 2], "'hash_ids'"),
    ("hash_ids", [2 ** 70, 2], "'hash_ids'"),
    ("session_id", {"a": 1}, "'session_id'"),
    ("session_id", "x" * 5000, "'session_id'"),
    ("delay", 10 ** 300, "'delay'"),
])
def test_simulate_refuses_a_mooncake_field_out_of_its_bounds(tmp_path, field, value, words):
    doc = dict(MOONCAKE_OK, **{field: value})
    if field == "delay":
        del doc["timestamp"]
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps(MOONCAKE_OK) + "\n" + json.dumps(doc) + "\n", encoding="utf-8")
    proc = shadowlab("simulate", trace, "--policy", "baseline")
    assert_no_crash(proc)
    assert proc.returncode == 2 and f"{trace}:2" in proc.stderr and words in proc.stderr, proc.stderr


TRACE_HEADER = {"format": "shadowlab-trace", "version": 1, "time_unit": "s", "source": "shadowlab logs"}
TRACE_OK = {"time": 1.0, "server": "a.log", "slot": 0, "prompt_tokens": 100, "shared_prefix": 0,
            "shared_source": "lcp"}


@pytest.mark.parametrize("field, value, words", [
    ("server", [1], "'server'"),
    ("slot", {"x": 1}, "'slot'"),
    ("slot", -1, "'slot'"),
    ("time", 1e300, "'time'"),
    ("time", -3.0, "'time'"),
    ("shared_prefix", 10 ** 30, "'shared_prefix'"),
])
def test_simulate_refuses_a_logs_trace_field_out_of_its_bounds(tmp_path, field, value, words):
    trace = tmp_path / "t.jsonl"
    lines = [TRACE_HEADER, TRACE_OK, dict(TRACE_OK, **{field: value})]
    trace.write_text("".join(json.dumps(d) + "\n" for d in lines), encoding="utf-8")
    proc = shadowlab("simulate", trace, "--policy", "baseline")
    assert_no_crash(proc)
    assert proc.returncode == 2 and f"{trace}:3" in proc.stderr and words in proc.stderr, proc.stderr


# ---------------------------------------------------------------- item 4: no qualification without evidence


@pytest.fixture(scope="module")
def skip_cascade_without_logs(tmp_path_factory) -> tuple[Path, Path]:
    """A skip-cascade run of a matrix without expectations (the default cascade rule is its only
    judge of the cascade), and a copy of it without any engine.log."""
    root = tmp_path_factory.mktemp("skip")
    run, proc = reference_run(root, REFERENCE_MATRIX, "skip-cascade")
    assert proc.returncode == 1 and "cascade" in proc.stdout, proc.stdout  # with its logs: it fails
    bare = root / "nolog"
    shutil.copytree(run, bare)
    for log in bare.glob("cells/*/engine.log"):
        log.unlink()
    return run, bare


def test_the_cascade_check_does_not_pass_without_engine_log(skip_cascade_without_logs):
    _, nolog = skip_cascade_without_logs
    proc = shadowlab("gate", nolog)
    assert_no_crash(proc)
    assert proc.returncode == 3 and "qualified (exit 0)" not in proc.stdout, proc.stdout
    cascade = [line for line in proc.stdout.splitlines() if " cascade " in line]
    assert len(cascade) == 2, proc.stdout  # both warm cells
    for line in cascade:
        assert "ERROR" in line and "engine.log" in line and "missing" in line, line


def test_declared_checks_that_need_the_log_are_errors_naming_it(tmp_path):
    run, proc = reference_run(tmp_path, REFERENCE_MATRIX + DECLARED)
    assert proc.returncode == 0, proc.stdout  # with its log: every declared check passes
    for log in run.glob("cells/*/engine.log"):
        log.unlink()
    proc = shadowlab("gate", run)
    assert proc.returncode == 3, proc.stdout
    for check in ("checkpoints_created_at", "outcome", "cascade"):
        lines = [line for line in proc.stdout.splitlines() if f" {check} " in line and "reference.defaults.A-C " in line]
        assert lines and all("ERROR" in line and "cells/reference.defaults.A-C/engine.log" in line
                             for line in lines), (check, proc.stdout)


def test_a_verdicts_json_without_its_records_is_marked_unverified_everywhere(skip_cascade_without_logs, tmp_path):
    run, _ = skip_cascade_without_logs
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("matrix.yaml", "plan.json"):
        shutil.copy(run / name, bare / name)
    data = json.loads((run / "verdicts.json").read_text(encoding="utf-8"))
    for cell in data["cells"]:
        for turn in cell["turns"]:
            turn["cascade_missed"] = []  # edited: the kept checkpoints are gone from the verdicts
    (bare / "verdicts.json").write_text(json.dumps(data), encoding="utf-8")
    proc = shadowlab("gate", bare)
    assert_no_crash(proc)
    headline = proc.stdout.splitlines()[0]
    assert "UNVERIFIED" in headline and "verdicts.json" in headline and "cells/" in headline, headline
    assert shadowlab("report", bare).returncode == 0
    html = (bare / "report.html").read_text(encoding="utf-8")
    assert 'class="banner unverified"' in html and "UNVERIFIED" in html
    md = (bare / "report.md").read_text(encoding="utf-8")
    assert "UNVERIFIED" in md.splitlines()[0], md.splitlines()[0]
    root = ET.parse(bare / "junit.xml").getroot()
    props = {p.get("name"): p.get("value") for p in root.iter("property")}
    assert "verdicts.json" in props.get("shadowlab.unverified", ""), props
    skipped = [case for case in root.iter("testcase") if case.find("skipped") is not None]
    assert skipped and "cells/" in skipped[0].find("skipped").get("message"), ET.tostring(root)[:2000]
    # a run with its records is not marked
    assert "UNVERIFIED" not in shadowlab("gate", run).stdout


# ---------------------------------------------------------------- item 11: bounded JSON, full disks


DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize("first", [None, TRACE_HEADER, MOONCAKE_OK])
def test_a_deeply_nested_json_line_is_refused_with_its_line(tmp_path, first):
    trace = tmp_path / "deep.jsonl"
    trace.write_text("".join(json.dumps(d) + "\n" for d in ([first] if first else [])) + DEEP + "\n",
                     encoding="utf-8")
    proc = shadowlab("simulate", trace, "--policy", "baseline")
    assert_no_crash(proc)
    line = 2 if first else 1
    assert proc.returncode == 2 and f"{trace}:{line}" in proc.stderr, proc.stderr
    assert "nested deeper than 100" in proc.stderr, proc.stderr


def test_a_deeply_nested_shape_file_is_refused(tmp_path):
    shape = tmp_path / "shape.yaml"
    shape.write_text("seed: " + "[" * 100_000 + "]" * 100_000 + "\n", encoding="utf-8")
    proc = shadowlab("simulate", shape, "--policy", "baseline")
    assert_no_crash(proc)
    assert proc.returncode == 2 and str(shape) in proc.stderr, proc.stderr


def _fill(disk: Path) -> None:
    """Write until the filesystem is full."""
    with open(disk / "filler", "wb", buffering=0) as fh:
        try:
            while True:
                fh.write(b"\0" * 4096)
        except OSError:
            pass


def _one_enospc_line(proc: subprocess.CompletedProcess[str], command: str) -> str:
    assert_no_crash(proc)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    said = [line for line in proc.stderr.splitlines() if line.startswith(f"shadowlab{command}: cannot write")]
    assert len(said) == 1 and "No space left on device (ENOSPC)" in said[0], proc.stderr
    return said[0]


def test_report_on_a_full_disk_is_one_line_naming_the_file(honest_and_liar, tmpfs):  # noqa: F811
    honest, _ = honest_and_liar
    disk = tmpfs("disk", "size=4m")
    run = disk / "run"
    shutil.copytree(honest, run)
    for name in ("report.html", "report.md", "junit.xml", "verdicts.json"):
        (run / name).unlink()
    _fill(disk)
    said = _one_enospc_line(shadowlab("report", run), "")
    assert str(run / "verdicts.json") in said or str(run / "report.html") in said, said
    assert not list(run.glob(".*.tmp")), list(run.iterdir())  # no temporary file left behind


def test_simulate_out_on_a_full_disk_is_one_line_naming_the_file(tmpfs):  # noqa: F811
    disk = tmpfs("disk", "size=64k")
    _fill(disk)
    said = _one_enospc_line(shadowlab("simulate", "shape:case-study", "--policy", "baseline",
                                      "--out", disk / "sim"), " simulate")
    assert str(disk / "sim" / "simulate.json") in said, said


# ---------------------------------------------------------------- item 12: prompts compared like with like


def test_a_run_and_its_records_only_copy_are_the_same_prompts(honest_and_liar, tmp_path):
    honest, _ = honest_and_liar
    copy = records_only_copy(honest, tmp_path / "copy")
    proc = shadowlab("compare", honest, copy, "--allow", "unverified")
    assert_no_crash(proc)
    assert proc.returncode == 0 and "prompt" not in proc.stderr, proc.stderr
    assert "by their matrix spec" in proc.stdout, proc.stdout  # says how the prompts were compared
    # the copy of another matrix's prompts is still refused, by the same spec hash on both sides
    other = records_only_copy(honest, tmp_path / "other")
    text = (other / "matrix.yaml").read_text(encoding="utf-8")
    assert "seed: 2" in text
    (other / "matrix.yaml").write_text(text.replace("seed: 2", "seed: 7", 1), encoding="utf-8")
    refused = shadowlab("compare", honest, other, "--allow", "unverified")
    assert refused.returncode == 2 and "prompt 'C'" in refused.stderr and "spec" in refused.stderr, refused.stderr
