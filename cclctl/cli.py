"""The ``cclctl`` command: one typer app, one module per command under ``commands/``.

This is the one place where cclctl's typed errors become a message and an exit code
(0 fine, 1 error, 2 bad usage or input, 3 fault found, 4 check failed).
"""

from __future__ import annotations

import sys

import typer

from cclctl import __version__, ui
from cclctl.commands import abort, bench, diagnose, launch, probe, retry, top
from cclctl.commands import run as run_command
from cclctl.errors import EXIT_ERROR, CclError

app = typer.Typer(
    name="cclctl",
    help=(
        "Observability and fault diagnosis for collective communication.\n\n"
        "Measure bandwidth (bench), launch local ranks (launch) or a PyTorch job (run), "
        "check every link of a job or a set of hosts (probe), watch a live job (top), find "
        "the rank that hangs a job (diagnose hang) or the rank or link that slows it "
        "(diagnose slow), abort a live job (abort), re-run a stuck job's interrupted call "
        "(retry)."
    ),
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

for _module in (bench, launch, top, diagnose, abort, retry, probe):
    _module.register(app)
run_command.register(app)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"cclctl {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """cclctl: see `cclctl COMMAND --help` for each command."""


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; typed errors become one line on stderr and their exit code.

    A reader that closed stdout early (``cclctl ... | head -1``) ends the output quietly:
    the exit code stays the command's own (commands write through consoles that go quiet),
    or 1 where a write failed mid-command, and stdout is flushed here, then pointed at
    /dev/null, so Python's flush at exit finds nothing to complain about.
    """
    code: int | str | None = 0
    try:
        _run(argv)
    except SystemExit as exc:
        code = exc.code
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        ui.close_stdout()
    except (OSError, ValueError):
        pass  # stdout already closed or unusable: nothing left to write
    sys.exit(code)


def _run(argv: list[str] | None) -> None:
    try:
        app(args=argv, prog_name="cclctl", standalone_mode=True)
    except CclError as exc:
        print(f"cclctl: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except BrokenPipeError:  # a write outside a quiet console: the reader has gone
        ui.close_stdout()
        sys.exit(EXIT_ERROR)
    except KeyboardInterrupt:
        print("cclctl: interrupted", file=sys.stderr)
        sys.exit(130)
    except OSError as exc:  # unexpected I/O failure: one line, never a traceback
        print(f"cclctl: error: {exc}", file=sys.stderr)
        sys.exit(EXIT_ERROR)
