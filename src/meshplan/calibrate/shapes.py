"""What to measure: the GEMM, attention and memory-op sizes of one calibration run.

GEMMs are those one tensor-parallel rank runs in a decoder layer (Megatron-LM's column/row
split, Shoeybi et al. 2019, Sec. 3): qkv and fc1 are split along their outputs, proj and fc2
along their inputs. A forward ``[m,k] @ [k,n]`` with m tokens has a data gradient
``[m,n] @ [n,k]`` and a weight gradient ``[k,m] @ [m,n]``; rows are written as (m, n, k) like
the shipped H100 files (``gemm_bf16.csv``).
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.specs.model import TransformerModel


@dataclass(frozen=True)
class Sizes:
    """How big a run is: the full sweep, or ``--quick`` sizes that run on a CPU in seconds."""

    tokens: tuple[int, ...]
    square: tuple[int, ...]
    attention_seq: tuple[int, ...]
    attention_tokens: int  # batch x seq of each attention row
    attention_heads: tuple[tuple[int, int], ...]  # (heads, kv_heads) per rank
    memory_elements: tuple[int, ...]
    collective_bytes: tuple[int, ...]
    warmup: int
    repeats: int
    # sustained power (power.csv): seconds of each workload (--power-seconds), bf16 GEMM sizes
    # (the largest also in FP8), the bytes of each tensor of the HBM copy and add, and the most
    # the L2-resident copy may move
    power_seconds: float = 5.0
    power_gemms: tuple[int, ...] = (2048, 4096, 8192)
    power_hbm_bytes: int = 1 << 30
    power_l2_bytes: int = 16 << 20
    # whole decoder layers (layer.csv): sequence lengths of one micro-batch of one sequence, and
    # the probe, a layer whose kernels take a few microseconds, so it shows the host's dispatch
    layer_seq: tuple[int, ...] = (2048, 4096)
    probe: tuple[int, int, int, int] = (512, 4, 128, 512)  # hidden, heads, head dim, sequence
    # compute beside a collective (overlap.csv, under torchrun): the bytes of the all-gathers
    # run beside a square GEMM of this size, and how many GEMMs one timed loop runs
    overlap_bytes: tuple[int, ...] = (64 << 20, 256 << 20)
    overlap_gemm: int = 8192
    overlap_gemms: int = 20


FULL = Sizes(
    tokens=(1024, 4096, 16384),
    square=(256, 512, 1024, 2048, 4096, 8192, 16384),
    attention_seq=(1024, 2048, 4096, 8192, 16384, 32768),
    attention_tokens=16384,
    attention_heads=((4, 1), (8, 1), (8, 8), (12, 12), (16, 2), (32, 8), (64, 8)),
    memory_elements=(1 << 20, 1 << 24, 1 << 27, 1 << 29),
    collective_bytes=tuple(1 << p for p in range(10, 31, 2)),  # 1 KiB .. 1 GiB
    warmup=5,
    repeats=20,
)

#: a smoke test: one token count, small squares, short sequences (with --quick the model's
#: shapes are measured at its largest tensor-parallel degree only)
QUICK = Sizes(
    tokens=(16,),
    square=(32, 64),
    attention_seq=(32, 64),
    attention_tokens=64,
    attention_heads=((4, 1), (4, 4)),
    memory_elements=(1 << 12, 1 << 16),
    collective_bytes=(1 << 10, 1 << 16, 1 << 20),
    warmup=1,
    repeats=3,
    power_seconds=1.0,
    power_gemms=(32, 64),
    power_hbm_bytes=1 << 20,
    power_l2_bytes=64 << 10,
    layer_seq=(16,),
    probe=(64, 4, 16, 16),
    overlap_bytes=(1 << 20,),
    overlap_gemm=128,
    overlap_gemms=3,
)


@dataclass(frozen=True)
class Gemm:
    model: str
    tp: int
    tokens: int
    gemm: str  # qkv, proj, fc1, fc2, or square
    pass_: str  # fwd, dgrad, wgrad
    m: int
    n: int
    k: int

    @property
    def key(self) -> tuple:
        return (self.model, str(self.tp), str(self.tokens), self.gemm, self.pass_, str(self.m), str(self.n), str(self.k))

    @property
    def flop(self) -> float:
        return 2.0 * self.m * self.n * self.k


def layer_widths(model: TransformerModel, tp: int) -> dict[str, tuple[int, int]]:
    """(input, output) width of each layer GEMM on one of ``tp`` ranks. Gated FFNs (SwiGLU) fuse
    gate and up into one fc1 of twice the width; an MoE layer's GEMMs are one expert's."""
    h = model.hidden_size
    if model.mla:  # queries and the key/value up-projection as one width (MLA's latents are small)
        m = model.mla
        q_width = model.num_attention_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim)
        qkv, proj_in = q_width + model.num_attention_heads * (m.qk_nope_head_dim + m.v_head_dim), model.num_attention_heads * m.v_head_dim
    else:
        d = model.dim_per_head
        qkv, proj_in = (model.num_attention_heads + 2 * model.kv_heads) * d, model.num_attention_heads * d
    ffn = model.ffn_hidden_size or model.moe.expert_ffn_hidden_size
    up = (model.ffn_matrices - 1) * ffn
    return {"qkv": (h, qkv // tp), "proj": (proj_in // tp, h), "fc1": (h, up // tp), "fc2": (ffn // tp, h)}


def model_gemms(model: TransformerModel, tps: tuple[int, ...], tokens: tuple[int, ...]) -> list[Gemm]:
    """Forward, data-gradient and weight-gradient GEMMs of each layer GEMM, per tp and token count."""
    out = []
    for tp in tps:
        for t in tokens:
            for name, (k, n) in layer_widths(model, tp).items():
                out += [
                    Gemm(model.id, tp, t, name, "fwd", t, n, k),
                    Gemm(model.id, tp, t, name, "dgrad", t, k, n),
                    Gemm(model.id, tp, t, name, "wgrad", k, n, t),
                ]
    return out


def square_gemms(sizes: tuple[int, ...]) -> list[Gemm]:
    return [Gemm("square", 1, s, "square", "fwd", s, s, s) for s in sizes]


def valid_tps(model: TransformerModel, tps: tuple[int, ...]) -> tuple[int, ...]:
    """The degrees that split heads and FFN evenly (others are left out, as Megatron refuses them)."""
    ffn = model.ffn_hidden_size or model.moe.expert_ffn_hidden_size
    return tuple(tp for tp in tps if model.kv_heads % tp == 0 or tp % model.kv_heads == 0
                 if model.num_attention_heads % tp == 0 and ffn % tp == 0)


@dataclass(frozen=True)
class Attention:
    heads: int
    kv_heads: int
    head_dim: int
    batch: int
    seq: int
    causal: bool = True

    @property
    def key(self) -> tuple:
        return tuple(str(v) for v in (self.heads, self.kv_heads, self.head_dim, self.batch, self.seq, self.causal))

    @property
    def fwd_flop(self) -> float:
        """Forward flop as FlashAttention counts them: 4·b·s²·heads·d, halved when causal
        (Dao 2023, FlashAttention-2, Sec. 4.1 benchmark convention); backward is 2.5x forward."""
        flop = 4.0 * self.batch * self.seq * self.seq * self.heads * self.head_dim
        return flop / 2 if self.causal else flop


def attention_cases(model: TransformerModel | None, tps: tuple[int, ...], sizes: Sizes) -> list[Attention]:
    """The model's heads per rank (each tp) at each sequence length, batch x seq held fixed;
    without a model, the sweep of head counts the shipped H100 file holds."""
    if model is not None and not model.mla:
        heads = sorted({(model.num_attention_heads // tp, max(1, model.kv_heads // tp)) for tp in tps})
        head_dim = model.dim_per_head
    else:
        heads, head_dim = list(sizes.attention_heads), 128 if sizes is FULL else 32
    return [Attention(h, kv, head_dim, max(1, sizes.attention_tokens // s), s)
            for h, kv in heads for s in sizes.attention_seq]


@dataclass(frozen=True)
class Layer:
    """One tensor-parallel rank's pre-norm decoder layer, as layer.csv holds it: RMSNorm, QKV,
    causal attention, output projection, residual add; RMSNorm, the FFN (SwiGLU's gate and up
    as one GEMM, or GELU), residual add. Widths are the rank's shares."""

    model: str
    tp: int
    micro_batch: int
    seq: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    gated: bool

    @property
    def key(self) -> tuple:
        return (self.model, str(self.tp), str(self.micro_batch), str(self.seq))

    @property
    def params(self) -> int:
        qkv = self.hidden * (self.heads + 2 * self.kv_heads) * self.head_dim
        return qkv + self.heads * self.head_dim * self.hidden + (3 if self.gated else 2) * self.hidden * self.ffn + 2 * self.hidden

    @property
    def fwd_flop_gemm(self) -> float:
        return 2.0 * self.micro_batch * self.seq * (self.params - 2 * self.hidden)

    @property
    def fwd_flop_attn(self) -> float:
        return Attention(self.heads, self.kv_heads, self.head_dim, self.micro_batch, self.seq).fwd_flop


