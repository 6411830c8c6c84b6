"""The latent throughput function: what a job would really achieve on a hardware type.

Pure and vectorised: every argument is an array over (job × candidate) rows. The structure is
the one a performance engineer would sketch on a whiteboard, so a learned model has something
real to find and the prior-throughput feature has something real to reveal:

* roofline per micro-batch: time = max(FLOPs / (peak · MFU), bytes / (bandwidth · efficiency)),
  softened so a kernel near the ridge is slower than either bound alone;
* small-work penalty: tiny micro-batches cannot fill a big chip (launch and sync overheads);
* parallelism: tensor-parallel all-reduces over the scale-up link, pipeline bubbles,
  data-parallel gradient all-reduce (partly overlapped with backward) over the scale-up link
  inside a node and the scale-out network across nodes, MoE all-to-all, recsys embedding all-to-all;
* software maturity per (family × vendor) and framework effects per (framework × vendor);
* memory fit: a job whose per-device footprint exceeds the device memory is not eligible.

Multiplicative per-lineage, per-(model type × hardware) and drift factors and measurement noise
are applied by the fleet (``fleet.py``), not here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from leap_stream.catalog import HardwareCatalog, HardwareSpec
from leap_stream.contracts.vocab import OPTIMIZERS, VENDORS

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]


# Fraction of peak a well-tuned job of each family reaches when compute-bound (on NVIDIA).
FAMILY_MFU = np.array([0.50, 0.38, 0.48, 0.42, 0.46, 0.40, 0.30, 0.38, 0.22])
# Software maturity (rows: FAMILIES, cols: VENDORS). NVIDIA is the reference.
MATURITY = np.array(
    [
        # nvidia amd  google aws   intel
        [1.00, 0.74, 1.02, 0.82, 0.64],  # dense_llm: XLA on TPU is excellent for dense LLMs
        [1.00, 0.64, 0.98, 0.62, 0.48],  # moe_llm: custom MoE kernels lag outside CUDA
        [1.00, 0.74, 0.97, 0.80, 0.66],  # encoder
        [1.00, 0.70, 0.82, 0.62, 0.62],  # vision_cnn: conv kernels, NHWC layouts
        [1.00, 0.72, 0.98, 0.72, 0.62],  # vision_vit
        [1.00, 0.66, 0.86, 0.56, 0.42],  # diffusion: Gaudi and Trainium lag on UNets
        [1.00, 0.62, 0.88, 0.50, 0.44],  # recsys: embedding kernels (TPU SparseCore helps)
        [1.00, 0.66, 0.86, 0.62, 0.50],  # speech
        [1.00, 0.55, 0.40, 0.36, 0.36],  # gnn: scatter/gather heavy, poor on XLA devices
    ]
)
# Recalibration against real measurements (benchmarks/sim_vs_real.py, docs/model.md): in the
# public MLPerf Training v1.1-v3.1 results (../shared/data) Gaudi1 ran 1.4x and Gaudi2 1.8-2.3x
# faster against A100 and H100 than the table above made them. One factor for the Habana stack
# both share; the rest of Gaudi2's gap is left to the vendor tuning of MLPerf entries.
MATURITY[:, 4] *= 1.5
# Framework effect (rows: FRAMEWORKS, cols: VENDORS).
FRAMEWORK_EFFECT = np.array(
    [
        [1.00, 1.00, 0.62, 0.92, 0.96],  # pytorch (torch_xla on TPU is the weak spot)
        [0.94, 0.82, 1.14, 0.86, 1.00],  # jax
        [0.90, 0.80, 1.00, 1.00, 1.00],  # tensorflow
    ]
)
# Which frameworks run at all on a vendor's stack (training).
FRAMEWORK_SUPPORT = np.array(
    [
        [True, True, True, True, True],  # pytorch
        [True, True, True, True, False],  # jax (no Gaudi training support)
        [True, True, True, False, False],  # tensorflow (no Neuron / Habana training)
    ]
)
# Peak multiplier by precision (index: PRECISIONS). fp8 uses the fp8 peak where there is one.
PRECISION_PEAK = np.array([0.22, 0.50, 1.0, 1.0, 1.0])
PRECISION_BYTES = np.array([4.0, 4.0, 2.0, 2.0, 1.0])  # activation element size
# bytes per parameter for weights + grads, and for optimizer states (mixed precision keeps fp32
# master weights in the optimizer part).
_OPT_BYTES = {
    "adamw": 12.0,
    "adam": 12.0,
    "sgd": 8.0,
    "adafactor": 4.5,
    "lamb": 12.0,
    "lion": 8.0,
    "adagrad": 8.0,
}
OPT_BYTES = np.array([_OPT_BYTES[o] for o in OPTIMIZERS])
FP8_EFFICIENCY = 0.72  # share of the fp8 peak speed-up real training keeps (scaling, casts)
BW_EFFICIENCY = 0.75
# Share of the datasheet matrix peak a part sustains under training load, where power caps it
# below its boost clock: the 72 W L4 ran 1.6-2x slower against H100 in MLPerf Training v3.x
# (../shared/data) than its 121 TFLOPS predict (docs/decisions/0007). Every other part: 1.
SUSTAINED_PEAK = {"l4": 0.55}
PEAK_EFFICIENCY_EXP = 0.15
MEMORY_OVERLAP_LOSS = 0.6
SMALL_WORK_S = 0.004  # ideal compute time of a micro-batch at which efficiency is halved
DP_OVERLAP = 0.65  # share of the gradient all-reduce hidden behind backward
MEMORY_HEADROOM = 0.92  # usable share of device memory (allocator fragmentation, workspace)
MEMORY_OVERHEAD_GIB = 1.5  # context, communication buffers
CKPT_ACT_SHARE = 0.12  # activation memory kept with full activation checkpointing
CKPT_RECOMPUTE = 4.0 / 3.0  # extra forward pass


@dataclass(frozen=True)
class HardwareArrays:
    """Catalog columns as arrays (index = position in ``catalog.types``) plus simulator quirks."""

    types: tuple[str, ...]
    vendor_idx: I64
    peak_tflops: F64
    fp8_tflops: F64  # 0 when the part has no fp8 path
    bandwidth_gbps: F64
    interconnect_gbps: F64
    network_gbps: F64  # per-device scale-out bandwidth between nodes
    memory_gib: F64
    node_size: I64  # devices sharing the scale-up domain
    bf16_native: B  # False: bf16 runs through a slow path (pre-Ampere NVIDIA)
    cost: F64
    sustained: F64  # SUSTAINED_PEAK

    @classmethod
    def from_catalog(cls, catalog: HardwareCatalog) -> HardwareArrays:
        """The catalog's types; their deployment (`scale_up_domain`, `network_gbps`) from the
        catalog, guessed from the part where a catalog does not say (`_deployment`)."""
        specs = [catalog[t] for t in catalog.types]
        vendor = np.array([VENDORS.index(s.vendor) for s in specs], dtype=np.int64)
        ic = np.array([s.interconnect_gbps for s in specs], dtype=np.float64)
        deployed = [_deployment(s) for s in specs]
        node = np.array([d[0] for d in deployed], dtype=np.int64)
        net = np.array([d[1] for d in deployed], dtype=np.float64)
        bf16 = np.array(
            [not (s.vendor == "nvidia" and (s.generation_year or 2020) < 2020) for s in specs]
        )
        return cls(
            types=tuple(catalog.types),
            vendor_idx=vendor,
            peak_tflops=np.array([s.peak_bf16_tflops for s in specs], dtype=np.float64),
            fp8_tflops=np.array([s.peak_fp8_tflops or 0.0 for s in specs], dtype=np.float64),
            bandwidth_gbps=np.array([s.memory_bandwidth_gbps for s in specs], dtype=np.float64),
            interconnect_gbps=ic,
            network_gbps=net,
            memory_gib=np.array([s.device_memory_gib for s in specs], dtype=np.float64),
            node_size=node,
            bf16_native=bf16,
            cost=np.array([s.cost_per_device_hour for s in specs], dtype=np.float64),
            sustained=np.array([SUSTAINED_PEAK.get(s.type_id, 1.0) for s in specs]),
        )


def _deployment(spec: HardwareSpec) -> tuple[int, float]:
    """(devices per scale-up domain, scale-out GB/s per device): the catalog's; where a catalog
    does not say, a guess from the part: a TPU's ICI spans its pod on a slow data-centre
    network between pods, NVLink-class parts sit 8 to a node on 400 Gb/s per device, PCIe
    cards 2-4 to a host on 50-200 Gb/s."""
    ic = spec.interconnect_gbps
    if spec.vendor == "google":
        node, net = 4096, 12.5
    else:
        node = 8 if ic >= 300 else 4 if ic >= 64 else 2
        net = 50.0 if ic >= 300 else 25.0 if ic >= 100 else 6.25
    return spec.scale_up_domain or node, spec.network_gbps or net


@dataclass
class JobArrays:
    """Per-row job configuration and model terms (all arrays of one length)."""

    family_idx: I64
    framework_idx: I64
    precision_idx: I64
    optimizer_idx: I64
    parameters: F64
    active_parameters: F64
    embedding_params: F64
    layers: F64
    hidden: F64
    seq: F64
    flops_per_unit: F64
    attn_flops_per_unit2: F64
    traffic_per_unit: F64
    fixed_bytes: F64
    act_mem_per_unit: F64
    a2a_bytes: F64
    experts: F64
    top_k: F64
    global_batch: F64
    micro_batch: F64
    num_devices: F64
    dp: F64
    tp: F64
    pp: F64
    ckpt: B
    sharded: B  # optimizer states sharded over dp (ZeRO-1/FSDP)

    def take(self, idx: I64) -> JobArrays:
        return JobArrays(**{k: v[idx] for k, v in self.__dict__.items()})


def memory_per_device_gib(job: JobArrays) -> F64:
    """Per-device footprint: model states (sharded by tp·pp, optimizer also by dp when ZeRO) +
    activations of one micro-batch (pp stages each hold ~pp micro-batches of 1/pp of the layers)."""
    prec = job.precision_idx
    wg_bytes = np.where(prec <= 1, 8.0, 4.0)  # fp32/tf32 weights+grads are 4+4 bytes
    opt = OPT_BYTES[job.optimizer_idx] - np.where(prec <= 1, 4.0, 0.0)  # no separate master copy
    model_split = job.tp * job.pp
    opt_split = model_split * np.where(job.sharded, job.dp, 1.0)
    dense = job.parameters - job.embedding_params
    states = dense * (wg_bytes / model_split + opt / opt_split)
    # recsys embeddings are row-sharded over every device, fp32 with a row-wise optimizer
    states = states + job.embedding_params * 8.0 / job.num_devices
    act_unit = job.act_mem_per_unit * (PRECISION_BYTES[prec] / 2.0)
    acts = job.micro_batch * job.seq * act_unit / job.tp
    acts = np.where(job.ckpt, acts * CKPT_ACT_SHARE, acts)
    return np.asarray((states + acts) / 2**30 + MEMORY_OVERHEAD_GIB, dtype=np.float64)


def fits(job: JobArrays, hw: HardwareArrays, hw_idx: I64) -> B:
    return np.asarray(memory_per_device_gib(job) <= hw.memory_gib[hw_idx] * MEMORY_HEADROOM)


def framework_supported(framework_idx: I64, hw: HardwareArrays, hw_idx: I64) -> B:
    return np.asarray(FRAMEWORK_SUPPORT[framework_idx, hw.vendor_idx[hw_idx]])


def step_time_s(job: JobArrays, hw: HardwareArrays, hw_idx: I64) -> F64:
    """Seconds per optimizer step of the whole job on ``hw_idx`` (no maturity factors)."""
    prec = job.precision_idx
    peak = hw.peak_tflops[hw_idx] * PRECISION_PEAK[prec]
    fp8 = hw.fp8_tflops[hw_idx]
    peak = np.where((prec == 4) & (fp8 > 0), np.maximum(peak, fp8 * FP8_EFFICIENCY), peak)
    slow_bf16 = (prec == 3) & ~hw.bf16_native[hw_idx]
    peak = np.where(slow_bf16, peak * 0.15, peak)
    # faster chips reach a smaller share of their peak (latency, host and launch bound parts)
    scale_eff = (hw.peak_tflops[hw_idx] / 312.0) ** -PEAK_EFFICIENCY_EXP
    peak_flops = peak * 1e12 * FAMILY_MFU[job.family_idx] * scale_eff * hw.sustained[hw_idx]

    split = job.tp * job.pp
    ckpt = np.where(job.ckpt, CKPT_RECOMPUTE, 1.0)
    flops_sample = job.flops_per_unit * job.seq + job.attn_flops_per_unit2 * job.seq**2
    flops_micro = job.micro_batch * flops_sample * ckpt / split
    elem = PRECISION_BYTES[prec] / 2.0
    bytes_micro = (
        job.micro_batch * (job.traffic_per_unit * job.seq * elem + job.fixed_bytes)
        + 3.0 * job.active_parameters * 2.0 * elem
    ) / split
    t_c = flops_micro / peak_flops
    t_m = bytes_micro / (hw.bandwidth_gbps[hw_idx] * 1e9 * BW_EFFICIENCY)
    hi = np.maximum(t_c, t_m)
    lo = np.minimum(t_c, t_m)
    t_micro = hi + MEMORY_OVERLAP_LOSS * lo  # elementwise kernels only partly overlap matmuls
    ideal = flops_micro / (hw.peak_tflops[hw_idx] * 1e12)
    t_micro = t_micro * (1.0 + SMALL_WORK_S / (ideal + SMALL_WORK_S) * 0.8)

    accum = np.maximum(1.0, job.global_batch / (job.micro_batch * job.dp))
    bubble = (job.pp - 1.0) / accum
    t_compute = accum * t_micro * (1.0 + bubble)

    ic = hw.interconnect_gbps[hw_idx] * 1e9
    net = hw.network_gbps[hw_idx] * 1e9
    node = hw.node_size[hw_idx].astype(np.float64)
    # tensor parallel: 4 all-reduces of the activations per layer (2 fwd, 2 bwd), inside a node
    act_bytes = job.micro_batch * job.seq * job.hidden * 2.0 * elem
    tp_link = np.where(job.tp <= node, ic, net)
    t_tp = np.where(
        job.tp > 1,
        accum * 4.0 * (job.layers / job.pp) * act_bytes * 2.0 * (job.tp - 1) / job.tp / tp_link,
        0.0,
    )
    # data parallel gradient all-reduce (ring): scale-up link inside the node, else the network
    grad_bytes = (job.parameters - job.embedding_params) * 2.0 * elem / split
    dp_link = np.where(job.num_devices <= node, ic, np.minimum(ic, net))
    t_dp = np.where(job.dp > 1, 2.0 * (job.dp - 1) / job.dp * grad_bytes / dp_link, 0.0)
    t_dp = np.maximum(t_dp * (1 - DP_OVERLAP), t_dp - DP_OVERLAP * t_compute)
    # MoE expert all-to-all: dispatch + combine, fwd + bwd, of top_k copies of each token
    ep = np.minimum(job.dp, job.experts)
    moe_link = np.where(ep * job.tp <= node, ic, np.minimum(ic, net))
    t_moe = np.where(
        job.experts > 1,
        accum
        * 4.0
        * (job.layers / job.pp)
        * act_bytes
        * job.top_k
        * (ep - 1)
        / np.maximum(ep, 1)
        / job.tp
        / moe_link,
        0.0,
    )
    # recsys: pooled embeddings all-to-all (fwd + bwd) between all devices
    a2a_link = np.where(job.num_devices <= node, ic, np.minimum(ic, net))
    t_a2a = np.where(
        job.a2a_bytes > 0,
        accum
        * 2.0
        * job.micro_batch
        * job.a2a_bytes
        * (job.num_devices - 1)
        / job.num_devices
        / a2a_link,
        0.0,
    )
    return np.asarray(t_compute + t_tp + t_dp + t_moe + t_a2a, dtype=np.float64)


def software_factor(job: JobArrays, hw: HardwareArrays, hw_idx: I64) -> F64:
    v = hw.vendor_idx[hw_idx]
    return np.asarray(
        MATURITY[job.family_idx, v] * FRAMEWORK_EFFECT[job.framework_idx, v], dtype=np.float64
    )


def base_throughput(job: JobArrays, hw: HardwareArrays, hw_idx: I64) -> F64:
    """Samples/s of the whole job from physics and software stack, before per-lineage effects."""
    return np.asarray(
        job.global_batch / step_time_s(job, hw, hw_idx) * software_factor(job, hw, hw_idx),
        dtype=np.float64,
    )


__all__ = [
    "HardwareArrays",
    "JobArrays",
    "base_throughput",
    "fits",
    "framework_supported",
    "memory_per_device_gib",
    "step_time_s",
]
