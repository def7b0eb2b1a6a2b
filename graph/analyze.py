"""Turn a joint fx graph into the solver's framework-free problem structure.

Storage identity of the traced fake tensors decides what allocates: a node
whose outputs all share storage with earlier values (views, getitem, detach)
is an alias and costs nothing; any other node is an op that allocates its new
storages. Every alias maps to the tensors it shares, so a read through a view
is a read of the underlying storage, which is what keeps memory alive. A tensor
constant (`get_attr`: a tensor the forward made from Python data) is held by the
compiled step before and after every step: it is no tensor of the problem, and the
op that copies it (`lift_fresh_copy`) is an op with no tensor inputs.
"""

from __future__ import annotations

import hashlib
import operator
from dataclasses import dataclass

import torch
from torch._functorch._aot_autograd import descriptors as d
from torch.multiprocessing.reductions import StorageWeakRef

from monet.errors import MonetError
from monet.solver import Impl, Op, Problem, Tensor

from .cudnn_batch_norm import TRAINING_FORWARDS

_INPUT_ROLES = {d.ParamAOTInput: "param", d.BufferAOTInput: "buffer", d.PlainAOTInput: "input",
                d.TangentAOTInput: "tangent"}
_CUDA_BLOCK = 512  # the CUDA caching allocator rounds every block to this


class UnsupportedGraphError(MonetError, RuntimeError):
    """The traced graph uses a feature monet does not schedule."""


@dataclass(frozen=True)
class GraphAnalysis:
    """The problem structure (costs zero) plus what the runtime needs to map it back."""

    problem: Problem
    node_tensors: dict[str, tuple[int, ...]]  # every fx value -> the tensors it references
    fingerprint: str


