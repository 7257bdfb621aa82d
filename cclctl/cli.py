"""The ``cclctl`` command: one typer app, one module per command under ``commands/``.

This is the one place where cclctl's typed errors become a message and an exit code
(0 fine, 1 error, 2 bad usage or input, 3 fault found, 4 check failed).
"""

from __future__ import annotations

import sys

import typer

from cclctl import __version__
from cclctl.commands import bench, diagnose, launch, top
from cclctl.commands import run as run_command
from cclctl.errors import EXIT_ERROR, CclError

app = typer.Typer(
    name="cclctl",
    help=(
        "Observability and fault diagnosis for collective communication.\n\n"
        "Measure bandwidth (bench), launch local ranks (launch), watch a live job (top) and "
        "find the rank that hangs a job (diagnose hang)."
    ),
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

for _module in (bench, launch, top, diagnose):
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
    """Run the CLI; typed errors become one line on stderr and their exit code."""
    try:
        app(args=argv, prog_name="cclctl", standalone_mode=True)
    except CclError as exc:
        print(f"cclctl: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        print("cclctl: interrupted", file=sys.stderr)
        sys.exit(130)
    except OSError as exc:  # unexpected I/O failure: one line, never a traceback
        print(f"cclctl: error: {exc}", file=sys.stderr)
        sys.exit(EXIT_ERROR)
