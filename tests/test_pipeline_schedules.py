"""Pipeline schedules: the fast ``pipeline_time`` against the unrolled ``simulate``, hand-computed
toy pipelines, published bubble formulas, properties and input validation.

The differential test draws 300 pipelines per schedule (fixed seeds): 1-12 stages whose first and
last stages are 0-100% heavier than the middle ones (sometimes two middle kinds), 1-64
micro-batches, 1-4 model chunks where interleaving applies (in groups of pp, or of any group
Megatron-Core accepts for a micro-batch count that need not be a multiple of pp), a random
weight-gradient share,
random first-forward / last-backward / paired times, some stages released late, p2p latency
zero or up to 30% of a forward, overlapped or not. ``pipeline_time`` is exact in every case (closed form or certified periodic
extrapolation, see pipeline_schedule), so totals, per-entry bubbles and finishes must agree with
the simulation to 1e-9 relative.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshplan.errors import MeshplanError
from meshplan.specs.plan import group_problem, interleave_group
from meshplan.timeline.pipeline_schedule import StageWork, pipeline_time, pipeline_time_s, simulate, simulate_1f1b

PROPERTY = settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
KINDS = {"gpipe": ("gpipe", 1), "1f1b": ("1f1b", 1), "interleaved": ("1f1b", None), "grouped": ("1f1b", None),
         "zb-h1": ("zb-h1", 1), "dualpipe": ("dualpipe", 1)}


def random_pipeline(rng: np.random.Generator, kind: str) -> tuple[list[StageWork], int, str, int, float, bool, int | None]:
    """(stages, micro_batches, schedule, virtual, p2p_s, overlap_p2p, group) for one random case."""
    schedule, virtual = KINDS[kind]
    p = 2 * int(rng.integers(1, 7)) if schedule == "dualpipe" else int(rng.integers(1, 13))
    group = None
    if kind == "grouped":
        virtual = int(rng.integers(2, 4))
        m = int(rng.integers(p, 65))
        group = int(rng.choice([g for g in range(p, m + 1) if group_problem(p, m, g) is None]))
    elif virtual is None:
        virtual = int(rng.integers(2, 5))
        m = p * int(rng.integers(1, 64 // p + 1))
    elif schedule == "dualpipe":
        m = 2 * int(rng.integers(p, 33))
    else:
        m = int(rng.integers(1, 65))
    forward = rng.uniform(0.5, 2.0)
    weight_share = rng.uniform(0.0, 0.5)

    def work(scale: float, count: int) -> StageWork:
        f = forward * scale * rng.uniform(0.9, 1.1)
        full = 2 * f * rng.uniform(0.75, 1.25)
        w = weight_share * full
        return StageWork(
            forward_s=f, backward_s=full - w, weight_s=w,
            first_forward_s=f * rng.uniform(1.0, 1.5) if rng.random() < 0.3 else None,
            last_backward_s=full * rng.uniform(1.0, 1.5) if rng.random() < 0.3 else None,
            paired_s=(f + full) * rng.uniform(0.6, 1.0) if rng.random() < 0.5 else None,
            count=count,
            release_s=f * rng.uniform(0.0, 3.0) if rng.random() < 0.2 else 0.0,
        )

    first, last = 1 + rng.uniform(0, 1), 1 + rng.uniform(0, 1)
    if p == 1:
        stages = [work(first, 1)]
    elif p == 2:
        stages = [work(first, 1), work(last, 1)]
    elif p >= 4 and rng.random() < 0.3:  # two kinds of middle stages
        split = int(rng.integers(1, p - 2))
        stages = [work(first, 1), work(1.0, split), work(rng.uniform(0.8, 1.2), p - 2 - split), work(last, 1)]
    else:
        stages = [work(first, 1), work(1.0, p - 2), work(last, 1)]
    p2p = 0.0 if rng.random() < 0.3 else rng.uniform(0.0, 0.3) * forward
    return stages, m, schedule, virtual, p2p, bool(rng.integers(2)), group


def reference(stages, m, schedule, virtual, p2p_s, overlap_p2p, group=None) -> tuple[float, list[float], list[float]]:
    """(total, bubble per entry, finish per entry) read off the unrolled simulation."""
    timeline = simulate(stages, m, schedule, virtual, p2p_s, overlap_p2p, group)
    total = max(op.end_s for ops in timeline for op in ops)
    bubble, finish, start = [], [], 0
    for w in stages:
        rows = timeline[start:start + w.count]
        bubble.append(max(total - sum(op.end_s - op.start_s for op in ops) for ops in rows))
        finish.append(max(ops[-1].end_s for ops in rows))
        start += w.count
    return total, bubble, finish


@pytest.mark.parametrize("kind", list(KINDS))
def test_pipeline_time_equals_the_simulation(kind):
    rng = np.random.default_rng(list(KINDS).index(kind) + 2024)
    mismatches = []
    for _ in range(300):
        case = random_pipeline(rng, kind)
        total, bubble, finish = reference(*case)
        fast = pipeline_time(*case)
        ok = (fast.total_s == pytest.approx(total, rel=1e-9)
              and fast.bubble_s == pytest.approx(bubble, rel=1e-9, abs=1e-9 * total)
              and fast.finish_s == pytest.approx(finish, rel=1e-9))
        if not ok:
            mismatches.append((case, fast, (total, bubble, finish)))
    assert not mismatches, mismatches[:3]


# Hand-computed and published pipelines


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("p,m", [(1, 4), (4, 4), (4, 16), (8, 3), (16, 64)])
def test_uniform_stages_take_m_plus_p_minus_1_cycles(schedule, p, m):
    """Narayanan et al. SC21 Sec. 2.2.1: (m + p - 1)(F + B), bubble fraction (p-1)/m."""
    f, b, w = 1.0, 1.5, 0.5
    result = pipeline_time([StageWork(f, b, w, count=p)], m, schedule)
    assert result.total_s == pytest.approx((m + p - 1) * (f + b + w))
    assert result.bubble_s == pytest.approx(((p - 1) * (f + b + w),))
    assert result.finish_s == pytest.approx((result.total_s,))


def test_two_stages_with_a_heavy_first_stage_by_hand():
    """p=2, m=2, stage 0: F=2, B=4; stage 1: F=1, B=2. Stage 0 runs F0 [0,2], F1 [2,4]; stage 1
    F0 [2,3], B0 [3,5], F1 [5,6], B1 [6,8]; stage 0 B0 [5,9] (waits for stage 1), B1 [9,13].
    The old closed form m·max(c) + sum(c) - max(c) said 15."""
    result = pipeline_time([StageWork(2.0, 4.0), StageWork(1.0, 2.0)], 2)
    assert result.total_s == pytest.approx(13.0)
    assert result.finish_s == pytest.approx((13.0, 8.0))
    assert result.bubble_s == pytest.approx((1.0, 7.0))


@pytest.mark.parametrize("schedule,v", [("gpipe", 1), ("1f1b", 1), ("1f1b", 3)])
def test_a_release_on_every_stage_delays_the_pipeline_once(schedule, v):
    """Every stage's first op waits until R (parameters gathered on all stages at once): the
    schedule is the unreleased one shifted by R, not R per stage along the warm-up."""
    plain = [StageWork(1.0, 2.0), StageWork(1.5, 2.5, count=2), StageWork(1.2, 2.0)]
    released = [StageWork(w.forward_s, w.backward_s, count=w.count, release_s=7.0) for w in plain]
    before, after = pipeline_time(plain, 8, schedule, v), pipeline_time(released, 8, schedule, v)
    assert after.total_s == pytest.approx(before.total_s + 7.0)
    assert after.finish_s == pytest.approx(tuple(f + 7.0 for f in before.finish_s))


def test_a_late_released_second_stage_by_hand():
    """p=2, m=1, F=1, B=2; stage 1 released at 5: stage 0 F [0,1]; stage 1 F [5,6], B [6,8];
    stage 0 B [8,10]."""
    result = pipeline_time([StageWork(1.0, 2.0), StageWork(1.0, 2.0, release_s=5.0)], 1, "1f1b")
    assert result.total_s == pytest.approx(10.0)
    assert result.finish_s == pytest.approx((10.0, 8.0))


@pytest.mark.parametrize("p,v,m", [(4, 2, 8), (4, 4, 16), (8, 2, 8), (8, 4, 64)])
def test_interleaving_divides_the_bubble_by_v(p, v, m):
    """Narayanan et al. SC21 Sec. 2.2.2: with v chunks of (F+B)/v each the bubble is
    (p-1)(F+B)/v, including m == p where Megatron runs all forwards first."""
    f, b = 1.0, 2.0  # per stage and micro-batch; one chunk does 1/v of it
    result = pipeline_time([StageWork(f / v, b / v, count=p)], m, "1f1b", virtual=v)
    assert result.bubble_s == pytest.approx(((p - 1) * (f + b) / v,))
    assert result.total_s == pytest.approx(m * (f + b) + (p - 1) * (f + b) / v)


def test_groups_follow_megatron_cores_schedule_table():
    """Megatron-Core's own example (model_parallel_config.py, microbatch_group_size_per_vp_stage):
    PP=2 VP=2 with groups of 3 and 5 micro-batches runs forwards 0 1 2 0 1 2 3 4 3 4 (chunk 0 for
    the first three, chunk 1 for them, then the last group of two through both chunks)."""
    forwards = [op for op in simulate([StageWork(1.0, 2.0, count=2)], 5, "1f1b", 2, group=3)[0] if op.kind == "F"]
    assert [op.micro_batch for op in forwards] == [0, 1, 2, 0, 1, 2, 3, 4, 3, 4]
    assert [op.chunk for op in forwards] == [0, 0, 0, 1, 1, 1, 0, 0, 1, 1]


@pytest.mark.parametrize("p,v,m,group", [(4, 2, 24, 6), (4, 2, 22, 6), (4, 3, 10, 5), (8, 2, 20, 10), (4, 2, 6, 6)])
def test_any_accepted_group_keeps_the_interleaved_bubble(p, v, m, group):
    """Uniform stages, no p2p latency: whatever the group, each stage idles (p-1) chunk
    forwards-and-backwards, the bubble of Narayanan et al. SC21 Sec. 2.2.2 (a larger group only
    keeps more micro-batches in flight)."""
    f, b = 1.0, 2.0
    result = pipeline_time([StageWork(f / v, b / v, count=p)], m, "1f1b", virtual=v, group=group)
    assert result.bubble_s == pytest.approx(((p - 1) * (f + b) / v,))
    assert result.total_s == pytest.approx(m * (f + b) + (p - 1) * (f + b) / v)


def test_the_default_group_is_pytorchs_round_where_pytorch_runs():
    """interleave_group: pp when it divides m, else the smallest group Megatron-Core accepts; that
    is PyTorch's ScheduleInterleaved1F1B round, m // (m // p), for every m it accepts."""
    assert interleave_group(4, 16) == 4
    assert interleave_group(4, 10) == 5  # groups of 4 would leave 2 < pp
    assert interleave_group(4, 9) == 5  # 5 + 4: the last group holds pp
    assert interleave_group(8, 12) == 12
    for p in range(2, 13):
        for m in range(p, 200):
            rounds = m // p
            if m % rounds == 0:
                assert interleave_group(p, m) == m // rounds, (p, m)


