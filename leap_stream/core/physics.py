"""The physics a job's configuration implies, per sample and per device: FLOPs, memory
(an estimate and a lower bound), memory traffic and communication bytes, and the shares of
the datasheet peaks a well-tuned job sustains. The feature builder (`core.features`) places
them on each type's peaks; the learned roofline (`core.roofline`) learns the efficiencies."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from leap_stream.core.columns import Frame as Jobs
from leap_stream.core.columns import f64, map_column

# Bytes per parameter for weights + gradients + optimizer state; a coarse estimate, used for the
# fit check and as a feature. The optimizer's state includes the fp32 master copy of the weights
# that mixed precision keeps (`_MASTER_COPY_BYTES`; weights already in fp32 need none).
_MASTER_COPY_BYTES = 4.0
_OPT_STATE_BYTES = {"adamw": 12.0, "adam": 12.0, "lamb": 12.0, "adafactor": 6.0, "lion": 8.0}
_OPT_STATE_DEFAULT = 8.0  # sgd (momentum), adagrad
# Families whose parameters are mostly embedding tables (recommenders: >99 % in DLRM-style
# models); `min_memory_per_device_gib` counts their weights only.
_WEIGHTS_ONLY_FAMILIES = {"recsys": 1.0}
_ELEM_BYTES = {"fp32": 4.0, "tf32": 4.0, "fp16": 2.0, "bf16": 2.0, "fp8": 1.0}
# Share of the dense bf16 peak a precision can use (fp32 rarely hits tensor cores). fp8 runs at
# the part's own fp8 peak where it has one (`_peak_tflops`), else at the bf16 rate.
_PREC_PEAK = {"fp32": 0.125, "tf32": 0.5, "fp16": 1.0, "bf16": 1.0, "fp8": 1.0}
ATTENTION_FLOPS = 12.0  # training FLOPs of attention scores per (layer × hidden × seq²)


# log of 0 is -inf and of a negative NaN, without a warning: the functions calling `_log` are
# decorated with it, one context per feature build (entering one costs more than a log of a
# serving batch). A decorator only: as a decorator numpy's errstate is re-entrant and
# thread-safe, a shared instance used in `with` is neither.
QUIET_LOGS = np.errstate(divide="ignore", invalid="ignore")


def _log(x: np.ndarray) -> np.ndarray:
    """Natural log as float64; call it under `QUIET_LOGS`."""
    return np.log(np.asarray(x, dtype=np.float64))


def _elem_bytes(jobs: Jobs) -> np.ndarray:
    return map_column(jobs, "precision", _ELEM_BYTES, 2.0)


def _opt_bytes(jobs: Jobs) -> np.ndarray:
    return map_column(jobs, "optimizer", _OPT_STATE_BYTES, _OPT_STATE_DEFAULT)


def _active_params(jobs: Jobs) -> np.ndarray:
    active, params = f64(jobs, "active_parameters"), f64(jobs, "parameters")
    return np.where(np.isnan(active), params, active)


def memory_per_device_gib(jobs: Jobs, elem: np.ndarray | None = None) -> np.ndarray:
    """Estimated peak memory per device: sharded model state plus micro-batch activations."""
    params = f64(jobs, "parameters")
    elem = _elem_bytes(jobs) if elem is None else elem
    opt = _opt_bytes(jobs)
    tp = f64(jobs, "tensor_parallel")
    pp = f64(jobs, "pipeline_parallel")
    state = params * (2.0 * elem + opt) / (tp * pp)
    seq = f64(jobs, "sequence_length")
    hidden = f64(jobs, "hidden_size")
    layers = f64(jobs, "layers")
    mbs = f64(jobs, "micro_batch_size")
    ckpt = np.asarray(jobs["activation_checkpointing"], bool)
    per_layer = np.where(ckpt, 2.0, 16.0)  # elements per (token × hidden) kept per layer
    acts = mbs * seq * hidden * (layers / pp) * per_layer * elem / tp
    return np.asarray((state + acts) / 2**30)


def min_memory_per_device_gib(jobs: Jobs, elem: np.ndarray | None = None) -> np.ndarray:
    """A lower bound: model state fully sharded over every device (ZeRO-3 / FSDP, row-sharded
    embeddings) plus the activations a checkpoint at every layer keeps (one element per token
    and hidden unit of a layer; the layer being recomputed is left out). A candidate is
    excluded only when even this does not fit, because the submission does not say how the
    job shards its state or recomputes."""
    state, acts = memory_parts_gib(jobs, elem)
    return np.asarray(state / f64(jobs, "num_devices") + acts)


def memory_parts_gib(jobs: Jobs, elem: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The two parts of `min_memory_per_device_gib`: the whole model state (to be divided by
    the devices) and the activations per device (whatever the data-parallel degree). Weights
    kept in fp32 need no fp32 master copy in the optimizer state. A family whose parameters are
    embedding tables (`_WEIGHTS_ONLY_FAMILIES`) counts its weights alone: their gradients are
    sparse and their optimizers keep state per row, not per parameter."""
    params = f64(jobs, "parameters")
    elem = _elem_bytes(jobs) if elem is None else elem
    opt = _opt_bytes(jobs) - np.where(elem >= _MASTER_COPY_BYTES, _MASTER_COPY_BYTES, 0.0)
    weights_only = map_column(jobs, "family", _WEIGHTS_ONLY_FAMILIES, 0.0) > 0.0
    state = params * np.where(weights_only, elem, 2.0 * elem + opt)
    seq = f64(jobs, "sequence_length")
    hidden = f64(jobs, "hidden_size")
    layers = f64(jobs, "layers")
    mbs = f64(jobs, "micro_batch_size")
    tp = f64(jobs, "tensor_parallel")
    pp = f64(jobs, "pipeline_parallel")
    acts = mbs * seq * hidden * (layers / pp) * elem / tp
    return np.asarray(state / 2**30), np.asarray(acts / 2**30)


