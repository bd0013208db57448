"""How published tables and configs spell the plan's and the model's values, each word mapped to
what meshplan calls it (keyed by ``name_key``: letters and digits only, unless a table says
otherwise). ``meshplan.io.case_inputs`` reads a validation case through these; a word not here is
passed on as written, so the plan's own validation names the field and what is valid."""

from __future__ import annotations

#: precisions as published tables and training flags spell them (keyed by name_key: letters and
#: digits only): (plan precision, FP8 scaling or None for the framework's). Megatron-Bridge's
#: performance tables write FP8-CS (current scaling), FP8-DS (delayed), FP8-MX and MXFP8 (a scale
#: per block of 32) and NVFP4 (per block of 16, OCP MX and NVIDIA's NVFP4 formats); torchtitan and
#: PyTorch say float8, bfloat16, float16 (float8_e4m3fn the tensor dtype); PyTorch Lightning and
#: NeMo's trainer bf16-mixed, 16-mixed (fp16 autocast) and bf16-true; Transformer Engine's FP8
#: formats are E4M3 and HYBRID (E4M3 forward, E5M2 gradients), both FP8 GEMMs
PRECISION_ALIASES = {
    "fp8cs": ("fp8", "current"), "fp8current": ("fp8", "current"), "fp8currentscaling": ("fp8", "current"),
    "fp8ds": ("fp8", "delayed"), "fp8delayed": ("fp8", "delayed"), "fp8delayedscaling": ("fp8", "delayed"),
    "fp8mx": ("fp8", "block"), "mxfp8": ("fp8", "block"), "nvfp4": ("fp4", "nvfp4"), "mxfp4": ("fp4", "block"),
    "float8": ("fp8", None), "float8e4m3fn": ("fp8", None), "fp8e4m3": ("fp8", None), "fp8hybrid": ("fp8", None),
    "bfloat16": ("bf16", None), "bf16mixed": ("bf16", None),
    "float16": ("fp16", None), "16mixed": ("fp16", None), "fp16mixed": ("fp16", None), "float32": ("fp32", None),
    # DeepSeek-V3's 1x128 / 128x128 tiles and Transformer Engine's Float8BlockScaling: scales per
    # block, inside the cast, as MXFP8's
    "fp8block": ("fp8", "block"), "fp8blockwise": ("fp8", "block"), "fp8blockscaling": ("fp8", "block"),
    "blockwisefp8": ("fp8", "block"),
    # torchao's float8 recipes as torchtitan names them (--float8.recipe_name): scales from the
    # tensor's own amax, per tensor or per row, a pass over it before the cast
    "fp8tensorwise": ("fp8", "current"), "fp8rowwise": ("fp8", "current"),
    "float8tensorwise": ("fp8", "current"), "float8rowwise": ("fp8", "current"),
    # automatic mixed precision as papers of the fp16 era say it: PyTorch's torch.autocast on CUDA
    # (and torch.cuda.amp, NVIDIA Apex's amp before it) casts to float16 unless told otherwise
    "amp": ("fp16", None), "mixed": ("fp16", None), "mixedprecision": ("fp16", None), "fp16amp": ("fp16", None),
    "ampfp16": ("fp16", None),
}

#: precisions that train a bf16 model with no fp32 copy (keyed by name_key): PyTorch Lightning's
#: bf16-true (the model cast to bf16, its optimizer stepping bf16 state), "pure bf16" as papers and
#: PyTorch loops say; bf16, bf16-mixed and the rest keep fp32 master weights or run autocast over
#: fp32 ones
PURE_BF16 = {"bf16true", "purebf16", "bf16pure"}
PRECISION_ALIASES.update(dict.fromkeys(PURE_BF16, ("bf16", None)))

#: ffn_type as configs spell it (keyed by name_key): NeMo's Nemotron configs say squared-relu,
#: Hugging Face's Nemotron config relu2 (hidden_act), both the schema's squared_relu; Hugging
#: Face's silu is the gated Llama-family MLP's activation (LlamaMLP: down(silu(gate) * up)), and its
#: gelu_new GPT-2's tanh GELU in a plain MLP (gelu_pytorch_tanh the same, as Gemma's configs say);
#: T5 v1.1 calls its gated GELU gated-gelu; ReGLU (Shazeer 2020, "GLU Variants Improve Transformer")
#: is the gated MLP's three matrices with ReLU as the gate, costed as swiglu
FFN_TYPES = {"gelu": "gelu", "relu": "relu", "squaredrelu": "squared_relu", "relu2": "squared_relu",
             "swiglu": "swiglu", "geglu": "geglu", "silu": "swiglu", "gelunew": "gelu", "gatedgelu": "geglu",
             "gelutanh": "gelu", "gelupytorchtanh": "gelu", "reglu": "swiglu"}