@pytest.mark.parametrize("f,b,w", [(1.0, 1.0, 1.0), (1.0, 2.0, 0.5), (2.0, 1.0, 0.5), (1.0, 1.0, 0.2)])
@pytest.mark.parametrize("p,m", [(4, 8), (8, 16), (8, 32)])
def test_zb_h1_uniform_bubble(f, b, w, p, m):
    """Qi et al. ICLR 2024 Sec. 2.1: ZB-H1's bubble is (p-1)(F+B-W) against 1F1B's (p-1)(F+B+W),
    for W no longer than F or B (the W passes then fit the gaps)."""
    result = pipeline_time([StageWork(f, b, w, count=p)], m, "zb-h1")
    assert result.bubble_s == pytest.approx(((p - 1) * (f + b - w),))
    assert pipeline_time([StageWork(f, b, w, count=p)], m, "1f1b").bubble_s == pytest.approx(((p - 1) * (f + b + w),))


@pytest.mark.parametrize("f,w,pair", [(1.0, 1.0, 2.5), (1.0, 0.5, 2.0), (2.0, 1.0, 4.0)])
@pytest.mark.parametrize("p,m", [(4, 8), (8, 16), (8, 40)])
def test_dualpipe_bubble_matches_deepseek_v3_table_2_when_f_equals_b(f, w, pair, p, m):
    """DeepSeek-V3 Table 2 (B there is the full backward, our B + W): the middle devices idle
    (PP/2 - 1)(F&B + B + W - 3W). Exact for our order when F = B (input-gradient part)."""
    b = f
    result = pipeline_time([StageWork(f, b, w, paired_s=pair, count=p)], m, "dualpipe")
    assert max(result.bubble_s) == pytest.approx((p / 2 - 1) * (pair + b + w - 3 * w))


