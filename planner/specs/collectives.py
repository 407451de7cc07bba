"""The collective library a cluster runs (NCCL), as data: the latencies and per-protocol bandwidth shares of its own
tuning model, read from ``collectives/*.json``. ``planner.cost.comm`` composes them into each collective's time;
this module only reads and checks the file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from planner.errors import PlannerError
from planner.specs.model import _data_dir, _resolve, read_json_file

#: the library a hardware profile runs when it names none
DEFAULT_COLLECTIVE_LIBRARY = "nccl-2.30"
#: NCCL's protocols, in the order the arrays of :class:`CollectiveLibrary` hold them
PROTOCOLS = ("LL", "LL128", "Simple")
#: algorithms whose latencies and bandwidth shares the file gives per protocol
ALGORITHMS = ("ring", "tree")
US = 1e-6
_FIX = "see collectives/nccl-2.30.json for the format"


@dataclass(frozen=True)
class CollectiveLibrary:
    """Per algorithm, a tuple over :data:`PROTOCOLS`: the base latency (s), the latency of one hop over NVLink and
    over the network (s), and the share of the link's bus bandwidth the protocol carries."""

    name: str
    ring_base_s: tuple[float, ...]
    tree_base_s: tuple[float, ...]
    ring_nvlink_hop_s: tuple[float, ...]
    tree_nvlink_hop_s: tuple[float, ...]
    ring_net_hop_s: tuple[float, ...]
    tree_net_hop_s: tuple[float, ...]
    ring_bandwidth_share: tuple[float, ...]
    tree_bandwidth_share: tuple[float, ...]
    nvls_nvlink_hop_s: float
    #: the network hop of NVLink SHARP's tree across nodes (NCCL's NVLS_TREE, Simple only); None: the library has
    #: no such algorithm
    nvls_tree_net_hop_s: float | None = None
    source: str = ""


def collectives_dir() -> Path:
    return _data_dir("collectives")


def shipped_collective_libraries() -> list[str]:
    return sorted(p.stem for p in collectives_dir().glob("*.json"))


@lru_cache(maxsize=8)
def load_collective_library(name_or_path: str = DEFAULT_COLLECTIVE_LIBRARY) -> CollectiveLibrary:
    """Load a shipped collective library by name (``nccl-2.30``) or a library file by path."""
    path = _resolve(name_or_path, collectives_dir(), "collective_library", "collective library",
                    f"use one of: {', '.join(shipped_collective_libraries())}")
    return library_from_dict(read_json_file(path, "collective library"), source=str(path), default_name=path.stem)


def _per_protocol(d: Any, keys: tuple[str, ...], source: str, field: str, scale: float, *,
                  maximum: float | None = None) -> tuple[float, ...]:
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            raise PlannerError("missing", source=source, field=f"{field}.{k}" if isinstance(d, dict) else field,
                               fix=_FIX)
        d = d[k]
    if not isinstance(d, dict):
        raise PlannerError("must be an object of protocols", source=source, field=field, fix=_FIX)
    out = []
    for p in PROTOCOLS:
        v = d.get(p)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 or \
                maximum is not None and v > maximum:
            bound = f" and <= {maximum}" if maximum is not None else ""
            raise PlannerError(f"must be a number >= 0{bound}, got {v!r}", source=source,
                               field=f"{field}.{'.'.join(keys)}.{p}", fix=_FIX)
        out.append(float(v) * scale)
    return tuple(out)


def library_from_dict(data: Any, source: str = "<dict>", default_name: str = "collectives") -> CollectiveLibrary:
    if not isinstance(data, dict):
        raise PlannerError("must be a JSON object", source=source, fix=_FIX)
    base, hop, share = data.get("base_latency_us"), data.get("hop_latency_us"), data.get("bandwidth_share")
    nvls = _simple_hop(hop, "nvlink", "nvls", source, required=True)
    nvls_tree = _simple_hop(hop, "net", "nvls_tree", source, required=False)
    shares = {a: _per_protocol(share, (a,), source, "bandwidth_share", 1.0, maximum=1.0) for a in ALGORITHMS}
    for a, s in shares.items():
        if max(s) <= 0:
            raise PlannerError("needs a protocol with a share > 0", source=source, field=f"bandwidth_share.{a}",
                               fix=_FIX)
    return CollectiveLibrary(
        name=str(data.get("name", default_name)),
        ring_base_s=_per_protocol(base, ("ring",), source, "base_latency_us", US),
        tree_base_s=_per_protocol(base, ("tree",), source, "base_latency_us", US),
        ring_nvlink_hop_s=_per_protocol(hop, ("nvlink", "ring"), source, "hop_latency_us", US),
        tree_nvlink_hop_s=_per_protocol(hop, ("nvlink", "tree"), source, "hop_latency_us", US),
        ring_net_hop_s=_per_protocol(hop, ("net", "ring"), source, "hop_latency_us", US),
        tree_net_hop_s=_per_protocol(hop, ("net", "tree"), source, "hop_latency_us", US),
        ring_bandwidth_share=shares["ring"], tree_bandwidth_share=shares["tree"],
        nvls_nvlink_hop_s=nvls * US, nvls_tree_net_hop_s=None if nvls_tree is None else nvls_tree * US,
        source=str(data.get("source", "")),
    )


def _simple_hop(hop: Any, link: str, algorithm: str, source: str, required: bool) -> float | None:
    """The Simple protocol's hop latency (us) of an algorithm that runs Simple only (NVLS, NVLS tree); None for an
    optional one the file leaves out (the library has no such algorithm)."""
    block = hop.get(link, {}) if isinstance(hop, dict) else None
    v = block.get(algorithm, {}) if isinstance(block, dict) else None
    v = v.get("Simple") if isinstance(v, dict) else None
    if v is None and not required:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise PlannerError(f"must be a number >= 0, got {v!r}", source=source,
                           field=f"hop_latency_us.{link}.{algorithm}.Simple", fix=_FIX)
    return float(v)


#: a library with no latencies and the full bus bandwidth in every protocol: the plain bandwidth model, for
#: hand-checked formulas (tests) and what-if studies of the wire alone
IDEAL_COLLECTIVES = CollectiveLibrary(
    name="ideal", ring_base_s=(0.0,) * 3, tree_base_s=(0.0,) * 3, ring_nvlink_hop_s=(0.0,) * 3,
    tree_nvlink_hop_s=(0.0,) * 3, ring_net_hop_s=(0.0,) * 3, tree_net_hop_s=(0.0,) * 3,
    ring_bandwidth_share=(0.0, 0.0, 1.0), tree_bandwidth_share=(0.0, 0.0, 0.0), nvls_nvlink_hop_s=0.0,
    source="no latency, full bus bandwidth (Simple protocol only); tree off",
)
