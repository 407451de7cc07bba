"""Megatron-LM exports checked by Megatron-Core's own configuration classes (issue 11): the arguments of every
export of a spread of plans become ``TransformerConfig`` (``MLATransformerConfig`` for MLA models) and
``DistributedDataParallelConfig`` fields, whose ``__post_init__`` runs Megatron-Core's rules (parallel degrees, MoE and
expert parallelism, recompute modules, fp8 recipes, the all-to-all overlap, the pipeline layout string, which it
parses itself), on the CPU.

Megatron-LM's own ``parse_args`` lives in ``megatron.training``, which the megatron-core wheel does not ship; the
step from arguments to config fields is Megatron-LM's ``core_transformer_config_from_args`` (an argument whose name,
dashes as underscores, is a config field sets it) plus the renames it makes, written out below. Arguments of the
training loop (batch sizes, data, optimizer) are not config fields and are left to Megatron-LM.
"""

from __future__ import annotations

import dataclasses
import enum
import subprocess
import typing
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from megatron.core.distributed import DistributedDataParallelConfig
from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

from planner.errors import PlannerError
from planner.export import emit

from test_launchers import CONFIGS, _plan, _plans

#: Megatron-LM argument -> config field, where the names differ (megatron/training/arguments.py
#: core_transformer_config_from_args and the DDP config built in megatron/training/training.py)
RENAMES = {"num_experts": "num_moe_experts", "fp8_format": "fp8",
           "accumulate_allreduce_grads_in_fp32": "grad_reduce_in_fp32",
           "decoder_first_pipeline_num_layers": "num_layers_in_first_pipeline_stage",
           "decoder_last_pipeline_num_layers": "num_layers_in_last_pipeline_stage",
           "disable_bias_linear": None, "swiglu": None, "group_query_attention": None, "bf16": "bf16",
           "num_layers_per_virtual_pipeline_stage": None, "untie_embeddings_and_output_weights": None,
           "multi_latent_attention": None}

#: every Megatron-Core MoE / fp8 / overlap plan the spread below adds to the launcher conformance spread
EXTRA = [
    dict(model="mixtral-8x7b", num_gpus=64, tp=2, pp=2, vpp=2, schedule="interleaved-1f1b", ep=8,
         global_batch_size=64, seq_len=4096, precision="fp8", recompute_modules="core_attn,moe"),
    dict(model="mixtral-8x7b", num_gpus=64, pp=2, vpp=2, schedule="interleaved-1f1b", ep=8, global_batch_size=64,
         recompute="none", ep_comm_overlap=True),
    dict(model="deepseek-v3", num_gpus=256, pp=8, ep=32, global_batch_size=256, seq_len=4096, precision="fp8",
         recompute_modules="layernorm,mla_up_proj,moe_act"),
    dict(model="llama-3.1-8b", num_gpus=16, tp=2, pp=2, global_batch_size=32, seq_len=8192,
         layers_per_stage=(15, 17), recompute_modules="core_attn,layernorm,mlp"),
    # the kernel and fp8-weight options of the megatron-core stack: --attention-backend, --fp8-param-gather (and the
    # grad-buffer reuse DistributedDataParallelConfig asks of mxfp8)
    dict(model="llama-3.1-8b", num_gpus=16, tp=2, global_batch_size=32, seq_len=8192, precision="fp8",
         fp8_param_gather=True, attention_kernel="cudnn"),
    dict(model="llama-3.1-8b", num_gpus=16, tp=2, global_batch_size=32, seq_len=8192, precision="mxfp8",
         fp8_param_gather=True, attention_kernel="flash-attention-3"),
    # sliding-window attention on alternate layers (gpt-oss: --window-size 128,0 --window-attn-skip-freq 2)
    dict(model="planner/validation/models/gpt-oss-120b.json", num_gpus=64, ep=8, global_batch_size=64,
         seq_len=4096),
    # MoE layers between dense ones (Llama 4 Maverick: --moe-layer-freq '([0,1]*24)')
    dict(model="llama-4-maverick", num_gpus=64, tp=2, pp=2, ep=8, etp=1, global_batch_size=64, seq_len=8192),
    # the flex dispatcher's backends (--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep|hybridep)
    dict(model="deepseek-v3", num_gpus=256, pp=8, ep=32, global_batch_size=256, seq_len=4096, precision="fp8",
         recompute_modules="layernorm,mla_up_proj,moe_act", ep_dispatcher="deepep"),
    dict(model="mixtral-8x7b", num_gpus=64, pp=2, vpp=2, schedule="interleaved-1f1b", ep=8, global_batch_size=64,
         recompute="none", ep_comm_overlap=True, ep_dispatcher="hybridep"),
    # blocking pipeline sends with virtual stages (--no-overlap-p2p-communication: the megatron-2021 stack's)
    dict(model="llama-3.1-8b", num_gpus=16, tp=2, pp=2, vpp=2, schedule="interleaved-1f1b", global_batch_size=32,
         seq_len=8192, overlap_p2p_comm=False),
]


