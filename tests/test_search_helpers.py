"""The search's array helpers against the numpy functions they replace (hypothesis): the distinct rows of a
group table (``np.unique(axis=0)``) and the lazily sorted group order (``np.argsort(kind="stable")``)."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from planner.search.bounds import _unique_rows
from planner.search.engine import _AscendingOrder

_columns = st.integers(1, 5).flatmap(lambda k: st.integers(0, 300).flatmap(lambda n: st.lists(
    hnp.arrays(np.int32, n, elements=st.one_of(st.integers(0, 3), st.integers(0, 20000), st.integers(-5, 5))),
    min_size=k, max_size=k)))


@settings(max_examples=150, deadline=None)
@given(_columns)
def test_unique_rows_is_numpys_unique_over_rows(cols):
    uniq, inv = _unique_rows(*cols)
    table = np.stack(cols, axis=1).astype(np.int64)
    want, want_inv = np.unique(table, axis=0, return_inverse=True)
    assert np.array_equal(uniq, want)
    assert np.array_equal(inv, want_inv.reshape(-1))
    assert np.array_equal(uniq[inv], table)


def test_unique_rows_of_a_wide_key_falls_back_to_sorting():
    """Columns whose joint span is beyond a presence table's still give numpy's answer."""
    rng = np.random.default_rng(0)
    cols = [rng.integers(0, 50_000, 4_000) for _ in range(4)]
    uniq, inv = _unique_rows(*cols)
    want, want_inv = np.unique(np.stack(cols, axis=1), axis=0, return_inverse=True)
    assert np.array_equal(uniq, want) and np.array_equal(inv, want_inv.reshape(-1))


_values = hnp.arrays(np.float64, st.integers(0, 400), elements=st.one_of(
    st.sampled_from([0.0, 1.0, 2.5, np.inf, np.nan]), st.floats(-1e3, 1e3)))


@settings(max_examples=150, deadline=None)
@given(_values, st.integers(1, 64), st.lists(st.integers(0, 450), max_size=6))
def test_ascending_order_is_the_stable_argsort(values, block, stops):
    order = _AscendingOrder(values, block)
    want = np.argsort(values, kind="stable")
    assert len(order) == len(values)
    for stop in stops:  # read piecewise, in any order of lengths, as the search does
        assert np.array_equal(order.head(stop), want[:stop])
    assert np.array_equal(order.slice(0, len(values)), want)
    if len(values):
        assert order[len(values) - 1] == want[-1]


def test_a_layer_keys_costs_are_the_same_in_any_batch():
    """The search seeds an exact evaluation under full or no recomputation from a one-key batch, and under selective
    recomputation from the bounds' batch of every key: the cost model's batch functions are elementwise over keys,
    so a key's costs must not depend on the batch around it (to the bit)."""
    from planner.cost.step import _floats, batch_costs
    from planner.search.bounds import group_tables, layer_key_batch
    from planner.search.space import build_space
    from planner.specs.hardware import load_cluster
    from planner.specs.model import load_model
    for name, cluster, gpus, batch, seq in (("deepseek-v3", "h800-80gb-sxm", 256, 1024, 4096),
                                            ("nemotron-h-56b", "h100-80gb-sxm", 64, 256, 8192)):
        model, hw = load_model(name), load_cluster(cluster)
        space = build_space(model, hw, gpus, batch, seq)
        keys = group_tables(model, hw, space).layer_keys
        for mode in ("none", "selective"):
            full = batch_costs(model, hw, layer_key_batch(space, keys, mode))
            for i in np.random.default_rng(0).choice(len(keys), 12, replace=False):
                one = batch_costs(model, hw, layer_key_batch(space, keys[i:i + 1], mode))
                for k in range(len(full.kinds)):
                    assert _floats(one.kinds[k], 0) == _floats(full.kinds[k], i), (name, mode, i, k)
                assert _floats(one.ends, 0) == _floats(full.ends, i), (name, mode, i)