def test_dualpipe_bubble_with_a_longer_backward():
    """With B = 2F (F=1, B=2, W=1, F&B=3.5, p=8, 16 micro-batches) Table 2's count is
    3 x (3.5 + 3 - 3) = 10.5 s; our order idles 9.5 s on the middle devices: 3.0 s before the
    first forward arrives, 2.0 s before the first backward does, 3 x 0.5 s in the cool-down and
    3.0 s after the last op; 8.5 s on the end devices. The table's slot count holds when a forward
    chunk takes as long as an input-gradient one (test above)."""
    stages = [StageWork(1.0, 2.0, 1.0, paired_s=3.5, count=8)]
    result = pipeline_time(stages, 16, "dualpipe")
    idle = [result.total_s - sum(op.end_s - op.start_s for op in ops) for ops in simulate(stages, 16, "dualpipe")]
    assert result.total_s == pytest.approx(70.0)
    assert max(result.bubble_s) == pytest.approx(9.5)
    assert idle == pytest.approx([8.5, 9.0, 9.5, 9.5, 9.5, 9.5, 9.0, 8.5])


def test_cost_does_not_grow_with_micro_batches():
    """A million micro-batches: closed form and certified extrapolation both stay exact."""
    uniform = [StageWork(1.0, 2.0, count=8)]
    assert pipeline_time(uniform, 10**6).total_s == pytest.approx((10**6 + 7) * 3.0, rel=1e-12)
    chunks = [StageWork(0.5, 1.0, count=8)]  # two chunks of half the work each
    assert pipeline_time(chunks, 8 * 10**5, "1f1b", virtual=2).total_s == pytest.approx(
        8 * 10**5 * 3.0 + 7 * 1.5, rel=1e-12)
    stages = [StageWork(1.1, 2.2, 0.4), StageWork(1.0, 2.0, 0.3, count=6), StageWork(1.6, 3.2, 0.5)]
    small, large = (pipeline_time(stages, m, "zb-h1", p2p_s=0.05) for m in (200, 200 + 10**6))
    assert large.total_s - small.total_s == pytest.approx(10**6 * 5.3, rel=1e-12)


