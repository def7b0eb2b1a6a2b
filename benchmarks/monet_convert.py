"""MONeT's published instances as monet Problems, and Gurobi's decisions as monet Schedules.

An instance (benchmarks.monet_instances.Instance: MONeT's SolverInfo and Gurobi's Solution) is
converted with MONeT's own accounting as far as monet's Problem expresses it:
  * sizes in MONeT's units: each node's memory ceiled to KiB (then in bytes), workspace (MiB in
    the pickle) ceiled to KiB, times ceiled to 0.01 ms; one 0.01 ms is UNIT seconds here, so a
    step time in seconds divided by UNIT is in MONeT's units;
  * forward node i (V of them, the loss included) is forward op i making tensor i, reading what
    the forward edges say; node 0 reads the input, which is in the fixed memory;
  * the fixed memory of the forward nodes (parameters, input) is one persistent tensor; a
    backward node whose fixed memory grows by some bytes (its parameter gradient) makes a `grad`
    tensor of those bytes, held to the end of the step as monet holds gradients;
  * backward node b is backward op b making its gradient (a temp tensor, freed after its last
    reader) and reading, under each of its paths (MONeT's multiway backward), that path's
    forward tensors and gradients: a choice per backward node with two or more paths;
  * a convolution's algorithm is a choice per conv node (forward, and each backward node
    apart), among the algorithms MONeT profiled as available (-1000: unavailable, not an option);
  * an intermediate node (MONeT's "newnode": a ReLU's 1-bit mask, a max-pool's indices) is a
    forward op that runs, and may rerun, only under the path of its backward reader that reads it;
    it reads its parent's output (a mask is output > 0), and a pool's indices the pool's input
    too (the kernel that finds them reads it): MONeT reruns one only beside its parent, and a rerun
    here needs what that pair would read;
  * an in-place node (MONeT's IP: a ReLU taking its input's memory) is a choice per node, "in"
    overwriting its input (Impl.overwrites) in the forward and in every rerun, at MONeT's in-place
    time; where it is not the last forward reader of its input, or its input is an intermediate,
    it is not offered.
What it cannot express (README, "MONeT's instances"): in place in some stages only (MONeT's IP
per stage; one per op here), in-place intermediate nodes, a conv algorithm per stage (one per op
here, its reruns included), a recompute workspace other than the forward one, and an intermediate
node made in a rerun only (here the forward makes every one its path reads). monet's simulator can
replay several recomputations of one tensor; the compact formulation rebuilds each at most once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from monet.solver.problem import Choice, Impl, Op, Problem, Tensor
from monet.solver.schedule import Schedule

UNIT = 1e-5  # seconds in MONeT's time unit, 0.01 ms
KIB = 1024


def _kib(nbytes) -> int:
    return math.ceil(float(nbytes) / KIB)  # MONeT's ram: bytes ceiled to KiB


def _ws(mib) -> int:
    return math.ceil(float(mib) * KIB) * KIB  # MONeT's workspace: MiB ceiled to KiB, here in bytes


def _cpu(ms) -> int:
    return math.ceil(float(ms) * 100)  # MONeT's time: ms ceiled to 0.01 ms


def budget_bytes(inst) -> int:
    """MONeT's budget: GB as KiB (int(GB * 2^20)), here in bytes."""
    return int(inst.budget_gb * KIB * KIB) * KIB


@dataclass(frozen=True)
class Converted:
    problem: Problem
    forward_op: dict[int, int]  # MONeT node -> op id
    tensor_of: dict[int, int]  # MONeT node -> tensor id of its output
    conv_choice: dict[int, str]  # MONeT conv node -> choice name (absent: one algorithm)
    path_choice: dict[int, str]  # MONeT backward node -> choice name (absent: one path)
    place_choice: dict[int, str]  # MONeT in-place node -> choice name ("out" or "in")
    rerun_intermediates: tuple[int, ...]  # MONeT intermediate nodes that may rerun (under their path)


def _available(node) -> list[int]:
    return [c for c, ms in enumerate(node.workspace_compute) if float(ms) >= 0]


