"""planner: an auto-parallelism planner for LLM training."""

__version__ = "0.1.0"
