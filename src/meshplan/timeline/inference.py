"""Inference: a prefill of the prompts, then decoding one token at a time with a KV cache.

Each phase is one forward pass through the stages training goes through: the same lowering
(meshplan.workloads.transformer; a decode step's new token attends to the cache), the same
sharding, collectives and device roles (meshplan.parallel.program.build_program with a Phase),
the same op and collective costs (meshplan.costs.costed), and each role's pass built by the same
builders (meshplan.timeline.passes.forward_pass) and scheduled as tasks on streams by the one
engine (meshplan.timeline.engine.schedule_pass). Prefill runs the ``prompt_len`` tokens of every
sequence at once; a decode step runs one token per sequence that attends to its cached keys and
values. Attention cost is linear in the context length, so the decode step at the mean context
(prompt + output/2) gives the mean time per output token. A token passes the pipeline stages one
after another, so their pass times add, with one activation send between neighbouring chunks.
A serving engine issues each step as CUDA graphs; an eager plan (Hugging Face generate) issues
kernel by kernel and waits for the host as eager training does (costs.host.host_bound).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from meshplan.costs.costed import CostedProgram, comm_s, cost_program, forward_bound
from meshplan.costs.energy import EnergyBreakdown, pass_energy
from meshplan.parallel.memory import InferenceMemory
from meshplan.parallel.program import Phase, build_program
from meshplan.specs.task import Task
from meshplan.specs.scenario import Scenario
from meshplan.timeline.engine import Pass, schedule_pass
from meshplan.timeline.step import pass_plans
from meshplan.units import format_bytes, format_devices, format_seconds


@dataclass(frozen=True)
class PhaseTime:
    time_s: float  # one pass through every pipeline stage
    compute_s: float  # compute tasks of the pass, every stage
    tp_comm_s: float  # tensor-parallel communication the pass waits on (exposed), every stage
    pp_comm_s: float  # activation sends between the stages
    flop: float  # per device, all decoder layers of the pass
    hbm_bytes: float  # bytes the layers must move through HBM at least (weights, KV cache)
    roofline_s: float  # max(flop / peak, bytes / peak bandwidth) summed over layers: a lower bound

    @property
    def memory_bound(self) -> bool:
        return self.hbm_bytes > 0 and self.roofline_s > 0 and self.arithmetic_intensity < self.ridge

    arithmetic_intensity: float = 0.0  # flop per byte of HBM traffic
    ridge: float = 0.0  # the device's flop per byte at which compute and bandwidth balance
    # of time_s, the GPU's waits for the host to issue the decoder layers' kernels (an eager
    # plan's; costs.host.host_bound): more than half of the pass, and the host sets its pace
    host_wait_s: float = 0.0

    @property
    def host_bound(self) -> bool:
        return self.host_wait_s > 0.5 * self.time_s


@dataclass(frozen=True)
class InferenceEstimate:
    model_id: str
    cluster_id: str
    num_devices: int
    plan: dict
    batch_size: int
    prompt_len: int
    output_len: int
    ttft_s: float  # time to first token: the prefill
    tpot_s: float  # time per output token: one decode step at the mean context
    request_s: float  # ttft + output_len x tpot
    decode_tokens_per_s: float  # all replicas
    tokens_per_s: float  # output tokens over the whole request, all replicas
    prefill: PhaseTime
    decode: PhaseTime
    memory: InferenceMemory  # the device with the least headroom
    fits: bool
    prefill_energy: EnergyBreakdown | None = None  # every device, one prefill (None: no power model)
    decode_energy: EnergyBreakdown | None = None  # every device, one decode step

    @property
    def energy_per_request_j(self) -> float | None:
        """The prefill and every decode step of one batch of requests, all devices."""
        if self.prefill_energy is None or self.decode_energy is None:
            return None
        return self.prefill_energy.total_j + self.output_len * self.decode_energy.total_j

    @property
    def energy_per_output_token_j(self) -> float | None:
        request = self.energy_per_request_j
        return None if request is None else request / (self.batch_size * self.output_len)

    def _repr_html_(self) -> str:
        """Key numbers and small charts in notebooks (meshplan.plots.notebook)."""
        from meshplan.plots.notebook import inference_html

        return inference_html(self)

    def to_dict(self) -> dict:
        out = asdict(self)
        for phase in ("prefill_energy", "decode_energy"):
            energy = getattr(self, phase)
            out[phase] = energy.as_dict() if energy else None
        out["energy_per_request_j"] = self.energy_per_request_j
        out["energy_per_output_token_j"] = self.energy_per_output_token_j
        out["memory"]["total_bytes"] = self.memory.total_bytes
        out["prefill"]["memory_bound"] = self.prefill.memory_bound
        out["decode"]["memory_bound"] = self.decode.memory_bound
        return out

    def __repr__(self) -> str:
        return (
            f"InferenceEstimate({self.model_id} on {format_devices(self.num_devices, self.cluster_id)}, batch {self.batch_size}: "
            f"TTFT {format_seconds(self.ttft_s)}, TPOT {format_seconds(self.tpot_s)}, "
            f"{self.decode_tokens_per_s:,.0f} tokens/s decoding, memory {format_bytes(self.memory.total_bytes)} "
            f"of {format_bytes(self.memory.capacity_bytes)} ({'fits' if self.fits else 'DOES NOT FIT'}))"
        )


@dataclass(frozen=True)
class PhasePlan:
    """A serving phase ready to schedule or draw: its costed program and each role's pass."""

    costed: CostedProgram
    passes: tuple[Pass, ...]  # one per device role, in pipeline order
    send_s: float  # one activation to the next pipeline chunk

    @property
    def sends(self) -> int:
        """Chunk boundaries a token crosses on its way through the pipeline."""
        plan = self.costed.program.scenario.plan
        return plan.pp * plan.virtual_pipeline_stages - 1


