"""What-if sweeps: the best plan for every combination of models, clusters, GPU counts, batch sizes and sequence
lengths, as one ``pandas`` DataFrame (one row per scenario, in the order of the Cartesian product of the inputs).

Large sweeps run on a process pool (one search per scenario, each worker with its own estimate cache), or on
dask.distributed (``backend="dask"``: a local cluster or a running scheduler); the rows come back in scenario order
whatever the workers do, so a sweep's result is deterministic. ``pandas`` and the search are
imported when a sweep runs, so ``import planner`` stays cheap.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Iterable

from planner.errors import PlannerError

#: below this many scenarios a sweep runs in-process; a search takes 0.1 s or more, forking a worker ~10 ms, so
#: even a handful of scenarios gains from the pool
PARALLEL_MIN_SCENARIOS = 4
#: work items handed to a worker at once, as a fraction of the scenarios per worker (small enough to balance
#: searches of very different cost, large enough to amortize inter-process traffic)
CHUNKS_PER_WORKER = 8

SCENARIO_COLUMNS = ("model", "cluster", "num_gpus", "global_batch_size", "seq_len")
PLAN_COLUMNS = ("tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch_size", "num_microbatches", "schedule",
                "recompute", "recompute_num_layers", "zero_stage", "dp_shard", "sequence_parallel", "cp_kind")
ESTIMATE_COLUMNS = ("step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu", "hfu",
                    "peak_memory_gib", "memory_limit_gib")
#: what a run costs (NaN without a price, or without a token budget for the last two): the cluster's price per
#: GPU-hour (the profile's ``price_per_gpu_hour_usd`` or ``prices``), per million tokens, and for ``train_tokens``
#: the days and dollars to train on them at the plan's throughput
COST_COLUMNS = ("price_per_gpu_hour_usd", "cost_per_million_tokens_usd", "time_to_train_days", "cost_to_train_usd")
COLUMNS = SCENARIO_COLUMNS + ("feasible",) + PLAN_COLUMNS + ESTIMATE_COLUMNS + COST_COLUMNS + ("error",)
SECONDS_PER_HOUR, SECONDS_PER_DAY = 3600.0, 86400.0
#: where a sweep's scenarios run: a local process pool, or dask.distributed (a local cluster or a scheduler)
BACKENDS = ("process", "dask")


@dataclass(frozen=True)
class Scenario:
    model: Any  # a shipped name, a config.json path or a ModelSpec
    cluster: Any  # a shipped name, a profile path or a Cluster
    num_gpus: int
    global_batch_size: int
    seq_len: int


def _as_list(value: Any, name: str) -> list[Any]:
    if value is None:
        raise PlannerError("needs at least one value", source=name)
    items = [value] if isinstance(value, (str, int)) or not isinstance(value, Iterable) else list(value)
    if not items:
        raise PlannerError("needs at least one value", source=name)
    return items


def _positive_ints(values: list[Any], name: str) -> list[int]:
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise PlannerError(f"must be positive integers, got {v!r}", source=name)
        out.append(int(v))
    return out


@lru_cache(maxsize=64)
def _load_model(name: str):
    from planner.specs.model import load_model
    return load_model(name)


@lru_cache(maxsize=64)
def _load_cluster(name: str):
    from planner.specs.hardware import load_cluster
    return load_cluster(name)


def _resolve(model: Any, cluster: Any):
    return (_load_model(model) if isinstance(model, str) else model,
            _load_cluster(cluster) if isinstance(cluster, str) else cluster)


def default_search(model, cluster, num_gpus: int, global_batch_size: int, seq_len: int, *,
                   launcher: str | None = None, precision: str = "bf16", stack: str | None = None,
                   constraints: Any = None, adam_moment_bytes: int = 4, activation_fp8_input_store: bool = False,
                   moe_load_factor: float = 1.0, comm_reserved_sms: int = 0, **kw):
    """The full search, or with ``launcher`` / ``stack`` (a stack name or file) the best plan that launcher / stack
    can run, at GEMM ``precision``, within ``constraints`` (``planner.search.space.Constraints``) if given; Adam's
    moments at ``adam_moment_bytes`` and the SwiGLU inputs in fp8 as the run asks (refused for a model without
    gated MLPs: that scenario's row says so)."""
    from planner.specs.stack import activation_fp8_input_store as checked_store
    checked_store(activation_fp8_input_store, None, model.gated_mlp)
    if launcher is not None or stack is not None:
        from planner.export import plan_for_launcher, stack_target
        from planner.specs.stack import load_stack
        run_stack = load_stack(stack) if stack is not None else None
        return plan_for_launcher(model, cluster, num_gpus, global_batch_size, seq_len,
                                 stack_target(run_stack, launcher, activation_fp8_input_store), precision=precision,
                                 stack=run_stack, constraints=constraints, adam_moment_bytes=adam_moment_bytes,
                                 activation_fp8_input_store=activation_fp8_input_store,
                                 moe_load_factor=moe_load_factor, comm_reserved_sms=comm_reserved_sms, **kw)
    from planner.search import search_plans
    from planner.search.space import SearchSpace
    space = SearchSpace(precision=precision, adam_moment_bytes=adam_moment_bytes,
                        activation_fp8_input_store=activation_fp8_input_store, moe_load_factor=moe_load_factor,
                        comm_reserved_sms=comm_reserved_sms)
    if constraints is not None:
        space = constraints.narrow([space], "the search")[0]
    return search_plans(model, cluster, num_gpus, global_batch_size, seq_len, space=space, **kw)


def plan_row(plan: Any) -> dict[str, Any]:
    """The plan and estimate columns of one feasible scenario."""
    cfg, est = plan.config, plan.estimate
    row = {name: getattr(cfg, name) for name in PLAN_COLUMNS}
    row.update(step_time_s=est.step_time_s, tokens_per_s=est.tokens_per_s,
               tokens_per_s_per_gpu=est.tokens_per_s / cfg.num_gpus, tflops_per_gpu=est.tflops_per_gpu, mfu=est.mfu,
               hfu=est.hfu, peak_memory_gib=est.peak_memory_gib, memory_limit_gib=est.memory_limit_bytes / 1024**3)
    return row


def run_scenario(job: tuple[Scenario, dict[str, Any], Callable[..., Any]]) -> dict[str, Any]:
    """One row: the best plan of one scenario, or why there is none (picklable, runs in pool workers)."""
    scenario, search_kw, search = job
    model, cluster = _resolve(scenario.model, scenario.cluster)
    row: dict[str, Any] = {"model": model.name, "cluster": cluster.name, "num_gpus": scenario.num_gpus,
                           "global_batch_size": scenario.global_batch_size, "seq_len": scenario.seq_len}
    try:
        plan = search(model, cluster, scenario.num_gpus, scenario.global_batch_size, scenario.seq_len, **search_kw)
    except PlannerError as e:  # infeasible or an impossible combination (batch not divisible, ...): a row, not a crash
        row.update(feasible=False, error=str(e))
        return row
    row.update(feasible=True, error="", **plan_row(plan))
    return row


def scenarios(models: Any, clusters: Any, gpus: Any, global_batch_sizes: Any, seq_lens: Any) -> list[Scenario]:
    """The Cartesian product of the inputs, in order (models outermost, sequence lengths innermost)."""
    ms, cs = _as_list(models, "models"), _as_list(clusters, "clusters")
    ns = _positive_ints(_as_list(gpus, "gpus"), "gpus")
    bs = _positive_ints(_as_list(global_batch_sizes, "global_batch_sizes"), "global_batch_sizes")
    ss = _positive_ints(_as_list(seq_lens, "seq_lens"), "seq_lens")
    for m in ms:  # fail on a bad name before any search runs
        if isinstance(m, str):
            _load_model(m)
    for c in cs:
        if isinstance(c, str):
            _load_cluster(c)
    return [Scenario(*combo) for combo in itertools.product(ms, cs, ns, bs, ss)]


def hardware_variants(clusters: list[Any], vary: dict[str, Any] | None) -> tuple[list[Any], list[dict[str, float]]]:
    """The clusters of a co-design sweep: every profile with every combination of the varied fields' values
    (``specs.hardware.cluster_variant``), and the values of each; without ``vary`` the clusters as given."""
    if not vary:
        return clusters, [{} for _ in clusters]
    from planner.specs.hardware import cluster_variant

    paths = list(vary)
    lists = [_as_list(vary[p], f"vary {p}") for p in paths]
    for p, values in zip(paths, lists):
        if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in values):
            raise PlannerError(f"needs numbers, got {values!r}", source="--vary", field=p)
    out, values_of = [], []
    for c in clusters:
        if not isinstance(c, str):
            raise PlannerError("a varied cluster must be a profile name or path, not a Cluster object",
                               source="--vary", fix="pass the cluster's name or profile file")
        for combo in itertools.product(*lists):
            values = dict(zip(paths, combo))
            out.append(cluster_variant(c, values))
            values_of.append(values)
    return out, values_of


