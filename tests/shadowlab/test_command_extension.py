"""Extension cost (issue 22, "Must show"): a new subcommand is its own module plus one row of
`cli.COMMANDS` — its help, its exit-code table and its errors' exit codes come from the one
table and the one error boundary, with nothing else in shadowlab changed.

The command below is written to a module of its own in a temporary directory (as a
`shadowlab/commands/<name>.py` would be), and added with one table row.
"""

from __future__ import annotations

import sys
import textwrap

import pytest

from shadowlab import cli
from shadowlab.exitcodes import epilog

MODULE = textwrap.dedent('''
    """shadowlab hello: a command a test adds with one row of cli.COMMANDS."""
    from shadowlab.errors import ShadowlabError
    from shadowlab.exitcodes import EXIT_QUALIFIED, EXIT_USAGE

    EXITS = ((EXIT_QUALIFIED, "greeted"), (EXIT_USAGE, "nobody to greet"))


    def add_arguments(parser):
        parser.add_argument("name", nargs="?", default="")
        parser.add_argument("--crash", action="store_true")


    def main(args):
        if args.crash:
            raise RuntimeError("a bug in the new command")
        if not args.name:
            raise ShadowlabError("nobody to greet", hint="name someone")
        print(f"hello {args.name}")
        return EXIT_QUALIFIED
''')


@pytest.fixture
def hello(tmp_path, monkeypatch):
    (tmp_path / "hello_command.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(cli.COMMANDS, "hello", ("hello_command", "say hello (a test's new command)"))
    monkeypatch.chdir(tmp_path)  # an internal error writes its traceback under the working directory
    yield
    sys.modules.pop("hello_command", None)


def test_a_new_command_is_one_table_row(hello, capsys):
    assert cli.main(["hello", "world"]) == 0
    assert capsys.readouterr().out == "hello world\n"
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--help"])
    assert exit_.value.code == 0
    assert "say hello (a test's new command)" in capsys.readouterr().out  # listed with the others
    with pytest.raises(SystemExit):
        cli.main(["hello", "--help"])
    out = capsys.readouterr().out
    assert epilog(((0, "greeted"), (2, "nobody to greet"))) in out and "--crash" in out


def test_a_new_command_s_errors_go_through_the_one_boundary(hello, capsys):
    assert cli.main(["hello"]) == 2  # a ShadowlabError: usage, with its hint, no traceback
    err = capsys.readouterr().err
    assert err == "shadowlab: nobody to greet\n  hint: name someone\n"
    assert cli.main(["hello", "x", "--crash"]) == 3  # a bug: never exit 1 ("a check failed")
    err = capsys.readouterr().err
    assert "internal error: RuntimeError: a bug in the new command" in err and "Traceback" not in err


def test_other_commands_stay_unimported(hello, monkeypatch):
    """The table builds only the named command's options: a new row costs the others nothing."""
    for name, (module, _) in cli.COMMANDS.items():
        if name != "hello":
            monkeypatch.delitem(sys.modules, module, raising=False)
    assert cli.main(["hello", "world"]) == 0
    assert not [m for n, (m, _) in cli.COMMANDS.items() if n != "hello" and m in sys.modules]
