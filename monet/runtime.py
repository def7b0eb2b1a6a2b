"""Run a schedule: split the joint graph into forward and backward fx modules.

AOTAutograd calls our partitioner with the joint graph and wraps the two
modules it returns in one autograd.Function. The forward module runs every
forward node and returns the model outputs plus the tensors the schedule saves.
The backward module runs the schedule's sequence: backward ops in order and
forward ops copied in where they are recomputed; views and tuple elements are
re-derived from the newest copy of their base. fx codegen frees every value
after its last use, which is what the simulator assumes.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass

from torch import fx
from torch._functorch._aot_autograd.descriptors import (
    BufferAOTInput,
    SavedForBackwardsAOTOutput,
    SavedForBackwardsNoVcCheckAOTOutput,
)
from torch._functorch.partitioners import (
    _extract_fwd_bwd_outputs,
    _extract_graph_with_inputs_outputs,
    _is_primal,
    _is_tangent,
)

from monet.errors import MonetError
from monet.graph import RECOMPUTED, RERUN, GraphAnalysis, fingerprint, rewrite
from monet.solver import Problem, Schedule

_PINNED_ROLES = ("param", "buffer", "input", "output")


class ScheduleMismatchError(MonetError, ValueError):
    """A schedule that was made for another graph, shape, dtype or device."""


@dataclass(frozen=True)
class ExecutionPlan:
    """A schedule in fx node names: how ops run, what the forward saves, what the backward runs."""

    analysis: GraphAnalysis  # of the joint graph as traced
    options: dict[str, str]  # choice -> option, where not PyTorch's own
    saved: tuple[str, ...]  # values the forward returns for the backward
    steps: tuple[tuple[str, bool], ...]  # (op node, is a recomputation)
    derived: dict[str, tuple[str, ...]]  # op node -> every value that shares its outputs

    @classmethod
    def build(cls, analysis: GraphAnalysis, problem: Problem, schedule: Schedule) -> ExecutionPlan:
        """The plan for `schedule` on `problem` (the analysed problem with its choices)."""
        tensors = problem.tensors
        saved = [tensors[t].name for t in sorted(schedule.saved)]
        for i in schedule.backward:
            for t in schedule.impl(problem, problem.ops[i]).inputs:
                if tensors[t].role in _PINNED_ROLES and tensors[t].name not in saved:
                    saved.append(tensors[t].name)
        made_by_options = {tensors[t].name for op in problem.ops if op.name not in analysis.node_tensors
                           for t in op.outputs}
        missing = [name for name in saved if name not in analysis.node_tensors and name not in made_by_options]
        if missing:
            raise ValueError(f"saved tensors {missing} have no graph value that holds them alone")
        steps = tuple((problem.ops[i].name, problem.ops[i].phase == "forward") for i in schedule.backward)
        sharing: dict[int, list[str]] = {}
        for name, refs in analysis.node_tensors.items():
            for t in refs:
                sharing.setdefault(t, []).append(name)
        derived = {
            op.name: tuple(dict.fromkeys(n for t in op.outputs for n in sharing.get(t, ())))
            for op in analysis.problem.forward_ops
        }
        return cls(analysis, dict(schedule.options), tuple(saved), steps, derived)


def make_partition(plan: ExecutionPlan, on_split: Callable[[fx.GraphModule, fx.GraphModule], None] | None = None):
    """An AOTAutograd partition_fn that splits the joint graph as `plan` says; `on_split` sees
    the forward and backward modules it makes."""

    def partition(joint_module: fx.GraphModule, _joint_inputs, *, num_fwd_outputs: int, **_):
        got = fingerprint(joint_module)
        if got != plan.analysis.fingerprint:
            raise ScheduleMismatchError(
                f"the graph being compiled (fingerprint {got}) is not the one the schedule was made for "
                f"({plan.analysis.fingerprint})"
            )
        rewrite(joint_module, plan.analysis, plan.options)
        graph = joint_module.graph
        nodes = {n.name: n for n in graph.nodes}
        fwd_outputs, bwd_outputs, fwd_descs, bwd_descs = _extract_fwd_bwd_outputs(
            joint_module, num_fwd_outputs=num_fwd_outputs
        )
        placeholders = list(graph.find_nodes(op="placeholder"))
        # Buffers are updated in place after the forward (running stats); a rerun that
        # reads one is safe (see monet.graph.analyze), so skip autograd's version check
        # for them. AOTAutograd wants those saved tensors last.
        saved = [nodes[name] for name in plan.saved]
        held = {plan.analysis.node_tensors[n.name] for n in saved if n.op == "placeholder"}
        saved += [p for p in placeholders  # tied parameters: every input that holds a saved one's storage
                  if p not in saved and plan.analysis.node_tensors[p.name] in held]
        unchecked = [n for n in saved if isinstance(n.meta.get("desc"), BufferAOTInput)]
        saved = [n for n in saved if n not in unchecked] + unchecked
        for node in unchecked:
            node.meta["saved_tensor_with_no_vc_check"] = True
        n_checked = len(saved) - len(unchecked)
        fw_graph = _extract_graph_with_inputs_outputs(
            graph,
            [p for p in placeholders if _is_primal(p)],
            fwd_outputs + saved,
            fwd_descs + [SavedForBackwardsAOTOutput(i) if i < n_checked else SavedForBackwardsNoVcCheckAOTOutput(i)
                         for i in range(len(saved))],
            "forward",
        )
        tangents = [p for p in placeholders if _is_tangent(p)]
        bw_graph = _backward_graph(plan, nodes, saved + tangents, bwd_outputs, bwd_descs)
        modules = fx.GraphModule(joint_module, fw_graph), fx.GraphModule(joint_module, bw_graph)
        if on_split:
            on_split(*modules)
        return modules

    return partition


def _backward_graph(plan: ExecutionPlan, nodes: dict[str, fx.Node], inputs: list[fx.Node],
                    outputs: list, output_descs: list) -> fx.Graph:
    graph = fx.Graph()
    env: dict[str, fx.Node] = {}
    for node in inputs:
        env[node.name] = graph.placeholder(node.name)
        env[node.name].meta = node.meta

    def value(node: fx.Node) -> fx.Node:
        """The newest copy of a joint-graph value; views are re-derived on demand."""
        if node.name not in env:
            if node.name in plan.derived or any(node.name == step for step, _ in plan.steps):
                raise ValueError(f"the schedule reads {node.name} before it is saved or recomputed")
            env[node.name] = graph.node_copy(node, value)
        return env[node.name]

    for name, recompute in plan.steps:
        node = nodes[name]
        copied = _rerun(graph, node, value) if recompute else graph.node_copy(node, value)
        if recompute:  # later reads take the new copy (its inputs were read above, before this)
            copied.meta[RECOMPUTED] = True
            for stale in plan.derived[name]:
                env.pop(stale, None)
        env[name] = copied
        for user in node.users:  # take tuple elements at once so the tuple itself dies here
            if user.target is operator.getitem:
                env[user.name] = graph.node_copy(user, value)
    out = graph.output(tuple(value(o) if isinstance(o, fx.Node) else o for o in outputs))
    out.meta["desc"] = output_descs
    graph.lint()
    return graph


def _rerun(graph: fx.Graph, node: fx.Node, value: Callable[[fx.Node], fx.Node]) -> fx.Node:
    """A forward node copied into the backward as a recomputation; where the schedule's option
    reruns it another way (node.meta[RERUN]: a kernel and extra arguments, such as the statistics
    its forward run saved), that kernel runs on the node's arguments and those."""
    if RERUN not in node.meta:
        return graph.node_copy(node, value)
    kernel, extra = node.meta[RERUN]
    new = graph.call_function(kernel, fx.node.map_arg((*node.args, *extra), value))
    new.meta = {key: val for key, val in node.meta.items() if key != RERUN}
    return new
