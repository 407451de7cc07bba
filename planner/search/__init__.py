"""The search behind ``planner plan`` (method and the part each module plays: :mod:`planner.search.engine`).

``planner.search.engine.search`` returns a :class:`~planner.search.engine.SearchResult`;
``planner.search.search_plans`` is the plan layer's wrapper (``planner.plan.search_plans``) that returns a
:class:`planner.plan.Plan`, looked up lazily so that this package never imports the layer above it at import time.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "search_plans":
        from planner.plan import search_plans

        return search_plans
    if name in ("search", "SearchResult", "SearchSpace"):
        from planner.search import engine

        return getattr(engine, name)
    raise AttributeError(f"module 'planner.search' has no attribute '{name}'")
