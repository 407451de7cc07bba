"""A cluster of several GPU pools: each pool a hardware profile (GPU type, node, network) and a node count, and the
links between pools (two sites, two fabrics). Pool files are data in ``pooled_clusters/`` (or any path); this
module only reads them.

A pool file::

    {"name": "h100-a100", "source": "...",
     "pools": [{"name": "h100", "profile": "h100-80gb-sxm", "nodes": 4},
               {"name": "a100", "profile": "a100-80gb-sxm", "nodes": 4}],
     "links": [{"pools": ["h100", "a100"], "name": "shared InfiniBand", "bandwidth_gb_s": 25,
                "latency_us": 5, "efficiency": 0.9}]}

A link is per GPU, as a profile's ``inter_node`` is. Pools without a link between them talk over the slower of
their two networks (the slowest-link rule: a transfer between pools runs at the rate of the weaker side).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from planner.errors import PlannerError
from planner.specs.hardware import Cluster, Link, _link, cluster_from_dict, load_cluster
from planner.specs.model import MAX_CONFIG_INT, _data_dir, _path_exists, read_json_file

_FORMAT_FIX = "see a shipped pool file for the format: files in pooled_clusters/"


@dataclass(frozen=True)
class Pool:
    """One homogeneous part of the cluster: ``nodes`` nodes of one hardware profile."""

    name: str
    cluster: Cluster  # the profile, with no GPU-count cap (the pool's own count is ``num_gpus``)
    nodes: int

    @property
    def num_gpus(self) -> int:
        return self.nodes * self.cluster.gpus_per_node


@dataclass(frozen=True)
class PooledCluster:
    """Pools in rank order (pool 0's GPUs take the first ranks) and the links between them."""

    name: str
    pools: tuple[Pool, ...]
    links: tuple[tuple[int, int, Link], ...] = ()  # (pool i, pool j, link), i < j
    source: str = ""

    @property
    def num_gpus(self) -> int:
        return sum(p.num_gpus for p in self.pools)

    def link(self, i: int, j: int) -> Link:
        """The link between pools i and j: the file's, else the slower of the two pools' networks."""
        a, b = min(i, j), max(i, j)
        for x, y, link in self.links:
            if (x, y) == (a, b):
                return link
        nets = (self.pools[a].cluster.inter_node, self.pools[b].cluster.inter_node)
        return min(nets, key=lambda n: n.bus_bandwidth_bytes_per_s)


def pooled_clusters_dir() -> Path:
    return _data_dir("pooled_clusters")


def shipped_pooled_clusters() -> list[str]:
    d = pooled_clusters_dir()
    return sorted(p.stem for p in d.glob("*.json")) if d.is_dir() else []


def _pool_path(name_or_path: str) -> Path | None:
    path = Path(name_or_path)
    if _path_exists(path):
        return path
    candidate = pooled_clusters_dir() / f"{name_or_path}.json"
    return candidate if "/" not in name_or_path and _path_exists(candidate) else None


def is_pooled_cluster(name_or_path: str) -> bool:
    """Whether ``--cluster`` names a pool file (a shipped one, or a JSON file with ``pools``)."""
    path = _pool_path(name_or_path)
    if path is None or not path.is_file():
        return False
    try:
        data = read_json_file(path, "cluster")
    except PlannerError:
        return False
    return isinstance(data, dict) and "pools" in data


def load_pooled_cluster(name_or_path: str) -> PooledCluster:
    path = _pool_path(name_or_path)
    if path is None:
        raise PlannerError(f"unknown pool file '{name_or_path}'", source="--cluster",
                           fix=f"use a pool file path or one of: {', '.join(shipped_pooled_clusters())}")
    return pooled_cluster_from_dict(read_json_file(path, "pool"), source=str(path), default_name=path.stem)


def pooled_cluster_from_dict(data: Any, *, source: str = "<pools>", default_name: str = "pools") -> PooledCluster:
    if not isinstance(data, dict):
        raise PlannerError("top level must be a JSON object", source=source, fix=_FORMAT_FIX)
    raw = data.get("pools")
    if not isinstance(raw, list) or not raw:
        raise PlannerError("must be a non-empty list of pools", source=source, field="pools", fix=_FORMAT_FIX)
    pools: list[Pool] = []
    for i, p in enumerate(raw):
        where = f"pools[{i}]"
        if not isinstance(p, dict):
            raise PlannerError("must be an object", source=source, field=where, fix=_FORMAT_FIX)
        name = p.get("name")
        if not isinstance(name, str) or not name.strip() or name in {q.name for q in pools}:
            raise PlannerError(f"needs a unique non-empty name, got {name!r}", source=source, field=f"{where}.name")
        nodes = p.get("nodes")
        if isinstance(nodes, bool) or not isinstance(nodes, int) or not 1 <= nodes <= MAX_CONFIG_INT:
            raise PlannerError(f"must be a positive integer, got {nodes!r}", source=source, field=f"{where}.nodes")
        prof = p.get("profile")
        if isinstance(prof, str):
            cluster = load_cluster(prof)
        elif isinstance(prof, dict):
            cluster = cluster_from_dict(prof, source=f"{source} {where}.profile", default_name=name)
        else:
            raise PlannerError("must be a shipped profile name, a profile path or a profile object",
                               source=source, field=f"{where}.profile", fix="e.g. \"profile\": \"h100-80gb-sxm\"")
        pools.append(Pool(name, replace(cluster, max_gpus=0), nodes))
    index = {p.name: i for i, p in enumerate(pools)}
    links: list[tuple[int, int, Link]] = []
    for k, ln in enumerate(data.get("links", []) or []):
        where = f"links[{k}]"
        ends = ln.get("pools") if isinstance(ln, dict) else None
        if not isinstance(ends, list) or len(ends) != 2 or any(e not in index for e in ends) or ends[0] == ends[1]:
            raise PlannerError(f"'pools' must name two different pools of {sorted(index)}, got {ends!r}",
                               source=source, field=f"{where}.pools")
        i, j = sorted(index[e] for e in ends)
        if any((x, y) == (i, j) for x, y, _ in links):
            raise PlannerError(f"a second link between {ends[0]} and {ends[1]}", source=source, field=where,
                               fix="give one link per pair of pools")
        links.append((i, j, _link(ln, source, where)))
    return PooledCluster(name=str(data.get("name", default_name)), pools=tuple(pools), links=tuple(links),
                         source=str(data.get("source", "")))
