"""The CLI's variable-length options (``estimate`` and ``plan``): ``--seq-len-dist``, ``--packing``,
``--dynamic-cp``, ``--max-seqlen-per-rank``, and the tables that show their effect."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

from planner.cli.render import add_columns

SEQ_LEN_DIST = typer.Option(None, "--seq-len-dist",
                            help="Sample-length distribution: a histogram file (JSON {\"lengths\": [...], \"counts\": "
                                 "[...]} or {\"buckets\": [[min, max, count], ...]}, or CSV length,count), a shipped "
                                 "data set's (planner list distributions, e.g. wikipedia-en) or "
                                 "lognormal:mean=TOKENS,sigma=S,max=TOKENS; --seq-len "
                                 "is then the context the samples are packed into (or cut at)")
PACKING = typer.Option(True, "--packing/--no-packing",
                       help="With --seq-len-dist: pack samples into --seq-len sequences with per-document attention "
                            "(THD / varlen kernels), or one sample per sequence padded to the micro-batch's longest")
DYNAMIC_CP = typer.Option(False, "--dynamic-cp",
                          help="With --seq-len-dist: also price Megatron-Core's hybrid (dynamic) context "
                               "parallelism, a CP degree per document, and report its gain over static CP")
MAX_SEQLEN_PER_RANK = typer.Option(None, "--max-seqlen-per-rank",
                                   help="With --dynamic-cp: tokens one DP x CP rank holds (Megatron "
                                        "--max-seqlen-per-dp-cp-rank; default seq-len / cp)")


def check_length_options(seq_len_dist: str | None, packing: bool, dynamic: bool, max_per_rank: int | None):
    """The distribution of ``--seq-len-dist`` (None without it); one-line errors for options that need it."""
    from planner.errors import PlannerError
    from planner.specs.lengths import load_seq_len_dist

    if seq_len_dist is None:
        for name, given in (("--dynamic-cp", dynamic), ("--no-packing", not packing),
                            ("--max-seqlen-per-rank", max_per_rank is not None)):
            if given:
                raise PlannerError(f"{name} needs a length distribution", source=name,
                                   fix="add --seq-len-dist FILE or lognormal:mean=...,sigma=...,max=...")
        return None
    if dynamic and not packing:
        raise PlannerError("dynamic CP runs packed documents (Megatron's hybrid CP needs sequence packing)",
                           source="--dynamic-cp", fix="drop --no-packing")
    if max_per_rank is not None and max_per_rank < 1:
        raise PlannerError(f"must be >= 1, got {max_per_rank}", source="--max-seqlen-per-rank")
    return load_seq_len_dist(seq_len_dist)


def print_length_tables(con: Console, data: dict) -> None:
    """The distribution-aware estimate beside the fixed-length one, and dynamic CP's classes and gain."""
    dist = data["seq_len_dist"]
    t = Table(title=f"Over the length distribution {dist['name'] or ''} (mean {dist['mean_tokens']:,.0f} tokens, "
                    f"max {dist['max_tokens']:,}), {'packed' if data['packing'] else 'unpacked'}")
    add_columns(t, ("", "step s", "tok/s", "MFU", "CP comm s", "DP wait s"), text=("",))
    fixed = data["fixed_length"]
    t.add_row("fixed length (one document per sequence)", f"{fixed['step_time_s']:.3f}",
              f"{fixed['tokens_per_s']:,.0f}", f"{100 * fixed['mfu']:.1f}%",
              f"{fixed['breakdown'].get('cp_comm_s', 0.0):.3f}", "-")
    t.add_row("this distribution", f"{data['step_time_s']:.3f}", f"{data['tokens_per_s']:,.0f}",
              f"{100 * data['mfu']:.1f}%", f"{data['breakdown'].get('cp_comm_s', 0.0):.3f}",
              f"{data['imbalance_s']:.3f}")
    dyn = data.get("dynamic_cp")
    if dyn is not None:
        t.add_row(f"dynamic CP ({dyn['layout']})", f"{dyn['step_time_s']:.3f}", f"{dyn['tokens_per_s']:,.0f}",
                  f"{100 * dyn['mfu']:.1f}%", "-", "-")
    con.print(t)
    if data["packing"]:
        con.print(f"packed: a query attends {data['packed_doc_len']:,.0f} keys on average (token-weighted mean "
                  f"document length)")
    else:
        con.print(f"unpacked: {100 * data['useful_token_share']:.1f}% of the tokens computed are data, the rest "
                  f"padding")
    if dyn is None:
        return
    c = Table(title=f"Dynamic CP: documents by CP degree at {dyn['max_seqlen_per_dp_cp_rank']:,} tokens per rank")
    add_columns(c, ("CP", "documents", "tokens", "mean length", "ms per document", "GPU time"))
    for k in dyn["classes"]:
        c.add_row(str(k["cp"]), f"{100 * k['sample_share']:.1f}%", f"{100 * k['token_share']:.1f}%",
                  f"{k['mean_len']:,.0f}", f"{1e3 * k['time_per_sample_s']:.1f}", f"{100 * k['gpu_time_share']:.1f}%")
    con.print(c)
    con.print(f"dynamic CP is {dyn['gain_over_best_static']:.2f}x the static plan's throughput "
              f"({dyn['groups_per_step']:.0f} scheduling groups per step, {1e3 * dyn['barrier_s']:.1f} ms of barriers); "
              f"runs as: {dyn['launcher']}")
