"""Published nccl-tests measurements against the collective model (``planner.cost.comm``): each row of
``collective_runs.json`` names a shipped profile (optionally a different NIC share per GPU), a collective, the ranks
and the message, and the measured bus bandwidth or time, with its source and quote."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from planner.cost import comm
from planner.specs.hardware import GB, Cluster, load_cluster
from planner.validation.compare import relative_error

RUNS_FILE = Path(__file__).with_name("collective_runs.json")
#: nccl-tests' bus-bandwidth factor per collective (NVIDIA/nccl-tests doc/PERFORMANCE.md)
_BUSBW_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
                 "reduce_scatter": lambda n: (n - 1) / n}


@dataclass(frozen=True)
class CollectiveComparison:
    id: str
    source: str
    metric: str  # "busbw_gb_s" or "time_us"
    measured: float
    estimated: float
    in_sample: str  # the profile value this row's quote set, "" for an independent check

    @property
    def error(self) -> float:
        return relative_error(self.estimated, self.measured)


def _cluster(row: dict) -> Cluster:
    c = load_cluster(row["cluster"])
    if "inter_node_bandwidth_gb_s" in row:
        nic = dataclasses.replace(c.inter_node, bandwidth_bytes_per_s=row["inter_node_bandwidth_gb_s"] * GB)
        c = dataclasses.replace(c, inter_node=nic)
    return c


def collective_time_s(row: dict) -> float:
    """The model's time of the row's collective."""
    c, n = _cluster(row), row["ranks"]
    g = comm.place_group(n, c.gpus_per_node // row["ranks_per_node"], c.gpus_per_node)
    size = row["size_bytes"]
    if row["collective"] == "all_reduce":
        return float(comm.all_reduce_s(c, g, size, algorithm=row.get("algorithm")))
    if row["collective"] in ("all_gather", "reduce_scatter"):
        return float(comm.reduce_scatter_s(c, g, size))
    raise ValueError(f"{row['id']}: unknown collective {row['collective']!r}")


def compare(path: Path = RUNS_FILE) -> list[CollectiveComparison]:
    """Every row, measured vs estimated, in the row's own metric."""
    out = []
    for row in json.loads(path.read_text())["runs"]:
        t = collective_time_s(row)
        (metric, measured), = row["measured"].items()
        if metric == "time_us":
            est = t * 1e6
        else:
            est = _BUSBW_FACTOR[row["collective"]](row["ranks"]) * row["size_bytes"] / t / GB
        out.append(CollectiveComparison(row["id"], row["source"], metric, float(measured), est,
                                        row.get("in_sample", "")))
    return out
