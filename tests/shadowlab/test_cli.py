"""The command line: exit codes, clear errors without tracebacks, README and CI agreeing."""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from shadowlab import cli

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "matrices"


def shadowlab(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shadowlab", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_help_documents_the_exit_codes(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["run", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for text in ("0  qualified", "1  a check failed", "2  usage or matrix error", "3  infrastructure failure",
                 "130  interrupted by SIGINT", "--resume", "--dry-run", "--jobs", "--fault"):
        assert text in out


@pytest.mark.parametrize("name", sorted(cli.COMMANDS))
def test_each_command_s_help_lists_the_exit_codes_it_returns(name, capsys):
    """Generated from the command's own EXITS: `logs --help` never promises a 'check failed' (1)
    it cannot return, as the run gate's table once printed under every subcommand did."""
    import importlib

    from shadowlab.exitcodes import epilog

    module = importlib.import_module(cli.COMMANDS[name][0])
    with pytest.raises(SystemExit):
        cli.main([name, "--help"])
    out = capsys.readouterr().out
    assert epilog(module.EXITS) in out
    listed = {code for code, _ in module.EXITS}
    judged = {"run", "gate"}
    assert (1 in listed) == (name in judged), (name, listed)


def test_version_is_the_installed_package_s(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"shadowlab {version('shadowlab')}"


@pytest.mark.parametrize("fixture", sorted(FIXTURES.glob("*.yaml")), ids=lambda p: p.stem)
def test_bad_matrix_is_one_clear_error_and_exit_2(fixture, tmp_path, capsys):
    expected_line = fixture.read_text().splitlines()[0].split("|")[0].removeprefix("# expect:").strip()
    code = cli.main(["run", str(fixture), "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith(f"shadowlab: {fixture}")
    if expected_line:
        assert f"{fixture}:{expected_line}:" in err
    assert "Traceback" not in err
    assert not (tmp_path / "run").exists()  # nothing was started or written


def test_bad_matrix_from_a_real_process_has_no_traceback(repo_root, tmp_path):
    done = shadowlab("run", str(FIXTURES / "unknown_engine_key.yaml"), cwd=repo_root)
    assert done.returncode == 2
    assert "engines.ref.thread" in done.stderr and "hint:" in done.stderr
    assert "Traceback" not in done.stderr


def test_missing_matrix_file_is_a_usage_error(tmp_path, capsys):
    assert cli.main(["run", str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml" in capsys.readouterr().err


def test_dry_run_prints_the_plan_and_starts_nothing(repo_root, tmp_path):
    out = tmp_path / "run"
    done = shadowlab("run", "matrices/ckpt.yaml", "--dry-run", "--out", str(out), cwd=repo_root)
    assert done.returncode == 0, done.stderr
    assert "reference.defaults.A-C" in done.stdout and "cold" in done.stdout and "control" in done.stdout
    assert not out.exists()


def test_reused_output_directory_is_refused(repo_root, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "meta.json").write_text("{}")
    done = shadowlab("run", "matrices/ckpt.yaml", "--out", str(out), cwd=repo_root)
    assert done.returncode == 2
    assert "already exists" in done.stderr and "--resume" in done.stderr
    assert "Traceback" not in done.stderr


def test_resume_without_a_run_is_refused(tmp_path, capsys):
    code = cli.main(["run", "matrices/ckpt.yaml", "--resume", "--out", str(tmp_path / "empty")])
    assert code == 2
    assert "nothing to resume" in capsys.readouterr().err


def test_report_and_gate_on_a_non_run_directory_are_usage_errors(tmp_path):
    assert cli.main(["gate", str(tmp_path)]) == 2
    assert cli.main(["report", str(tmp_path)]) == 2


def _ci_commands(repo_root) -> dict[str, str]:
    """{variable: the README line .ci/run picks for it}: each pattern must match one line."""
    ci = (repo_root / ".ci" / "run").read_text()
    readme = (repo_root / "README.md").read_text().splitlines()
    picked = {}
    for name, pattern in re.findall(r"^(\w+)=\$\(readme_command '([^']+)'\)", ci, re.M):
        matches = [line for line in readme if re.search(pattern, line)]
        assert len(matches) == 1, f"{name}: {pattern!r} matches {len(matches)} README lines"
        picked[name] = matches[0]
    return picked


def test_ci_runs_both_readme_commands_each_in_a_fresh_venv(repo_root):
    ci = (repo_root / ".ci" / "run").read_text()
    commands = _ci_commands(repo_root)
    assert set(commands) == {"main_command", "test_command"}
    assert commands["main_command"].endswith("shadowlab run matrices/ckpt.yaml")
    assert commands["test_command"].endswith("python -m pytest -q")
    assert "torch==2.13.0" in commands["test_command"] and "LLAMA_CPP_BUILD_JOBS=2" in commands["test_command"]
    runs = re.findall(r'^in_fresh_venv (\w+) (?:\d+|"\$\w+") "\$(\w+)"$', ci, re.M)
    assert runs == [("main", "main_command"), ("test", "test_command")]  # main first, own venvs
    assert 'python3 -m venv "$venvs/$name"' in ci
    assert "set -euo pipefail" in ci and "CI=true" in ci


def test_readme_run_command_runs_the_case_study(repo_root):
    readme = (repo_root / "README.md").read_text()
    assert "pip install torch==2.13.0 && pip install -e '.[engine]' && shadowlab run matrices/ckpt.yaml" in readme


# ---------------------------------------------------------------- robustness of the CLI itself

REPO = Path(__file__).resolve().parent.parent.parent


def test_jobs_defaults_to_the_matrix(tmp_path):
    # --jobs absent: None, so the matrix's isolation.jobs wins (run.CellScheduler).
    assert cli.build_parser().parse_args(["run", "m.yaml"]).jobs is None
    assert cli.build_parser().parse_args(["run", "m.yaml", "--jobs", "3"]).jobs == 3


def test_scheduler_uses_the_matrix_jobs_unless_given():
    from types import SimpleNamespace

    from shadowlab import run

    ctx = SimpleNamespace(options=SimpleNamespace(jobs=None), isolation=SimpleNamespace(jobs=4))
    assert run.CellScheduler(ctx, None).jobs == 4
    ctx.options.jobs = 2
    assert run.CellScheduler(ctx, None).jobs == 2


def test_dry_run_into_a_closed_pipe_is_quiet(tmp_path):
    # `shadowlab run X --dry-run | head -1`: the reader is gone before shadowlab writes.
    read_end, write_end = __import__("os").pipe()
    __import__("os").close(read_end)
    proc = subprocess.run([sys.executable, "-m", "shadowlab", "run", str(REPO / "matrices" / "ckpt.yaml"),
                           "--dry-run"], stdout=write_end, stderr=subprocess.PIPE, text=True,
                          cwd=REPO, timeout=120)
    __import__("os").close(write_end)
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr
    assert proc.returncode == 0


def test_an_unexpected_exception_is_exit_3_with_a_traceback_file(tmp_path, monkeypatch, capsys):
    from shadowlab import run
    from shadowlab.judge import gate

    def boom(*_args, **_kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(run, "run", boom)
    out = tmp_path / "run"
    out.mkdir()
    assert cli.main(["run", "m.yaml", "--out", str(out)]) == 3
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error: RuntimeError: a bug" in err
    assert len(err.strip().splitlines()) == 1
    assert "RuntimeError: a bug" in (out / cli.TRACEBACK_NAME).read_text()

    monkeypatch.setattr(gate, "evaluate", boom)
    (out / cli.TRACEBACK_NAME).unlink()
    assert cli.main(["gate", str(out)]) == 3
    assert "internal error" in capsys.readouterr().out
    assert (out / cli.TRACEBACK_NAME).is_file()


@pytest.mark.parametrize("option, value, message", [
    ("--request-timeout", "-5", "expected seconds > 0, got -5"),
    ("--request-timeout", "nan", "expected seconds > 0 and ≤ 86400, got nan"),
    ("--request-timeout", "0", "expected seconds > 0, got 0"),
    ("--request-timeout", "inf", "inf is too large (at most 86400)"),
    ("--request-timeout", "two", "'two' is not seconds"),
    ("--jobs", "0", "expected an integer ≥ 1, got 0"),
    ("--jobs", "-1", "expected an integer ≥ 1, got -1"),
    ("--jobs", "100000", "100000 is too large (at most 4096)"),  # as isolation.jobs
    ("--fault", "bogus", "unknown fault 'bogus' (known: stale-restore, skip-cascade"),
    ("--fault", "hang-on-request=0", "out of range"),
])
def test_bad_option_values_are_usage_errors_at_parse_time(option, value, message, capsys):
    """Nothing is loaded or started: argparse refuses the value (exit 2) with what is allowed."""
    with pytest.raises(SystemExit) as exit_:
        cli.main(["run", "does-not-exist.yaml", f"{option}={value}"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}" in err and message in err and "Traceback" not in err


def test_good_option_values_are_kept():
    args = cli.build_parser().parse_args(
        ["run", "m.yaml", "--request-timeout", "2.5", "--jobs", "3", "--fault", "stale-restore",
         "--fault", "crash-after-requests=2"])
    assert (args.request_timeout, args.jobs, args.fault) == (2.5, 3, ["stale-restore", "crash-after-requests=2"])


def test_help_and_a_bare_command_line_import_no_command():
    """`shadowlab --help` (and `shadowlab` alone) list every command from COMMANDS: none of
    their modules is imported (all of them once cost ~0.5 s of CPU before the help showed)."""
    code = ("import contextlib, io, sys; from shadowlab import cli\n"
            "for argv in (['--help'], [], ['--version']):\n"
            "    out = io.StringIO()\n"
            "    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):\n"
            "        try: cli.main(argv)\n"
            "        except SystemExit: pass\n"
            "    print(repr(out.getvalue()))\n"
            "print(sorted(m for m in sys.modules if m.startswith('shadowlab.commands.') or m == 'httpx'))")
    *helps, imported = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                      check=True).stdout.splitlines()
    assert imported == "[]"
    text = ast.literal_eval(helps[0])
    assert all(name in text and help_text.split()[0] in text for name, (_, help_text) in cli.COMMANDS.items())


def test_a_module_backed_command_builds_only_its_own_options():
    """`shadowlab logs` on a large log is timed against grep: the other subcommands' modules
    (httpx, the matrix package, ...) stay unimported; every command still parses its options."""
    code = ("import sys; before = set(sys.modules); from shadowlab import cli; p = cli.build_parser('logs'); "
            "p.parse_args(['logs', 'x.log', '--json', '--out', 'd']); "
            "print(sorted(m for m in ('shadowlab.simulate', 'shadowlab.compare', 'httpx') if m in sys.modules))\n"
            # pathlib and shutil (its compression modules) were ~10% of the start: imported when
            # needed (an editable install's finder may have imported pathlib before: not counted)
            "print(sorted(m for m in ('pathlib', 'shutil', 'urllib.parse') if m in set(sys.modules) - before))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["[]", "[]"]
    for argv in (["simulate", "x.yaml", "--json"], ["compare", "a", "b", "--json"], ["logs", "x.log", "--json"]):
        assert cli.build_parser(argv[0]).parse_args(argv).json is True
        assert cli.build_parser().parse_args(argv).json is True


def test_the_help_is_as_wide_as_shutil_says_and_collection_is_back_on_after_the_start(monkeypatch, capsys):
    """The formatter finds the terminal's width as shutil.get_terminal_size does, without
    importing it; the garbage collector, off while the command's modules load, is on again."""
    import gc
    import shutil

    for columns in ("60", "132", "", "junk"):
        monkeypatch.setenv("COLUMNS", columns)
        assert cli._columns() == shutil.get_terminal_size().columns, columns
    monkeypatch.setenv("COLUMNS", "60")
    with pytest.raises(SystemExit):
        cli.main(["logs", "--help"])
    ours = capsys.readouterr().out
    monkeypatch.setattr(cli, "_Formatter", argparse.RawDescriptionHelpFormatter)  # argparse's, shutil's width
    with pytest.raises(SystemExit):
        cli.main(["logs", "--help"])
    assert ours == capsys.readouterr().out and "\n                        " in ours  # wrapped alike
    assert gc.isenabled()
    gc.disable()
    try:
        with pytest.raises(SystemExit):
            cli.main(["logs", "--help"])
        assert not gc.isenabled()  # the caller's choice stands
    finally:
        gc.enable()


def test_an_internal_error_of_logs_writes_its_traceback_into_out(tmp_path, monkeypatch, capsys):
    """--out is kept as the text given (pathlib is imported only to write it): a bug still
    leaves its traceback there."""
    from shadowlab.commands import logs

    def boom(*_args, **_kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(logs, "analyse", boom)
    log = tmp_path / "server.log"
    log.write_text("0.00.000.000 I srv  update_slots: all slots are idle\n")
    out = tmp_path / "out"
    out.mkdir()
    assert cli.main(["logs", str(log), "--out", str(out)]) == 3
    assert "internal error: RuntimeError: a bug" in capsys.readouterr().err
    assert "RuntimeError: a bug" in (out / cli.TRACEBACK_NAME).read_text()
