"""planner: an auto-parallelism planner for LLM training."""

__version__ = "0.1.0"

# ``planner.sweep(...)``: the function replaces the submodule's name on the package (the module stays importable as
# ``importlib.import_module("planner.sweep")``); planner.sweep imports pandas and the search only when called.
from planner.sweep import sweep  # noqa: E402

__all__ = ["__version__", "sweep"]