def serving_phases(task: Task) -> tuple[Phase, Phase]:
    """The prefill (the prompt attending to itself) and the decode step at the mean context."""
    return (Phase("prefill", task.prompt_len, task.prompt_len),
            Phase("decode", 1, int(round(task.prompt_len + task.output_len / 2.0))))


def phase_plan(scenario: Scenario, phase: Phase) -> PhasePlan:
    costed = cost_program(build_program(scenario, phase))
    program = costed.program
    passes = tuple(pass_plans(costed, i, forward_only=True)["forward"] for i in range(len(program.roles)))
    return PhasePlan(costed, passes, comm_s(program.pp_comm) if program.pp_comm else 0.0)


def phase_time(plan: PhasePlan, compose: bool = True) -> PhaseTime:
    """Every role's pass scheduled (composed, or unrolled for tests), its stages one after another."""
    program = plan.costed.program
    stages = [role.stages for role in program.roles]
    timed = [schedule_pass(p, compose) for p in plan.passes]
    pp_s = plan.sends * plan.send_s
    bound = forward_bound(program)
    kinds = plan.costed.kinds
    host_wait = sum(role.stages * sum(n * kinds[k].host_wait_forward_s for k, n, _ in role.layer_counts)
                    for role in program.roles)
    return PhaseTime(
        time_s=sum(n * t.time_s for n, t in zip(stages, timed)) + pp_s,
        compute_s=sum(n * t.compute_s for n, t in zip(stages, timed)),
        tp_comm_s=sum(n * t.exposed_s["tp"] for n, t in zip(stages, timed)),
        pp_comm_s=pp_s,
        flop=bound.flop,
        hbm_bytes=bound.hbm_bytes,
        roofline_s=bound.roofline_s,
        arithmetic_intensity=bound.arithmetic_intensity,
        ridge=bound.ridge,
        host_wait_s=host_wait,
    )


def serving_plans(scenario: Scenario) -> tuple[PhasePlan, PhasePlan]:
    return tuple(phase_plan(scenario, phase) for phase in serving_phases(scenario.task))  # type: ignore[return-value]


def inference_estimate(scenario: Scenario, compose: bool = True, plans: tuple[PhasePlan, PhasePlan] | None = None) -> InferenceEstimate:
    task = scenario.task
    prefill_plan, decode_plan = plans or serving_plans(scenario)
    prefill, decode = phase_time(prefill_plan, compose), phase_time(decode_plan, compose)
    roles = decode_plan.costed.program.roles
    memory = min((role.memory for role in roles), key=lambda m: m.headroom_bytes)
    request = prefill.time_s + task.output_len * decode.time_s
    return InferenceEstimate(
        model_id=scenario.model.id,
        cluster_id=scenario.cluster.id,
        num_devices=scenario.num_devices,
        plan=scenario.plan.model_dump(),
        batch_size=task.batch_size,
        prompt_len=task.prompt_len,
        output_len=task.output_len,
        ttft_s=prefill.time_s,
        tpot_s=decode.time_s,
        request_s=request,
        decode_tokens_per_s=task.batch_size / decode.time_s,
        tokens_per_s=task.batch_size * task.output_len / request,
        prefill=prefill,
        decode=decode,
        memory=memory,  # type: ignore[arg-type]
        fits=all(role.memory.fits for role in roles),
        prefill_energy=pass_energy(prefill_plan.costed, prefill.time_s),
        decode_energy=pass_energy(decode_plan.costed, decode.time_s),
    )
