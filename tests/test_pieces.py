"""A backward compiled by Inductor in pieces (graph.pieces): the values a piece reads last are donated to it."""

import functools

import torch
from torch.fx.experimental.proxy_tensor import make_fx

import monet.graph.pieces as pieces
from monet import PeakMemory
from monet.graph import inductor_compile

TOKENS, WIDTH, HIDDEN = 50_000, 256, 512  # a 48.8 MiB table and its gradient
TABLE = TOKENS * WIDTH * 4


def tied_gradient(hidden, grad_logits, grad_embedded, ids):
    """A tied embedding's gradient, as GPT-2's backward makes it: the LM head's, then the embedding's, summed."""
    head = torch.mm(grad_logits.t(), hidden)
    embedding = torch.ops.aten.embedding_dense_backward(grad_embedded, ids, TOKENS, -1, False)
    return (head + embedding,)


def _inputs():
    torch.manual_seed(0)
    return [torch.randn(HIDDEN, WIDTH), torch.randn(HIDDEN, TOKENS), torch.randn(HIDDEN, WIDTH),
            torch.randint(0, TOKENS, (HIDDEN,))]


def _peak_and_result(graph):
    compiled = pieces.compile_in_pieces(graph, _inputs(), functools.partial(inductor_compile, backward=True))
    args = _inputs()
    with PeakMemory("cpu") as meter:  # the rise over the inputs
        result = compiled(args)
    return meter.peak, result[0]


def test_a_piece_writes_its_result_into_the_value_it_reads_last(monkeypatch):
    """Cut before the embedding backward, the LM head's gradient crosses into the second piece; donated
    to it, Inductor sums into it and the backward makes two table-sized buffers, not three. The
    gradient is the same either way."""
    graph = make_fx(tied_gradient)(*_inputs())
    assert len(pieces._pieces(graph)) == 2
    donated, donated_result = _peak_and_result(graph)
    monkeypatch.setattr(pieces, "_donated", lambda gm, inputs, kept: [[] for _ in inputs])
    kept, kept_result = _peak_and_result(graph)
    expected = tied_gradient(*_inputs())[0]
    torch.testing.assert_close(donated_result, expected)
    torch.testing.assert_close(kept_result, expected)
    assert donated < 2.2 * TABLE, (donated, TABLE)
    assert kept - donated > 0.9 * TABLE, (kept, donated, TABLE)


def test_a_value_whose_storage_is_read_later_is_not_donated():
    """The LM head's gradient read last by the second piece, its transpose (a view, the same storage) by
    the third: donating it would let the second piece overwrite what the third reads."""
    def twice_tied(hidden, grad_logits, grad_embedded, ids):
        head = torch.mm(grad_logits.t(), hidden)
        transposed = head.t()
        first = torch.ops.aten.embedding_dense_backward(grad_embedded, ids, TOKENS, -1, False) + head
        second = torch.ops.aten.embedding_dense_backward(grad_embedded, ids, TOKENS, -1, False)
        return (first, second + transposed.t())

    graph = make_fx(twice_tied)(*_inputs())
    cut = pieces._pieces(graph)
    assert len(cut) == 3
    inputs = [names for _, names, _ in cut]
    kept = {n.name for n in list(graph.graph.find_nodes(op="output"))[0].args[0]}
    donated = pieces._donated(graph, inputs, kept)
    head = next(n.name for n in graph.graph.nodes if n.target is torch.ops.aten.mm.default)
    assert head in inputs[1] and all(inputs[1][i] != head for i in donated[1]), (inputs, donated)
    args = _inputs()
    compiled = pieces.compile_in_pieces(graph, args, functools.partial(inductor_compile, backward=True))
    for got, expected in zip(compiled(_inputs()), twice_tied(*_inputs())):
        torch.testing.assert_close(got, expected)
