"""The run stage against the real reference engine (python -m shadowlab_engine).

Every test starts real engine processes on loopback. Engine start-up is seconds (torch
import), so matrices here are small: short prompts, few cells, cores_per_cell 1.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from shadowlab import engines, run
from shadowlab.results import records, rundir
from shadowlab.errors import RunDirError
from shadowlab.results.records import CellStatus

MATRIX = """\
version: 1
name: {name}
engines:
  reference:
    kind: reference
    model: {{preset: tiny, seed: 0}}
    flags: [-c, 1024, -b, 64, -ub, 32, --ctx-checkpoints, 8, -cram, 0, -np, 1]
    threads: 1
    ready_timeout_s: {ready_timeout}
configurations:
{configurations}
prompts:
  A: {{kind: random, tokens: 120, seed: 1}}
  C: {{kind: diverge, from: A, shared: 70, tokens: 130, seed: 2}}
sequences:
{sequences}
generation: {{n_predict: 4, temperature: 0}}
isolation: {{cores_per_cell: 1}}
identity: {{control: {control}}}
"""


def write_matrix(path: Path, *, name: str = "t", configurations: str = "  defaults: {}",
                 sequences: str = "  A-C: [A, C]", control: bool = False,
                 ready_timeout: float = 60) -> Path:
    path.write_text(MATRIX.format(name=name, configurations=configurations, sequences=sequences,
                                  control=str(control).lower(), ready_timeout=ready_timeout))
    return path


def options(tmp_path: Path, matrix: Path, repo_root: Path, **kwargs) -> run.RunOptions:
    lines: list[str] = []
    kwargs.setdefault("out", tmp_path / "run")
    return run.RunOptions(matrix_path=matrix, model_cache=repo_root / "models",
                          progress=lines.append, **kwargs)


def metas(run_dir: Path) -> dict[str, records.CellMeta]:
    return rundir.read_cell_metas(run_dir)


def assert_no_engine_alive(metas_by_id: dict[str, records.CellMeta]) -> None:
    for meta in metas_by_id.values():
        if meta.pid is not None and psutil.pid_exists(meta.pid):
            assert psutil.Process(meta.pid).status() == psutil.STATUS_ZOMBIE, meta.cell_id


def test_run_records_every_cell(tmp_path, repo_root):
    matrix = write_matrix(tmp_path / "m.yaml")
    outcome = run.run(options(tmp_path, matrix, repo_root))
    assert outcome.all_ran
    layout = records.RunLayout(outcome.run_dir)
    for path in (layout.matrix, layout.plan, layout.environment, layout.prompts("reference")):
        assert path.exists(), path
    prompts = json.loads(layout.prompts("reference").read_text())
    assert len(prompts["A"]["tokens"]) == 120 and len(prompts["C"]["tokens"]) == 130

    by_id = metas(outcome.run_dir)
    assert list(by_id) == ["reference.defaults.A-C", "reference.defaults.cold.C"]
    warm = by_id["reference.defaults.A-C"]
    assert warm.status is CellStatus.OK
    # Pinned and verified from the running process; GPU hidden and verified from /props.
    assert warm.cores.observed_affinity == warm.cores.leased and len(warm.cores.leased) == 1
    assert warm.env_delta["CUDA_VISIBLE_DEVICES"] == "" and warm.env_delta["OMP_NUM_THREADS"] == "1"
    assert warm.gpu.reported_device == "cpu" and warm.gpu.verified is True
    assert warm.engine.props["pid"] == warm.pid
    assert warm.engine.model_sha256 == warm.engine.props["model_sha256"]
    assert warm.stop.survivors == [] and warm.stop.port_free
    assert 0 < warm.health_ms <= warm.startup_ms < warm.elapsed_ms
    # Turns: exact prompts, API reuse counts, the log span of each turn.
    log = layout.engine_log(warm.cell_id).read_bytes()
    assert [t.prompt_id for t in warm.turns] == ["A", "C"]
    # Each turn carries the plan's conversation: the ordered sequence's; a cold turn none.
    assert [t.conversation for t in warm.turns] == ["A-C", "A-C"]
    assert [t.conversation for t in by_id["reference.defaults.cold.C"].turns] == [None]
    for turn in warm.turns:
        assert turn.prompt_token_ids == prompts[turn.prompt_id]["tokens"]
        assert turn.prompt_sha256 == prompts[turn.prompt_id]["sha256"]
        assert turn.reused_tokens + turn.processed_tokens == turn.prompt_tokens
        assert turn.completion.sha256 == records.sha256_text(turn.completion.text)
        assert len(turn.completion.tokens) == 4
        start, end = turn.log_offsets
        span = log[start:end]
        assert turn.log_complete and b"prompt eval time" in span
        assert span.count(b"prompt eval time") == 1  # exactly this turn's
        assert turn.task_ids == [turn.index]
        raw = json.loads((layout.cell_dir(warm.cell_id) / turn.response_file).read_text())
        assert raw["tokens"] == turn.completion.tokens
    assert warm.turns[0].log_offsets[1] == warm.turns[1].log_offsets[0]  # contiguous spans
    assert not layout.scratch(warm.cell_id).exists()  # keep_scratch: false
    assert_no_engine_alive(by_id)


def test_reused_run_directory_is_refused(tmp_path, repo_root):
    matrix = write_matrix(tmp_path / "m.yaml")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "something").write_text("x")
    with pytest.raises(RunDirError, match="already exists") as err:
        run.run(options(tmp_path, matrix, repo_root))
    assert "--resume" in str(err.value)


def test_engine_that_never_starts_fails_its_cell_only(tmp_path, repo_root):
    matrix = write_matrix(
        tmp_path / "m.yaml",
        configurations="  broken: {flags: [--no-such-flag]}\n  defaults: {}",
        sequences="  A: [A]",
    )
    outcome = run.run(options(tmp_path, matrix, repo_root))
    by_id = metas(outcome.run_dir)
    broken, good = by_id["reference.broken.A"], by_id["reference.defaults.A"]
    assert broken.status is CellStatus.FAILED
    assert "exited with code 2 during start-up" in broken.reason
    assert "--no-such-flag" in broken.log_tail  # the engine's own complaint, kept
    assert broken.stop.signal == "none" and broken.stop.returncode == 2
    assert good.status is CellStatus.OK
    assert not outcome.all_ran


def test_engine_that_is_never_ready_fails_with_its_log(tmp_path, repo_root):
    matrix = write_matrix(
        tmp_path / "m.yaml",
        configurations="  slow: {flags: [--fault, slow-start=600]}\n  defaults: {}",
        sequences="  A: [A]", ready_timeout=10,
    )
    outcome = run.run(options(tmp_path, matrix, repo_root))
    by_id = metas(outcome.run_dir)
    slow, good = by_id["reference.slow.A"], by_id["reference.defaults.A"]
    assert slow.status is CellStatus.FAILED
    assert "not ready after 10 s" in slow.reason
    assert "slow-start" in slow.log_tail
    assert slow.pid and "--fault" in slow.command  # what was started is on record
    assert slow.stop.signal == "TERM" and slow.stop.survivors == [] and slow.stop.port_free
    assert good.status is CellStatus.OK
    assert_no_engine_alive(by_id)


def test_crashing_engine_fails_its_cell_only(tmp_path, repo_root):
    # Each process crashes (exit 134) right after answering its first completion: the warm
    # cell finds it dead after turn 0 or during turn 1. The cold cell needs one answer only:
    # it fails when its engine exited 134, and is ok only when shadowlab stopped the engine
    # before it crashed (its exit status then the stop signal's), never by luck of timing.
    matrix = write_matrix(tmp_path / "m.yaml")
    outcome = run.run(options(tmp_path, matrix, repo_root, faults=("crash-after-requests=1",)))
    by_id = metas(outcome.run_dir)
    warm, cold = by_id["reference.defaults.A-C"], by_id["reference.defaults.cold.C"]
    assert warm.status is CellStatus.FAILED, warm.reason
    assert "code 134" in warm.reason, warm.reason
    assert "during turn 1" in warm.reason or "after answering turn 0" in warm.reason, warm.reason
    assert warm.turns[0].completion is not None and (len(warm.turns) == 1 or warm.turns[1].error)
    assert warm.log_tail
    assert cold.turns[0].completion is not None
    if cold.stop.returncode == 134:
        assert cold.status is CellStatus.FAILED and "code 134" in cold.reason, cold.reason
    else:
        assert cold.status is CellStatus.OK and cold.stop.returncode == -signal.SIGTERM, cold.stop
    assert_no_engine_alive(by_id)


def test_hanging_engine_fails_its_cell_only(tmp_path, repo_root):
    matrix = write_matrix(tmp_path / "m.yaml")
    started = time.monotonic()
    outcome = run.run(options(tmp_path, matrix, repo_root, faults=("hang-on-request=2",),
                              request_timeout_s=3))
    by_id = metas(outcome.run_dir)
    warm, cold = by_id["reference.defaults.A-C"], by_id["reference.defaults.cold.C"]
    assert warm.status is CellStatus.FAILED
    assert "no answer within 3 s" in warm.reason
    assert warm.stop.survivors == [] and warm.stop.port_free
    assert cold.status is CellStatus.OK
    assert time.monotonic() - started < 120
    assert_no_engine_alive(by_id)


# ---------------------------------------------------------------- shadowlab as a process


def shadowlab_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "shadowlab", *args]


def engine_descendants(pid: int) -> list[psutil.Process]:
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    return [c for c in children if "shadowlab_engine" in " ".join(_cmdline(c))]


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return []


def alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_interrupted_run_leaves_no_engine_and_resumes(tmp_path, repo_root, sig):
    matrix = write_matrix(tmp_path / "m.yaml", sequences="  A: [A]\n  C: [C]\n  A-C: [A, C]")
    out = tmp_path / "run"
    args = shadowlab_cmd("run", str(matrix), "--out", str(out), "--no-report")
    shadowlab = subprocess.Popen(args, cwd=repo_root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Wait until the first cell finished and the second cell's engine is running.
        wait_for(lambda: (out / "cells" / "reference.defaults.A" / "meta.json").exists(), 120, "first cell")
        engines = wait_for(lambda: engine_descendants(shadowlab.pid), 60, "second cell's engine")
        shadowlab.send_signal(sig)
        _, stderr = shadowlab.communicate(timeout=60)
    finally:
        if shadowlab.poll() is None:
            shadowlab.kill()
    assert shadowlab.returncode == 128 + sig, stderr
    assert not [e.pid for e in engines if alive(e)], "an engine survived shadowlab's interruption"
    first = records.read_meta(out / "cells" / "reference.defaults.A" / "meta.json")
    assert first.status is CellStatus.OK
    interrupted = out / "cells" / "reference.defaults.C" / "meta.json"
    if interrupted.exists():  # written as aborted, never as ok
        assert records.read_meta(interrupted).status is CellStatus.ABORTED

    if sig == signal.SIGINT:
        return  # the resume path is the same; one run of it is enough on a 2-core machine
    done = subprocess.run(shadowlab_cmd("run", str(matrix), "--out", str(out), "--resume", "--no-report"),
                          cwd=repo_root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "reference.defaults.A ok (kept from the resumed run)" in done.stderr.replace("[", "").replace("]", "")
    by_id = metas(out)
    assert {m.status for m in by_id.values()} == {CellStatus.OK}
    assert by_id["reference.defaults.A"].pid == first.pid  # not rerun
    assert_no_engine_alive(by_id)


def test_two_runs_at_once_never_share_a_core_or_port(tmp_path, repo_root):
    """Two shadowlab processes, one machine, one lock directory: sample live engines."""
    sequences = "  A: [A]\n  C: [C]"
    runs = []
    for name in ("one", "two"):
        matrix = write_matrix(tmp_path / f"{name}.yaml", name=name, sequences=sequences)
        runs.append(subprocess.Popen(
            shadowlab_cmd("run", str(matrix), "--out", str(tmp_path / name), "--no-report"),
            cwd=repo_root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    overlaps = 0
    try:
        while any(p.poll() is None for p in runs):
            live = [e for p in runs for e in engine_descendants(p.pid) if alive(e)]
            cores: list[int] = []
            for engine in live:
                try:
                    cores += engine.cpu_affinity()
                except psutil.NoSuchProcess:
                    continue
            assert len(cores) == len(set(cores)), f"engines share a core: {cores}"
            overlaps += len({p.pid for p in runs if engine_descendants(p.pid)}) == 2
            time.sleep(0.05)
    finally:
        for p in runs:
            if p.poll() is None:
                p.kill()
            p.communicate()
    assert [p.returncode for p in runs] == [0, 0]
    one, two = metas(tmp_path / "one"), metas(tmp_path / "two")
    assert overlaps > 0, "the two runs never had engines alive at the same time"
    for a in one.values():
        for b in two.values():
            if _overlap(a, b):
                assert not set(a.cores.leased) & set(b.cores.leased)
                assert a.port != b.port


def _overlap(a: records.CellMeta, b: records.CellMeta) -> bool:
    import datetime as dt

    def span(m: records.CellMeta) -> tuple[float, float]:
        start = dt.datetime.fromisoformat(m.started_at).timestamp()
        return start, start + m.elapsed_ms / 1000.0

    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1


def test_port_taken_between_check_and_bind_is_retried(tmp_path, repo_root, monkeypatch):
    """Another program binds the port after shadowlab chose it: the engine cannot listen,
    says so in its log, and shadowlab retries on a fresh port."""
    import socket

    from shadowlab.run import isolation

    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    taken = squatter.getsockname()[1]
    real_lease_port = isolation.lease_port
    handed_out: list[int] = []

    def lease_port(*args, **kwargs):
        lease = isolation.PortLease(taken) if not handed_out else real_lease_port(*args, **kwargs)
        handed_out.append(lease.port)
        return lease

    monkeypatch.setattr(isolation, "lease_port", lease_port)
    matrix = write_matrix(tmp_path / "m.yaml", sequences="  A: [A]")
    try:
        outcome = run.run(options(tmp_path, matrix, repo_root))
    finally:
        squatter.close()
    meta = metas(outcome.run_dir)["reference.defaults.A"]
    # handed_out[0] went to the prompts' tokenizer engine, which also had to retry.
    assert handed_out[0] == taken
    assert meta.status is CellStatus.OK
    assert meta.port != taken
    log = records.RunLayout(outcome.run_dir).prompts_dir / "reference.engine.log"
    assert b"Address already in use" in log.read_bytes()


CHAT_PROMPTS = """\
  T1:
    kind: chat
    messages:
      - {role: system, content: You answer briefly.}
      - {role: user, content: Name a colour.}
  T2:
    kind: chat
    messages:
      - {role: system, content: You answer briefly.}
      - {role: user, content: Name a colour.}
      - {role: assistant, content: {from_turn: 0}}
      - {role: user, content: And another one?}
