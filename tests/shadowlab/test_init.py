"""`shadowlab init`: a starter matrix for my build, my GGUF, current vs candidate flags, written
only when it loads (the real-engine walk through init → run → report → gate is
tests/llama/test_new_user_path.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from shadowlab import plan as plan_module
from shadowlab.matrix import load, loads

REPO = Path(__file__).resolve().parents[2]


def init(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shadowlab", "init", *argv], capture_output=True, text=True,
                          cwd=cwd, timeout=120)


def _model(tmp_path: Path) -> Path:
    model = tmp_path / "models" / "mine.gguf"
    model.parent.mkdir(exist_ok=True)
    model.write_bytes(b"GGUF")
    return model


def test_it_writes_the_probes_and_a_traffic_for_current_against_candidate(tmp_path):
    model = _model(tmp_path)
    done = init("my-change.yaml", "--model", "models/mine.gguf", "--binary", sys.executable, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "shadowlab run my-change.yaml --dry-run" in done.stderr
    matrix = load(tmp_path / "my-change.yaml")
    assert matrix.name == "my-change" and matrix.baseline == "current"
    engine = matrix.engines["mine"]
    assert engine.kind == "llama-server" and engine.binary == sys.executable
    assert engine.model.path == model  # written absolute: the matrix works from anywhere
    assert [matrix.configurations[c].flags for c in ("current", "candidate")] == [("-cram", "0"), ("-cram", "8192")]
    assert {n: matrix.sequences[n].kind for n in matrix.sequences} == {
        "A-C": "ordered", "A-B-C": "ordered", "A-B-A": "ordered", "append": "ordered", "traffic": "traffic"}
    assert matrix.prompts["C"].shared == 2531 and matrix.prompts["A"].length == 4560  # the case study's
    warm = [c.id for c in plan_module.build_plan(matrix).of_kind(plan_module.CellKind.WARM)]
    assert warm == [f"mine.{c}.{s}" for c in ("current", "candidate") for s in ("A-C", "A-B-C", "A-B-A", "append", "traffic")]
    assert matrix.identity.required and matrix.identity.control


def test_flags_environment_and_size_are_the_users(tmp_path):
    _model(tmp_path)
    done = init("-", "--model", "models/mine.gguf", "--flags", "-c 8192 -np 1", "--current", "-cram 0",
                "--candidate", "-cram 0 --ctx-checkpoints 8", "--candidate-env", "MY_KNOB=1 2",
                "--tokens", "1200", "--threads", "1", "--name", "knob", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    matrix = loads(done.stdout, file="<stdout>", base_dir=tmp_path)
    assert matrix.name == "knob" and matrix.engines["mine"].flags == ("-c", "8192", "-np", "1")
    assert matrix.configurations["candidate"].flags == ("-cram", "0", "--ctx-checkpoints", "8")
    assert dict(matrix.configurations["candidate"].env) == {"MY_KNOB": "1 2"}
    assert matrix.prompts["A"].length == 1200 and matrix.prompts["C"].shared == 666
    assert matrix.isolation.cores_per_cell == 1 and matrix.engines["mine"].binary == "auto"
    assert not (tmp_path / "-").exists()


def test_it_never_overwrites_and_never_writes_what_would_not_load(tmp_path):
    _model(tmp_path)
    target = tmp_path / "my-change.yaml"
    target.write_text("mine\n")
    exists = init("--model", "models/mine.gguf", cwd=tmp_path)
    assert exists.returncode == 2 and "my-change.yaml exists" in exists.stderr and "--force" in exists.stderr
    assert target.read_text() == "mine\n"
    missing = init("other.yaml", "--model", "models/nope.gguf", cwd=tmp_path)
    assert missing.returncode == 2, missing.stderr
    assert "engines.mine.model.path: model file" in missing.stderr and "does not exist" in missing.stderr
    assert not (tmp_path / "other.yaml").exists()
    forced = init("--force", "--model", "models/mine.gguf", cwd=tmp_path)
    assert forced.returncode == 0 and load(target).name == "my-change"


def test_a_llama_server_matrix_needs_a_model_and_says_how(tmp_path):
    done = subprocess.run([sys.executable, "-m", "shadowlab", "init"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120, env={k: v for k, v in __import__("os").environ.items()
                                                          if k != "SHADOWLAB_MODEL"})
    assert done.returncode == 2
    assert "no model" in done.stderr and "--model /path/to/model.gguf" in done.stderr
    assert "--engine reference" in done.stderr and not (tmp_path / "my-change.yaml").exists()


def test_the_reference_engine_needs_no_build(tmp_path):
    done = init("-", "--engine", "reference", "--tokens", "300", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    matrix = loads(done.stdout, file="<stdout>")
    assert matrix.engines["mine"].kind == "reference" and matrix.engines["mine"].model.preset == "tiny"


def test_its_help_has_its_own_exit_codes(tmp_path):
    done = subprocess.run([sys.executable, "-m", "shadowlab", "init", "--help"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    assert done.returncode == 0
    assert "the matrix was written" in done.stdout and "a check failed" not in done.stdout


def test_its_matrix_pipes_into_run(tmp_path):
    """`shadowlab init - ... | shadowlab run - --dry-run`: `-` is standard output, then input."""
    _model(tmp_path)
    printed = init("-", "--model", "models/mine.gguf", "--tokens", "300", cwd=tmp_path)
    assert printed.returncode == 0, printed.stderr
    planned = subprocess.run([sys.executable, "-m", "shadowlab", "run", "-", "--dry-run", "-k", "A-C"],
                             input=printed.stdout, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert planned.returncode == 0, planned.stderr
    assert "mine.candidate.A-C" in planned.stdout and "mine.current.cold.C" in planned.stdout
    broken = subprocess.run([sys.executable, "-m", "shadowlab", "run", "-", "--dry-run"],
                            input=printed.stdout.replace("kind: diverge", "kind: divrge"),
                            capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert broken.returncode == 2 and "<stdin>:" in broken.stderr and "prompts.C.kind" in broken.stderr
