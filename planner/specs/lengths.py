"""Sequence-length distributions: how long the training samples (documents) are.

A distribution is a histogram of sample lengths in tokens: ``lengths`` (each bin's length) and ``weights`` (the share
of samples in it, summing to 1). It comes from a file (``--seq-len-dist FILE``: a JSON object ``{"lengths": [...],
"counts": [...], "source": "..."}``, a JSON object of length ranges ``{"buckets": [[min, max, count], ...]}`` as
published tables give them, or a CSV of ``length,count`` rows, e.g. from a tokenized data set), from a shipped
histogram of a public data set by name (``length_distributions/*.json``, e.g. ``wikipedia-en``), or from a named
distribution (``lognormal:mean=TOKENS,sigma=S,max=TOKENS``). The cost model reads only its moments
(``planner.cost.variable_length``).
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from planner.errors import PlannerError
from planner.specs.model import read_json_file

#: bins a named distribution is discretized into (log-spaced from 1 token to its max)
NAMED_BINS = 96
OPTION = "--seq-len-dist"
FIX = "give a histogram file (JSON {\"lengths\": [...], \"counts\": [...]} or {\"buckets\": [[min, max, count], " \
      "...]}, or CSV length,count), a shipped data set (planner list distributions) or " \
      "lognormal:mean=4096,sigma=1.2,max=131072"
#: log-spaced sub-bins one published length range is spread over (:func:`from_buckets`)
BUCKET_SUBBINS = 8


@dataclass(frozen=True, eq=False)
class SeqLenDist:
    """Sample lengths (tokens, ascending, distinct) and the share of samples of each length (sums to 1)."""

    lengths: np.ndarray
    weights: np.ndarray
    name: str = ""
    source: str = ""

    def __post_init__(self):
        if len(self.lengths) == 0 or len(self.lengths) != len(self.weights):
            raise ValueError("lengths and weights must be non-empty and of one length")

    def __eq__(self, other):  # the moments are what matters; arrays compare elementwise
        return isinstance(other, SeqLenDist) and np.array_equal(self.lengths, other.lengths) and \
            np.allclose(self.weights, other.weights)

    @property
    def max_len(self) -> int:
        return int(self.lengths[-1])

    @property
    def mean_len(self) -> float:
        """Mean sample length (tokens per sample)."""
        return float(self.weights @ self.lengths)

    def split_at(self, seq_len: int) -> "SeqLenDist":
        """The pieces a ``seq_len``-token context trains on: a sample longer than it becomes floor(L / s) pieces of
        s tokens and one of the remainder (as pre-training data loaders cut long documents)."""
        s = int(seq_len)
        L = self.lengths.astype(np.int64)
        full, rest = L // s, L % s
        pieces = np.concatenate([np.minimum(L, s), rest[L > s], np.full(int((L > s).sum()), s)])
        mass = np.concatenate([np.where(L > s, 0.0, self.weights), self.weights[L > s] * (rest[L > s] > 0),
                               (self.weights * full)[L > s]])
        keep = (mass > 0) & (pieces > 0)
        return _merged(pieces[keep], mass[keep], self.name, self.source)

    def token_weights(self) -> np.ndarray:
        """Share of tokens in each bin: w L / sum(w L)."""
        t = self.weights * self.lengths
        return t / t.sum()

    def packed_doc_len(self, seq_len: int) -> float:
        """Token-weighted mean document length E[L^2] / E[L] of the pieces packed into ``seq_len``-token sequences:
        the number of keys a query of a packed sequence attends under per-document masking is, on average, the
        length of its document, so a packed sequence's attention square is ``seq_len`` times this (with
        cross-document masking a chunk's attention costs the sum of its documents' squared lengths: Pouransari et
        al. 2024, "Dataset Decomposition", arXiv 2405.13226). Pieces are packed whole (sample-level packing, as
        Megatron-Core's SFT packing and hybrid CP run it); a loader that also cuts documents at the sequence
        boundary attends up to a third less for documents near ``seq_len``."""
        d = self.split_at(seq_len)
        return float(d.weights @ d.lengths.astype(float) ** 2 / (d.weights @ d.lengths))

    def describe(self) -> dict:
        """The distribution as a plan JSON stores it (``data.seq_len_dist``; :func:`from_description` reads it)."""
        return {"name": self.name, "source": self.source, "bins": int(len(self.lengths)),
                "mean_tokens": self.mean_len, "max_tokens": self.max_len,
                "lengths": self.lengths.tolist(), "weights": self.weights.tolist()}


def _merged(lengths, weights, name: str, source: str) -> SeqLenDist:
    lengths = np.asarray(lengths, dtype=np.int64)
    weights = np.asarray(weights, dtype=float)
    uniq, inv = np.unique(lengths, return_inverse=True)
    w = np.bincount(inv, weights=weights, minlength=len(uniq))
    return SeqLenDist(uniq, w / w.sum(), name, source)


def from_histogram(lengths, counts, name: str = "", source: str = "", where: str = OPTION) -> SeqLenDist:
    """A distribution from bin lengths (tokens, > 0) and sample counts (>= 0, not all 0); PlannerError names
    ``where``."""
    try:
        L = np.asarray(lengths, dtype=float)
        c = np.asarray(counts, dtype=float)
    except (TypeError, ValueError):
        raise PlannerError("lengths and counts must be numbers", source=where, fix=FIX) from None
    if L.ndim != 1 or c.shape != L.shape or L.size == 0:
        raise PlannerError(f"need as many counts as lengths, at least one (got {L.size} lengths, {c.size} counts)",
                           source=where, fix=FIX)
    if not (np.isfinite(L).all() and np.isfinite(c).all()) or (L < 1).any() or (L != np.round(L)).any():
        raise PlannerError("lengths must be whole numbers of tokens >= 1", source=where, fix=FIX)
    if (c < 0).any() or c.sum() <= 0:
        raise PlannerError("counts must be >= 0 and not all 0", source=where, fix=FIX)
    keep = c > 0
    return _merged(L[keep].astype(np.int64), c[keep], name, source)


def from_buckets(buckets, name: str = "", source: str = "", where: str = OPTION,
                 subbins: int = BUCKET_SUBBINS) -> SeqLenDist:
    """A distribution from published length ranges ``[[min, max, count], ...]`` (tokens, min < max, ranges apart):
    each range's samples spread evenly in log length over ``subbins`` log-spaced sub-bins of [min, max), each at
    its geometric midpoint. Log-uniform inside a range is an assumption (a range of a doubling length holds a
    falling density in a long tail; within one octave the difference to E[L^2] is a few percent); it keeps each
    range's sample count exactly. PlannerError names ``where``."""
    rows = buckets if isinstance(buckets, list) else None
    if not rows or not all(isinstance(r, (list, tuple)) and len(r) == 3 for r in rows):
        raise PlannerError("buckets must be a non-empty list of [min, max, count]", source=where, fix=FIX)
    try:
        lo, hi, c = (np.asarray(col, dtype=float) for col in zip(*rows))
    except (TypeError, ValueError):
        raise PlannerError("bucket entries must be numbers", source=where, fix=FIX) from None
    if not (np.isfinite(lo).all() and np.isfinite(hi).all()) or (lo < 1).any() or (hi <= lo).any():
        raise PlannerError("every bucket needs 1 <= min < max (tokens)", source=where, fix=FIX)
    order = np.argsort(lo)
    if (lo[order][1:] < hi[order][:-1]).any():
        raise PlannerError("buckets overlap", source=where, fix="give length ranges that do not overlap")
    lengths, counts = [], []
    for a, b, n in zip(lo, hi, c):
        edges = np.geomspace(a, b, subbins + 1)
        lengths.append(np.maximum(1, np.round(np.sqrt(edges[:-1] * edges[1:]))))
        counts.append(np.full(subbins, n / subbins))
    return from_histogram(np.concatenate(lengths), np.concatenate(counts), name=name, source=source, where=where)


def length_distributions_dir() -> Path:
    """The shipped histograms of public data sets (``length_distributions/*.json``)."""
    from planner.specs.model import _data_dir

    return _data_dir("length_distributions")


def shipped_distributions() -> list[str]:
    return sorted(p.stem for p in length_distributions_dir().glob("*.json"))


def from_description(d: dict, where: str = "data.seq_len_dist") -> SeqLenDist:
    """The distribution a plan JSON stored (:meth:`SeqLenDist.describe`)."""
    if not isinstance(d, dict) or "lengths" not in d or "weights" not in d:
        raise PlannerError("the plan's length distribution has no lengths and weights", source=where,
                           fix="re-plan with --seq-len-dist")
    return from_histogram(d["lengths"], d["weights"], name=str(d.get("name", "")), source=str(d.get("source", "")),
                          where=where)


def lognormal(mean_tokens: float, sigma: float, max_tokens: int, bins: int = NAMED_BINS) -> SeqLenDist:
    """Sample lengths distributed log-normally with mean ``mean_tokens`` and log-standard-deviation ``sigma``
    (mu = ln(mean) - sigma^2 / 2), discretized into ``bins`` log-spaced bins from 1 token to ``max_tokens``; each
    bin's mass (CDF difference) sits at its geometric midpoint, and the tail above the max at the max (a sample that
    long is cut to the context by the data loader)."""
    mu = math.log(mean_tokens) - sigma * sigma / 2
    edges = np.unique(np.round(np.geomspace(1.0, float(max_tokens), bins + 1)))
    cdf = np.array([0.5 * (1 + math.erf((math.log(e) - mu) / (sigma * math.sqrt(2)))) for e in edges])
    cdf[0] = 0.0
    mass = np.diff(cdf)
    mids = np.round(np.sqrt(edges[:-1] * edges[1:]))
    mids[-1] = max_tokens
    mass[-1] += 1.0 - cdf[-1]
    name = f"lognormal:mean={mean_tokens:g},sigma={sigma:g},max={max_tokens}"
    return _merged(mids, mass, name, "log-normal sample lengths (named distribution)")


def parse_named(text: str) -> SeqLenDist:
    """``lognormal:mean=4096,sigma=1.2,max=131072``."""
    kind, _, args = text.partition(":")
    if kind != "lognormal":
        raise PlannerError(f"unknown distribution {kind!r}", source=OPTION, fix=FIX)
    values = {}
    for item in filter(None, (a.strip() for a in args.split(","))):
        key, eq, val = item.partition("=")
        try:
            values[key.strip()] = float(val)
        except ValueError:
            raise PlannerError(f"{item!r} is not key=number", source=OPTION, fix=FIX) from None
    missing = [k for k in ("mean", "sigma", "max") if k not in values]
    unknown = sorted(set(values) - {"mean", "sigma", "max"})
    if missing or unknown:
        raise PlannerError("lognormal needs mean, sigma and max" + (f" (unknown: {', '.join(unknown)})" if unknown
                                                                     else f" (missing: {', '.join(missing)})"),
                           source=OPTION, fix=FIX)
    if not (1 <= values["mean"] <= values["max"]) or values["sigma"] <= 0 or values["max"] != int(values["max"]):
        raise PlannerError("need 1 <= mean <= max (tokens, max a whole number) and sigma > 0", source=OPTION, fix=FIX)
    return lognormal(values["mean"], values["sigma"], int(values["max"]))


def load_seq_len_dist(spec: str) -> SeqLenDist:
    """``--seq-len-dist``: a named distribution (``lognormal:...``) or a histogram file (``.json`` / ``.csv``)."""
    if spec.startswith("lognormal:") or (":" in spec and not Path(spec).exists() and "/" not in spec):
        return parse_named(spec)
    path = Path(spec)
    if not path.exists() and "/" not in spec and spec in shipped_distributions():
        path = length_distributions_dir() / f"{spec}.json"
    if path.suffix.lower() == ".csv":
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise PlannerError("file not found", source=spec, fix=FIX) from None
        except (OSError, UnicodeDecodeError) as e:
            raise PlannerError(f"cannot read: {e.__class__.__name__}", source=spec, fix=FIX) from None
        rows = [r for r in csv.reader(io.StringIO(text)) if r and not r[0].lstrip().startswith("#")]
        if rows and not _is_number(rows[0][0]):
            rows = rows[1:]  # a header row
        if any(len(r) < 2 for r in rows):
            raise PlannerError("every row needs length,count", source=spec, fix=FIX)
        return from_histogram([r[0] for r in rows], [r[1] for r in rows], name=path.stem, where=spec)
    data = read_json_file(path, "sequence-length histogram")
    if isinstance(data, dict) and "buckets" in data:
        return from_buckets(data["buckets"], name=str(data.get("name", path.stem)), source=str(data.get("source", "")),
                            where=f"{spec}: buckets")
    if not isinstance(data, dict) or "lengths" not in data or "counts" not in data:
        raise PlannerError("need a JSON object with 'lengths' and 'counts' lists (or 'buckets')", source=spec,
                           fix=FIX)
    return from_histogram(data["lengths"], data["counts"], name=str(data.get("name", path.stem)),
                          source=str(data.get("source", "")), where=spec)


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False
