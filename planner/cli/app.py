"""The typer application and what every command shares: error handling, loaders, the console."""

from __future__ import annotations

import functools
import sys
import traceback
from typing import Any, Callable

import typer
from rich.console import Console

from planner.errors import PlannerError

app = typer.Typer(
    name="planner",
    help="Plan how to parallelize LLM training: cost model, search, launcher configs.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
state = {"debug": False}


@app.callback()
def _root(debug: bool = typer.Option(False, "--debug", help="Show Python tracebacks on errors.")) -> None:
    state["debug"] = debug


def console() -> Console:
    return Console(soft_wrap=False, width=None if sys.stdout.isatty() else 160)


def err(message: str) -> None:
    """One line on stderr."""
    typer.echo(message, err=True)


def handle_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn PlannerError into a one-line message and its exit code; never show a traceback unless --debug."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort, SystemExit):
            raise
        except PlannerError as e:
            if state["debug"]:
                traceback.print_exc()
            err(f"error: {e}")
            raise typer.Exit(e.exit_code)
        except KeyboardInterrupt:
            err("interrupted")
            raise typer.Exit(130)
        except Exception as e:  # a bug of ours: say so, briefly
            if state["debug"]:
                traceback.print_exc()
            err(f"internal error: {e.__class__.__name__}: {e} (rerun with --debug for the traceback and report it)")
            raise typer.Exit(3)

    return wrapper


def choice(value: str, allowed: tuple[str, ...] | list[str], option: str) -> str:
    if value not in allowed:
        raise PlannerError(f"unknown value {value!r}", source=option, fix=f"use one of: {', '.join(allowed)}")
    return value


def positive(value: int | float, option: str) -> None:
    if value is None or value < 1:
        raise PlannerError(f"must be >= 1, got {value}", source=option)