def _price(cluster: Any, prices: Any) -> float | None:
    """The price per GPU-hour of a cluster: ``prices`` (one number, or by cluster name, a varied profile answering
    to its base name too), else its profile's."""
    if isinstance(prices, (int, float)) and not isinstance(prices, bool):
        return float(prices)
    if isinstance(prices, dict):
        for key in (cluster.name, cluster.name.split("[")[0]):
            if key in prices:
                return float(prices[key])
    return cluster.price_per_gpu_hour_usd


def cost_columns(tokens_per_s: float, num_gpus: int, price: float | None, train_tokens: float | None) -> dict:
    """``COST_COLUMNS`` of one plan: dollars per million tokens = price x GPUs / 3600 / (tokens/s) x 1e6; days
    and dollars to train ``train_tokens`` tokens at that throughput."""
    nan = float("nan")
    per_million = price * num_gpus / SECONDS_PER_HOUR / tokens_per_s * 1e6 if price is not None else nan
    seconds = train_tokens / tokens_per_s if train_tokens is not None else nan
    return {"price_per_gpu_hour_usd": price if price is not None else nan,
            "cost_per_million_tokens_usd": per_million, "time_to_train_days": seconds / SECONDS_PER_DAY,
            "cost_to_train_usd": price * num_gpus * seconds / SECONDS_PER_HOUR if price is not None else nan}


