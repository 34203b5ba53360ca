"""The CPU/memory-aware fragmentation measure and the target workload learned from arrivals."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.benchmarks.fgd.learned import LearnedShapes, LearnedWorkload, ResourceFrag
from autoscaler.benchmarks.fgd.sim import PodView, State, simulate
from autoscaler.benchmarks.fgd.slotwise import SlotwisePolicy
from autoscaler.benchmarks.fgd.workload import Arrival, Cluster, Pods, target_shapes

MODELS = ("A", "B")


def _cluster(n: int, cpu: int, mem: int, gpus: list[int]) -> Cluster:
    models = [MODELS[i % 2] for i in range(n)]
    return Cluster.from_columns([f"n{i}" for i in range(n)], [cpu] * n, [mem] * n, gpus, models)


def _pods(rows: list[tuple[int, int, int, int, str]]) -> Pods:
    return Pods.from_columns([f"p{i}" for i in range(len(rows))], [r[0] for r in rows], [r[1] for r in rows],
                             [r[2] for r in rows], [r[3] for r in rows], [r[4] for r in rows])


def _shapes(rows: list[tuple[int, int, int, int, str, int]]) -> LearnedShapes:
    """(cpu, mem, num_gpu, gpu_milli, spec, weight) rows."""
    def col(i: int) -> np.ndarray:
        return np.array([r[i] for r in rows], dtype=np.int64)

    return LearnedShapes(cpu=col(0), mem=col(1), num_gpu=col(2), gpu_milli=col(3), spec=tuple(r[4] for r in rows),
                         weight=col(5))


shape_rows = st.lists(
    st.tuples(st.integers(0, 16000), st.integers(0, 64000), st.integers(0, 4), st.sampled_from([100, 250, 500, 1000]),
              st.sampled_from(["", "A", "B", "A|B"]), st.integers(1, 50)),
    min_size=1, max_size=8,
).map(lambda rs: [(c, m, n, g if n else 0, s if n else "", w) for c, m, n, g, s, w in rs])

placements = st.lists(st.tuples(st.integers(0, 5), st.integers(0, 32000), st.integers(0, 128000),
                                st.sampled_from([0, 1, 2]), st.sampled_from([100, 300, 700, 1000])),
                      max_size=30)


def _state(cpu: int, mem: int, steps: list[tuple[int, int, int, int, int]]) -> State:
    cl = _cluster(6, cpu, mem, [1, 2, 4, 8, 8, 2])
    pods = _pods([(0, 0, 0, 0, "")])
    s = State(cl, pods)
    for node, c, m, num, g in steps:
        pod = PodView(0, min(c, int(s.cpu_left[node])), min(m, int(s.mem_left[node])), num, g if num else 0, 0)
        if pod.num_gpu and (s.full_free[node] < pod.num_gpu if not pod.shared else s.gpu_max[node] < pod.gpu_milli):
            continue
        s.apply(node, s.default_gpus(node, pod), pod)
    return s


@settings(max_examples=60, deadline=None)
@given(shape_rows, placements)
def test_resource_aware_measure_is_at_least_the_gpu_only_one(rows, steps) -> None:
    state = _state(64000, 256000, steps)
    fm = ResourceFrag(_shapes(rows), MODELS)
    fm.bind(state)
    nodes = np.arange(len(state.cpu_left))
    assert (fm.F[nodes] >= fm.gpu_only(nodes) - 1e-9).all()


@settings(max_examples=60, deadline=None)
@given(shape_rows, placements)
def test_resource_aware_measure_equals_gpu_only_when_cpu_and_memory_are_plentiful(rows, steps) -> None:
    big = 10**9  # far above any shape's CPU or memory, whatever the placements took
    state = _state(big, big, steps)
    fm = ResourceFrag(_shapes(rows), MODELS)
    fm.bind(state)
    nodes = np.arange(len(state.cpu_left))
    assert np.array_equal(fm.F[nodes], fm.gpu_only(nodes))


@settings(max_examples=40, deadline=None)
@given(shape_rows, placements, st.integers(0, 5), st.integers(0, 40000), st.integers(0, 80000))
def test_after_matches_a_recount(rows, steps, node, c, m) -> None:
    """The closed form for a candidate equals the measure recomputed on the placed state."""
    state = _state(64000, 256000, steps)
    fm = ResourceFrag(_shapes(rows), MODELS)
    fm.bind(state)
    pod = PodView(0, min(c, int(state.cpu_left[node])), min(m, int(state.mem_left[node])), 1, 300, 0)
    if state.gpu_max[node] < 300:
        return
    gpu = state.best_fit_gpu(node, 300)
    predicted = fm.after(np.array([node]), int(state.gpu_left[node, gpu]), 300, 1, pod)[0]
    state.apply(node, np.array([gpu]), pod)
    fm.refresh(np.array([node]))
    assert predicted == fm.F[node]


def test_node_without_cpu_counts_all_its_free_gpus_as_fragmented() -> None:
    cl = _cluster(2, 32000, 256000, [4, 4])
    state = State(cl, _pods([(0, 0, 0, 0, "")]))
    shapes = _shapes([(8000, 1000, 1, 1000, "", 3), (4000, 1000, 1, 500, "", 2)])
    fm = ResourceFrag(shapes, MODELS)
    fm.bind(state)
    assert fm.F[0] == 0.0  # all GPUs free and every shape fits: nothing fragmented
    # A CPU-only pod takes all but 2000 milli of node 0's CPU: no GPU shape's CPU fits any more.
    state.apply(0, np.empty(0, dtype=np.int64), PodView(0, 30000, 0, 0, 0, 0))
    fm.refresh(np.array([0]))
    assert fm.F[0] == 4000.0 * (3 + 2)  # all 4 idle GPUs, for every shape
    assert fm.gpu_only(np.array([0]))[0] == 0.0  # the GPU-only measure misses it
    assert fm.F[1] == 0.0


def test_node_without_memory_counts_its_free_gpus_as_fragmented() -> None:
    cl = _cluster(1, 64000, 16000, [2])
    state = State(cl, _pods([(0, 0, 0, 0, "")]))
    fm = ResourceFrag(_shapes([(1000, 12000, 1, 1000, "", 1)]), MODELS)
    fm.bind(state)
    assert fm.F[0] == 0.0
    state.apply(0, np.empty(0, dtype=np.int64), PodView(0, 0, 8000, 0, 0, 0))
    fm.refresh(np.array([0]))
    assert fm.F[0] == 2000.0


def test_learned_distribution_follows_arrivals() -> None:
    prior = target_shapes(_pods([(4000, 0, 1, 1000, "")] * 10))
    w = LearnedWorkload(prior, half_life=100.0, prior_weight=50.0)
    assert w.probabilities() == {(4000, 1000, 1, ""): 1.0}
    for _ in range(300):
        w.observe(2000, 8000, 1, 500, "")
    p = w.probabilities()
    # The prior (50) has halved 3 times; the arrivals weigh ~126 after decay: 126 / (126 + 6.25).
    assert abs(p[(2000, 500, 1, "")] - 0.953) < 0.01
    # The mix shifts: after a few half-lives the new shape dominates, the old one fades.
    for _ in range(400):
        w.observe(16000, 32000, 0, 0, "")
    p = w.probabilities()
    assert p[(16000, 0, 0, "")] > 0.9 and p[(2000, 500, 1, "")] < 0.1
    sh = w.shapes()
    assert (sh.cpu[0], sh.num_gpu[0], sh.mem[0]) == (16000, 0, 32000)  # memory: mean of the arrivals


def test_learned_memory_is_the_decayed_mean_of_the_shape() -> None:
    w = LearnedWorkload(None, half_life=1e12)
    for m in (1000, 3000):
        w.observe(1000, m, 1, 200, "")
    sh = w.shapes()
    assert sh.mem.tolist() == [2000] and sh.weight.sum() > 0


def test_slotwise_sees_every_arrival_placed_or_not() -> None:
    cl = _cluster(2, 8000, 64000, [1, 1])
    rows = [(1000, 1000, 1, 500, ""), (1000, 1000, 1, 1000, ""), (1000, 1000, 1, 1000, ""), (1000, 1000, 0, 0, "")]
    pods = _pods(rows)
    pol = SlotwisePolicy(target_shapes(pods), refresh_every=1)
    seen: list[int] = []
    orig = pol.arrived

    def spy(state: State, pod: PodView) -> None:
        seen.append(pod.index)
        orig(state, pod)

    pol.arrived = spy  # type: ignore[method-assign]
    res = simulate(cl, pods, Arrival(np.arange(4), np.arange(2), 0), pol)
    assert seen == [0, 1, 2, 3]
    assert res.failed == 1  # one whole-GPU pod finds no free GPU; the mix still learned it


def test_keep_prior_keeps_the_rare_prior_shapes_in_the_cut() -> None:
    # The prior is already FGD's cut; a second cut would drop its rarest shape (one 8-GPU pod in 40).
    pods = _pods([(4000, 0, 1, 500, "")] * 39 + [(120000, 0, 8, 1000, "")])
    prior = target_shapes(pods, coverage=1.0)
    for keep, expect in ((False, False), (True, True)):
        lw = LearnedWorkload(prior, half_life=100.0, coverage=0.95, keep_prior=keep)
        sh = lw.shapes()
        assert (8 in sh.num_gpu.tolist()) is expect
        keys = zip(sh.cpu.tolist(), sh.gpu_milli.tolist(), sh.num_gpu.tolist(), sh.spec, strict=True)
        assert len(sh) == len(set(keys))  # no shape twice
