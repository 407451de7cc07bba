"""Elastic re-planning (issue 12 of the guide): how long `planner replan` takes for Llama-3.1-70B on 512 H100
losing 8, 64 and 256 GPUs (the issue's "< 2 s each"), and what it answers.

    python benchmarks/bench_replan.py

Each row times ``planner.replan.replan`` in this process (wall and CPU seconds): the searches on every node count
it tries (all the GPUs left, and up to an eighth of the nodes idle), the old layout's degrees, and the state moved
to each candidate with its node placement. The old plan is the planner's own best for 512 GPUs (batch 512 x 8192).
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.table import Table

from planner.cli.render import layout_label, recipe_label
from planner.plan import search_plans
from planner.replan import replan
from planner.specs.hardware import GB, load_cluster
from planner.specs.model import load_model

con = Console(width=160)


def main() -> None:
    model, cluster = load_model("llama-3.1-70b"), load_cluster("h100-80gb-sxm")
    old = search_plans(model, cluster, 512, 512, 8192, top_k=0)
    con.print(f"old plan on 512 GPUs: {layout_label(old.config)}, {recipe_label(old.config)}: "
              f"{old.estimate.tokens_per_s:,.0f} tokens/s")
    t = Table(title="replan: Llama-3.1-70B, 512 H100, batch 512 x 8192, horizon 24 h, restart 300 s, "
                    "checkpoint read 50 GB/s")
    for col in ("GPUs lost", "time s", "cpu s", "options", "chosen", "GPUs", "layout", "tokens/s", "transition s",
                "moved GB", "from checkpoint GB"):
        t.add_column(col, justify="left" if col in ("chosen", "layout") else "right")
    for lost in (8, 64, 256):
        w0, c0 = time.perf_counter(), time.process_time()
        r = replan(model, cluster, old.config, lose_nodes=lost // cluster.gpus_per_node, horizon_s=24 * 3600,
                   restart_s=300, checkpoint_bytes_per_s=50 * GB)
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        b = r.best
        t.add_row(str(lost), f"{wall:.2f}", f"{cpu:.2f}", str(len(r.options)), b.label, str(b.plan.config.num_gpus),
                  layout_label(b.plan.config), f"{b.tokens_per_s:,.0f}", f"{b.transition.seconds:.1f}",
                  f"{b.transition.reshard.total_bytes / GB:,.0f}", f"{b.transition.reshard.lost_bytes / GB:,.0f}")
    con.print(t)


if __name__ == "__main__":
    main()
