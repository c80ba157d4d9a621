"""``poolgrad <command> ...`` run in the test's own process, with what it printed and its
exit status, as a finished subprocess would give them. A new interpreter per call cost
the tests that check the commands' output and errors most of their time (imports, then
Numba's and matplotlib's start-up); tests/test_cli.py still runs the entry point itself
as a subprocess."""

import contextlib
import io
import os
import subprocess

from poolgrad import cli


def run_command(*argv: str, cwd=None) -> subprocess.CompletedProcess:
    """``cli.main(argv)`` in ``cwd`` (the current folder by default), stdout and stderr
    captured; an argparse error's ``SystemExit`` gives its status, anything else
    raised fails the test, as a traceback would."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(cwd or os.getcwd()), contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(err):
        try:
            status = cli.main(list(argv))
        except SystemExit as leaving:
            status = leaving.code
    return subprocess.CompletedProcess(list(argv), status, out.getvalue(), err.getvalue())
