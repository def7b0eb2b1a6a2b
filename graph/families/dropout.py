"""Dropout: backward from the mask, from the mask packed 8 per byte, or replayed from the
generator state (the dropout may then also rerun), or from the mask with the dropout able to rerun
from the generator state (as PyTorch's checkpointing reruns it)."""

from __future__ import annotations

import torch

from monet.solver.edit import Alternative, ChoiceSpec, NewOp, NewTensor

from .. import kernels
from ..analyze import allocation_bytes
from ..profile import measure_call
from .base import RERUN, BackwardFromCompact, Measured, Site, aten, producer_of, tensor_of


class DropoutMask(BackwardFromCompact):
    """Dropout's backward from its bool mask (PyTorch, a byte per element), from the mask packed
    8 per byte, or from the mask drawn again from the generator state saved before the dropout
    (`replay`: nothing of the mask is kept; the backward redraws it, exactly). Under `replay` the
    dropout itself may also rerun from that state, so its output need not be kept either. Under
    `rerun` it may rerun so too, and the backward reads the mask, kept or made by that rerun: a block
    rebuilt whole draws each mask once, as under PyTorch's checkpointing, where `replay` draws it twice."""

    name, options = "dropout", ("bytes", "bits", "replay", "rerun")
    # options whose kernels Inductor cannot trace: they set the generator's state
    not_compiled = {"replay": "redraws the mask by setting the generator's state, which Inductor cannot trace",
                    "rerun": "reruns dropout by setting the generator's state, which Inductor cannot trace"}
    backward_target = aten.native_dropout_backward.default
    pack_kernel, backward_kernel = kernels.dropout_mask, kernels.dropout_backward_from_mask

    def match(self, node, analysis):
        grad, mask, scale = node.args
        op = producer_of(analysis, tensor_of(analysis, mask))
        if op is None or op.target != "aten.native_dropout.default" or not tensor_of(analysis, grad):
            return None
        source, p = mask.args[0].args[:2]
        if producer_of(analysis, tensor_of(analysis, source)) is None:
            return None
        return Site(self.name, f"{op.name}:mask", (op.name, node.name),
                    (tensor_of(analysis, grad), tensor_of(analysis, mask)), (scale, p))

    def backward_args(self, site, node_args, packed):
        return (node_args[0], packed, site.params[0])

    def _state(self, site: Site, device: torch.device) -> NewTensor:
        """The saved generator state: device memory only where the generator keeps it there."""
        state = kernels.rng_state(torch.empty(0, device=device))
        on_device = allocation_bytes(state.untyped_storage().nbytes(), device.type) if state.device == device else 0
        return NewTensor(f"{site.tensors[-1]}__{self.options[2]}", on_device, tuple(state.shape), "uint8")

    def measure(self, site, node, node_args, value, device):
        found = super().measure(site, node, node_args, value, device)
        grad = node_args[0]
        t_new, ws_new, state = measure_call(lambda: kernels.rng_state(grad), device)
        scale, p = site.params
        t_alt, ws_alt, _ = measure_call(lambda: kernels.dropout_backward_replay(grad, state, p, scale), device)
        return {**found, self.options[2]: Measured((t_new, ws_new), (t_alt, ws_alt), self._state(site, device))}

    def shapes(self, site, node, fake_mode):
        state = self._state(site, node.meta["val"].device)
        return {**super().shapes(site, node, fake_mode), self.options[2]: Measured((0.0, 0), (0.0, 0), state)}

    def spec(self, site, problem, measured):
        """`rerun` costs what `replay` does to save the state, and what PyTorch's backward does."""
        bits, replay = measured[self.options[1]], measured[self.options[2]]
        source = problem.tensor_named(site.tensors[-1])
        dropout = problem.ops[source.producer]
        before = problem.ops[problem.tensors[dropout.inputs[0]].producer]
        pack = NewOp(bits.out.name, f"monet.{kernels.dropout_mask.__name__}", dropout.name, (source.name,),
                     (bits.out,), ((0.0, 0, False), (*bits.new, True), (0.0, 0, False), (0.0, 0, False)))
        state = NewOp(replay.out.name, f"monet.{kernels.rng_state.__name__}", before.name,
                      (problem.tensors[dropout.inputs[0]].name,), (replay.out,),
                      ((0.0, 0, False), (0.0, 0, False), (*replay.new, True), (*replay.new, True)))
        backward = problem.op_named(site.nodes[1])
        plain = (tuple(problem.tensors[t].name for t in backward.inputs), backward.time, backward.workspace)
        alternative = Alternative(site.nodes[1], (
            plain, ((site.tensors[0], bits.out.name), *bits.alt), ((site.tensors[0], replay.out.name), *replay.alt),
            plain))
        reads = tuple(problem.tensors[t].name for t in dropout.inputs)
        # a rerun from the saved state holds a copy of the generator's state meanwhile (to put it back)
        from_state = (reads, dropout.time, dropout.workspace + replay.out.bytes, None, (replay.out.name,), True)
        rerun = Alternative(dropout.name, ((reads, dropout.time, dropout.workspace),) * 2 + (from_state,) * 2)
        return ChoiceSpec(site.choice, self.options, new_ops=(pack, state), alternatives=(alternative, rerun))

    def rewrite(self, graph, nodes, site, option):
        if option == self.options[1]:
            return super().rewrite(graph, nodes, site, option)
        dropout = nodes[site.nodes[0]]
        with graph.inserting_before(dropout):
            state = graph.create_node("call_function", kernels.rng_state, (dropout.args[0],),
                                      name=f"{site.tensors[-1]}__{self.options[2]}")
        dropout.meta[RERUN] = (kernels.dropout_rerun, (state,))
        if option == self.options[3]:  # the backward reads the mask as PyTorch's does
            return [state]
        backward = nodes[site.nodes[1]]
        backward.target = kernels.dropout_backward_replay
        backward.args = (backward.args[0], state, site.params[1], site.params[0])
        backward.kwargs = {}
        return [state]