def layer_cases(model: TransformerModel | None, tps: tuple[int, ...], sizes: Sizes) -> list[Layer]:
    """The model's dense decoder layer on each tensor-parallel rank (``tps``) at each of
    ``sizes.layer_seq``, and the probe (``sizes.probe``), which shows what the host takes to
    issue a layer (calibrate.fit_kernels.fit_host fits on the least layer). Models with MoE or
    MLA layers measure the probe only."""
    hidden, heads, head_dim, seq = sizes.probe
    cases = [Layer("probe", 1, 1, seq, hidden, heads, heads, head_dim, 2 * hidden, True)]
    if model is None or model.moe is not None or model.mla or not model.ffn_hidden_size:
        return cases
    gated = model.ffn_type in ("swiglu", "geglu")
    for tp in tps:
        for s in sizes.layer_seq:
            cases.append(Layer(model.id, tp, 1, s, model.hidden_size, model.num_attention_heads // tp,
                               max(1, model.kv_heads // tp), model.dim_per_head, model.ffn_hidden_size // tp, gated))
    return cases


#: memory ops and the bytes each moves per element: inputs read once, outputs written once
#: (bf16 elements; AdamW over fp32 params reads param, grad, two moments, writes three)
MEMORY_OPS = {
    "copy": 2 * 2, "add": 3 * 2, "gelu": 2 * 2, "silu_mul": 3 * 2,
    "rms_norm": 2 * 2, "layer_norm": 2 * 2, "softmax": 2 * 2, "adamw_fused_fp32": 7 * 4,
}
