"""A partitioned backward compiled by Inductor in pieces, so that it frees what the schedule frees.

Inductor inlines a pointwise op into the kernel that reads its output and runs it there: a gradient
sum and the ReLU backward after it run inside the next batch-norm backward's kernel, after the
recomputations the schedule placed between them, so both gradient contributions and the ReLU's
output stay live across those recomputations where the schedule had only their result (ResNet-50 at
16x3x128x128, 40 %: 830 MiB measured, 724 predicted, the same graphs uncompiled 724). Cut before each
run of recomputed nodes (marked RECOMPUTED by the partition), each piece is compiled on its own:
Inductor fuses within a piece, and every value crossing a cut is a buffer made in monet's order.
It is cut before each embedding backward too (CUT_BEFORE): Inductor makes that table-sized gradient
as a zero-filled buffer that it scatters into, and in one piece with the ops before it the buffer was
live with buffers the schedule frees before it (DistilBERT at 8x128, its least-peak schedule: 528.48
MiB measured against 509.34 MiB predicted; cut there, 509.71).
A value that crosses a cut is a piece's input, which Inductor never overwrites unless it is donated;
each piece is compiled with the values whose last reader it is donated (_donated), so that it can
write a result into one of them as it does into a buffer of its own: GPT-2's tied embedding gradient
(the LM head's plus the embedding's) was a third table-sized buffer after the cut until it could.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from unittest import mock

import torch
import torch._inductor.graph
from torch import fx
from torch._guards import detect_fake_mode
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

RECOMPUTED = "monet_recomputed"  # node.meta key: the partition's copy of a forward node, rerun in the backward
CUT_BEFORE = (torch.ops.aten.embedding_dense_backward.default,)  # ops that begin a piece of their own


def compile_in_pieces(gm: fx.GraphModule, example_inputs, compile_piece: Callable) -> Callable:
    """`gm` compiled by `compile_piece(piece, its example inputs)` piece by piece, cut before each run of
    RECOMPUTED nodes and each CUT_BEFORE op; one piece (`gm` as it is) where there is no such cut or a
    cut would pass something other than a tensor. The result is a boxed callable (it takes a list and
    empties it), as Inductor's."""
    pieces = _pieces(gm)
    if len(pieces) < 2:
        return compile_piece(gm, example_inputs)
    placeholders = [n.name for n in gm.graph.find_nodes(op="placeholder")]
    values = dict(zip(placeholders, _fakes(example_inputs)))
    result = list(gm.graph.find_nodes(op="output"))[0].args[0]
    kept = {n.name for n in result if isinstance(n, fx.Node)}
    donated = _donated(gm, [inputs for _, inputs, _ in pieces], kept)
    tag = torch.compiler.config.cache_key_tag  # Inductor's cache keys leave the donation out: the tag says it
    compiled = []
    for (piece, inputs, outputs), given in zip(pieces, donated):
        piece_inputs = [values[name] for name in inputs]
        values.update(zip(outputs, FakeTensorProp(piece, _mode(piece_inputs)).propagate_dont_convert_inputs(
            *piece_inputs)))
        with (mock.patch.object(torch._inductor.graph, "get_donated_idxs", lambda given=given: given),
              torch.compiler.config.patch(cache_key_tag=f"{tag} monet donated {given}")):
            compiled.append((compile_piece(piece, piece_inputs), inputs, outputs))
    last_piece = {}
    for i, (_, inputs, _) in enumerate(compiled):
        for name in inputs:
            last_piece[name] = i

    def run(args: list):
        env = {name: arg for name, arg in zip(placeholders, args) if name in last_piece or name in kept}
        args.clear()
        for i, (fn, inputs, outputs) in enumerate(compiled):
            piece_args = [env[name] for name in inputs]
            for name in inputs:
                if last_piece[name] == i and name not in kept:
                    del env[name]
            env.update(zip(outputs, fn(piece_args) if getattr(fn, "_boxed_call", False) else fn(*piece_args)))
        return [env[n.name] if isinstance(n, fx.Node) else n for n in result]

    run._boxed_call = True
    return run


