"""Causal attention masks that are constants of the graph become SDPA's own `is_causal`.

Eager transformers models (Llama, for one) drop their causal mask and call SDPA with
`is_causal=True` after checking, on the values of the position ids, that the batch packs one
sequence per row. A traced step cannot read values, so the traced model builds the mask
(batch x 1 x L x L, float) and every attention layer keeps one for its backward: memory eager
never spends. Where the mask depends on no input (it is made from `arange` and shapes alone), it
is a constant of the graph: this pass computes it, and where it is exactly the causal mask of
SDPA's `is_causal` (0 on and below the diagonal, -inf or the dtype's least value above; boolean:
True on and below), the attention ops and their backwards take `is_causal=True` without it, as in
eager, and the ops that built it are dropped.
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.fx.node import map_arg


def _mask_argument(node: torch.fx.Node) -> tuple[torch.fx.Node, list[str]] | None:
    """(the mask node, the schema's argument names) of an attention op whose schema takes both
    `attn_mask` and `is_causal`, called with a mask; None otherwise."""
    schema = getattr(node.target, "_schema", None)
    if node.op != "call_function" or schema is None:
        return None
    names = [a.name for a in schema.arguments]
    if "attn_mask" not in names or "is_causal" not in names:
        return None
    mask = _argument(node, names, "attn_mask")
    return (mask, names) if isinstance(mask, torch.fx.Node) else None


def _argument(node: torch.fx.Node, names: list[str], name: str):
    """The argument `name` of `node`, given by position or keyword (None if not given)."""
    position = names.index(name)
    return node.args[position] if position < len(node.args) else node.kwargs.get(name)


def _set_argument(node: torch.fx.Node, names: list[str], name: str, value) -> None:
    """Give `node` the argument `name` as `value`, where it was given (by position, else by keyword)."""
    position = names.index(name)
    if position < len(node.args):
        node.args = node.args[:position] + (value,) + node.args[position + 1:]
    else:
        node.kwargs = {**node.kwargs, name: value}


def _constant_ancestry(node: torch.fx.Node) -> list[torch.fx.Node] | None:
    """The ops that make `node`, in graph order, if none reads an input or draws random numbers."""
    seen, stack = set(), [node]
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        if current.op != "call_function":
            return None
        tags = getattr(current.target, "tags", ())
        if torch.Tag.nondeterministic_seeded in tags:
            return None
        seen.add(current)
        stack.extend(current.all_input_nodes)
    order = {n: i for i, n in enumerate(node.graph.nodes)}
    return sorted(seen, key=order.__getitem__)


def _value(nodes: list[torch.fx.Node]) -> torch.Tensor:
    """The last of `nodes` computed from the others."""
    values = {}
    for n in nodes:
        values[n] = n.target(*map_arg(n.args, values.__getitem__), **map_arg(n.kwargs, values.__getitem__))
    return values[nodes[-1]]


def is_causal_mask(mask: torch.Tensor) -> bool:
    """Whether `mask` (..., L, L) is what SDPA's `is_causal=True` applies in every batch and head."""
    if mask.dim() < 2 or mask.shape[-1] != mask.shape[-2]:
        return False
    allowed = torch.ones(mask.shape[-2:], dtype=torch.bool, device=mask.device).tril()
    if mask.dtype == torch.bool:
        return bool((mask == allowed).all())
    if not mask.is_floating_point():
        return False
    masked = (mask == float("-inf")) | (mask == torch.finfo(mask.dtype).min)
    return bool(torch.where(allowed, mask == 0, masked).all())


def fold_causal_masks(gm: torch.fx.GraphModule) -> int:
    """Rewrite `gm`'s attention ops whose mask is a constant causal mask to `is_causal=True` without a
    mask (see the module's docstring); the number of ops rewritten."""
    verdicts: dict[torch.fx.Node, bool] = {}
    rewritten, dropped = 0, set()
    for node in list(gm.graph.nodes):
        found = _mask_argument(node)
        if found is None:
            continue
        mask, names = found
        if mask not in verdicts:
            ancestry = _constant_ancestry(mask)
            with unset_fake_temporarily():  # the trace's fake mode: these run on real tensors
                verdicts[mask] = ancestry is not None and is_causal_mask(_value(ancestry))
            dropped.update(ancestry or ())
        if not verdicts[mask]:
            continue
        _set_argument(node, names, "attn_mask", None)
        _set_argument(node, names, "is_causal", True)
        rewritten += 1
    for node in reversed([n for n in gm.graph.nodes if n in dropped]):  # the masks' ops nothing reads any more
        if not node.users:
            gm.graph.erase_node(node)
    if rewritten:
        gm.recompile()
    return rewritten
