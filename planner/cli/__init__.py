"""Command-line interface: ``planner <command>``. Each command lives in its own module and registers on ``app``."""

from __future__ import annotations

import importlib

from planner.cli.app import app

# every module here that defines commands; each registers itself on ``app`` when imported
COMMAND_MODULES = ("estimate", "validate", "plan", "export", "explain", "sweep", "replan", "listing")

for _name in COMMAND_MODULES:
    try:
        importlib.import_module(f"planner.cli.{_name}")
    except ModuleNotFoundError as _e:  # a command module not written yet
        if _e.name != f"planner.cli.{_name}":
            raise


def main() -> None:
    app(prog_name="planner")


__all__ = ["app", "main"]