def allocation_bytes(nbytes: int, device_type: str) -> int:
    """Bytes the device allocator charges for a storage of `nbytes`."""
    if device_type == "cuda":
        return -(-nbytes // _CUDA_BLOCK) * _CUDA_BLOCK
    return nbytes


def _tensors_in(value) -> list[torch.Tensor | None]:
    if isinstance(value, (tuple, list)):
        return [v if isinstance(v, torch.Tensor) else None for v in value]
    return [value if isinstance(value, torch.Tensor) else None]


def _role_of_input(node: torch.fx.Node) -> str:
    desc = node.meta.get("desc")
    for cls, role in _INPUT_ROLES.items():
        if type(desc) is cls:
            return role
    raise UnsupportedGraphError(f"graph input {node.name} has an unsupported kind {desc!r}")


def _forward_nodes(graph: torch.fx.Graph, fwd_outputs: list[torch.fx.Node]) -> set[str]:
    """Names of the nodes that the forward outputs depend on."""
    seen: set[str] = set()
    stack = list(fwd_outputs)
    while stack:
        node = stack.pop()
        if node.name in seen or node.op == "placeholder":
            continue
        seen.add(node.name)
        stack.extend(node.all_input_nodes)
    return seen


def _recomputable(node: torch.fx.Node, mutated_buffers: set[str]) -> bool:
    """Whether rerunning `node` in the backward gives the values it gave in the forward.

    Random ops would draw new numbers, impure ones would act twice; an op tagged random that is
    given no randomness to draw (attention with `dropout_p` 0) gives the same values. An op that
    reads a buffer the step updates (running stats) would see the new value on a
    rerun; training-mode batch norm is the exception that is safe: its outputs
    that anyone reads in the backward do not depend on the running stats.
    """
    target = node.target
    seeded = isinstance(target, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in target.tags
    if seeded and (target._schema.is_mutable or not _without_dropout(node)):
        return False
    if not seeded and (node.is_impure() or (isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable)):
        return False  # fx calls random ops impure: those without dropout were let through above
    reads_mutated = any(arg.name in mutated_buffers for arg in node.all_input_nodes)
    return not reads_mutated or (target in TRAINING_FORWARDS and node.args[5] is True)


def _without_dropout(node: torch.fx.Node) -> bool:
    """Whether `node` calls an op whose only randomness is its dropout with `dropout_p` 0."""
    names = [a.name for a in node.target._schema.arguments]
    if "dropout_p" not in names:
        return False
    index = names.index("dropout_p")
    value = node.args[index] if index < len(node.args) else node.kwargs.get("dropout_p", 0.0)
    return value == 0


def input_values(gm: torch.fx.GraphModule) -> list[torch.Tensor]:
    """The (fake) tensors of `gm`'s placeholders, in order; a Python constant among the inputs has none."""
    return [val for n in gm.graph.find_nodes(op="placeholder") if isinstance(val := n.meta.get("val"), torch.Tensor)]


def analyze(gm: torch.fx.GraphModule, num_fwd_outputs: int | None = None) -> GraphAnalysis:
    """Structure of the joint graph `gm`: tensors, ops, phases and roles."""
    graph = gm.graph
    output_node = next(iter(graph.find_nodes(op="output")))
    outputs = list(output_node.args[0])
    descs = list(output_node.meta.get("desc") or [None] * len(outputs))
    if num_fwd_outputs is None:
        num_fwd_outputs = sum(not isinstance(x, d.GradAOTOutput) for x in descs if x is not None)
    fwd_outputs = [n for n in outputs[:num_fwd_outputs] if isinstance(n, torch.fx.Node)]
    forward = _forward_nodes(graph, fwd_outputs)
    mutated_descs = [x.mutated_input for x in descs if isinstance(x, d.InputMutationAOTOutput)]
    mutated = {n.name for n in graph.find_nodes(op="placeholder") if n.meta.get("desc") in mutated_descs}

    tensors: list[dict] = []
    owner: dict[StorageWeakRef, int] = {}
    node_tensors: dict[str, tuple[int, ...]] = {}
    raw_ops: list[dict] = []

    for node in graph.nodes:
        if node.op == "placeholder" and not isinstance(node.meta.get("val"), torch.Tensor):
            node_tensors[node.name] = ()  # a Python constant among the inputs: the graph bakes it in
        elif node.op == "placeholder":
            (val,) = _tensors_in(node.meta["val"])
            key = StorageWeakRef(val.untyped_storage())
            if key in owner:  # a tied parameter (GPT-2's embedding and LM head): one storage, counted once
                node_tensors[node.name] = (owner[key],)
                continue
            tid = len(tensors)
            tensors.append({"name": node.name, "bytes": _bytes(val), "role": _role_of_input(node), "op": None,
                            "shape": tuple(val.shape), "dtype": str(val.dtype)})
            owner[key] = tid
            node_tensors[node.name] = (tid,)
        elif node.op == "call_function":
            refs, new = [], []
            for i, val in enumerate(_tensors_in(node.meta.get("val"))):
                if val is None:
                    continue
                key = StorageWeakRef(val.untyped_storage())
                if key not in owner:
                    owner[key] = len(tensors)
                    new.append(len(tensors))
                    tensors.append({"name": f"{node.name}.{i}", "bytes": _bytes(val), "role": None,
                                    "op": len(raw_ops), "shape": tuple(val.shape), "dtype": str(val.dtype)})
                refs.append(owner[key])
            node_tensors[node.name] = tuple(refs)
            if node.target is operator.getitem and len(refs) == 1 and not new:
                parent = node.args[0]
                element = tensors[refs[0]]
                if len(node_tensors.get(parent.name, ())) > 1 and element["name"].startswith(parent.name + "."):
                    element["name"] = node.name  # the value that holds this tuple element
            if new:
                if len(new) == 1 and len(refs) == 1:
                    tensors[new[0]]["name"] = node.name
                inputs = []
                for arg in node.all_input_nodes:
                    for t in node_tensors[arg.name]:
                        if t not in inputs and t not in new:
                            inputs.append(t)
                raw_ops.append({"node": node, "inputs": inputs, "outputs": new,
                                "phase": "forward" if node.name in forward else "backward"})
        elif node.op == "get_attr":  # a tensor constant the compiled step holds, made before any step runs
            if not isinstance(node.meta.get("val"), torch.Tensor):
                raise UnsupportedGraphError(f"graph node {node.name} reads attribute {node.target}, not a tensor")
            node_tensors[node.name] = ()
        elif node.op != "output":
            raise UnsupportedGraphError(f"graph node {node.name} of kind {node.op} is not supported")

    _assign_output_roles(tensors, node_tensors, outputs, descs)
    for t in tensors:
        if t["role"] is None:
            phase = raw_ops[t["op"]]["phase"]
            t["role"] = "activation" if phase == "forward" else "temp"

    # Forward ops first, then backward ops, each in graph order (backward ops never feed forward ones).
    order = [r for r in raw_ops if r["phase"] == "forward"] + [r for r in raw_ops if r["phase"] == "backward"]
    new_id = {id(r): i for i, r in enumerate(order)}
    op_of_raw = [new_id[id(r)] for r in raw_ops]
    tensor_objs = tuple(
        Tensor(i, t["name"], t["bytes"], t["role"], None if t["op"] is None else op_of_raw[t["op"]],
               t["shape"], t["dtype"].removeprefix("torch."))
        for i, t in enumerate(tensors)
    )
    ops = tuple(
        Op(i, r["node"].name, _target_name(r["node"]), r["phase"], tuple(r["outputs"]),
           Impl(tuple(r["inputs"]), 0.0, recomputable=r["phase"] == "forward" and _recomputable(r["node"], mutated)))
        for i, r in enumerate(order)
    )
    fp = fingerprint(gm)
    # Which autograd node's formula each backward op belongs to (its forward op's sequence number):
    # PyTorch's eager autograd holds what a formula makes until the formula returns (stack.py).
    nodes = {r["node"].name: r["node"].meta["seq_nr"] for r in order
             if r["phase"] == "backward" and "seq_nr" in r["node"].meta}
    meta = {"fingerprint": fp, **_links(graph, outputs, descs, node_tensors, tensors), "autograd_nodes": nodes}
    return GraphAnalysis(Problem(tensor_objs, ops, meta), node_tensors, fp)


def _links(graph: torch.fx.Graph, outputs: list, descs: list, node_tensors: dict, tensors: list[dict]) -> dict:
    """Which tensor is the gradient of each plain input ("gradients": input -> gradient) and which
    output each tangent is the gradient of ("tangents": output -> tangent), by tensor name: what
    joins one block's problem to the next one's (solver/stack.py); and each parameter's name in its
    module ("parameters": tensor -> name) and gradient ("parameter_gradients": tensor -> gradient),
    by which a parameter that several problems of one step use is counted once (a tied embedding)."""
    def name(node) -> str | None:
        refs = node_tensors.get(node.name, ()) if isinstance(node, torch.fx.Node) else ()
        return tensors[refs[0]]["name"] if len(refs) == 1 else None

    placeholders = list(graph.find_nodes(op="placeholder"))
    gradients, tangents, param_gradients = {}, {}, {}
    parameters = {name(p): p.meta["desc"].target for p in placeholders
                  if isinstance(p.meta.get("desc"), d.ParamAOTInput) and name(p)}
    for node, desc in zip(outputs, descs):
        if isinstance(desc, d.GradAOTOutput) and isinstance(desc.grad_of, (d.PlainAOTInput, d.ParamAOTInput)):
            source = next((p for p in placeholders if p.meta.get("desc") == desc.grad_of), None)
            if source is not None and name(source) and name(node):
                links = gradients if isinstance(desc.grad_of, d.PlainAOTInput) else param_gradients
                links[name(source)] = name(node)
    for p in placeholders:
        desc = p.meta.get("desc")
        if isinstance(desc, d.TangentAOTInput) and isinstance(desc.output, d.PlainAOTOutput) and name(p):
            output = name(outputs[desc.output.idx]) if desc.output.idx < len(outputs) else None
            if output:
                tangents[output] = name(p)
    return {"gradients": gradients, "tangents": tangents, "parameters": parameters,
            "parameter_gradients": param_gradients}


def _bytes(val: torch.Tensor) -> int:
    return allocation_bytes(val.untyped_storage().nbytes(), val.device.type)


def _assign_output_roles(tensors, node_tensors, outputs, descs) -> None:
    for node, desc in zip(outputs, descs):
        if not isinstance(node, torch.fx.Node):
            continue
        if isinstance(desc, d.GradAOTOutput):
            role = "grad"
        elif isinstance(desc, d.InputMutationAOTOutput):
            role = "state"
        elif isinstance(desc, (d.PlainAOTOutput, d.IntermediateBaseAOTOutput)):
            role = "output"
        else:
            raise UnsupportedGraphError(f"graph output {node.name} has an unsupported kind {desc!r}")
        for t in node_tensors[node.name]:
            if tensors[t]["op"] is not None and tensors[t]["role"] != "output":
                tensors[t]["role"] = role


def _target_name(node: torch.fx.Node) -> str:
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return f"aten.{target._opname}.{target._overloadname}" if target.namespace == "aten" else str(target)
    return getattr(target, "__name__", str(target))


def fingerprint(gm: torch.fx.GraphModule) -> str:
    """A hash of the graph's ops, wiring, shapes and dtypes (not of any values)."""
    index = {}
    h = hashlib.sha256()
    for i, node in enumerate(gm.graph.nodes):
        index[node] = i
        args = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: f"%{index[n]}")
        vals = [None if v is None else (tuple(v.shape), str(v.dtype), tuple(v.stride()))
                for v in _tensors_in(node.meta.get("val"))]
        target = _target_name(node) if node.op == "call_function" else str(node.target)
        h.update(f"{node.op}|{target}|{args!r}|{vals!r}\n".encode())
    return h.hexdigest()[:20]