def flops_per_sample(jobs: Jobs) -> np.ndarray:
    """Training FLOPs per sample: 6·active params per token plus the attention scores,
    12·layers·hidden·seq² (Narayanan et al., SC 2021); 4/3 of that with recomputation."""
    active = _active_params(jobs)
    seq = f64(jobs, "sequence_length")
    attn = ATTENTION_FLOPS * f64(jobs, "layers") * f64(jobs, "hidden_size") * seq * seq
    ckpt = np.asarray(jobs["activation_checkpointing"], bool)
    return np.asarray(np.where(ckpt, 4.0 / 3.0, 1.0) * (6.0 * active * seq + attn))


# NVIDIA parts before Ampere (V100, T4) have fp16 but no bf16 tensor cores: bf16 runs on the
# fp32 units there (datasheets; frameworks emulate it).
BF16_NATIVE_FROM_YEAR = 2020


def _bf16_native(specs: pd.DataFrame) -> np.ndarray:
    if "generation_year" not in specs:
        return np.ones(len(specs), bool)
    year = specs["generation_year"].to_numpy(np.float64)
    old_nvidia = (specs["vendor"].to_numpy(object) == "nvidia") & (year < BF16_NATIVE_FROM_YEAR)
    return np.asarray(~old_nvidia)


# The physics estimate behind log_phys_rate and its parts (a prior the booster corrects; the
# fractions are typical sustained shares of the datasheet peaks for a well-tuned job):
ROOFLINE_SHARE = 0.4  # log_roofline: samples/s at this share of peak FLOP/s
COMPUTE_SHARE = 0.45  # of peak FLOP/s (times the precision's peak multiplier) sustained
MEMORY_SHARE = 0.7  # of peak memory bandwidth sustained
OVERLAP_RESIDUE = 0.2  # compute and memory time overlap but for this share of the shorter
DP_EXPOSED = 0.5  # share of the gradient all-reduce not hidden behind the backward pass
ACTIVATION_BYTES = 16.0  # bytes moved per (token × hidden × layer × element) for activations
WEIGHT_PASSES = 6.0  # weight reads per micro-batch (forward, backward, optimizer)
TP_BYTES = 16.0  # tensor-parallel all-reduce bytes per (token × hidden × element) per layer
A2A_BYTES = 4.0  # all-to-all bytes per (token × hidden × element) per layer: dispatch + combine,
# forward and backward (expert-parallel MoE layers, a recommender's pooled embeddings)


@dataclass(frozen=True)
class _JobPhysics:
    """Per-job inputs of the physics estimate (per sample, per device), one array each."""

    fps: np.ndarray  # FLOPs per sample
    mem: np.ndarray  # GiB per device
    prec_peak: np.ndarray  # peak multiplier of the precision
    traffic: np.ndarray  # bytes of memory traffic per sample: activations + weights
    act_traffic: np.ndarray  # of it, the activations' (per sample)
    weight_traffic: np.ndarray  # of it, the weights' (read per micro-batch)
    grad: np.ndarray  # gradient all-reduce bytes per sample
    tp_bytes: np.ndarray  # tensor-parallel all-reduce bytes per sample
    a2a_bytes: np.ndarray  # all-to-all bytes per sample, were every layer to exchange its tokens
    micro_flops: np.ndarray  # FLOPs of one micro-batch per device
    is_fp8: np.ndarray
    is_bf16: np.ndarray
    devices: np.ndarray
    tp: np.ndarray

    @classmethod
    def of(cls, jobs: Jobs, elem: np.ndarray) -> _JobPhysics:
        gbs, dp = f64(jobs, "global_batch_size"), f64(jobs, "data_parallel")
        tp, pp = f64(jobs, "tensor_parallel"), f64(jobs, "pipeline_parallel")
        mbs, seq = f64(jobs, "micro_batch_size"), f64(jobs, "sequence_length")
        hid, lay = f64(jobs, "hidden_size"), f64(jobs, "layers")
        act, par = _active_params(jobs), f64(jobs, "parameters")
        fps = flops_per_sample(jobs)
        act_traffic = ACTIVATION_BYTES * seq * hid * lay * elem
        weight_traffic = WEIGHT_PASSES * act * elem / mbs
        samples_per_dev_step = gbs / f64(jobs, "num_devices")
        grad = (
            np.where(dp > 1, 2.0 * (dp - 1) / dp * par * 2.0 * elem / (tp * pp), 0.0)
            / samples_per_dev_step
        )
        return cls(
            fps=fps,
            mem=memory_per_device_gib(jobs, elem),
            prec_peak=map_column(jobs, "precision", _PREC_PEAK, 1.0),
            traffic=act_traffic + weight_traffic,
            act_traffic=act_traffic,
            weight_traffic=weight_traffic,
            grad=grad,
            tp_bytes=np.where(
                tp > 1, TP_BYTES * (lay / pp) * seq * hid * elem * (tp - 1) / tp**2, 0.0
            ),
            a2a_bytes=A2A_BYTES * (lay / pp) * seq * hid * elem / tp,
            micro_flops=mbs * fps / (tp * pp),
            is_fp8=np.asarray(jobs["precision"], object) == "fp8",
            is_bf16=np.asarray(jobs["precision"], object) == "bf16",
            devices=f64(jobs, "num_devices"),
            tp=tp,
        )
