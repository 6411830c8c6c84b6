"""The simulator's model catalog: a few hundred architectures from realistic size grids.

Each row carries what the latent throughput function needs (training FLOPs and memory traffic per
sample, memory footprint terms) and what a submission shows (parameters, layers, hidden size,
sequence length). Generated programmatically so the catalog is large and internally consistent
instead of a hand-written list that drifts out of step with the formulas.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import pandas as pd

from leap_stream.contracts.vocab import FAMILIES

# Families whose samples are sequences of tokens: tokens_per_s is reported for them.
TOKEN_FAMILIES = frozenset({"dense_llm", "moe_llm", "encoder"})
# Families that shard optimizer states over data-parallel ranks (ZeRO-1 / FSDP) when n > 1.
SHARDED_FAMILIES = frozenset({"dense_llm", "moe_llm"})


@dataclass(frozen=True)
class _Row:
    model_type: str
    family: str
    parameters: float
    active_parameters: float
    layers: int
    hidden_size: int
    seq_min: int
    seq_max: int
    flops_per_unit: float  # training FLOPs per sequence unit (token / image / sample)
    attn_flops_per_unit2: float  # training FLOPs per sample per seq² (attention scores)
    traffic_per_unit: float  # HBM bytes per sequence unit (activations, bf16)
    fixed_bytes: float  # HBM bytes per sample independent of seq (embedding lookups, gathers)
    act_mem_per_unit: float  # activation memory per sequence unit without checkpointing, bytes
    embedding_params: float  # parameters in sharded embedding tables (recsys)
    a2a_bytes: float  # bytes per sample exchanged all-to-all (recsys pooled embeddings)
    experts: int
    top_k: int
    batch_min: int
    batch_max: int
    frameworks: str  # '|'-joined, most likely first


def _transformer(
    name: str,
    family: str,
    layers: int,
    hidden: int,
    seq_min: int,
    seq_max: int,
    frameworks: str,
    batch: tuple[int, int],
    *,
    ffn_mult: float = 4.0,
    vocab: int = 32000,
    experts: int = 1,
    top_k: int = 1,
) -> _Row:
    """Transformer block counts: 4h² attention + 2·ffn_mult·h² MLP (×experts for MoE)."""
    attn = 4 * hidden * hidden
    mlp = 2 * ffn_mult * hidden * hidden
    emb = vocab * hidden
    total = layers * (attn + mlp * experts) + emb
    active = layers * (attn + mlp * top_k) + emb
    return _Row(
        model_type=name,
        family=family,
        parameters=float(total),
        active_parameters=float(active),
        layers=layers,
        hidden_size=hidden,
        seq_min=seq_min,
        seq_max=seq_max,
        flops_per_unit=6.0 * active,
        attn_flops_per_unit2=12.0 * layers * hidden,
        traffic_per_unit=200.0 * layers * hidden,  # norms, softmax, residuals, GELU
        fixed_bytes=0.0,
        act_mem_per_unit=34.0 * layers * hidden,
        embedding_params=0.0,
        a2a_bytes=0.0,
        experts=experts,
        top_k=top_k,
        batch_min=batch[0],
        batch_max=batch[1],
        frameworks=frameworks,
    )


def _dense_llms() -> list[_Row]:
    # (size label, layers, hidden) from the published GPT/LLaMA-style grids
    sizes = [
        ("125m", 12, 768),
        ("350m", 24, 1024),
        ("760m", 24, 1536),
        ("1.3b", 24, 2048),
        ("2.7b", 32, 2560),
        ("3b", 26, 3072),
        ("7b", 32, 4096),
        ("8b", 32, 4096),
        ("13b", 40, 5120),
        ("20b", 44, 6144),
        ("34b", 48, 8192),
        ("70b", 80, 8192),
        ("180b", 80, 14848),
        ("405b", 126, 16384),
    ]
    series = [
        ("gpt", 50257, 4.0, "pytorch|jax", (1, 16)),
        ("llama", 32000, 4.0, "pytorch|jax", (1, 16)),
        ("qwen", 151936, 4.0, "pytorch|jax", (1, 16)),
        ("mistral", 32768, 5.25, "pytorch|jax", (1, 16)),
        ("palm", 256000, 4.0, "jax|pytorch", (1, 16)),
    ]
    rows = []
    for prefix, vocab, ffn, fw, batch in series:
        for label, layers, hidden in sizes:
            rows.append(
                _transformer(
                    f"{prefix}-{label}",
                    "dense_llm",
                    layers,
                    hidden,
                    512,
                    8192,
                    fw,
                    batch,
                    ffn_mult=ffn,
                    vocab=vocab,
                )
            )
            if label in ("1.3b", "7b", "8b", "13b", "70b"):
                rows.append(
                    _transformer(
                        f"{prefix}-{label}-32k",
                        "dense_llm",
                        layers,
                        hidden,
                        8192,
                        32768,
                        fw,
                        (1, 4),
                        ffn_mult=ffn,
                        vocab=vocab,
                    )
                )
    return rows


def _moe_llms() -> list[_Row]:
    grid = [
        # name, layers, hidden, experts, top_k, ffn_mult
        ("mixtral-8x7b", 32, 4096, 8, 2, 5.25),
        ("mixtral-8x22b", 56, 6144, 8, 2, 4.0),
        ("switch-base-8", 12, 768, 8, 1, 4.0),
        ("switch-base-64", 12, 768, 64, 1, 4.0),
        ("switch-base-128", 12, 768, 128, 1, 4.0),
        ("switch-large-128", 24, 1024, 128, 1, 4.0),
        ("deepseek-moe-16b", 28, 2048, 64, 6, 0.7),
        ("deepseek-v2-lite", 27, 2048, 64, 6, 0.7),
        ("dbrx-132b", 40, 6144, 16, 4, 1.7),
        ("qwen-moe-a2.7b", 24, 2048, 60, 4, 0.7),
        ("qwen3-moe-30b-a3b", 48, 2048, 128, 8, 0.375),
        ("olmoe-1b-7b", 16, 2048, 64, 8, 0.5),
        ("grok-1-314b", 64, 6144, 8, 2, 5.3),
        ("arctic-480b", 35, 7168, 128, 2, 0.68),
    ]
    rows = []
    for name, layers, hidden, experts, top_k, ffn in grid:
        for seq_lo, seq_hi, suffix in ((512, 8192, ""), (8192, 32768, "-32k")):
            rows.append(
                _transformer(
                    f"{name}{suffix}",
                    "moe_llm",
                    layers,
                    hidden,
                    seq_lo,
                    seq_hi,
                    "pytorch|jax",
                    (1, 8) if suffix else (1, 16),
                    ffn_mult=ffn,
                    experts=experts,
                    top_k=top_k,
                )
            )
    # generic grid: experts × top-k on two base widths
    for hidden, layers in ((1024, 24), (2048, 24), (4096, 32)):
        for experts in (8, 16, 32, 64):
            for top_k in (1, 2):
                rows.append(
                    _transformer(
                        f"moe-h{hidden}-e{experts}-top{top_k}",
                        "moe_llm",
                        layers,
                        hidden,
                        1024,
                        4096,
                        "jax|pytorch",
                        (1, 16),
                        experts=experts,
                        top_k=top_k,
                    )
                )
    return rows


def _encoders() -> list[_Row]:
    sizes = [
        ("small", 4, 512),
        ("base", 12, 768),
        ("large", 24, 1024),
        ("xl", 24, 2048),
        ("xxl", 24, 4096),
    ]
    rows = []
    for prefix, fw, vocab in (
        ("bert", "pytorch|tensorflow|jax", 30522),
        ("roberta", "pytorch|jax", 50265),
        ("deberta-v3", "pytorch|tensorflow", 128000),
        ("t5-enc", "jax|pytorch|tensorflow", 32128),
        ("electra", "pytorch|tensorflow", 30522),
        ("xlm-r", "pytorch|jax", 250002),
    ):
        for label, layers, hidden in sizes:
            rows.append(
                _transformer(
                    f"{prefix}-{label}",
                    "encoder",
                    layers,
                    hidden,
                    128,
                    1024,
                    fw,
                    (8, 256),
                    vocab=vocab,
                )
            )
    return rows


def _cnn(
    name: str, fwd_gflops: float, params_m: float, layers: int, width: int, res: int, fw: str
) -> _Row:
    scale = (res / 224.0) ** 2
    fwd = fwd_gflops * 1e9 * scale
    return _Row(
        model_type=name if res == 224 else f"{name}-{res}",
        family="vision_cnn",
        parameters=params_m * 1e6,
        active_parameters=params_m * 1e6,
        layers=layers,
        hidden_size=width,
        seq_min=1,
        seq_max=1,
        flops_per_unit=3.0 * fwd,
        attn_flops_per_unit2=0.0,
        traffic_per_unit=0.045 * fwd,  # BN/ReLU/elementwise traffic: CNNs are bandwidth-hungry
        fixed_bytes=3 * res * res * 4.0,
        act_mem_per_unit=0.025 * fwd,
        embedding_params=0.0,
        a2a_bytes=0.0,
        experts=1,
        top_k=1,
        batch_min=32,
        batch_max=512,
        frameworks=fw,
    )


def _vision_cnns() -> list[_Row]:
    nets = [
        ("resnet-18", 1.8, 11.7, 18, 512),
        ("resnet-34", 3.6, 21.8, 34, 512),
        ("resnet-50", 4.1, 25.6, 50, 2048),
        ("resnet-101", 7.8, 44.5, 101, 2048),
        ("resnet-152", 11.5, 60.2, 152, 2048),
        ("resnext-50", 4.3, 25.0, 50, 2048),
        ("resnext-101", 16.5, 88.8, 101, 2048),
        ("wide-resnet-50", 11.4, 68.9, 50, 2048),
        ("efficientnet-b0", 0.39, 5.3, 82, 1280),
        ("efficientnet-b3", 1.8, 12.0, 131, 1536),
        ("efficientnet-b5", 9.9, 30.0, 187, 2048),
        ("efficientnet-b7", 37.0, 66.0, 271, 2560),
        ("convnext-tiny", 4.5, 28.6, 18, 768),
        ("convnext-small", 8.7, 50.2, 36, 768),
        ("convnext-base", 15.4, 88.6, 36, 1024),
        ("convnext-large", 34.4, 197.8, 36, 1536),
        ("regnety-16gf", 16.0, 83.6, 18, 3024),
        ("mobilenet-v3-large", 0.22, 5.4, 20, 960),
        ("vgg-16", 15.5, 138.0, 16, 4096),
        ("densenet-121", 2.9, 8.0, 121, 1024),
        ("yolov5-l", 54.0, 46.5, 120, 1024),
        ("unet-seg", 30.0, 31.0, 23, 1024),
    ]
    rows = []
    for name, gf, pm, layers, width in nets:
        for res in (224, 384):
            rows.append(_cnn(name, gf, pm, layers, width, res, "pytorch|tensorflow|jax"))
    return rows


def _vits() -> list[_Row]:
    sizes = [("s", 12, 384), ("b", 12, 768), ("l", 24, 1024), ("h", 32, 1280), ("g", 40, 1408)]
    rows = []
    for prefix, fw in (("vit", "jax|pytorch"), ("deit", "pytorch|jax"), ("eva", "pytorch|jax")):
        for label, layers, hidden in sizes:
            for patch in (14, 16):
                for res in (224, 384):
                    tokens = (res // patch) ** 2 + 1
                    r = _transformer(
                        f"{prefix}-{label}-p{patch}-{res}",
                        "vision_vit",
                        layers,
                        hidden,
                        tokens,
                        tokens,
                        fw,
                        (16, 256),
                        vocab=1000,
                    )
                    rows.append(r)
    return rows


def _diffusion() -> list[_Row]:
    # UNets: (name, params M, fwd GFLOPs at base res, layers, width); DiTs: transformer grid
    unets = [
        ("sd-1.5-unet", 860, 400, 25, 1280),
        ("sd-2.1-unet", 865, 420, 25, 1280),
        ("sdxl-unet", 2600, 1300, 70, 1280),
        ("ddpm-cifar", 36, 6, 18, 512),
        ("imagen-base", 2000, 900, 30, 1536),
        ("kandinsky-unet", 1200, 600, 28, 1280),
    ]
    rows = []
    for name, pm, gf, layers, width in unets:
        for res_mult, suffix in ((1.0, ""), (2.25, "-hires")):
            fwd = gf * 1e9 * res_mult
            rows.append(
                _Row(
                    model_type=name + suffix,
                    family="diffusion",
                    parameters=pm * 1e6,
                    active_parameters=pm * 1e6,
                    layers=layers,
                    hidden_size=width,
                    seq_min=1,
                    seq_max=1,
                    flops_per_unit=3.0 * fwd,
                    attn_flops_per_unit2=0.0,
                    traffic_per_unit=0.03 * fwd,
                    fixed_bytes=0.0,
                    act_mem_per_unit=0.02 * fwd,
                    embedding_params=0.0,
                    a2a_bytes=0.0,
                    experts=1,
                    top_k=1,
                    batch_min=4,
                    batch_max=64,
                    frameworks="pytorch|jax",
                )
            )
    for label, layers, hidden in (
        ("s", 12, 384),
        ("b", 12, 768),
        ("l", 24, 1024),
        ("xl", 28, 1152),
    ):
        for patch in (2, 4):
            for res in (256, 512):
                tokens = (res // 8 // patch) ** 2
                rows.append(
                    _transformer(
                        f"dit-{label}-{patch}-{res}",
                        "diffusion",
                        layers,
                        hidden,
                        tokens,
                        tokens,
                        "pytorch|jax",
                        (8, 128),
                        ffn_mult=4.0,
                        vocab=1000,
                    )
                )
    return rows


def _recsys() -> list[_Row]:
    rows = []
    archs = [
        ("dlrm", 4.0),
        ("dcn-v2", 6.0),
        ("two-tower", 2.0),
        ("din", 3.0),
        ("deepfm", 2.5),
        ("wide-deep", 1.5),
    ]
    tiers = [
        # label, tables, pooling, dim, rows per table (M), dense params (M)
        ("small", 26, 1, 64, 1.0, 2.0),
        ("medium", 26, 10, 128, 5.0, 10.0),
        ("large", 100, 20, 128, 5.0, 40.0),
        ("xl", 200, 30, 128, 10.0, 120.0),
        ("xxl", 300, 40, 128, 20.0, 400.0),
    ]
    for arch, dense_mult in archs:
        for label, tables, pooling, dim, rows_m, dense_m in tiers:
            emb = tables * rows_m * 1e6 * dim
            dense = dense_m * 1e6 * dense_mult / 8.0
            rows.append(
                _Row(
                    model_type=f"{arch}-{label}",
                    family="recsys",
                    parameters=emb + dense,
                    active_parameters=dense + tables * pooling * dim,
                    layers=8,
                    hidden_size=dim,
                    seq_min=1,
                    seq_max=1,
                    flops_per_unit=6.0 * dense,
                    attn_flops_per_unit2=0.0,
                    traffic_per_unit=8.0 * dense / 1024 + 2048.0,
                    # lookups: read fp32 rows, backward gradient write and scatter-add,
                    # optimizer row and state read+write: ~6 row-sized passes per lookup
                    fixed_bytes=tables * pooling * dim * 4.0 * 6.0,
                    act_mem_per_unit=4096.0 + tables * dim * 16.0,
                    embedding_params=emb,
                    a2a_bytes=tables * dim * 4.0 * 2.0,
                    experts=1,
                    top_k=1,
                    batch_min=512,
                    batch_max=65536,
                    frameworks="pytorch|tensorflow",
                )
            )
    return rows


def _speech() -> list[_Row]:
    rows = []
    grid = [
        ("whisper-tiny", 4, 384),
        ("whisper-base", 6, 512),
        ("whisper-small", 12, 768),
        ("whisper-medium", 24, 1024),
        ("whisper-large", 32, 1280),
        ("conformer-s", 16, 144),
        ("conformer-m", 16, 256),
        ("conformer-l", 17, 512),
        ("conformer-xl", 24, 1024),
        ("wav2vec2-base", 12, 768),
        ("wav2vec2-large", 24, 1024),
        ("hubert-xl", 48, 1280),
        ("rnnt-large", 18, 1024),
    ]
    for name, layers, hidden in grid:
        for seq_lo, seq_hi, suffix in ((500, 1500, ""), (1500, 3000, "-long")):
            r = _transformer(
                name + suffix,
                "speech",
                layers,
                hidden,
                seq_lo,
                seq_hi,
                "pytorch|jax|tensorflow",
                (8, 128),
                vocab=5000,
            )
            rows.append(r)
    return rows


def _gnns() -> list[_Row]:
    rows = []
    for arch, flop_mult in (
        ("graphsage", 1.0),
        ("gat", 2.5),
        ("gcn", 0.8),
        ("gin", 1.2),
        ("mpnn", 3.0),
        ("rgcn", 1.8),
    ):
        for layers in (2, 3):
            for hidden in (128, 256, 512):
                params = layers * 2 * hidden * hidden * flop_mult
                nodes_min, nodes_max = (256, 4096) if layers == 2 else (1024, 16384)
                rows.append(
                    _Row(
                        model_type=f"{arch}-l{layers}-h{hidden}",
                        family="gnn",
                        parameters=params,
                        active_parameters=params,
                        layers=layers,
                        hidden_size=hidden,
                        seq_min=nodes_min,  # sampled subgraph nodes per seed node
                        seq_max=nodes_max,
                        flops_per_unit=6.0 * params,
                        attn_flops_per_unit2=0.0,
                        # neighbour gathers dominate: feature rows read, scattered, re-read
                        traffic_per_unit=hidden * 4.0 * 12.0 * layers,
                        fixed_bytes=0.0,
                        act_mem_per_unit=hidden * 4.0 * 4.0 * layers,
                        embedding_params=0.0,
                        a2a_bytes=0.0,
                        experts=1,
                        top_k=1,
                        batch_min=64,
                        batch_max=2048,
                        frameworks="pytorch|tensorflow",
                    )
                )
    return rows


@functools.cache
def model_catalog() -> pd.DataFrame:
    """All model types, one row each, indexed 0..n-1 (the simulator refers to them by position)."""
    rows = (
        _dense_llms()
        + _moe_llms()
        + _encoders()
        + _vision_cnns()
        + _vits()
        + _diffusion()
        + _recsys()
        + _speech()
        + _gnns()
    )
    frame = pd.DataFrame([r.__dict__ for r in rows])
    if frame["model_type"].duplicated().any():
        dupes = frame.loc[frame["model_type"].duplicated(), "model_type"].tolist()
        raise AssertionError(f"duplicate model types: {dupes}")
    frame["family_idx"] = (
        frame["family"].map({f: i for i, f in enumerate(FAMILIES)}).astype(np.int64)
    )
    return frame


__all__ = [
    "SHARDED_FAMILIES",
    "TOKEN_FAMILIES",
    "model_catalog",
]
