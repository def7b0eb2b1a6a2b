"""Models that once failed to trace, from transformers configs (no download): BERT with an attention
mask and a loss inside, Llama with labels (a DynamicCache's tensor constants; without the cache,
its packed-sequence check), and a model that makes tensor constants. Each trains under a 70 %
schedule with eager's gradients and the predicted peak. Trace failures name their cause."""

import copy
import inspect

import pytest
import torch
from conftest import gradient_errors
from torch import nn

import monet
from monet import MONeTWrapper
from monet.graph import InputSpec, TracedStep, TraceError, analyze
from monet.graph.causal_masks import is_causal_mask
from monet.training import compare_training

transformers = pytest.importorskip("transformers")

VOCAB = 1000
SHAPE = (4, 32)
LLAMA = {"vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 128}
BERT = {"vocab_size": VOCAB, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "intermediate_size": 128, "max_position_embeddings": 128, "num_labels": 3}


class BertClassifier(nn.Module):
    """BERT sequence classification; padding (id 0) masked out, labels from the first token, the loss
    computed inside. Dropout stays on (0.1): the gradient check seeds it."""

    def __init__(self):
        super().__init__()
        self.model = transformers.BertForSequenceClassification(transformers.BertConfig(**BERT))

    def forward(self, ids):
        return self.model(input_ids=ids, attention_mask=ids != 0, labels=ids[:, 0] % 3).loss


class LlamaLM(nn.Module):
    """Llama causal LM with labels (the loss inside); `config` overrides the tiny config."""

    def __init__(self, **config):
        super().__init__()
        self.model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA, **config))

    def forward(self, ids):
        return self.model(input_ids=ids, labels=ids).loss


class Constants(nn.Module):
    """A forward that makes tensors from Python data: constants of the traced graph."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        return self.fc(x) * torch.tensor(2.0) + torch.tensor([float(i) for i in range(16)])


def token_ids():
    ids = torch.randint(1, VOCAB, SHAPE, generator=torch.Generator().manual_seed(1))
    ids[1, 20:] = 0  # padding in two rows: the mask has values to read
    ids[3, 5:] = 0
    return ids


def trains_as_predicted(model, shape, x, budget="70%", dtype="int64"):
    """Solve, wrap, and check one step's gradients and measured peak against eager and the prediction."""
    reference = copy.deepcopy(model)
    schedule = monet.solve(model, shape, budget, input_dtype=dtype, cost_model="analytic", time_limit=3)
    forward_ops = {name for name, _, phase in schedule.graph.ops if phase == "forward"}
    wrapped = MONeTWrapper(model, schedule, shape)
    errors = gradient_errors(wrapped, model, reference, x)
    assert errors.pop("output") < 1e-6
    assert max(errors.values()) <= 1e-5, errors
    stats = compare_training({"monet": wrapped}, x, lambda out: out if out.dim() == 0 else out.sum(), steps=1)
    measured, predicted = stats["monet"].peak, schedule.predicted.peak
    assert measured <= schedule.budget + 64  # + a summed output's loss scalar, which is the caller's
    assert abs(measured - predicted) <= 0.01 * predicted, (measured, predicted)
    return schedule, wrapped, [name for name in schedule.schedule.backward if name in forward_ops]


def test_bert_with_attention_mask_and_loss_trains_as_predicted():
    torch.manual_seed(0)
    schedule, wrapped, recomputed = trains_as_predicted(BertClassifier(), SHAPE, token_ids())
    assert recomputed  # 70 % is below the unconstrained peak: something reruns
    out = wrapped(token_ids())
    assert out.dim() == 0 and torch.isfinite(out)  # the loss itself is the wrapper's output


def test_llama_with_labels_and_its_cache_constants_trains_as_predicted():
    torch.manual_seed(0)
    # 80 %: a heuristic schedule fits from 72 % up, so the 3 s search never comes back empty on a busy machine
    _, wrapped, recomputed = trains_as_predicted(LlamaLM(), SHAPE, token_ids(), budget="80%")
    assert recomputed
    # use_cache is on by default: each layer concatenates onto the DynamicCache's empty start, a
    # tensor the forward made, which the graph reads as a constant (and the backward again where
    # the schedule reruns its copy)
    constants = {n.target for n in wrapped.graphs["forward"].graph.nodes if n.op == "get_attr"}
    assert len(constants) == 2 * LLAMA["num_hidden_layers"]  # a key and a value per layer


def test_constants_made_in_forward_train_as_predicted():
    torch.manual_seed(0)
    model = Constants()
    with TracedStep(model, InputSpec((64, 16))) as step:
        constants = list(step.graph_module.graph.find_nodes(op="get_attr"))
        analysis = analyze(step.graph_module)
    assert len(constants) == 2 and all(c.name not in {t.name for t in analysis.problem.tensors} for c in constants)
    trains_as_predicted(model, (64, 16), torch.randn(64, 16), budget="100%", dtype="float32")