@pytest.mark.parametrize("schedule,virtual,p2p", [("1f1b", 1, 0.01), ("1f1b", 2, 0.0), ("zb-h1", 1, 0.0), ("dualpipe", 1, 0.0)])
def test_nearly_equal_stages_are_still_exact(schedule, virtual, p2p):
    """First and last stage within 0.1% of each other: the slower one takes over only after
    hundreds of micro-batches, so the extrapolation inserts the steady periods as max-plus
    matrix powers instead of a constant step (dualpipe's devices each hold a first-half and a
    last-half stage, so there it settles at once); it must still match the simulation."""
    stages = [StageWork(1.101, 2.202, 0.3), StageWork(1.0, 2.0, 0.3, count=6), StageWork(1.1, 2.2, 0.3)]
    m = 320
    total, bubble, finish = reference(stages, m, schedule, virtual, p2p, True)
    fast = pipeline_time(stages, m, schedule, virtual, p2p)
    assert fast.total_s == pytest.approx(total, rel=1e-9)
    assert fast.finish_s == pytest.approx(finish, rel=1e-9)
    assert fast.bubble_s == pytest.approx(bubble, rel=1e-9, abs=1e-9 * total)


# Properties

stage_work = st.builds(
    lambda f, b, w, n: StageWork(f, b, w, count=n),
    st.floats(0.1, 3.0), st.floats(0.1, 6.0), st.floats(0.0, 2.0), st.integers(1, 4),
)
pipelines = st.tuples(st.lists(stage_work, min_size=1, max_size=3), st.integers(1, 24), st.floats(0.0, 0.5), st.booleans())


