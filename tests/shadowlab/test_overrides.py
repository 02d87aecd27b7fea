"""`shadowlab run --binary/--model` and their variables choose the build and the GGUF over what
the matrix says (shadowlab/matrix/overrides.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from shadowlab.errors import MatrixError
from shadowlab.matrix import loads
from shadowlab.matrix.overrides import Overrides

REPO = Path(__file__).resolve().parents[2]


def _matrix(tmp_path: Path, binary: str = "auto", second: bool = False):
    model = tmp_path / "matrix-model.gguf"
    model.write_bytes(b"GGUF")
    other = (f"  theirs:\n    kind: llama-server\n    binary: {binary}\n    model: {{path: {model}}}\n"
             if second else "")
    text = f"""\
version: 1
name: o
engines:
  mine:
    kind: llama-server
    binary: {binary}
    model: {{path: {model}}}
{other}  ref: {{kind: reference, model: {{preset: tiny, seed: 0}}}}
prompts:
  A: {{kind: random, tokens: 100, seed: 1}}
  C: {{kind: diverge, from: A, shared: 50, tokens: 120, seed: 2}}
sequences: {{A-C: [A, C]}}
"""
    return loads(text, file=str(tmp_path / "o.yaml"), base_dir=tmp_path)


@pytest.fixture
def files(tmp_path):
    build = tmp_path / "build" / "llama-server"
    build.parent.mkdir()
    build.write_bytes(b"#!/bin/sh\n")
    model = tmp_path / "mine.gguf"
    model.write_bytes(b"GGUF")
    return build, model


def test_the_command_line_sets_every_llama_server_engine_and_says_where_from(tmp_path, files):
    build, model = files
    overrides = Overrides.gather(str(build), str(model), environ={})
    loaded = _matrix(tmp_path)
    matrix = overrides.apply(loaded)
    assert matrix.engines["mine"].binary == str(build) and matrix.engines["mine"].model.path == model
    assert matrix.engines["ref"].binary == "auto" and matrix.engines["ref"].model.source == "preset"
    assert overrides.applied_to(loaded) == [
        {"key": "engines.mine.binary", "value": str(build), "from": "--binary"},
        {"key": "engines.mine.model", "value": str(model), "from": "--model"}]


def test_the_command_line_wins_over_the_variables(tmp_path, files):
    build, model = files
    environ = {"SHADOWLAB_BINARY": "/nonexistent/llama-server", "SHADOWLAB_MODEL": str(model),
               "LLAMA_SERVER_BIN_PATH": "/nonexistent/other"}
    overrides = Overrides.gather(str(build), None, environ=environ)
    assert [(o.key, o.source) for o in overrides.items] == [("binary", "--binary"), ("model", "$SHADOWLAB_MODEL")]
    matrix = overrides.apply(_matrix(tmp_path))
    assert matrix.engines["mine"].binary == str(build) and matrix.engines["mine"].model.path == model


def test_llama_servers_own_variable_only_fills_binary_auto(tmp_path, files):
    build, _ = files
    overrides = Overrides.gather(environ={"LLAMA_SERVER_BIN_PATH": str(build)})
    assert overrides.apply(_matrix(tmp_path)).engines["mine"].binary == str(build)
    assert overrides.applied_to(_matrix(tmp_path)) == [
        {"key": "engines.mine.binary", "value": str(build), "from": "$LLAMA_SERVER_BIN_PATH"}]
    explicit = _matrix(tmp_path, binary=sys.executable)
    assert overrides.apply(explicit).engines["mine"].binary == sys.executable  # the matrix's own wins
    assert overrides.applied_to(explicit) == []


def test_one_engine_by_name(tmp_path, files):
    build, _ = files
    matrix = Overrides.gather(f"theirs={build}", environ={}).apply(_matrix(tmp_path, second=True))
    assert matrix.engines["theirs"].binary == str(build) and matrix.engines["mine"].binary == "auto"
    with pytest.raises(MatrixError) as info:
        Overrides.gather(f"nobody={build}", environ={}).apply(_matrix(tmp_path))
    assert "no engine 'nobody' in the matrix" in str(info.value) and "engines: mine, ref" in info.value.hint


@pytest.mark.parametrize("flag", ["binary", "model"])
def test_a_path_that_is_no_file_names_its_source(tmp_path, flag):
    given = {flag: str(tmp_path / "missing")}
    with pytest.raises(MatrixError) as info:
        Overrides.gather(**given, environ={}).apply(_matrix(tmp_path))
    text = str(info.value)
    assert f"engines.mine.{flag}: --{flag} " in text and "no such" in text
    with pytest.raises(MatrixError, match="is not a regular file"):
        Overrides.gather(**{flag: str(tmp_path)}, environ={}).apply(_matrix(tmp_path))


def test_a_matrix_without_a_llama_server_engine_refuses_binary(tmp_path, files):
    build, _ = files
    only_ref = loads("version: 1\nname: r\nengines:\n  ref: {kind: reference, model: {preset: tiny}}\n"
                     "prompts:\n  A: {kind: random, tokens: 10, seed: 1}\nsequences: {one: [A]}\n", file="r.yaml")
    with pytest.raises(MatrixError, match="the matrix has no engine to apply it to"):
        Overrides.gather(str(build), environ={}).apply(only_ref)
    assert Overrides.gather(environ={"LLAMA_SERVER_BIN_PATH": str(build)}).apply(only_ref) == only_ref


def test_run_dry_run_takes_them_from_the_command_line_and_the_environment(tmp_path, files):
    build, model = files
    path = tmp_path / "m.yaml"
    path.write_text(f"""\
version: 1
name: m
engines:
  mine: {{kind: llama-server, binary: /nonexistent/llama-server-in-yaml, model: {{path: /nonexistent/x.gguf}}}}
prompts:
  A: {{kind: random, tokens: 100, seed: 1}}
sequences: {{one: [A]}}
""")
    base = [sys.executable, "-m", "shadowlab", "run", str(path), "--dry-run"]
    refused = subprocess.run(base, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert refused.returncode == 2 and "does not exist" in refused.stderr
    # The YAML's own paths are checked at load: an override replaces an engine the matrix can load.
    path.write_text(path.read_text().replace("/nonexistent/llama-server-in-yaml", "auto")
                    .replace("/nonexistent/x.gguf", str(model)))
    by_flag = subprocess.run([*base, "--binary", str(build), "--model", str(model)], capture_output=True,
                             text=True, cwd=tmp_path, timeout=120)
    assert by_flag.returncode == 0, by_flag.stderr
    env = {**__import__("os").environ, "SHADOWLAB_BINARY": str(tmp_path / "missing")}
    by_env = subprocess.run(base, capture_output=True, text=True, cwd=tmp_path, timeout=120, env=env)
    assert by_env.returncode == 2 and "$SHADOWLAB_BINARY" in by_env.stderr, by_env.stderr


def test_every_variable_is_documented():
    from shadowlab.matrix.overrides import env_names

    running = (REPO / "docs" / "running.md").read_text()
    assert all(f"`${name}`" in running for name in env_names()), env_names()
