"""Model factories for the CLI tests, named as package.module:factory."""

import torch

from monet.models import MLP


def small_mlp():
    return MLP(hidden=64, depth=24)


def tiny_mlp():
    return MLP(in_features=8, hidden=16, depth=2)


def eval_mlp():
    """A model left in eval mode by its factory: monet solves its training step and says so."""
    return tiny_mlp().eval()


def needs_extra():
    raise ValueError("this model needs transformers: pip install 'monet[transformers]'")


class KeywordNet(torch.nn.Module):
    """Token ids, a mask and labels by keyword, a constant among them; the loss computed inside,
    returned in a dict with the logits (as transformers models take and return them)."""

    def __init__(self, vocab: int = 100, width: int = 64, depth: int = 6, classes: int = 5):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(depth))
        self.head = torch.nn.Linear(width, classes)

    def forward(self, input_ids, attention_mask, labels=None, scale=1.0):
        h = self.embed(input_ids) * attention_mask[..., None] * scale
        for layer in self.layers:
            h = torch.tanh(layer(h))
        logits = self.head(h).mean(1)
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = torch.nn.functional.cross_entropy(logits, labels)
        return out


def keyword_inputs(batch: int = 64, length: int = 32) -> dict:
    gen = torch.Generator().manual_seed(0)
    return {"input_ids": torch.randint(0, 100, (batch, length), generator=gen),
            "attention_mask": torch.ones(batch, length), "labels": torch.randint(0, 5, (batch,), generator=gen),
            "scale": 2.0}


def keyword_net():
    """A factory that returns the model and its example inputs."""
    torch.manual_seed(0)
    return KeywordNet(), keyword_inputs()


def keyword_net_alone():
    torch.manual_seed(0)
    return KeywordNet()