@PROPERTY
@given(pipelines, st.sampled_from(["gpipe", "1f1b", "zb-h1"]))
def test_more_micro_batches_never_lower_the_total(pipeline, schedule):
    stages, m, p2p, overlap = pipeline
    assert pipeline_time(stages, m + 1, schedule, 1, p2p, overlap).total_s >= pipeline_time(stages, m, schedule, 1, p2p, overlap).total_s


@PROPERTY
@given(pipelines, st.sampled_from(["gpipe", "1f1b", "zb-h1"]))
def test_bubbles_are_never_negative_and_finishes_never_exceed_the_total(pipeline, schedule):
    stages, m, p2p, overlap = pipeline
    result = pipeline_time(stages, m, schedule, 1, p2p, overlap)
    assert min(result.bubble_s) >= -1e-9 * result.total_s
    assert max(result.finish_s) == pytest.approx(result.total_s)


@PROPERTY
@given(stage_work, st.integers(1, 24), st.integers(1, 4), st.sampled_from(["gpipe", "1f1b", "zb-h1"]))
def test_one_stage_has_no_bubble(work, m, v, schedule):
    single = StageWork(work.forward_s, work.backward_s, work.weight_s)
    result = pipeline_time([single], m, schedule, v if schedule == "1f1b" else 1, 0.3, False)
    assert result.bubble_s == pytest.approx((0.0,), abs=1e-9 * result.total_s)


@PROPERTY
@given(stage_work, st.integers(1, 12), st.integers(1, 24), st.floats(0.0, 0.5), st.booleans())
def test_zb_h1_is_never_slower_than_1f1b_for_identical_stages(work, p, m, p2p, overlap):
    """The same F and B + W on every stage, with W split out and deferred: never later."""
    stages = [StageWork(work.forward_s, work.backward_s, work.weight_s, count=p)]
    assert pipeline_time(stages, m, "zb-h1", 1, p2p, overlap).total_s <= pipeline_time(stages, m, "1f1b", 1, p2p, overlap).total_s * (1 + 1e-12)


def test_zb_h1_can_be_slower_than_1f1b_when_stages_differ():
    """ZB-H1's fixed order defers every W by p-1 iterations. Here the middle stage (the only one
    with a W) runs b0 [4,5], waits for b1 until 6, then W0, W1 [7,9]; 1F1B's fused backward
    B0 = b0 + W0 [4,6] fills that wait and ends at 8.5. (Found by the property test over
    heterogeneous stages; it also happens with m >= p when some W exceeds its stage's B.)"""
    stages = [StageWork(1.0, 0.5, 0.0), StageWork(1.0, 1.0, 1.0), StageWork(1.0, 1.0, 0.0)]
    assert pipeline_time(stages, 2, "zb-h1").total_s == pytest.approx(9.0)
    assert pipeline_time(stages, 2, "1f1b").total_s == pytest.approx(8.5)


