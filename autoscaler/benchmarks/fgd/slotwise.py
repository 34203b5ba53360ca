"""``slotwise``: shared pods go where the planned packing of the target workload has room for them.

Measured on the FGD protocol (docs/sharing.md), the idle GPU left at 130% arrival is per-GPU gaps
too small for the pods still arriving, plus GPUs whose node has run out of CPU. Most of the gap
waste that a better online choice can remove comes from shared pods paired badly: a 320-milli pod
put next to a 470 (210 left, which only the rare pods of 160 milli or less fill) instead of next
to a 650 (30 left). So slotwise plans the pairing from the target workload (FGD's own input: the
shapes of the original trace) and places each shared pod against that plan:

1. **Planned packing (dual prices of the bin-packing LP).** Over the target workload's shared-GPU
   sizes with demands n_s, the LP relaxation min sum_c x_c s.t. sum_c a_sc x_c >= n_s (c = a way to
   fill one GPU) has dual prices y_s: the share of a GPU each size costs in the best packing
   (Gilmore-Gomory; solved by column generation with a knapsack). K(r) = the most price a gap of r
   milli can hold (a knapsack over y). Putting a pod of size s into a GPU with v free loses
   K(v) - K(v - s) - y_s >= 0 of planned value: 0 when the pod is where the plan would put it, more
   when it leaves a residual no planned mix of pods fills. No constant is fitted: the prices come
   from the target shapes of whatever trace is replayed.
2. **CPU stranding, in the same unit.** A node's idle GPUs need CPU to be used; the target workload
   says how much per GPU milli (``cpu_per_milli``). The CPU deficit max(0, idle x cpu_per_milli -
   CPU left) a placement adds, divided by cpu_per_milli, is GPU milli that can no longer be served.
   For shared pods the primary cost is 1000 x loss + that stranded milli (both GPU milli)
   **+ 0.3 x the expected fragmentation the placement adds** (dF / total of item 3, also GPU milli).
   The plan prices only shared-GPU gaps; dF also sees whole nodes that multi-GPU shapes need and
   GPUs a shape's CPU no longer fits. Measured: without it cpu200s seed 46 was 1.03x FGD's
   unallocated GPUs at 130% (0.85x with it), cpu250s seed 45 1.007x (0.94x); it costs cpu050 /
   default about 0.07 / 0.05 of ratio. Weight 1.0, or only dF's CPU/memory part, was worse on
   average (gpushare40 0.92x, cpu050 0.81x); dF's CPU/memory part alone at weight 1 put shared pods
   on fresh 8-GPU nodes: multigpu70s seed 44 at 100% arrival went to 11x FGD.
   **Model scarcity, in the same unit.** Where target shapes accept only some GPU models
   (``gpu_spec``), rho_m = the share of model m's GPUs those shapes claim while the cluster fills
   (their demand spread over the models they accept by GPU count). A pod taking g milli on model m
   is expected to crowd out g x clip(rho_m - rho_min, 0, 1) milli of constrained pods, rho_min over
   the models the pod accepts. Added to the shared cost, and ahead of FGD's score for whole-GPU
   pods. Without it the stranding term sent shared pods to the CPU-rich T4/P100 nodes the
   constrained pods need: gpuspec10 at 100% arrival was 1.04x FGD's unallocated GPUs.
3. **FGD's integer score, over FGD's CPU-aware measure of a learned workload**
   (:mod:`autoscaler.benchmarks.fgd.learned`) orders equal costs (and is the primary key for
   CPU-only pods, and for whole-GPU pods after model scarcity: their planned loss is always 0).
   The measure is FGD's F (a shape whose CPU no longer fits the node counts all its idle GPUs as
   fragmented) over shapes and weights from a decayed histogram of what has *arrived* (half-life
   8,000 arrivals, seeded by the trace's shapes), rebuilt every 200 arrivals. The prior is FGD's
   cut already, so every prior shape stays in the cut (``keep_prior``): cutting it again dropped
   the rare 120-core 8-GPU shape that only the 128-core nodes fit, CPU-only pods then filled those
   nodes, and multigpu45s seed 42 at 100% arrival was 1.40x FGD (under 0.87x kept). CPU and memory per
   GPU milli for the stranding cost come from the same histogram, each shape's memory the decayed
   mean of its pods: that is where memory enters. Memory in the measure's fit as well
   (``frag="learned"``) was measured worse: a node's first small pod makes the memory-heavy 8-GPU
   shapes stop fitting, after which the measure no longer protects the whole node (multigpu70s at
   100% arrival 1.14x FGD on seeds 44-45, 0.92x without); ``mem250s`` is 0.35x FGD either way
   (it was 1.20x before memory entered the stranding cost). Ranking by the raw dF, or by the plan
   alone, was measured worse: the coarse score spreads load across nodes, which matters at 100%.
4. **Then the old tie-breaks:** the Sum-of-Squares gap balance (Csirik et al., JACM 2006) plus the
   node's CPU deficit after the placement, then the seeded node order and the lowest GPU index.
   CPU-only and whole-GPU pods instead break FGD-score ties by the GPU milli they strand (CPU or
   memory), then **best fit on the spare room** (CPU/memory left beyond what the node's idle GPUs
   need, in GPU milli): they fill nodes that already have CPU to spare for their GPUs, not CPU-lean
   ones. On ``cpu300s`` (3x CPU-only pods, seed 42) that took slotwise from 1.01x FGD to 0.94x.
   Measured without it for whole-GPU pods (``rest="bestfit_cpu"``, seeds 42-51): cpu200s / cpu250s /
   cpu300s 1.21 / 1.09 / 1.05x FGD at 130% arrival. With it, ``multigpu45s`` at 100% arrival is
   above FGD (1.13x, seeds 42-43) though 0.82x at 130% -- that was the double cut of item 3.
   Worst fit on the spare room for CPU-only pods fixed multigpu45s too but cpu200s rose to 1.10x.

Nothing here reads the trace being replayed beyond FGD's own input (the target shapes from the
original pod list, used only as the learned histogram's prior) and the arrivals seen so far, so it
carries over to unseen variants. The ablation switches (``frag="fgd"`` FGD's fixed measure, ``frag="learned"``
memory in the fit too, ``blend=0``, ``keep_prior=False``, ``strand="cpu"``, ``rest="deficit"``,
``scarcity="node"``: scarcity also from CPU, memory and GPU count, measured worse) reproduce the
earlier policy's pieces.
"""