def _args(text: str) -> list[str]:
    """The PLANNER_ARGS array of an exported script, as bash reads it."""
    out = subprocess.run(["bash", "-c", 'source /dev/stdin; printf "%s\\n" "${PLANNER_ARGS[@]}"'], input=text,
                         capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def _options(args: list[str]) -> dict[str, list[str]]:
    """``--name v1 v2`` -> {"name": ["v1", "v2"]}, a flag -> []."""
    opts: dict[str, list[str]] = {}
    name = None
    for a in args:
        if a.startswith("--"):
            name = a[2:].replace("-", "_")
            opts[name] = []
        elif name is not None:
            opts[name].append(a)
    return opts


def _convert(value: list[str], annotation):
    """A field's value from its argument's words, by the field's declared type."""
    if not value:
        return True
    origin = typing.get_origin(annotation)
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if origin in (list, typing.List) or any(typing.get_origin(a) in (list, typing.List) for a in args):
        return list(value)
    word = value[0]
    for kind in ([annotation] if not args else args):
        if isinstance(kind, type) and issubclass(kind, enum.Enum):  # Megatron-LM's argument_utils: Enum[name]
            return kind[word]
        if kind is bool:
            return word.lower() in ("1", "true")
        if kind in (int, float):
            try:
                return kind(word)
            except ValueError:
                continue
    return word


def configs_from_args(args: list[str]):
    """(TransformerConfig, DistributedDataParallelConfig) as Megatron-LM would build them from ``args``."""
    opts = _options(args)
    mla = "multi_latent_attention" in opts
    cls = MLATransformerConfig if mla else TransformerConfig
    tf_fields = {f.name: f for f in dataclasses.fields(cls)}
    ddp_fields = {f.name: f for f in dataclasses.fields(DistributedDataParallelConfig)}
    hints = typing.get_type_hints(cls)
    ddp_hints = typing.get_type_hints(DistributedDataParallelConfig)
    tf, ddp = {}, {}
    for name, value in opts.items():
        if name in ("moe_layer_freq", "window_attn_skip_freq", "no_rope_freq"):  # Megatron-LM's moe_freq_type /
            # no_rope_freq_type: an int, or a Python list expression it evaluates
            word = value[0]
            tf[name] = eval(word, {"__builtins__": {}}) if "[" in word else int(word)
            continue
        if name == "window_size":  # Megatron-LM's tuple_type: "128,0" -> (128, 0)
            tf[name] = tuple(int(i) for i in value[0].strip("()").split(","))
            continue
        field = RENAMES.get(name, name)
        if field is None:
            continue
        if field in tf_fields:
            tf[field] = _convert(value, hints[field])
        if field in ddp_fields:
            ddp[field] = _convert(value, ddp_hints[field])
    # the renames core_transformer_config_from_args makes by hand: one --cp-comm-type for every layer is a string
    if isinstance(tf.get("cp_comm_type"), list) and len(tf["cp_comm_type"]) == 1:
        tf["cp_comm_type"] = tf["cp_comm_type"][0]
    if "swiglu" in opts:
        tf.update(gated_linear_unit=True, activation_func=F.silu, bias_activation_fusion=True)
    tf["add_bias_linear"] = "disable_bias_linear" not in opts
    if "group_query_attention" not in opts:
        tf.pop("num_query_groups", None)
    # params_dtype from --bf16 / --fp16, and the pipeline's send dtype is the same (core_transformer_config_from_args)
    dtype = torch.bfloat16 if "bf16" in opts else torch.float16 if "fp16" in opts else torch.float32
    tf["params_dtype"] = tf["pipeline_dtype"] = dtype
    if "num_layers_per_virtual_pipeline_stage" in opts:
        per = int(opts["num_layers_per_virtual_pipeline_stage"][0])
        tf["virtual_pipeline_model_parallel_size"] = tf["num_layers"] // tf["pipeline_model_parallel_size"] // per
    # --no-overlap-p2p-communication is store_false into overlap_p2p_comm, which arguments.py keeps only with virtual
    # stages; batch_p2p_comm is its opposite (core_transformer_config_from_args)
    interleaved = tf.get("virtual_pipeline_model_parallel_size") or tf.get("pipeline_model_parallel_layout")
    tf["overlap_p2p_comm"] = bool(interleaved) and "no_overlap_p2p_communication" not in opts
    tf["batch_p2p_comm"] = not tf["overlap_p2p_comm"]
    tf.setdefault("num_layers", 1)
    return cls(**tf), DistributedDataParallelConfig(**ddp)


@pytest.fixture(autouse=True)
def _transformer_engine_of_the_recipes(monkeypatch):
    """Transformer Engine is not installable on a CPU machine; where Megatron-Core's rules ask its version (fp8 with
    moe_act / layernorm recomputation needs TE >= 2.6), answer as a current TE would: the recipes run TE 2.x."""
    import megatron.core.transformer.transformer_config as tc

    monkeypatch.setattr(tc, "is_te_min_version", lambda *a, **k: True, raising=False)


def _megatron_plans():
    """The launchers' spread planned for Megatron-LM, the extra plans above, each with its export (a hand-written
    corner Megatron-LM cannot run, a torchtitan-only schedule, is left out by the exporter's refusal)."""
    out = [(n, p) for n, p in _plans("megatron")]
    out += [(f"megatron-extra-{i}-{Path(spec['model']).stem}", _plan(spec)) for i, spec in enumerate(EXTRA)]
    kept = []
    for name, plan in out:
        try:
            kept.append((name, plan, emit(plan, "megatron")))
        except PlannerError as e:
            if "cannot run" not in str(e):
                raise
    return kept


MEGATRON_PLANS = _megatron_plans()


@pytest.mark.parametrize("name, plan, text", MEGATRON_PLANS, ids=lambda x: x if isinstance(x, str) and
                         not x.startswith("#") else "")
def test_megatron_core_accepts_every_export(name, plan, text):
    tf, ddp = configs_from_args(_args(text))
    par = plan["parallelism"]
    assert tf.tensor_model_parallel_size == par["tp"] and tf.pipeline_model_parallel_size == par["pp"]
    assert tf.context_parallel_size == par["cp"] and tf.expert_model_parallel_size == par["ep"]
    if par["pp"] > 1 and par["vpp"] > 1:
        assert tf.virtual_pipeline_model_parallel_size == par["vpp"] or tf.pipeline_model_parallel_layout is not None
    if plan["recompute"]["mode"] == "selective":
        assert tf.recompute_granularity == "selective"
        assert sorted(tf.recompute_modules) == sorted(plan["recompute"].get("modules", ["core_attn"]))
    if plan["options"].get("ep_comm_overlap"):
        assert tf.overlap_moe_expert_parallel_comm
    if plan.get("layers_per_stage") and tf.pipeline_model_parallel_layout is not None:
        # Megatron-Core parsed the layout string: its decoder layers per model chunk are the plan's
        layout = tf.pipeline_model_parallel_layout
        assert layout.pipeline_model_parallel_size == par["pp"]
    if par["zero_stage"] <= 1:
        assert ddp.use_distributed_optimizer == (par["zero_stage"] == 1)
    opts = plan["options"]
    if opts.get("fp8_param_gather") and opts.get("precision") in ("fp8", "mxfp8") and par["zero_stage"] >= 1:
        assert ddp.fp8_param_gather and ddp.reuse_grad_buf_for_mxfp8_param_ag == (opts["precision"] == "mxfp8")
    spec = plan["model_spec"]
    if spec.get("num_experts") and (spec.get("moe_layer_pattern") or spec.get("first_k_dense_layers")):
        # the dense and MoE layers where the plan costed them, as Megatron-LM's moe_freq_type reads the list
        pattern = spec.get("moe_layer_pattern") or "D" * spec["first_k_dense_layers"] + "E" * (
            spec["num_layers"] - spec["first_k_dense_layers"])
        assert tf.moe_layer_freq == [int(c == "E") for c in pattern]
    if spec.get("sliding_window") and spec.get("model_type") not in ("llama4", "llama4_text"):
        # each layer windowed or global as the plan costed it, by Megatron-Core's own rule
        from megatron.core.transformer.utils import is_layer_window_attention

        pattern = spec.get("attention_pattern") or "L" * spec["num_layers"]
        assert tf.window_size == (spec["sliding_window"], 0)
        assert [is_layer_window_attention(tf.window_size, tf.window_attn_skip_freq, i + 1)
                for i in range(spec["num_layers"])] == [c == "L" for c in pattern]
    if spec.get("model_type") in ("llama4", "llama4_text") and "G" in spec.get("attention_pattern", ""):
        # Llama 4's global layers skip RoPE: TransformerConfig expands no_rope_freq to one flag per layer
        assert tf.no_rope_freq == [int(c == "G") for c in spec["attention_pattern"]]
    if par["pp"] > 1 and par["vpp"] > 1:  # Megatron-Core's interleaved schedule sends as the plan was costed
        assert tf.overlap_p2p_comm is opts.get("overlap_p2p_comm", True)
    if spec.get("num_experts"):  # the token dispatcher the plan costed (planner.cost.moe)
        dispatcher = opts.get("ep_dispatcher", "alltoall")
        assert tf.moe_token_dispatcher_type == ("alltoall" if dispatcher == "alltoall" else "flex")
        if dispatcher != "alltoall":
            assert tf.moe_flex_dispatcher_backend == dispatcher
    if opts.get("attention_kernel"):  # Megatron-Core's AttnBackend, as Megatron-LM's parser makes it
        assert tf.attention_backend.name == {"cudnn": "fused"}.get(opts["attention_kernel"], "flash")


def test_the_extra_spread_covers_what_it_says():
    assert len(MEGATRON_PLANS) >= len(EXTRA) + 5
    assert any("moe" in s.get("recompute_modules", "") for s in EXTRA)
    assert any(s.get("ep_comm_overlap") for s in EXTRA) and any(s.get("layers_per_stage") for s in EXTRA)
    assert any(s.get("overlap_p2p_comm") is False for s in EXTRA)
    assert {s.get("ep_dispatcher") for s in EXTRA} >= {"deepep", "hybridep"}
    assert any(s["model"] == "llama-4-maverick" for s in EXTRA) and any("gpt-oss" in s["model"] for s in EXTRA)
    assert any(s.get("fp8_param_gather") and s.get("precision") == "mxfp8" for s in EXTRA)
    assert {s.get("attention_kernel") for s in EXTRA} >= {"cudnn", "flash-attention-3"}
    assert CONFIGS  # the launchers' spread is shared


def test_the_swiglu_fp8_input_store_is_refused_by_megatron_core_where_the_planner_refuses_it():
    """``--activation-fp8-input-store`` (TransformerConfig.activation_func_fp8_input_store, which Megatron-Bridge's
    model config sets): Megatron-Core accepts it on every exported SwiGLU model and refuses it on the others, as the
    planner does (planner.specs.stack.activation_fp8_input_store, cost.validity)."""
    seen = set()
    for name, plan, text in MEGATRON_PLANS:
        tf, _ = configs_from_args(_args(text))
        gated = plan["model_spec"].get("gated_mlp", True)
        fields = {f.name: getattr(tf, f.name) for f in dataclasses.fields(tf) if f.init}
        fields["activation_func_fp8_input_store"] = True
        if gated:
            type(tf)(**fields)
        else:
            with pytest.raises(ValueError, match="only for SwiGLU"):
                type(tf)(**fields)
        seen.add(gated)
    assert seen == {True, False}
