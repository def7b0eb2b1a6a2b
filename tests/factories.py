"""Model factories for the CLI tests, named as package.module:factory."""

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