def _donated(gm: fx.GraphModule, inputs: list[list[str]], kept: set[str]) -> list[list[int]]:
    """For each piece (the names of its inputs), the indices of the inputs it may overwrite: those it
    reads last, that the backward does not return, that share no storage with a value a piece reads
    from then on or the backward returns (a view and its base are one storage), and that are made by
    an earlier piece or, among the backward's own inputs, are donated by AOTAutograd (saved tensors
    no output aliases, and none where the graph may run again: `retain_graph`)."""
    placeholders = [n.name for n in gm.graph.find_nodes(op="placeholder")]
    own = set(placeholders) - {placeholders[i] for i in torch._inductor.graph.get_donated_idxs() or ()}
    base = _bases(gm)
    donated = []
    for p, names in enumerate(inputs):
        later = {base[name] for q in inputs[p + 1:] for name in q} | {base[name] for name in kept}
        shared = [base[name] for name in names]
        donated.append([i for i, name in enumerate(names)
                        if name not in own and base[name] not in later and shared.count(base[name]) == 1])
    return donated


def _bases(gm: fx.GraphModule) -> dict[str, str]:
    """{value: the value whose storage it is}: itself, or for a view (an op whose result aliases its
    first argument, or an item of such an op's results) its argument's."""
    base = {}
    for node in gm.graph.nodes:
        source = node.args[0] if node.target is operator.getitem else node
        aliasing = (isinstance(source.target, torch._ops.OpOverload)
                    and any(r.alias_info is not None for r in source.target._schema.returns))
        first = next((a for a in source.args if isinstance(a, fx.Node)), None) if aliasing else None
        base[node.name] = base[first.name] if first is not None else node.name
    return base


def _fakes(example_inputs) -> list:
    """The backward's example inputs as fake tensors of one mode, with their strides: AOTAutograd hands
    the backward the strides the compiled forward returns (channels-last where Inductor's layout
    optimization chose it), which can differ from the joint trace's."""
    mode = detect_fake_mode(example_inputs)
    if mode is not None:
        return list(example_inputs)
    mode = FakeTensorMode()
    return [mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in example_inputs]


def _mode(values: list) -> FakeTensorMode:
    return detect_fake_mode(values) or FakeTensorMode()


def _pieces(gm: fx.GraphModule) -> list[tuple[fx.GraphModule, list[str], list[str]]]:
    """(piece, the names of the values it reads from before it, the names of those it makes for later)."""
    nodes = [n for n in gm.graph.nodes if n.op not in ("placeholder", "output")]
    starts, previous = [], None
    for i, node in enumerate(nodes):
        marked = _marked(node)
        if (marked and previous is False) or (node.target in CUT_BEFORE and previous is not None):
            starts.append(i)
        if node.op == "call_function" and node.target is not operator.getitem:
            previous = marked
    bounds = list(zip([0, *starts], [*starts, len(nodes)]))
    where = {node: p for p, (lo, hi) in enumerate(bounds) for node in nodes[lo:hi]}
    output = list(gm.graph.find_nodes(op="output"))[0]
    pieces = []
    for p, (lo, hi) in enumerate(bounds):
        inputs = list(dict.fromkeys(a for n in nodes[lo:hi] for a in n.all_input_nodes if where.get(a) != p))
        outputs = [n for n in nodes[lo:hi] if any(where.get(u, len(bounds)) > p or u is output for u in n.users)]
        if not all(isinstance(n.meta.get("val"), torch.Tensor) for n in (*inputs, *outputs)):
            return []
        graph = fx.Graph()
        env = {}
        for node in inputs:
            env[node] = graph.placeholder(node.name)
            env[node].meta = dict(node.meta)
        for node in nodes[lo:hi]:
            env[node] = graph.node_copy(node, env.__getitem__)
        graph.output(tuple(env[n] for n in outputs))
        pieces.append((fx.GraphModule(gm, graph), [n.name for n in inputs], [n.name for n in outputs]))
    return pieces


def _marked(node: fx.Node) -> bool:
    """Whether `node` belongs to a run of recomputed nodes: marked itself, or a getitem of a marked node."""
    if node.target is operator.getitem and isinstance(node.args[0], fx.Node):
        return _marked(node.args[0])
    return bool(node.meta.get(RECOMPUTED))