def test_llama_without_cache_traces_past_its_packed_sequence_check():
    seen = []

    class Recording(LlamaLM):
        def forward(self, ids):
            seen.append(torch.compiler.is_compiling())
            return super().forward(ids)

    # without the cache, transformers checks whether the position ids pack several sequences
    # ((mask[:, -1] == 0).all(), a value) unless it is being compiled, as torch.compile and
    # torch.export say it is; monet's trace says so too, and only while it traces
    with TracedStep(Recording(use_cache=False), InputSpec(SHAPE, "int64")) as step:
        problem = analyze(step.graph_module).problem
    assert seen and all(seen) and not torch.compiler.is_compiling()
    assert not list(step.graph_module.graph.find_nodes(op="get_attr"))  # no cache, no constants
    assert any(op.phase == "backward" for op in problem.ops)


def test_llama_output_with_its_cache_names_use_cache():
    class WholeOutput(LlamaLM):
        def forward(self, ids):
            return self.model(input_ids=ids)  # logits and the DynamicCache

    with pytest.raises(TraceError, match=r"WholeOutput .*holds a transformers\.cache_utils\.DynamicCache") as info:
        TracedStep(WholeOutput(), InputSpec(SHAPE, "int64"))
    assert "use_cache=False" in str(info.value)
    assert "control flow" not in str(info.value)


class Linear(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)


class TwoInputs(Linear):
    def forward(self, x, mask):
        return self.fc(x) * mask


class InPlace(Linear):
    def forward(self, x):
        y = torch.sigmoid(self.fc(x))
        y.mul_(2)  # sigmoid's backward reads its output: autograd refuses
        return y


class Branches(Linear):
    def forward(self, x):
        y = self.fc(x)
        if y.sum() > 0:
            return y * 2
        return y


class MaskedSum(Linear):
    def forward(self, x):
        y = self.fc(x)
        return y[y > 0].sum()


def line_of(cls, text):
    lines, start = inspect.getsourcelines(cls.forward)
    return start + next(i for i, line in enumerate(lines) if text in line)


def trace_error(model, shape=(2, 4)):
    with pytest.raises(TraceError) as info:
        TracedStep(model, InputSpec(shape))
    return str(info.value)


def test_a_two_input_model_given_one_tensor_is_told_to_pass_every_input():
    message = trace_error(TwoInputs())
    assert message.startswith("TwoInputs.forward cannot take the inputs (2, 4) float32: missing a required "
                              "argument: 'mask'. Pass every input the forward needs")
    assert "control flow" not in message


@pytest.mark.filterwarnings("ignore:Error detected in SigmoidBackward0")  # autograd's anomaly note
def test_an_in_place_autograd_error_is_named():
    message = trace_error(InPlace())
    assert "autograd refuses an in-place operation" in message
    assert "output 0 of Sigmoid" in message and "Hint:" not in message
    assert "control flow" not in message


def test_data_dependent_control_flow_is_named_where_it_is():
    message = trace_error(Branches())
    assert f"data-dependent Python control flow at {__file__}:{line_of(Branches, 'if y.sum()')} in forward" in message
    message = trace_error(MaskedSum())
    assert f"output shape depends on tensor values at {__file__}:{line_of(MaskedSum, 'y > 0')}" in message
    assert "control flow" not in message


def test_other_errors_pass_through_with_the_model_and_input():
    message = trace_error(InPlace(), shape=(2, 5))  # the wrong width: the linear layer's own error
    assert message.startswith("could not trace the training step of InPlace at input (2, 5) float32: RuntimeError: ")
    assert "a and b must have same reduction dim, but got [2, 5] X [4, 4]" in message
    assert "control flow" not in message and "in-place" not in message


def test_llamas_constant_causal_mask_becomes_is_causal():
    """Traced, Llama (without the cache) builds its causal mask from position ids, where eager checks
    them and calls SDPA with is_causal=True; the mask is a constant of the graph, so the trace folds
    it into is_causal as eager runs, and nothing in the graph makes a mask any more."""
    with TracedStep(LlamaLM(use_cache=False), InputSpec(SHAPE, "int64")) as step:
        graph = step.graph_module.graph
        attention = [n for n in graph.nodes if n.op == "call_function" and "attention" in str(n.target)]
        assert len(attention) == 2 * LLAMA["num_hidden_layers"]  # forward and backward of each layer
        for node in attention:
            schema = [a.name for a in node.target._schema.arguments]
            causal = node.kwargs.get("is_causal", node.args[schema.index("is_causal")]
                                     if len(node.args) > schema.index("is_causal") else None)
            assert node.kwargs.get("attn_mask") is None and causal is True, node.format_node()
        assert not [n for n in graph.nodes if n.target in (torch.ops.aten.where.self, torch.ops.aten.cumsum.default)]


@pytest.mark.parametrize("dtype", [torch.bool, torch.float32, torch.bfloat16])
def test_only_the_causal_mask_counts_as_causal(dtype):
    allowed = torch.ones(6, 6, dtype=torch.bool).tril().expand(2, 1, 6, 6)
    if dtype == torch.bool:
        mask = allowed
    else:
        mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    assert is_causal_mask(mask)
    padded = mask.clone()
    padded[0, 0, :, 0] = padded[0, 0, 0, 1]  # one sequence's first token masked (padding)
    assert not is_causal_mask(padded)
    assert not is_causal_mask(mask[..., :5])  # not square: no upper-left causal mask
    if dtype != torch.bool:
        assert is_causal_mask(torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, float("-inf")))
        assert not is_causal_mask(mask + 1)