"""


def test_chat_turns_splice_the_warm_replies(tmp_path, repo_root):
    text = write_matrix(tmp_path / "m.yaml", sequences="  chat: [T1, T2]").read_text()
    text = text.replace("prompts:\n", "prompts:\n" + CHAT_PROMPTS)
    matrix = tmp_path / "m.yaml"
    matrix.write_text(text)
    outcome = run.run(options(tmp_path, matrix, repo_root))
    by_id = metas(outcome.run_dir)
    warm, cold = by_id["reference.defaults.chat"], by_id["reference.defaults.cold.chat.T2"]
    assert warm.status is CellStatus.OK and cold.status is CellStatus.OK
    first, second = warm.turns
    assert first.endpoint == second.endpoint == "/v1/chat/completions"
    assert second.messages[2] == {"role": "assistant", "content": first.completion.text}
    # The cold run is fed exactly the warm turn's messages (with the warm reply spliced in).
    assert cold.turns[0].messages == second.messages
    assert cold.turns[0].prompt_sha256 == second.prompt_sha256 == records.sha256_json(second.messages)
    assert second.prompt_tokens == second.reused_tokens + second.processed_tokens
    assert second.prompt_token_ids is None


def test_engine_that_cannot_be_prepared_skips_its_cells_only(tmp_path, repo_root, monkeypatch):
    """An adapter's prepare() fails for one engine (say, its binary cannot be built)."""
    from shadowlab.engines.reference import ReferenceAdapter

    real_prepare = ReferenceAdapter.prepare

    def prepare(self, spec, cache_dir):
        if spec.name == "broken":
            raise FileNotFoundError("llama-server: not built")
        return real_prepare(self, spec, cache_dir)

    monkeypatch.setattr(ReferenceAdapter, "prepare", prepare)
    text = write_matrix(tmp_path / "m.yaml", sequences="  A: [A]").read_text()
    bad_engine = "  broken:\n    kind: reference\n    model: {preset: tiny, seed: 0}\n    threads: 1\n"
    text = text.replace("configurations:\n", bad_engine + "configurations:\n", 1)
    matrix = tmp_path / "m.yaml"
    matrix.write_text(text)
    outcome = run.run(options(tmp_path, matrix, repo_root))
    by_id = metas(outcome.run_dir)
    assert by_id["reference.defaults.A"].status is CellStatus.OK
    broken = by_id["broken.defaults.A"]
    assert broken.status is CellStatus.SKIPPED
    assert "could not be prepared" in broken.reason and "not built" in broken.reason
    assert not outcome.all_ran