def sweep(models: Any, clusters: Any, gpus: Any, global_batch_sizes: Any, seq_lens: Any, *, top_k: int = 0,
          objective: str = "time", max_memory_gib: float | None = None, launcher: str | None = None,
          precision: str = "bf16", stack: str | None = None, processes: int | None = None,
          progress: bool | Callable[[int, int], None] = False, search: Callable[..., Any] | None = None,
          constraints: Any = None, vary: dict[str, Any] | None = None, prices: Any = None,
          train_tokens: float | None = None, backend: str = "process", scheduler: str | None = None,
          on_row: Callable[[int, dict[str, Any]], None] | None = None, adam_moments: str = "fp32",
          activation_fp8_input_store: bool = False, moe_load_factor: float = 1.0,
          comm_reserved_sms: int = 0) -> "Any":
    """Best plan per scenario over every combination of the inputs; returns a pandas DataFrame.

    Each input is one value or a list: ``models`` shipped names / config.json paths / ``ModelSpec``s, ``clusters``
    shipped names / profile paths / ``Cluster``s, ``gpus``, ``global_batch_sizes`` (sequences) and ``seq_lens``
    (tokens). Rows follow the order of the product (models outermost); scenarios without a feasible plan keep their
    row with ``feasible = False`` and the reason in ``error``. ``launcher`` (megatron, torchtitan, deepspeed, nemo)
    restricts every search to what that launcher can run (``planner.export.plan_for_launcher``). ``processes``:
    worker processes (default: all cores once there are at least ``PARALLEL_MIN_SCENARIOS`` scenarios; 1 runs
    in-process). ``progress``: True for a rich progress bar, or a callback ``(done, total)``. ``top_k``: runner-up
    plans each search keeps (the row reports the best; 0 is fastest). ``search``: the search function (default
    ``planner.search.search_plans``; a replacement must be picklable to run in workers). ``constraints``: a
    ``planner.search.space.Constraints`` every search keeps to (``planner sweep --tp 8 --schedules 1f1b``).
    ``adam_moments`` (fp32 | bf16), ``activation_fp8_input_store``, ``moe_load_factor`` and ``comm_reserved_sms``:
    the run's optimizer moments, SwiGLU input store, MoE routing load and the SMs its communication kernels hold,
    as ``planner plan`` takes them (checked against the stack).

    Hardware co-design: ``vary`` maps profile fields ("gpu.hbm_gib", "node.gpus_per_node",
    "inter_node.bandwidth_gb_s") to lists of values; every cluster is swept with every combination, and each field
    gets its own column. ``prices``: dollars per GPU-hour, one number or by cluster name (default: the profile's
    ``price_per_gpu_hour_usd``); ``train_tokens``: a token budget. They fill ``COST_COLUMNS``.

    ``backend``: "process" (the default: a local process pool) or "dask" (dask.distributed: a local cluster of
    ``processes`` workers, or the scheduler at ``scheduler``); the frame is the same. ``on_row(index, row)`` is
    called as each scenario finishes (in any order with dask), so a caller can keep rows a failure would lose.
    """
    import pandas as pd

    if train_tokens is not None and not (isinstance(train_tokens, (int, float)) and train_tokens > 0):
        raise PlannerError(f"must be > 0, got {train_tokens!r}", source="train_tokens")
    if isinstance(prices, (int, float)) and not isinstance(prices, bool) and not prices > 0:
        raise PlannerError(f"must be > 0, got {prices!r}", source="prices")
    cluster_list, varied = hardware_variants(_as_list(clusters, "clusters"), vary)
    if backend not in BACKENDS:
        raise PlannerError(f"unknown backend '{backend}'", source="--backend", fix=f"use one of: {', '.join(BACKENDS)}")
    if scheduler is not None and backend != "dask":
        raise PlannerError("a scheduler address needs the dask backend", source="--scheduler",
                           fix="add --backend dask")
    jobs_list = scenarios(models, cluster_list, gpus, global_batch_sizes, seq_lens)
    from planner.search.engine import check_search_options

    check_search_options(objective, top_k, max_memory_gib)  # a bad option fails once, not in every row
    from planner.specs.config import PRECISIONS
    if precision not in PRECISIONS:
        raise PlannerError(f"unknown precision '{precision}'", source="precision",
                           fix=f"use one of: {', '.join(PRECISIONS)}")
    search_kw: dict[str, Any] = {"top_k": top_k, "objective": objective}
    if max_memory_gib is not None:
        search_kw["max_memory_gib"] = max_memory_gib
    # options that shape the default search's space: checked once here, not in every row
    from planner.specs.stack import activation_fp8_input_store as checked_store
    from planner.specs.stack import adam_moment_bytes, load_stack
    run_stack = load_stack(stack) if stack is not None else None
    moment_bytes = adam_moment_bytes(adam_moments, run_stack, "adam_moments")
    checked_store(activation_fp8_input_store, run_stack, option="activation_fp8_input_store")
    from planner.specs.config import comm_reserved_sms_value, moe_load_factor_value
    load = moe_load_factor_value(moe_load_factor, "moe_load_factor")
    reserved = comm_reserved_sms_value(comm_reserved_sms, "comm_reserved_sms")
    restricting = {"precision": precision if precision != "bf16" else None, "stack": stack, "launcher": launcher,
                   "constraints": constraints, "adam_moment_bytes": moment_bytes if moment_bytes != 4 else None,
                   "activation_fp8_input_store": activation_fp8_input_store or None,
                   "moe_load_factor": load if load != 1.0 else None,
                   "comm_reserved_sms": reserved or None}
    if launcher is not None:
        from planner.export import launcher_spaces
        launcher_spaces(launcher)
    if constraints is not None:  # a set that leaves the stack or launcher nothing fails once, here
        from planner.export.spaces import launcher_spaces, stack_spaces
        from planner.search.space import SearchSpace
        if run_stack is not None:
            spaces = stack_spaces(run_stack, launcher, precision)
        elif launcher is not None:
            spaces = launcher_spaces(launcher, precision=precision)
        else:
            spaces = [SearchSpace(precision=precision)]
        constraints.narrow(spaces, f"stack {stack}" if stack is not None else launcher or "the search")
    for name, value in restricting.items():
        if value is None:
            continue
        if search is not None:
            raise PlannerError(f"{name} shapes the default search; a custom search must apply it itself",
                               source=name)
        search_kw[name] = value
    fn = search or default_search
    jobs = [(s, search_kw, fn) for s in jobs_list]
    total = len(jobs)
    if processes is None:
        processes = (os.cpu_count() or 1) if total >= PARALLEL_MIN_SCENARIOS else 1
    if processes < 1:
        raise PlannerError(f"must be >= 1, got {processes}", source="processes")

    bar = None
    if progress is True:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn, TimeRemainingColumn
        bar = Progress("sweep", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn())
        task = bar.add_task("sweep", total=total)
        bar.start()

        def report(done: int, _total: int) -> None:
            bar.update(task, completed=done)
    elif callable(progress):
        report = progress
    else:
        def report(done: int, _total: int) -> None:
            return None

    varied_of = {c.name: values for c, values in zip(cluster_list, varied) if values}  # variants are named uniquely
    rows: list[dict[str, Any] | None] = [None] * total
    done = 0

    def arrive(i: int, row: dict[str, Any]) -> None:
        """A finished scenario: its cost and varied-hardware columns, then stored, reported and streamed."""
        nonlocal done
        scenario = jobs_list[i]
        _, cluster = _resolve(scenario.model, scenario.cluster)
        if row["feasible"]:
            row.update(cost_columns(row["tokens_per_s"], row["num_gpus"], _price(cluster, prices), train_tokens))
        row.update(varied_of.get(cluster.name, {}))
        rows[i] = row
        done += 1
        report(done, total)
        if on_row is not None:
            on_row(i, row)

    try:
        if backend == "dask":
            _run_dask(jobs, processes, scheduler, arrive)
        elif processes == 1 or total <= 1:
            for i, job in enumerate(jobs):
                arrive(i, run_scenario(job))
        else:
            from concurrent.futures import ProcessPoolExecutor

            workers = min(processes, total)
            chunk = max(1, total // (workers * CHUNKS_PER_WORKER))
            with ProcessPoolExecutor(max_workers=workers) as pool:
                for i, row in enumerate(pool.map(run_scenario, jobs, chunksize=chunk)):  # in submission order
                    arrive(i, row)
    finally:
        if bar is not None:
            bar.stop()
    columns = list(COLUMNS[:len(SCENARIO_COLUMNS)]) + list(vary or ()) + list(COLUMNS[len(SCENARIO_COLUMNS):])
    return pd.DataFrame(rows, columns=columns)


def run_chunk(chunk: list[tuple[int, Any]]) -> list[tuple[int, dict[str, Any]]]:
    """Scenarios of one dask task, each with its index in the sweep (picklable, runs on dask workers)."""
    return [(i, run_scenario(job)) for i, job in chunk]


def _run_dask(jobs: list[Any], processes: int | None, scheduler: str | None,
              arrive: Callable[[int, dict[str, Any]], None]) -> None:
    """The scenarios as dask.distributed tasks (chunks of them, like the process pool's), on the scheduler at
    ``scheduler`` or on a local cluster of ``processes`` single-threaded worker processes; each row is handed to
    ``arrive`` as its task finishes (any order: the caller keeps scenario order)."""
    try:
        from distributed import Client, LocalCluster, as_completed
    except ImportError:
        raise PlannerError("the dask backend needs dask.distributed", source="--backend",
                           fix="pip install 'distributed' (or the project's [cluster] extra), or use --backend "
                               "process") from None
    import logging

    cluster = None
    try:
        if scheduler is not None:
            try:
                client = Client(scheduler, timeout="10s")
            except (OSError, TimeoutError) as e:
                raise PlannerError(f"cannot reach the dask scheduler: {e}", source="--scheduler",
                                   fix="give the address a running `dask scheduler` prints (tcp://host:8786)")
        else:
            cluster = LocalCluster(n_workers=processes or os.cpu_count() or 1, threads_per_worker=1, processes=True,
                                   dashboard_address=None, silence_logs=logging.ERROR)
            client = Client(cluster)
        with client:
            workers = max(1, len(client.scheduler_info().get("workers", {})) or (processes or 1))
            size = max(1, len(jobs) // (workers * CHUNKS_PER_WORKER))
            indexed = list(enumerate(jobs))
            chunks = [indexed[k:k + size] for k in range(0, len(indexed), size)]
            futures = [client.submit(run_chunk, c, pure=False) for c in chunks]
            for future in as_completed(futures):
                for i, row in future.result():
                    arrive(i, row)
    finally:
        if cluster is not None:
            cluster.close()


def pareto_front(df: "Any", x: str = "peak_memory_gib", y: str = "tokens_per_s",
                 minimize_x: bool = True, maximize_y: bool = True) -> "Any":
    """Rows of ``df`` no other row beats on both ``x`` and ``y`` (e.g. less memory and more throughput), sorted by
    ``x``. Ties on both keep the first row."""
    data = df.dropna(subset=[x, y])
    sx = data[x] if minimize_x else -data[x]
    sy = -data[y] if maximize_y else data[y]
    order = sorted(range(len(data)), key=lambda i: (sx.iloc[i], sy.iloc[i]))
    keep, best = [], float("inf")
    for i in order:
        if sy.iloc[i] < best:
            keep.append(i)
            best = sy.iloc[i]
    return data.iloc[keep]

