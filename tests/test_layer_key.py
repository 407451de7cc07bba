"""The memo of layer costs (``step.LayerCostCache``) keys each configuration by the fields one layer's costs read
(``config.LAYER_FIELDS``), written out by hand in ``step._layer_key``: a field missing there would hand one
configuration another's costs. Each field of LAYER_FIELDS, changed alone where it matters, changes the key."""

from __future__ import annotations

from planner.cost.step import LayerCostCache
from planner.specs.config import LAYER_FIELDS, RunConfig

#: a configuration where every layer field matters: TP with SP, CP, EP, selective recomputation with a fused kernel
BASE = RunConfig(num_gpus=64, tp=2, cp=2, ep=4, global_batch_size=64, seq_len=8192, sequence_parallel=True,
                 recompute="selective", recompute_modules="core_attn", flash_attention=True, precision="fp8",
                 ep_comm_overlap=True, tp_comm_overlap=True, attention_kernel="cudnn")
#: per field of LAYER_FIELDS, a change of it alone
CHANGES = {"tp": dict(tp=4), "cp": dict(cp=4), "cp_kind": dict(cp_kind="ulysses"), "ep": dict(ep=8),
           "micro_batch_size": dict(micro_batch_size=2), "seq_len": dict(seq_len=4096),
           "sequence_parallel": dict(sequence_parallel=False), "recompute": dict(recompute="none"),
           "flash_attention": dict(flash_attention=False), "tp_comm_overlap": dict(tp_comm_overlap=False),
           "precision": dict(precision="bf16"), "expert_tp": dict(etp=1),
           "recompute_modules": dict(recompute_modules="core_attn,mlp"), "ep_comm_overlap": dict(ep_comm_overlap=False),
           "fused_cross_entropy": dict(fused_cross_entropy=False), "packed_doc_len": dict(packed_doc_len=2048.0),
           "offload_modules": dict(offload_modules="core_attn"), "attention_kernel": dict(attention_kernel="flash-attention-3"),
           "per_expert_gemm_calls": dict(per_expert_gemm_calls=False),
           "recompute_fused_attention": dict(recompute_fused_attention=False), "ep_dispatcher": dict(ep_dispatcher="deepep"),
           "activation_fp8_input_store": dict(activation_fp8_input_store=True),
           "moe_load_factor": dict(moe_load_factor=1.25),
           "moe_overlap_fills_issue_gaps": dict(moe_overlap_fills_issue_gaps=False),
           "comm_reserved_sms": dict(comm_reserved_sms=20)}


def test_every_layer_field_changes_the_cache_key():
    assert set(CHANGES) == set(LAYER_FIELDS), "a new layer field: add it to step._layer_key and to CHANGES"
    base = LayerCostCache._key(BASE)
    for field, change in CHANGES.items():
        assert LayerCostCache._key(BASE.with_(**change)) != base, field


def test_fields_that_cannot_matter_share_the_key():
    """The key's normalizations (what lets a search's many configurations share one evaluation): without EP the
    dispatcher and the all-to-all overlap, without TP sequence parallelism, without selective recomputation its
    modules, without a fused kernel the kernel's name, are not part of it."""
    dense = BASE.with_(ep=1)
    assert LayerCostCache._key(dense.with_(ep_dispatcher="deepep")) == LayerCostCache._key(dense)
    assert LayerCostCache._key(dense.with_(ep_comm_overlap=False)) == LayerCostCache._key(dense)
    one = BASE.with_(tp=1)
    assert LayerCostCache._key(one.with_(sequence_parallel=False)) == LayerCostCache._key(one)
    full = BASE.with_(recompute="full")
    assert LayerCostCache._key(full.with_(recompute_modules="core_attn,mlp")) == LayerCostCache._key(full)
    unfused = BASE.with_(flash_attention=False)
    assert LayerCostCache._key(unfused.with_(attention_kernel="flash-attention-3")) == LayerCostCache._key(unfused)