@PROPERTY
@given(pipelines, st.sampled_from(["gpipe", "1f1b", "zb-h1"]))
def test_overlapping_p2p_is_never_slower(pipeline, schedule):
    stages, m, p2p, _ = pipeline
    assert pipeline_time(stages, m, schedule, 1, p2p, True).total_s <= pipeline_time(stages, m, schedule, 1, p2p, False).total_s * (1 + 1e-12)


# Input validation


@pytest.mark.parametrize("kwargs,field", [
    (dict(schedule="pipedream"), "plan.schedule"),
    (dict(schedule="gpipe", virtual=2), "plan.virtual_pipeline_stages"),
    (dict(schedule="zb-h1", virtual=2), "plan.virtual_pipeline_stages"),
    (dict(schedule="dualpipe", virtual=2), "plan.virtual_pipeline_stages"),
    (dict(virtual=0), "plan.virtual_pipeline_stages"),
    (dict(virtual=2, micro_batches=6), "pipeline.micro_batches"),  # groups of p = 4 leave 2
    (dict(virtual=2, micro_batches=3, group=4), "pipeline.micro_batches"),  # fewer than p
    (dict(virtual=2, micro_batches=10, group=3), "plan.microbatch_group_size"),  # below p
    (dict(virtual=2, micro_batches=10, group=12), "plan.microbatch_group_size"),  # above m
    (dict(virtual=2, micro_batches=10, group=7), "plan.microbatch_group_size"),  # leaves 3 < p
    (dict(virtual=2, micro_batches=10, group=5.0), "plan.microbatch_group_size"),
    (dict(micro_batches=0), "pipeline.micro_batches"),
    (dict(micro_batches=2.5), "pipeline.micro_batches"),
    (dict(schedule="dualpipe", micro_batches=6), "pipeline.micro_batches"),  # < 2p
    (dict(schedule="dualpipe", micro_batches=9), "pipeline.micro_batches"),  # odd
    (dict(p2p_s=-1.0), "pipeline.p2p_s"),
    (dict(p2p_s=float("nan")), "pipeline.p2p_s"),
    (dict(stages=[]), "pipeline.stages"),
    (dict(stages=[StageWork(-1.0, 1.0, count=4)]), "pipeline.stages[0].forward_s"),
    (dict(stages=[StageWork(1.0, 1.0, count=0)]), "pipeline.stages[0].count"),
    (dict(stages=[StageWork(1.0, 2.0, last_backward_s=1.0, count=4)]), "pipeline.stages[0].last_backward_s"),
    (dict(stages=[StageWork(1.0, 2.0, count=4, release_s=-1.0)]), "pipeline.stages[0].release_s"),
    (dict(stages=[StageWork(1.0, 2.0, count=4, release_s=float("inf"))]), "pipeline.stages[0].release_s"),
    (dict(stages=[StageWork(1.0, 2.0, count=3)], schedule="dualpipe", micro_batches=8), "plan.pp"),
])
def test_invalid_inputs_name_the_field(kwargs, field):
    call = dict(stages=[StageWork(1.0, 2.0, count=4)], micro_batches=8, schedule="1f1b", virtual=1, p2p_s=0.0)
    call.update(kwargs)
    for fn in (pipeline_time, simulate):
        with pytest.raises(MeshplanError) as error:
            fn(**call)
        assert error.value.field == field


# The old entry points, kept for timeline.step and timeline.trace


def test_old_entry_points():
    total, bubble = pipeline_time_s([(3.0, 8)], 64)
    assert (total, bubble) == pytest.approx(((64 + 7) * 3.0, 7 * 3.0))
    total4, bubble4 = pipeline_time_s([(3.0, 8)], 64, 4)
    assert bubble4 == pytest.approx(bubble / 4)
    events = simulate_1f1b([1.0, 1.0], [2.0, 2.0], 3)
    assert [e[:2] for e in events[1]] == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2)]
    assert events[0][-1][3] == pytest.approx((3 + 1) * 3.0)
