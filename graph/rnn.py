"""Multi-layer RNNs traced as eager trains them.

The trace records nn.LSTM, nn.GRU and nn.RNN through PyTorch's Python decompositions
(`torch._decomp.decompositions`), which differ from eager training in two ways:
- `_rnn_helper` sets the dropout between layers to zero on every layer (its test
  `num_layers < i - 1` never holds), so a traced step with `dropout > 0` trained without it and its
  gradients were not eager's;
- an LSTM whose input needs no gradient is decomposed into oneDNN's `mkldnn_rnn_layer` as for
  inference (`train=False`): it keeps no workspace, and the traced backward fails for want of it.
While tracing, `traced_as_trained` puts in their place the same helper with the dropout applied
where eager applies it (after each layer but the last, after joining both directions: the masks
eager draws, in its order), and the cell-by-cell LSTM wherever a gradient is needed.
"""

from __future__ import annotations

import contextlib
from itertools import chain

import torch
from torch._decomp import decompositions


def _rnn_helper(input, hidden, params, has_biases, num_layers, dropout, train, bidirectional, batch_first,
                layer_fn):
    input = input.transpose(0, 1) if batch_first else input
    final_hiddens = []
    for i in range(num_layers):
        cur_params, cur_hidden, bidir_params, bidir_hidden = decompositions.params_hiddens(
            params, hidden, i, bidirectional)
        output, last = layer_fn(input, cur_hidden, cur_params, has_biases)
        final_hiddens.append(last)
        if bidirectional:
            backward, last = layer_fn(input, bidir_hidden, bidir_params, has_biases, reverse=True)
            final_hiddens.append(last)
            output = torch.cat([output, backward], output.dim() - 1)
        input = output
        if dropout != 0 and train and i < num_layers - 1:
            input = torch.dropout(input, dropout, train=True)
    input = input.transpose(0, 1) if batch_first else input
    return input, final_hiddens


def _one_layer_lstm(input, hx, params):
    if torch.is_grad_enabled() and any(t.requires_grad for t in chain([input], hx, *params)):
        return decompositions.one_layer_lstm
    return _select_one_layer_lstm(input, hx, params)


_select_one_layer_lstm = decompositions.select_one_layer_lstm_function


@contextlib.contextmanager
def traced_as_trained():
    """Within: RNN decompositions train as eager does (see the module's docstring)."""
    originals = decompositions._rnn_helper, decompositions.select_one_layer_lstm_function
    decompositions._rnn_helper, decompositions.select_one_layer_lstm_function = _rnn_helper, _one_layer_lstm
    try:
        yield
    finally:
        decompositions._rnn_helper, decompositions.select_one_layer_lstm_function = originals
