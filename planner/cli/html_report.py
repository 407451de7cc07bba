"""``planner explain PLAN.json --html FILE``: one self-contained page (inline CSS and SVG, no network) with the
plan's pipeline timeline, the step-time breakdown and the memory of every pipeline rank.

The timeline is the simulator's (``planner.cost.simulate``) playing the plan's schedule with each rank's forward,
input-gradient and weight-gradient time per micro-batch from the estimate; pipeline sends become the simulator's
transfer delay (each send's time taken out of the F and B it was folded into) and are drawn as lines from the
producing op to the consumer; the idle time of every rank (fill, drain, waiting) is its row's background. A small
script, run on load, measures what the browser drew and writes it into ``#render-check`` (JSON), so a headless
browser can check the page (``tests/test_explain_html.py``).
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

from planner.cli.render import TIME_LABELS, config_line
from planner.cost.schedule import get_schedule
from planner.cost.simulate import SimResult, microbatch_paths, simulate
from planner.specs.config import RunConfig

#: colours (CSS) of the op kinds, the step-time components and the memory parts
OP_COLORS = {"F": "#4c78a8", "B": "#f58518", "W": "#b279a2"}
OP_NAMES = {"F": "forward", "B": "backward (input gradient and recomputation; with the weight gradient where the "
                                 "schedule does not split it off)", "W": "backward (weight gradient, split off)"}
TIME_COLORS = {"compute_s": "#54a24b", "recompute_s": "#eeca3b", "bubble_s": "#e45756", "tp_comm_s": "#72b7b2",
               "cp_comm_s": "#4c78a8", "ep_comm_s": "#b279a2", "pp_comm_s": "#9ecae9", "offload_s": "#ff9da6",
               "dp_comm_s": "#9d755d", "dp_imbalance_s": "#d8b5a5", "optimizer_s": "#bab0ac"}
MEMORY_PARTS = ("weights", "gradients", "optimizer", "activations", "workspace")
MEMORY_COLORS = {"weights": "#54a24b", "gradients": "#72b7b2", "optimizer": "#4c78a8", "activations": "#eeca3b",
                 "workspace": "#b279a2"}
IDLE_COLOR = "#fbe3e3"
#: drawing area of the timeline (px): label column, plot width, row height
LABEL_W, PLOT_W, ROW_H = 70, 1000, 22


@dataclass(frozen=True)
class Timeline:
    """The simulated step of one pipeline: per rank its ops, the sends between ranks, and the transfer time."""

    sim: SimResult
    sends: tuple[tuple[int, float, int, float], ...]  # (from rank, start s, to rank, arrival s)
    p2p_s: float


def simulate_plan(est: dict[str, Any], cfg: RunConfig) -> Timeline:
    """Play the plan's schedule with the estimate's per-rank times (ms-accurate, from ``estimate.stages``)."""
    sched = get_schedule(cfg.schedule)
    p, m = cfg.pp, cfg.num_microbatches
    chunks = sched.chunks_per_rank(p, cfg.vpp)
    stages = est["stages"]
    # one send per chunk each way per micro-batch is folded into F and B (step.estimate); here it is the
    # simulator's transfer delay between ranks instead
    p2p = max((s["pp_comm_s"] for s in stages), default=0.0) / (2 * chunks) if p > 1 else 0.0
    f = [max(0.0, s["fwd_s"] - chunks * p2p) for s in stages]
    b = [max(0.0, s["bwd_s"] - s["bwd_weight_s"] + s["recompute_s"] - chunks * p2p) for s in stages]
    w = [s["bwd_weight_s"] for s in stages]
    order = [sched.order(p, m, cfg.vpp, r) for r in range(p)]
    cap = [sched.w_cap(p, m, cfg.vpp, r) for r in range(p)] if sched.w_cap is not None else None
    sim = simulate(p, m, chunks, f, b, w, order, sched.stage_index, defer_w=sched.defer_w, cap=cap, p2p_s=p2p,
                   route=sched.route)
    sends = []
    if p > 1 and p2p > 0:
        where = {}  # (kind, micro-batch, rank, chunk) -> end time
        for r, records in enumerate(sim.timeline):
            for op in records:
                where[(op.kind, op.microbatch, r, op.chunk)] = op.end_s
        for mb, path in enumerate(microbatch_paths(p, m, chunks, sched.stage_index, sched.route)):
            for j in range(1, len(path)):  # forward: stage j - 1 -> j; backward: j -> j - 1
                (r0, c0), (r1, c1) = path[j - 1], path[j]
                if r0 == r1:
                    continue
                if ("F", mb, r0, c0) in where:
                    t = where[("F", mb, r0, c0)]
                    sends.append((r0, t, r1, t + p2p))
                if ("B", mb, r1, c1) in where:
                    t = where[("B", mb, r1, c1)]
                    sends.append((r1, t, r0, t + p2p))
    return Timeline(sim=sim, sends=tuple(sends), p2p_s=p2p)


def _esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _timeline_svg(tl: Timeline, cfg: RunConfig) -> str:
    sim = tl.sim
    p = len(sim.timeline)
    total = max(sim.total_s, 1e-12)
    scale = PLOT_W / total
    height = p * ROW_H + 30
    out = [f'<svg id="timeline" xmlns="http://www.w3.org/2000/svg" width="{LABEL_W + PLOT_W + 10}" '
           f'height="{height}" role="img" aria-label="pipeline timeline">']
    for r, records in enumerate(sim.timeline):
        y = r * ROW_H
        idle = total - sim.busy_s[r]
        out.append(f'<text class="rank" x="{LABEL_W - 6}" y="{y + ROW_H * 0.7:.1f}" text-anchor="end">rank {r}</text>')
        out.append(f'<rect class="idle" data-rank="{r}" x="{LABEL_W}" y="{y + 2}" width="{PLOT_W}" '
                   f'height="{ROW_H - 4}" fill="{IDLE_COLOR}"><title>rank {r}: idle {1e3 * idle:.1f} ms of '
                   f'{1e3 * total:.1f} ms (fill, drain, waiting)</title></rect>')
        for op in records:
            x, wdt = LABEL_W + op.start_s * scale, max((op.end_s - op.start_s) * scale, 0.0)
            out.append(f'<rect class="op op-{op.kind}" data-rank="{r}" x="{x:.3f}" y="{y + 3}" width="{wdt:.3f}" '
                       f'height="{ROW_H - 6}" fill="{OP_COLORS[op.kind]}"><title>{OP_NAMES[op.kind]}: micro-batch '
                       f'{op.microbatch}, chunk {op.chunk}, {1e3 * op.start_s:.2f}-{1e3 * op.end_s:.2f} ms'
                       f'</title></rect>')
    for r0, t0, r1, t1 in tl.sends:
        y0, y1 = r0 * ROW_H + ROW_H / 2, r1 * ROW_H + ROW_H / 2
        out.append(f'<line class="send" x1="{LABEL_W + t0 * scale:.3f}" y1="{y0:.1f}" x2="{LABEL_W + t1 * scale:.3f}" '
                   f'y2="{y1:.1f}" stroke="#555" stroke-width="0.6"><title>send rank {r0} -> {r1}: '
                   f'{1e3 * (t1 - t0):.3f} ms</title></line>')
    ticks = 5
    for i in range(ticks + 1):
        x = LABEL_W + PLOT_W * i / ticks
        out.append(f'<line x1="{x:.1f}" y1="{p * ROW_H}" x2="{x:.1f}" y2="{p * ROW_H + 5}" stroke="#333"/>'
                   f'<text class="tick" x="{x:.1f}" y="{p * ROW_H + 18}" text-anchor="middle">'
                   f'{total * i / ticks:.3g} s</text>')
    out.append("</svg>")
    return "".join(out)


def _bars_svg(svg_id: str, rows: list[tuple[str, list[tuple[str, float, str, str]], str]], full: float,
              limit: float | None = None, unit: str = "") -> str:
    """Horizontal stacked bars: rows of (label, [(css class, value, colour, tooltip)], right-hand text), to scale of
    ``full``; ``limit`` draws a dashed line at that value."""
    width, row_h = 700, 22
    scale = width / max(full, 1e-12)
    h = len(rows) * row_h + 8
    out = [f'<svg id="{svg_id}" xmlns="http://www.w3.org/2000/svg" width="{LABEL_W + width + 140}" height="{h}">']
    for i, (label, parts, right) in enumerate(rows):
        y = i * row_h
        out.append(f'<text x="{LABEL_W - 6}" y="{y + row_h * 0.7:.1f}" text-anchor="end">{_esc(label)}</text>')
        x = LABEL_W
        for cls, value, color, tip in parts:
            wdt = max(0.0, value) * scale
            out.append(f'<rect class="{cls}" x="{x:.3f}" y="{y + 3}" width="{wdt:.3f}" height="{row_h - 6}" '
                       f'fill="{color}"><title>{_esc(tip)}</title></rect>')
            x += wdt
        out.append(f'<text x="{LABEL_W + width + 8}" y="{y + row_h * 0.7:.1f}">{_esc(right)}</text>')
    if limit is not None:
        lx = LABEL_W + limit * scale
        out.append(f'<line class="limit" x1="{lx:.1f}" y1="0" x2="{lx:.1f}" y2="{h}" stroke="#d00" '
                   f'stroke-dasharray="4 3"><title>{limit:.1f} {unit} usable</title></line>')
    out.append("</svg>")
    return "".join(out)


def _legend(items: list[tuple[str, str]]) -> str:
    return "<div class='legend'>" + "".join(
        f"<span><i style='background:{color}'></i>{_esc(name)}</span>" for name, color in items) + "</div>"


#: measures what the browser drew (the page's own check; a headless browser reads #render-check)
_CHECK_SCRIPT = """
window.addEventListener('load', function () {
  function inside(el, box) {
    var b = el.getBoundingClientRect();
    return b.left >= box.left - 0.5 && b.right <= box.right + 0.5 && b.top >= box.top - 0.5 &&
           b.bottom <= box.bottom + 0.5;
  }
  function count(svgId, selector) {
    var svg = document.getElementById(svgId), box = svg.getBoundingClientRect();
    var els = svg.querySelectorAll(selector), drawn = 0, out = 0;
    for (var i = 0; i < els.length; i++) {
      var b = els[i].getBoundingClientRect();
      if (b.height > 0 && (b.width > 0 || els[i].tagName === 'line')) drawn++;
      if (!inside(els[i], box)) out++;
    }
    return {elements: els.length, drawn: drawn, outside: out, width: Math.round(box.width)};
  }
  var check = {timeline_ops: count('timeline', 'rect.op'), timeline_rows: count('timeline', 'rect.idle'),
               sends: count('timeline', 'line.send'), breakdown: count('breakdown', 'rect'),
               memory: count('memory', 'rect'), title: document.title};
  document.getElementById('render-check').textContent = JSON.stringify(check);
});
"""


def render_html(d: dict[str, Any], est: dict[str, Any], origin: str, cfg: RunConfig) -> str:
    """The page for plan ``d`` and its estimate ``est`` (a dict, ``Estimate.to_dict(with_stages=True)``)."""
    tl = simulate_plan(est, cfg)
    sim = tl.sim
    step = est["step_time_s"]
    title = f"{d.get('model', 'model')} on {cfg.num_gpus} GPUs ({d.get('cluster', '?')})"
    # step-time breakdown: one bar
    parts = [(f"part part-{k}", float(est["breakdown"].get(k, 0.0)), TIME_COLORS[k],
              f"{label}: {est['breakdown'].get(k, 0.0):.3f} s") for k, label in TIME_LABELS.items()
             if est["breakdown"].get(k, 0.0) > 0]
    breakdown = _bars_svg("breakdown", [("step", parts, f"{step:.3f} s")], step)
    # memory: one stacked bar per rank, to scale of the larger of the limit and the peak
    limit = est["memory_limit_gib"]
    mem_rows = []
    for s in est["stages"]:
        segs = [(f"mem mem-{part}", s["memory_gib"].get(part, 0.0), MEMORY_COLORS[part],
                 f"{part}: {s['memory_gib'].get(part, 0.0):.1f} GiB") for part in MEMORY_PARTS]
        over = " (over)" if s["peak_memory_gib"] > limit else ""
        mem_rows.append((f"rank {s['rank']}", segs, f"{s['peak_memory_gib']:.1f} GiB{over}"))
    peak = max([s["peak_memory_gib"] for s in est["stages"]] + [limit])
    memory = _bars_svg("memory", mem_rows, peak, limit, "GiB")
    rows = "".join(
        f"<tr><td>{s['rank']}</td><td>{'+'.join(map(str, s['layers']))}</td><td>{1e3 * s['fwd_s']:.1f}</td>"
        f"<td>{1e3 * (s['bwd_s'] - s['bwd_weight_s']):.1f}</td><td>{1e3 * s['bwd_weight_s']:.1f}</td>"
        f"<td>{1e3 * s['recompute_s']:.1f}</td><td>{1e3 * (sim.total_s - sim.busy_s[s['rank']]):.1f}</td></tr>"
        for s in est["stages"])
    summary = (f"step {step:.3f} s; {est['tokens_per_s']:,.0f} tokens/s; {est['tflops_per_gpu']:.1f} model TFLOP/s "
               f"per GPU; MFU {100 * est['mfu']:.1f}% (attention: full s&sup2; square); peak memory "
               f"{est['peak_memory_gib']:.1f} of {limit:.1f} GiB")
    sim_note = (f"simulated pipeline: {sim.total_s:.3f} s for {cfg.num_microbatches} micro-batches "
                f"(the estimate's closed form, with the sends folded into F and B: "
                f"{step - est['breakdown'].get('dp_comm_s', 0.0) - est['breakdown'].get('optimizer_s', 0.0):.3f} s "
                f"with the exposed DP time and optimizer step taken out); one pipeline send: "
                f"{1e3 * tl.p2p_s:.3f} ms")
    unit = ("micro-batch" if get_schedule(cfg.schedule).microbatches_per_pass == 1 else
            "pass: one micro-batch each way through the rank's stage and its mirror")
    legend_ops = _legend([(OP_NAMES[k], c) for k, c in OP_COLORS.items()] + [("idle (fill, drain, waiting)",
                                                                              IDLE_COLOR)])
    legend_time = _legend([(TIME_LABELS[k], TIME_COLORS[k]) for k in TIME_LABELS
                           if est["breakdown"].get(k, 0.0) > 0])
    legend_mem = _legend([(p_, MEMORY_COLORS[p_]) for p_ in MEMORY_PARTS] + [("usable memory", "#d00")])
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{_esc(title)}</title>
<style>
body {{ font: 14px system-ui, sans-serif; margin: 1.5em; color: #222; }}
h1 {{ font-size: 1.3em; }} h2 {{ font-size: 1.1em; margin-top: 1.6em; }}
svg text {{ font: 11px system-ui, sans-serif; fill: #222; }}
.legend span {{ margin-right: 1.2em; white-space: nowrap; }}
.legend i {{ display: inline-block; width: 0.9em; height: 0.9em; margin-right: 0.3em; vertical-align: -0.1em; }}
table {{ border-collapse: collapse; }} td, th {{ padding: 2px 8px; text-align: right; border-bottom: 1px solid #ddd; }}
.note {{ color: #555; }}
</style></head>
<body>
<h1>{_esc(title)}</h1>
<p>{_esc(config_line(cfg))}</p>
<p>{summary}</p>
<p class="note">estimate {_esc(origin)}</p>
<h2>Pipeline timeline</h2>
{legend_ops}
{_timeline_svg(tl, cfg)}
<p class="note">{_esc(sim_note)}</p>
<h2>Where the step time goes</h2>
{legend_time}
{breakdown}
<h2>Per pipeline rank (ms per {_esc(unit)})</h2>
<table><tr><th>rank</th><th>layers</th><th>forward</th><th>backward (input)</th><th>backward (weights)</th>
<th>recompute</th><th>idle per step</th></tr>{rows}</table>
<h2>Memory per pipeline rank</h2>
{legend_mem}
{memory}
<pre id="render-check" hidden></pre>
<script>{_CHECK_SCRIPT}</script>
</body></html>
"""


def check_summary(page: str) -> dict[str, Any]:
    """What the page will report once drawn, computed from its source: elements per chart (for the browser test)."""
    return {"timeline_ops": page.count('class="op op-'), "timeline_rows": page.count('class="idle"'),
            "sends": page.count('class="send"')}

