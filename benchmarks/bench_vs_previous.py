"""This version's search against a previous release's, side by side in one run (issue 8's acceptance benchmark).

    python benchmarks/bench_vs_previous.py                 # against PREVIOUS (the release before the one cost model)
    python benchmarks/bench_vs_previous.py --base <rev>    # against any commit of this repository
    python benchmarks/bench_vs_previous.py --repeats 7

The previous release is unpacked from git (``git archive``) into a temporary folder and imported from there, so both
versions run with the same interpreter and the same numpy. Each (scenario, version) pair is timed ``--repeats``
times in fresh processes, taking turns, and the least CPU time is kept (on a shared machine the minimum is what an
idle one gives). Timed: the whole ``search(...)`` call of the README's three scenarios (top 3, partition DP on),
as ``planner plan`` makes it, in a process that has imported the package and loaded the model and the cluster:
``cold`` is the first search in the process, ``warm`` a second identical one. The ratio is this version / previous:
issue 8 asks for <= 1.10 although this version's space also holds the runtime options (TP communication overlap,
flash attention, data-parallel overlap and gradient-reduction dtype).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
#: the last commit before the single cost model (issue 8): the search there replicated the cost model in numpy
PREVIOUS = "9892d94"
SCENARIOS = (("GPT-3 175B, 1024 A100", "gpt3-175b", "a100-80gb-sxm", 1024, 1536, 2048),
             ("Llama-3.1-405B, 16384 H100", "llama-3.1-405b", "h100-80gb-sxm", 16384, 2048, 8192),
             ("DeepSeek-V3, 2048 H800", "deepseek-v3", "h800-80gb-sxm", 2048, 15360, 4096))
#: what one timing process runs: import, load, then two identical searches (cold, warm), CPU seconds as JSON
_CHILD = """
import json, sys, time
from planner.search.engine import SearchSpace, search
from planner.specs.hardware import load_cluster
from planner.specs.model import load_model
model, cluster = load_model(sys.argv[1]), load_cluster(sys.argv[2])
n, b, s = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
space = SearchSpace(tp_comm_overlap=(False,), ep_comm_overlap=(False,), uneven_chunks=0) \
    if sys.argv[6] == "previous-space" else SearchSpace()
out = {}
for name in ("cold", "warm"):
    c0 = time.process_time()
    res = search(model, cluster, n, b, s, top=3, space=space)
    out[name] = time.process_time() - c0
c = res.best.config
out["best"] = f"TP{c.tp} PP{c.pp} DP{c.dp} CP{c.cp} EP{c.ep} VPP{c.vpp} {c.schedule} Z{c.zero_stage}"
out["step_s"] = res.best.estimate.step_time_s
out["exact"] = res.stats["exact_evaluations"]
import planner
out["from"] = planner.__file__
print(json.dumps(out))
"""


def unpack(rev: str, dest: Path) -> Path:
    """The repository at ``rev`` (its tracked files) under ``dest``."""
    blob = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", rev], capture_output=True, check=True)
    with tarfile.open(fileobj=BytesIO(blob.stdout)) as tar:
        tar.extractall(dest, filter="data")
    return dest


def time_once(src: Path, scenario: tuple, space: str = "default") -> dict:
    """One fresh process importing ``planner`` from ``src``; its cold and warm search CPU seconds. ``space``:
    "default", or "previous-space" (this version searching only what the previous one could: no TP overlap, no MoE
    all-to-all overlap, virtual chunks of equal size)."""
    _, model, cluster, n, b, s = scenario
    r = subprocess.run([sys.executable, "-c", _CHILD, model, cluster, str(n), str(b), str(s), space],
                       capture_output=True,
                       text=True, cwd=src, env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"})
    if r.returncode:
        raise SystemExit(f"timing run failed in {src}: {r.stderr.strip()[-2000:]}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    if not out["from"].startswith(str(src)):
        raise SystemExit(f"imported planner from {out['from']}, not {src}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default=PREVIOUS, help="the previous release (a commit of this repository)")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    con = Console(width=160)
    with tempfile.TemporaryDirectory() as tmp:
        old_src = unpack(args.base, Path(tmp) / "previous")
        versions = {"previous": (old_src, "default"), "this": (ROOT, "default"), "same": (ROOT, "previous-space")}
        t = Table(title=f"Search CPU seconds, this version vs {args.base} (min of {args.repeats} fresh processes); "
                        "'same space': this version in the previous release's space (no TP or all-to-all "
                        "overlap dimensions, equal virtual chunks)")
        for col in ("scenario", "previous cold / warm", "this cold / warm", "ratio cold / warm",
                    "same space cold / warm", "ratio", "exact evals (prev / this)", "best plan (this)",
                    "step s (prev / this)"):
            t.add_column(col, justify="left" if col in ("scenario", "best plan (this)") else "right")
        worst = {"this": 0.0, "same": 0.0}
        for sc in SCENARIOS:
            runs: dict[str, list[dict]] = {k: [] for k in versions}
            for _ in range(args.repeats):
                for name, (src, space) in versions.items():  # taking turns, so drifts of the machine hit all alike
                    runs[name].append(time_once(src, sc, space))
            best = {k: {m: min(r[m] for r in v) for m in ("cold", "warm")} for k, v in runs.items()}
            ratio = {k: {m: best[k][m] / best["previous"][m] for m in ("cold", "warm")} for k in ("this", "same")}
            for k in worst:
                worst[k] = max(worst[k], *ratio[k].values())
            last = {k: v[-1] for k, v in runs.items()}

            def pair(d: dict, fmt: str = ".3f") -> str:
                return f"{d['cold']:{fmt}} / {d['warm']:{fmt}}"

            t.add_row(sc[0], pair(best["previous"]), pair(best["this"]), pair(ratio["this"], ".2f"),
                      pair(best["same"]), pair(ratio["same"], ".2f"),
                      f"{last['previous']['exact']} / {last['this']['exact']}", last["this"]["best"],
                      f"{last['previous']['step_s']:.2f} / {last['this']['step_s']:.2f}")
        con.print(t)
        for k, label in (("this", "default space"), ("same", "previous release's space")):
            con.print(f"largest ratio, {label}: {worst[k]:.2f} "
                      f"({'within' if worst[k] <= 1.10 else 'ABOVE'} issue 8's 1.10)")


if __name__ == "__main__":
    main()