#: activation_recompute as a yes/no flag (Megatron-LM's --checkpoint-activations, DeepSpeed's
#: activation_checkpointing): every layer recomputed, or none; the flag written as a word; and
#: Megatron's recompute methods, uniform and block, which recompute whole layers (full granularity)
RECOMPUTE_FLAGS = {True: "full", False: "none"}
RECOMPUTE_WORDS = {"true": "full", "yes": "full", "on": "full", "false": "none", "no": "none", "off": "none",
                   "uniform": "full", "block": "full"}

#: Megatron-Core's token dispatchers (moe_token_dispatcher_type) -> Plan.ep_dispatch: alltoall
#: sends each token once per expert; flex (DeepEP, HybridEP) once per node and forwards it there
DISPATCHERS = {"alltoall": "all_to_all", "flex": "hierarchical"}

#: pipeline schedules as papers and configs name them (keyed by name_key) -> Plan.schedule:
#: Megatron's 1F1B with or without interleaving (PipeDream-Flush), GPipe, zero-bubble ZB-H1 (Qi et
#: al. 2024; torchtitan's ZBVZeroBubble runs its V-shape), DeepSeek-V3's DualPipe
SCHEDULES = {"1f1b": "1f1b", "interleaved": "1f1b", "interleaved1f1b": "1f1b", "pipedreamflush": "1f1b",
             "gpipe": "gpipe", "zbh1": "zb-h1", "zerobubble": "zb-h1", "dualpipe": "dualpipe", "dualpipev": "dualpipe"}

#: attention backends as configs name them (keyed by name_key) -> Plan.attention_kernel: None is
#: the device family's newest, the kernel its model was fitted on (cuDNN's fused attention on
#: Hopper and Blackwell, which Transformer Engine's DotProductAttention runs); FlexAttention runs
#: at 90% of FlashAttention-2 forward and 85% backward (PyTorch blog, "FlexAttention", Aug 2024),
#: taken as FlashAttention-2's class
ATTENTION_KERNELS = {"te": None, "transformerengine": None, "cudnn": None, "fusedattention": None, "flash3": "flash3",
                     "fa3": "flash3", "flashattention3": "flash3", "flash2": "flash2", "fa2": "flash2",
                     "flashattention2": "flash2", "flex": "flash2", "flexattention": "flash2", "flash1": "flash1",
                     "flashattention": "flash1", "triton": "flash1"}
#: and the words for attention without a flash kernel: the scores written to HBM and read back by
#: the softmax (Megatron-LM's CoreAttention, PyTorch SDPA's math backend, eager Hugging Face)
UNFUSED_ATTENTION = {"unfused", "eager", "math", "sdpamath", "coreattention", "none"}

#: Megatron-Core's exp_avg_dtype (the precision-aware optimizer, fp32 master weights) -> Plan.optimizer_state
MOMENT_STATES = {"bf16": "bf16_moments", "bfloat16": "bf16_moments", "torch.bfloat16": "bf16_moments",
                 "fp32": "fp32", "float32": "fp32", "torch.float32": "fp32"}

#: MaxText's remat_policy (MaxText/layers/models.py, keyed by name_key) as (Plan.recompute,
#: Plan.selective_recompute): "full" keeps only each layer's input, "minimal" JAX's
#: checkpoint_dots_with_no_batch_dims, "none" everything
REMAT_POLICIES = {"full": ("full", "attention"), "minimal": ("selective", "dots"), "none": ("none", "attention")}

#: Megatron-Core's tp_comm_overlap switch as Plan.tp_overlap: userbuffers' ring-exchange GEMMs
#: pipeline each tensor-parallel collective in chunks, or none does
TP_COMM_OVERLAP = {True: "pipelined", False: "none"}