def convert(inst) -> Converted:
    """The monet Problem of one MONeT instance (see the module's docstring)."""
    info = inst.info
    V, N = inst.forward, len(info.nodes)
    nodes = info.nodes
    convs = set(info.conv_list) if info.select_conv_algo else set()
    ints = {i for i in range(V) if nodes[i].kind == "IntNode"}
    tensors: list[Tensor] = []

    def tensor(name, nbytes, role, producer=None) -> int:
        tensors.append(Tensor(len(tensors), name, int(nbytes), role, producer))
        return len(tensors) - 1

    fixed = [_kib(nodes[i].fixed_mem) for i in range(N)]
    tensor("fixed", fixed[0] * KIB, "param")
    tensor_of: dict[int, int] = {}
    for i in range(N):
        tensor_of[i] = tensor(f"n{i}", _kib(nodes[i].mem) * KIB, "activation" if i < V else "temp", i)
    grad_of = {b: tensor(f"paramgrad{b}", (fixed[b] - fixed[b - 1]) * KIB, "grad", b)
               for b in range(V, N) if fixed[b] > fixed[b - 1]}
    forward_inputs: dict[int, list[int]] = {v: [] for v in range(V)}
    for u, v, _ in info.edge_list:
        if u < V and v < V:
            forward_inputs[v].append(u)

    choices: list[Choice] = []
    conv_choice: dict[int, str] = {}
    path_choice: dict[int, str] = {}
    int_path: dict[int, tuple[int, int]] = {}  # intermediate node -> (backward reader, its path)
    for b in range(V, N):
        args = nodes[b].args
        if b not in convs and len(args) > 1:
            path_choice[b] = f"path{b}"
            choices.append(Choice(path_choice[b], tuple(f"p{p}" for p in range(len(args)))))
            for p, arg in enumerate(args):
                for i in arg:
                    if i in ints:
                        int_path[i] = (b, p)
    for i in sorted(convs):
        if len(_available(nodes[i])) > 1:
            conv_choice[i] = f"algo{i}"
            choices.append(Choice(conv_choice[i], tuple(f"a{c}" for c in _available(nodes[i]))))
    place_choice = {v: f"inplace{v}" for v in _in_place(inst, forward_inputs, ints)}
    choices += [Choice(name, ("out", "in")) for name in place_choice.values()]

    ops: list[Op] = []
    for i in range(N):
        node = nodes[i]
        outputs = (tensor_of[i],) + ((grad_of[i],) if i in grad_of else ())
        name = f"n{i}:{node.op}"
        if i < V:
            inputs = tuple(tensor_of[u] for u in forward_inputs[i])
            if i in ints and "max_pool" in nodes[forward_inputs[i][0]].op:  # indices need the pool's input too
                inputs += tuple(tensor_of[u] for u in forward_inputs[forward_inputs[i][0]])
            if i in conv_choice or i in convs:
                algos = _available(node)
                impls = [Impl(inputs, _cpu(node.workspace_compute[c]) * UNIT, _ws(node.workspace_mem[c]))
                         for c in algos]
            else:
                impls = [Impl(inputs, _cpu(node.workspace_compute[0]) * UNIT, _ws(node.workspace_mem[0]),
                              rerun_time=_cpu(node.recompute_workspace_compute[0]) * UNIT)]
            if i in place_choice:  # MONeT's in-place time replaces the forward's, in the forward and in reruns
                delta = _cpu(node.inplace_workspace_compute[0]) - _cpu(node.workspace_compute[0])
                impls.append(replace(impls[0], time=impls[0].time + delta * UNIT,
                                     rerun_time=impls[0].rerun_time + delta * UNIT, overwrites=inputs[0]))
            choice = conv_choice.get(i, place_choice.get(i))
            recomputable = True
            if i in int_path:  # runs, and reruns, only under the path that reads it
                b, p = int_path[i]
                choice, recomputable = path_choice[b], p == 0
                impls = [replace(impls[0], recomputable=True) if q == p
                         else Impl(inputs, 0.0, 0, runs=False, recomputable=False) for q in range(len(nodes[b].args))]
            elif i in ints:
                recomputable = False
            phase = "forward"
        else:
            def reads(arg):
                return tuple(dict.fromkeys(tensor_of[u] for u in arg))

            if i in convs:
                impls = [Impl(reads(node.args[0]), _cpu(node.workspace_compute[c]) * UNIT,
                              _ws(node.workspace_mem[c])) for c in _available(node)]
                choice = conv_choice.get(i)
            else:
                impls = [Impl(reads(arg), _cpu(node.workspace_compute[p]) * UNIT, _ws(node.workspace_mem[p]))
                         for p, arg in enumerate(node.args)]
                choice = path_choice.get(i)
            recomputable, phase = True, "backward"
        ops.append(Op(i, name, node.op, phase, outputs, replace(impls[0], recomputable=recomputable), choice,
                      tuple(impls[1:]) if choice else ()))
    meta = {"source": "MONeT instance", "model": inst.model, "batch": inst.batch, "budget_gb": inst.budget_gb,
            "time_unit_s": UNIT}
    problem = Problem(tensors, ops, meta, choices)
    return Converted(problem, {i: i for i in range(V)}, tensor_of, conv_choice, path_choice, place_choice,
                     tuple(sorted(int_path)))


def _in_place(inst, forward_inputs: dict[int, list[int]], ints: set[int]) -> list[int]:
    """MONeT's in-place nodes that monet can run in place: a forward node (not an intermediate) of one
    input whose memory it takes, read by no later forward node."""
    info, V = inst.info, inst.forward
    if not info.do_inplace:
        return []
    last_reader = {u: v for v in range(V) for u in forward_inputs[v]}
    return [v for v in sorted(info.inplace_list) if v < V and v not in ints and len(forward_inputs[v]) == 1
            and last_reader[forward_inputs[v][0]] == v and forward_inputs[v][0] not in ints
            and _kib(info.nodes[v].mem) == _kib(info.nodes[forward_inputs[v][0]].mem)]