@pytest.mark.parametrize(
    ("requested", "reported", "verified"),
    [(None, "cpu", True), (None, "cuda:0", False), (0, "cuda:0", True), (0, "cpu", False), (None, None, None)],
)
def test_gpu_visibility_is_checked_against_what_the_engine_reports(requested, reported, verified):
    from types import SimpleNamespace

    from shadowlab.engines.reference import ReferenceAdapter

    props = {} if reported is None else {"device": reported}
    live = SimpleNamespace(engine=SimpleNamespace(adapter=ReferenceAdapter()), props=props)
    record = run.gpu_record(requested, live)
    assert record.verified is verified
    assert record.visibility_env["CUDA_VISIBLE_DEVICES"] == ("" if requested is None else str(requested))


def test_engine_orphaned_by_a_killed_shadowlab_is_reaped_by_the_next(tmp_path, repo_root):
    """SIGKILL cannot be handled: the engine outlives shadowlab. The next shadowlab on the
    machine finds its stale core claim and kills it (same pid and creation time)."""
    from shadowlab.run import isolation

    matrix = write_matrix(tmp_path / "m.yaml", sequences="  A: [A]")
    shadowlab = subprocess.Popen(shadowlab_cmd("run", str(matrix), "--out", str(tmp_path / "run"), "--no-report"),
                                 cwd=repo_root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        engines = wait_for(lambda: engine_descendants(shadowlab.pid), 60, "an engine")
        lock_dir = Path(os.environ["SHADOWLAB_LOCK_DIR"])
        wait_for(lambda: list(lock_dir.glob("core-*.claim")), 10, "the engine's core claim")
    finally:
        shadowlab.kill()
        shadowlab.wait()
    orphans = [e for e in engines if alive(e)]
    assert orphans, "the engine should have outlived a SIGKILLed shadowlab"
    reaped = isolation.reap_orphans()
    assert {e.pid for e in orphans} <= set(reaped)
    wait_for(lambda: not any(alive(e) for e in orphans), 10, "the orphans to die")
    assert not list(lock_dir.glob("core-*.claim"))


def test_a_log_span_is_read_in_chunks_and_finds_lines_cut_by_them(tmp_path):
    # The turn's line straddles the first chunk's end; the span grows in odd steps.
    log = tmp_path / "engine.log"
    line = b"slot print_timing: id  0 | task 7 | prompt eval time =  1.00 ms / 5 tokens\n"
    head = b"z" * (run.SPAN_CHUNK - 30)  # one line of ~1 MiB, no newline
    log.write_bytes(head + line + b"| task 12345678901234567890 | too long to be a task id\n")
    family = engines.log_family("llama.cpp")
    whole, stepped = run.LogSpan(log, 0, family), run.LogSpan(log, 0, family)
    whole.extend(log.stat().st_size)
    for end in range(0, log.stat().st_size + 1, 997):
        stepped.extend(end)
    stepped.extend(log.stat().st_size)
    for span in (whole, stepped):
        assert span.complete and span.task_ids == {7}
    later = run.LogSpan(log, len(head) + len(line), family)  # a span after the line does not see it
    later.extend(log.stat().st_size)
    assert not later.complete and later.task_ids == set()


def test_a_run_directory_in_use_is_refused_with_its_holders_pid(tmp_path, repo_root):
    matrix = write_matrix(tmp_path / "m.yaml")
    layout = records.RunLayout(tmp_path / "run")
    layout.root.mkdir()
    with run.lock_run_dir(layout, resume=False):
        for resume in (False, True):
            with pytest.raises(RunDirError, match=rf"another shadowlab \(pid {os.getpid()}\) is running"):
                run.run(options(tmp_path, matrix, repo_root, resume=resume))
    assert not layout.plan.exists()  # nothing was written by the refused runs


def test_resume_compares_the_options_that_change_results(tmp_path):
    layout = records.RunLayout(tmp_path)
    records.write_json_atomic(layout.options, {"faults": ["stale-restore"], "request_timeout_s": 2.0})
    run.check_resumed_options(layout, {"faults": ["stale-restore"], "request_timeout_s": 2.0})
    with pytest.raises(RunDirError, match=r"--fault stale-restore then, not given now; "
                                          r"--request-timeout 2 then, 3 now"):
        run.check_resumed_options(layout, {"faults": [], "request_timeout_s": 3.0})
    layout.options.unlink()
    with pytest.raises(RunDirError, match="no readable options.json"):
        run.check_resumed_options(layout, {"faults": [], "request_timeout_s": None})
