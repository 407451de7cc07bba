"""Published measured runs as data, and the comparison of the cost model against them."""

from planner.validation.compare import ValidationRow, load_runs, validate

__all__ = ["ValidationRow", "load_runs", "validate"]
