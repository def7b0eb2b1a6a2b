"""Tracing and analysing the joint graph, and costing its ops."""

import pytest
import torch
from conftest import small_model
from torch import nn

from monet.graph import Feed, InputSpec, TracedStep, analyze, costed_problem
from monet.graph.profile import _walk


def analysed(model, shape, requires_grad=False):
    spec = InputSpec(shape, requires_grad=requires_grad)
    with TracedStep(model, spec) as step:
        analysis = analyze(step.graph_module)
    return step, analysis


class ViewNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        y = self.fc(x).view(4, 2, 8).transpose(0, 1).reshape(8, 8)  # views, and one copy
        return self.drop(torch.relu(y))


def test_roles_aliases_and_phases():
    _, analysis = analysed(ViewNet(), (8, 8), requires_grad=True)
    p = analysis.problem
    roles = {t.role for t in p.tensors}
    assert {"param", "input", "tangent", "activation", "output", "grad"} <= roles
    views = ("aten.view", "aten.t.", "aten.transpose")
    assert not any(op.target.startswith(views) for op in p.ops)  # views allocate nothing: not ops
    assert all(p.ops[i].phase == "forward" for i in range(len(p.forward_ops)))
    dropout = next(op for op in p.ops if "dropout" in op.target and op.phase == "forward")
    assert not dropout.recomputable  # random: never rerun
    for name, refs in analysis.node_tensors.items():
        assert all(0 <= t < len(p.tensors) for t in refs), name


def test_batch_norm_reruns_but_buffer_updates_do_not():
    model, shape = small_model("cnn")
    _, analysis = analysed(model, shape)
    ops = analysis.problem.forward_ops
    assert all(op.recomputable for op in ops if "batch_norm" in op.target)
    assert not any(op.recomputable for op in ops if op.target == "aten.add.Tensor" and op.outputs
                   and analysis.problem.tensors[op.outputs[0]].role == "state")


def test_fingerprint_is_stable_and_shape_sensitive():
    model, shape = small_model("mlp")
    first = analysed(model, shape)[1].fingerprint
    assert analysed(model, shape)[1].fingerprint == first
    assert analysed(model, (shape[0] // 2, *shape[1:]))[1].fingerprint != first
    assert analysed(model, shape, requires_grad=True)[1].fingerprint != first


def test_measured_and_analytic_costs():
    model, shape = small_model("cnn")
    step, analysis = analysed(model, shape)
    measured = costed_problem(step, analysis, "measured", repeats=1)
    analytic = costed_problem(step, analysis, "analytic")
    assert all(impl.time > 0 for op in measured.ops for impl in op.impls if impl.runs)
    assert all(impl.workspace >= 0 for op in measured.ops for impl in op.impls)
    assert costed_problem(step, analysis, "analytic").ops == analytic.ops  # deterministic
    conv = [op for op in analytic.ops if op.target == "aten.convolution.default"]
    relu = [op for op in analytic.ops if op.target == "aten.relu.default"]
    assert max(op.time for op in conv) > 2 * max(op.time for op in relu)  # FLOPs count, not just bytes
    assert measured.meta["cost_model"] == "measured"
    assert tuple(measured.meta["input"]["shape"]) == shape
    assert measured.tensors == analytic.tensors  # sizes come from the graph, not from the cost model


def test_a_walk_can_run_its_backward_where_autograd_runs_it():
    """The CUDA workspace walk runs backward ops where autograd would (cuBLAS keeps a workspace per
    thread); split so, the walk computes what it computes in one piece, and an error there reaches the
    caller. On CPU autograd runs the backward on the calling thread, so this checks the split itself."""
    model, shape = small_model("mlp")
    step, analysis = analysed(model, shape)
    feed = Feed(step.model, tuple(step.example.flat))
    backward = {op.name for op in analysis.problem.backward_ops}
    runs = [{}, {}]
    for seen, split in zip(runs, ((), backward)):
        torch.manual_seed(0)  # the same dropout masks
        with torch.no_grad():
            _walk(step.graph_module, feed.values(step.graph_module, 0), lambda node, call: call(),
                  lambda node, args, value, seen=seen: seen.__setitem__(node.name, value), backward=split,
                  device=feed.device)
    assert runs[0].keys() == runs[1].keys() and backward <= runs[0].keys()
    for name, value in runs[0].items():
        assert all(torch.equal(a, b) for a, b in zip(torch.utils._pytree.tree_leaves(value),
                                                    torch.utils._pytree.tree_leaves(runs[1][name])))

    def fails(node, call):
        if node.name in backward:
            raise RuntimeError(f"{node.name} failed")
        return call()

    with pytest.raises(RuntimeError, match="failed"), torch.no_grad():
        _walk(step.graph_module, feed.values(step.graph_module, 0), fails, backward=backward, device=feed.device)


def test_real_problems_survive_json():
    from monet.solver import Problem

    model, shape = small_model("transformer")
    step, analysis = analysed(model, shape)
    problem = costed_problem(step, analysis, "analytic")
    again = Problem.from_json(problem.to_json())
    assert again == problem
    attention = [t for t in again.tensors if t.shape == (4, 4, 64, 64)]  # batch, heads, tokens, tokens
    assert attention and all(t.dtype == "float32" and t.bytes == 4 * 4 * 64 * 64 * 4 for t in attention)