def gurobi_objective(inst) -> dict[str, int]:
    """MONeT's objective recomputed from Gurobi's decision matrices (0.01 ms), by term; their sum
    is `runtime_expected` when the reading of the format is right."""
    info, sol = inst.info, inst.solution
    V, T = inst.forward, inst.stages
    nodes = info.nodes
    R, M = np.round(sol.r), np.round(sol.m)
    RF = np.round(sol.rf) if info.select_conv_algo else None
    IP = np.round(sol.ip) if info.do_inplace else None
    convs = info.conv_list if info.select_conv_algo else {}
    terms = {"forward": 0, "recompute": 0, "conv": 0, "inplace": 0, "backward": 0}
    for i in range(V):
        if i in convs:
            continue
        terms["forward"] += int(R[0, i]) * _cpu(nodes[i].workspace_compute[0])
        terms["recompute"] += int(R[1:, i].sum()) * _cpu(nodes[i].recompute_workspace_compute[0])
    for i, k in convs.items():
        for c, ms in enumerate(nodes[i].workspace_compute):
            terms["conv"] += int(RF[:, k, c].sum()) * _cpu(ms)
    if IP is not None:
        for v in info.inplace_list:
            delta = _cpu(nodes[v].inplace_workspace_compute[0]) - _cpu(nodes[v].workspace_compute[0])
            terms["inplace"] += int(IP[:, v].sum()) * delta
    for t in range(T):
        b = V + t - 1
        if b in convs:
            continue
        cpu = nodes[b].workspace_compute
        terms["backward"] += sum(int(M[t, p]) * _cpu(cpu[p]) for p in range(min(3, len(cpu))))
    return terms


def gurobi_schedule(inst, conv: Converted) -> tuple[Schedule, list[str]]:
    """Gurobi's decisions as a monet Schedule, and notes on what had to change to express them:
    saved = stored after the forward stage (S[1]); stage t reruns the forward nodes R[t] marks,
    in order, before backward node V+t-1; each conv runs (reruns included) with the algorithm
    Gurobi picked for it, or where it picked several in different stages, the one of them with the
    least workspace; each backward node takes its path (M); an in-place node runs in place where
    every run of it (forward and reruns) was in place (IP), else out of place."""
    info, sol = inst.info, inst.solution
    V, T = inst.forward, inst.stages
    problem = conv.problem
    R, S, M = np.round(sol.r), np.round(sol.s), np.round(sol.m)
    RF = np.round(sol.rf) if info.select_conv_algo else None
    notes: list[str] = []
    options: dict[str, str] = {}
    for i, name in conv.conv_choice.items():
        k = info.conv_list[i]
        stages = [t for t in range(T) if RF[t, k].any()]
        picked = {int(np.argmax(RF[t, k])) for t in stages}
        lean = min(picked, key=lambda c: (float(info.nodes[i].workspace_mem[c]), c))
        if len(picked) > 1:
            notes.append(f"conv {i} ran with algorithms {sorted(picked)} in different stages; here {lean}, "
                         "the one with the least workspace, throughout")
        options[name] = f"a{lean}"
    for b, name in conv.path_choice.items():
        t = b + 1 - V
        chosen = [p for p in range(M.shape[1]) if M[t, p]]
        if len(chosen) > 1:
            notes.append(f"backward node {b} took paths {chosen}; here the first")
        options[name] = f"p{chosen[0]}"
    IP = np.round(sol.ip) if info.do_inplace else None
    for v, name in conv.place_choice.items():
        runs = [t for t in range(T) if R[t, v]]
        inside = [t for t in runs if IP[t, v]]
        options[name] = "in" if inside == runs else "out"
        if inside and inside != runs:
            notes.append(f"node {v} ran in place in stages {inside} of {runs}; here out of place throughout")
    options = {c: o for c, o in options.items() if problem.choice_named[c].options[0] != o}
    saved = {conv.tensor_of[i] for i in range(V) if S[1, i]}
    backward: list[int] = []
    for t in range(1, T):
        for i in range(V):
            if R[t, i]:
                op = problem.ops[i]
                if op.impl(problem.option_index(op, options)).recomputable:
                    backward.append(i)
                else:
                    notes.append(f"intermediate node {i} rerun in stage {t}: saved from the forward here")
                    saved.add(conv.tensor_of[i])
        backward.append(V + t - 1)
    saved = {t for t in saved if problem.ops[problem.tensors[t].producer].impl(
        problem.option_index(problem.ops[problem.tensors[t].producer], options)).runs}
    return Schedule(frozenset(saved), tuple(backward), options), notes