from __future__ import annotations

from dataclasses import replace
from math import gcd

import numpy as np

from autoscaler.benchmarks.fgd.learned import LearnedWorkload, ResourceFrag
from autoscaler.benchmarks.fgd.policies import FragModel, _Base, shared_candidates
from autoscaler.benchmarks.fgd.sim import PodView, State
from autoscaler.benchmarks.fgd.workload import MILLI, TARGET_COVERAGE, TargetShapes

GAP_STEP = 10  # milli per gap level; trace requests are multiples of 10
_EPS = 1e-9


def packing_prices(sizes: list[int], demand: list[float], cap: int = MILLI) -> np.ndarray:
    """Dual prices y of the bin-packing LP over ``sizes`` (with ``demand``), one per size.

    Gilmore-Gomory column generation: solve the dual max demand.y s.t. sum_s a_s y_s <= 1 for the
    configurations found so far, then add the most valuable configuration under y (an unbounded
    knapsack) until none exceeds 1. Starting from the one-size configurations keeps y bounded.
    """
    from scipy.optimize import linprog  # only the planner needs scipy; the simulator stays numpy

    if not sizes:
        return np.zeros(0)
    cols: list[list[int]] = [[cap // s if j == i else 0 for j in range(len(sizes))] for i, s in enumerate(sizes)]
    y = np.zeros(len(sizes))
    for _ in range(500):  # each round adds a new configuration; a few dozen suffice in practice
        res = linprog(-np.asarray(demand, dtype=np.float64), A_ub=np.array(cols, dtype=np.float64),
                      b_ub=np.ones(len(cols)), bounds=[(0, None)] * len(sizes), method="highs")
        if res.status != 0:
            raise RuntimeError(f"packing LP failed: {res.message}")
        y = np.maximum(np.asarray(res.x), 0.0)  # HiGHS can return -0.0
        value, config = _best_config(sizes, y, cap)
        if value <= 1.0 + _EPS or config in cols:
            break
        cols.append(config)
    return y


def _best_config(sizes: list[int], y: np.ndarray, cap: int) -> tuple[float, list[int]]:
    """The configuration (count per size, sum <= cap) with the largest total price."""
    step = _step(sizes, cap)
    k = knapsack(sizes, y, cap)
    counts = [0] * len(sizes)
    r = cap // step
    while r > 0:  # walk back through the DP
        if k[r] <= k[r - 1] + _EPS:
            r -= 1
            continue
        for i, s in enumerate(sizes):
            q = s // step
            if q <= r and abs(k[r - q] + y[i] - k[r]) <= _EPS:
                counts[i] += 1
                r -= q
                break
        else:
            r -= 1
    return float(k[cap // step]), counts


def _step(sizes: list[int], cap: int) -> int:
    g = cap
    for s in sizes:
        g = gcd(g, s)
    return max(g, 1)


def knapsack(sizes: list[int], y: np.ndarray, cap: int = MILLI) -> np.ndarray:
    """K[r // step]: the most price a gap of r milli holds (unbounded knapsack), r = 0..cap."""
    step = _step(sizes, cap)
    n = cap // step
    q = [s // step for s in sizes]
    k = np.zeros(n + 1)
    for r in range(1, n + 1):
        best = k[r - 1]
        for qi, yi in zip(q, y.tolist(), strict=True):
            if qi <= r and k[r - qi] + yi > best:
                best = k[r - qi] + yi
        k[r] = best
    return k


class SlotwisePolicy(_Base):
    """FGD's inputs and score, with shared pods placed by planned loss + stranded CPU (module doc)."""

    name = "slotwise"

    def __init__(self, shapes: TargetShapes, ss_weight: float = 1.0, cpu_weight: float = 1.0,
                 frag: str = "learned_cpu", strand: str = "cpumem", half_life: float = 8000.0,
                 refresh_every: int = 200, rest: str = "bestfit", mem_mean: str = "arith",
                 blend: float = 0.3, coverage: float = TARGET_COVERAGE, keep_prior: bool = True,
                 scarcity: str = "model") -> None:
        self.blend = blend
        self.coverage = coverage
        self.keep_prior = keep_prior
        self.scarcity = scarcity
        self.mem_mean = mem_mean
        self.rest = rest
        self.shapes = shapes
        self.frag_kind = frag
        self.strand_kind = strand
        self.half_life = half_life
        self.refresh_every = refresh_every
        self.ss_weight = ss_weight
        self.cpu_weight = cpu_weight
        # The plan: prices of the target workload's shared sizes (counts aggregated per milli).
        shared = (shapes.num_gpu == 1) & (shapes.gpu_milli > 0) & (shapes.gpu_milli < MILLI)
        demand: dict[int, float] = {}
        for g, c in zip(shapes.gpu_milli[shared].tolist(), shapes.counts[shared].tolist(), strict=True):
            demand[g] = demand.get(g, 0.0) + float(c)
        self.sizes = sorted(demand)
        self.prices = packing_prices(self.sizes, [demand[g] for g in self.sizes])
        self.price_of = dict(zip(self.sizes, self.prices.tolist(), strict=True))
        # A gap's value at 1 milli resolution (pods can ask for sizes the plan has not seen).
        steps = knapsack(self.sizes, self.prices)
        self.step = _step(self.sizes, MILLI)
        self.gap_value = np.repeat(steps, self.step)[: MILLI + 1] if len(self.sizes) else np.zeros(MILLI + 1)

    def bind(self, state: State, rng: np.random.Generator) -> None:
        super().bind(state, rng)
        self.state = state
        self.work = LearnedWorkload(self.shapes, half_life=self.half_life, mem_mean=self.mem_mean,
                                    coverage=self.coverage, keep_prior=self.keep_prior)
        self.since = 0
        if self.frag_kind in ("learned", "learned_cpu"):
            self.frag = ResourceFrag(self.work.shapes(), state.cluster.models)
        else:
            self.frag = FragModel(self.shapes, state.cluster.models)
        self.frag.bind(state)
        sh = self.shapes
        self.node_rho = node_scarcity(state, sh.cpu, np.zeros_like(sh.cpu), sh.num_gpu, sh.gpu_milli,
                                      sh.access(state.cluster.models), sh.counts, self.scarcity == "node")
        self.cpm, self.mpm = node_need(state, sh.cpu, np.zeros_like(sh.cpu), sh.num_gpu, sh.gpu_milli, sh.counts)
        # N(h) per GPU model: gaps on a T4 cannot serve a pod pinned to G2, so counts are per model.
        self.levels = MILLI // GAP_STEP + 1
        k = state.gpu_left.shape[1]
        self.node_levels = np.where(np.arange(k)[None, :] < state.gpus[:, None], state.gpu_left // GAP_STEP, -1)
        self.gap_count = np.zeros((len(state.cluster.models), self.levels), dtype=np.float64)
        real = self.node_levels >= 0
        gpu_model = np.broadcast_to(state.model[:, None], real.shape)[real]
        np.add.at(self.gap_count, (gpu_model, self.node_levels[real]), 1)

    def arrived(self, state: State, pod: PodView) -> None:
        """Learn the mix: every arrival enters the decayed histogram; the measure is rebuilt from it
        every ``refresh_every`` arrivals (a rebuild is one pass over the nodes)."""
        self.work.observe(pod.cpu, pod.mem, pod.num_gpu, pod.gpu_milli, state.specs[pod.spec])
        self.since += 1
        if self.since >= self.refresh_every:
            self.since = 0
            self._relearn(state)

    def _relearn(self, state: State) -> None:
        ls = self.work.shapes()
        if (ls.num_gpu > 0).any():
            self.cpm, self.mpm = node_need(state, ls.cpu, ls.mem, ls.num_gpu, ls.gpu_milli, ls.weight)
        if self.scarcity == "node":  # ablation: also CPU, memory and GPU count (measured worse)
            self.node_rho = node_scarcity(state, ls.cpu, ls.mem, ls.num_gpu, ls.gpu_milli,
                                          ls.access(state.cluster.models), ls.weight, True)
        if self.frag_kind in ("learned", "learned_cpu"):
            if self.frag_kind == "learned_cpu":
                ls = replace(ls, mem=np.zeros_like(ls.mem))
            self.frag = ResourceFrag(ls, state.cluster.models)
            self.frag.bind(state)

    def _fgd_score(self, nodes: np.ndarray, after: np.ndarray) -> np.ndarray:
        x = (self.frag.F[nodes] - after) / self.frag.total / 1000.0
        return (100.0 / (1.0 + np.exp(-x))).astype(np.int64)

    def _surplus(self, state: State, nodes: np.ndarray, pod: PodView) -> np.ndarray:
        """GPU milli the node's CPU and memory left after the pod could still serve, minus its idle GPUs."""
        idle = state.gpu_sum[nodes] - pod.gpu_total
        cpm, mpm = self.cpm[nodes], self.mpm[nodes]
        room = (state.cpu_left[nodes] - pod.cpu) / np.maximum(cpm, _EPS)
        room = np.where(mpm > 0, np.minimum(room, (state.mem_left[nodes] - pod.mem) / np.maximum(mpm, _EPS)), room)
        return np.minimum(room - idle, 1e6)

    def _cpu_deficit(self, state: State, nodes: np.ndarray, pod: PodView) -> np.ndarray:
        """CPU (milli) the node's idle GPUs would need beyond what is left, after the pod."""
        idle = state.gpu_sum[nodes] - pod.gpu_total
        return np.maximum(idle * self.cpm[nodes] - (state.cpu_left[nodes] - pod.cpu), 0.0)

    def choose(self, state: State, pod: PodView, feas: np.ndarray) -> tuple[int, np.ndarray]:
        if pod.shared:
            ri, ci, v = shared_candidates(state, pod, feas)
            nodes = feas[ri]
            after = self._after(nodes, v, pod.gpu_milli, 1, pod)
            score = self._fgd_score(nodes, after)
            second = 1000.0 * self.ss_weight * self._d_ss(state.model[nodes], v, pod.gpu_milli)
            deficit = self._cpu_deficit(state, nodes, pod)
            second += self.cpu_weight * deficit
            cost = self.planned_loss(v, pod.gpu_milli) * MILLI + self._stranded(state, nodes, deficit, pod, v)
            cost += self._displaced(state, nodes, pod)
            cost += self.blend * (after - self.frag.F[nodes]) / self.frag.total  # expected fragmentation added
            # Lexicographic: least cost (integer milli) first, then FGD's score (0..100).
            score = score - 1000 * np.round(cost).astype(np.int64)
            k = _lex_first(score, second)  # candidates are in (node order, GPU index): first = tie rule
            return int(nodes[k]), np.array([int(ci[k])])
        if pod.gpu_milli > 0:
            after = self._after(feas, MILLI, pod.gpu_milli, pod.num_gpu, pod)
        else:
            after = self._after(feas, 0, 0, 0, pod)
        score = self._fgd_score(feas, after)
        if pod.gpu_milli > 0:  # off the models constrained pods need first, then FGD's score
            score = score - 1000 * np.round(self._displaced(state, feas, pod)).astype(np.int64)
        second = self.cpu_weight * self._cpu_deficit(state, feas, pod)
        if self.rest == "bestfit" or (self.rest == "bestfit_cpu" and pod.gpu_milli <= 0):
            full = np.full(len(feas), MILLI, dtype=np.int64)
            stranded = np.round(self._stranded(state, feas, self._cpu_deficit(state, feas, pod), pod, full))
            surplus = self._surplus(state, feas, pod)
            sign = 1.0 if self.rest == "bestfit" else -1.0
            second = stranded * 1e9 + sign * surplus
        k = _lex_first(score, second)
        node = int(feas[k])
        return node, state.default_gpus(node, pod)

    def _after(self, rows: np.ndarray, v: np.ndarray | int, g: int, r: np.ndarray | int, pod: PodView) -> np.ndarray:
        if isinstance(self.frag, ResourceFrag):
            return self.frag.after(rows, v, g, r, pod)
        return self.frag.after(rows, v, g, r, pod.cpu)

    def planned_loss(self, v: np.ndarray, g: int) -> np.ndarray:
        """Planned value lost by taking ``g`` milli from GPUs with ``v`` free: K(v) - K(v-g) - y_g.

        A size outside the plan is priced at K(g), the planned pods its room could have held, so it
        goes where that room was not going to be used.
        """
        k = self.gap_value
        y = self.price_of.get(g, float(k[g]))
        return np.maximum(k[v] - k[v - g] - y, 0.0)

    def _displaced(self, state: State, nodes: np.ndarray, pod: PodView) -> np.ndarray:
        """GPU milli of constrained pods the placement is expected to crowd out: the pod's GPU milli
        times how much scarcer the node's model is than the least scarce model the pod accepts."""
        ok = state.node_access[pod.spec] & (state.gpus > 0)
        if self.scarcity == "node":
            cl = state.cluster
            ok &= (cl.cpu >= pod.cpu) & (cl.mem >= pod.mem) & (state.gpus >= pod.num_gpu)
        base = float(self.node_rho[ok].min()) if ok.any() else 0.0
        return pod.gpu_total * np.clip(self.node_rho[nodes] - base, 0.0, 1.0)

    def _stranded(self, state: State, nodes: np.ndarray, deficit_after: np.ndarray, pod: PodView,
                  v: np.ndarray) -> np.ndarray:
        """GPU milli the placement strands for lack of CPU (and memory): the deficit it adds / per milli."""
        if self.strand_kind == "frag" and isinstance(self.frag, ResourceFrag):
            fm = self.frag
            before = fm.F[nodes] - fm.gpu_only(nodes)
            after = self._after(nodes, v, pod.gpu_milli, 1, pod) - fm.after(nodes, v, pod.gpu_milli, 1, pod, False)
            return (after - before) / fm.total
        cpm, mpm = np.maximum(self.cpm[nodes], _EPS), self.mpm[nodes]
        idle = state.gpu_sum[nodes]
        cb = np.maximum(idle * cpm - state.cpu_left[nodes], 0.0) / cpm
        ca = deficit_after / cpm
        if self.strand_kind != "cpumem" or not (mpm > 0).any():
            return ca - cb
        m = np.maximum(mpm, _EPS)
        mb = np.maximum(idle * mpm - state.mem_left[nodes], 0.0) / m
        ma = np.maximum((idle - pod.gpu_total) * mpm - (state.mem_left[nodes] - pod.mem), 0.0) / m
        return np.maximum(ca, ma) - np.maximum(cb, mb)

    def _d_ss(self, model: np.ndarray, v: np.ndarray, g: int) -> np.ndarray:
        """Change of sum_h N(h)^2 over partial gaps when a GPU goes from ``v`` to ``v - g`` free."""
        h = v // GAP_STEP
        h2 = (v - g) // GAP_STEP
        top = self.levels - 1
        part_h = (h > 0) & (h < top)
        part_h2 = (h2 > 0) & (h2 < top)
        n = self.gap_count
        out = np.where(part_h2, 2.0 * n[model, np.clip(h2, 0, top)] + 1.0, 0.0)
        out -= np.where(part_h, 2.0 * n[model, np.clip(h, 0, top)] - 1.0, 0.0)
        return out

    def placed(self, state: State, node: int) -> None:
        self.frag.refresh(np.array([node]))
        # Recount this node's gap levels: at most 8 GPUs, and never drifts from the state.
        old = self.node_levels[node]
        new = np.where(old >= 0, state.gpu_left[node] // GAP_STEP, -1)
        m = int(state.model[node])
        for o, nw in zip(old.tolist(), new.tolist(), strict=True):
            if o != nw:
                self.gap_count[m, o] -= 1
                self.gap_count[m, nw] += 1
        self.node_levels[node] = new


def node_scarcity(state: State, cpu: np.ndarray, mem: np.ndarray, num_gpu: np.ndarray, gpu_milli: np.ndarray,
                  access: np.ndarray, weight: np.ndarray, resources: bool) -> np.ndarray:
    """rho_n: the share of node n's GPUs that target shapes able to run on only some nodes will claim.

    Shape j's GPU demand (weight x GPUs x milli, all shapes' demand scaled to the cluster's GPUs:
    arrivals up to 100% equal the capacity) is spread over the nodes A_j it fits, in proportion to
    their GPUs, so every node of A_j gets dem_j / G(A_j) per GPU. A_j: the GPU model is accepted
    (``access``, models x shapes) and, with ``resources``, the empty node has the GPUs, CPU and
    memory the shape asks for. Shapes that fit every GPU node add nothing.
    """
    cl = state.cluster
    gpu_nodes = state.gpus > 0
    gj = num_gpu > 0
    fit = access[state.model][:, gj]  # (nodes, GPU shapes)
    if resources:
        fit = fit & (state.gpus[:, None] >= num_gpu[gj][None, :]) & (cl.cpu[:, None] >= cpu[gj][None, :])
        fit &= cl.mem[:, None] >= mem[gj][None, :]
    fit &= gpu_nodes[:, None]
    dem = (weight[gj] * num_gpu[gj] * gpu_milli[gj]).astype(np.float64)
    if dem.sum() <= 0:
        return np.zeros(len(state.gpus))
    dem = dem / dem.sum() * float(state.gpus.sum())
    g_acc = state.gpus.astype(np.float64) @ fit
    constrained = (fit.sum(0) < gpu_nodes.sum()) & (g_acc > 0)
    per_gpu = np.where(constrained, dem / np.maximum(g_acc, 1.0), 0.0)
    return fit.astype(np.float64) @ per_gpu


def node_need(state: State, cpu: np.ndarray, mem: np.ndarray, num_gpu: np.ndarray, gpu_milli: np.ndarray,
              weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CPU and memory per GPU milli the target GPU shapes ask for (sum w cpu / sum w milli), per node.

    The same for every node. Measured: spreading each shape over the nodes whose capacity fits it
    and taking each node's own ratio changed nothing (multigpu45s, cpu200s-300s, seeds 42, 46).
    """
    gj = num_gpu > 0
    w = weight[gj].astype(np.float64)
    d = float((w * num_gpu[gj] * gpu_milli[gj]).sum())
    c = float((w * cpu[gj]).sum()) / d if d > 0 else 0.0
    me = float((w * mem[gj]).sum()) / d if d > 0 else 0.0
    n = len(state.gpus)
    return np.full(n, c), np.full(n, me)


def _lex_first(score: np.ndarray, second: np.ndarray) -> int:
    """Index of the highest ``score``, ties to the lowest ``second``, then to the lowest index."""
    top = score == score.max()
    return int(np.argmin(np.where(top, second, np.inf)))
