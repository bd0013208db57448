"""Memory per device of a DLRM under a per-layer-kind strategy (MAD Max Sec. 2.2, Insight 1).

Assumptions, stated once:
- embedding tables are split evenly over the ``mp`` devices (MAD Max Sec. 4.2) and replicated
  over ``ddp``; their optimizer is fused into the backward (FBGEMM/TorchRec table-batched
  embeddings), so no dense gradient of a table is ever stored. Row-wise Adagrad keeps one fp32
  per row, element-wise Adagrad one fp32 per weight, SGD nothing;
- dense weights are split by ``tp`` and ``fsdp`` (and experts by ``ep``), replicated by ``ddp``;
  gradients are kept like the weights (FSDP shards them after the reduce-scatter); Adagrad keeps
  one fp32 state per weight, Adam two, SGD none, and 16-bit weights add an fp32 master copy
  (Rajbhandari et al. 2020, ZeRO Sec. 3.1);
- FSDP holds two gathered layers at a time (the one computing and the one prefetched);
- activations are the tensors saved for backward plus the embedding lookups' indices (int64) and
  the all-to-all send and receive buffers.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.parallel.memory import ByteBreakdown

#: fp32 optimizer-state bytes per weight (dense) and per row or weight (embeddings)
DENSE_STATE_BYTES = {"adagrad": 4.0, "adam": 8.0, "sgd": 0.0}
INDEX_BYTES = 8.0  # int64 lookup indices


@dataclass(frozen=True)
class DLRMMemory(ByteBreakdown):
    """Bytes per device by category; ``total_bytes`` is their sum."""

    embedding_weights_bytes: float
    embedding_optimizer_bytes: float
    dense_weights_bytes: float
    dense_gradients_bytes: float
    dense_optimizer_bytes: float
    gathered_weights_bytes: float
    activations_bytes: float
    capacity_bytes: float


def embedding_state_bytes(rows: float, params: float, bytes_per_param: float, optimizer: str, mp: int) -> tuple[float, float]:
    """(weights, optimizer state) bytes per device for tables split ``mp`` ways."""
    state = {"rowwise_adagrad": 4.0 * rows, "adagrad": 4.0 * params, "sgd": 0.0}[optimizer]
    return params * bytes_per_param / mp, state / mp


def dense_state_bytes(params_per_device: float, bytes_per_param: float, optimizer: str) -> tuple[float, float, float]:
    """(weights, gradients, optimizer incl. master copy) bytes for the dense weights a device holds."""
    master = 4.0 if bytes_per_param < 4.0 else 0.0
    return (
        params_per_device * bytes_per_param,
        params_per_device * bytes_per_param,
        params_per_device * (DENSE_STATE_BYTES[optimizer] + master),
    )


def optimizer_traffic_bytes(params_per_device: float, bytes_per_param: float, optimizer: str) -> float:
    """HBM bytes of one dense optimizer step: read weights, gradients and states, write weights
    and states (a streaming kernel)."""
    weights, grads, states = dense_state_bytes(params_per_device, bytes_per_param, optimizer)
    return 2.0 * weights + grads + 2.0 * states
