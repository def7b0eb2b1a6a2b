"""Model factories for the CLI tests, named as package.module:factory."""

from monet.models import MLP


def small_mlp():
    return MLP(hidden=64, depth=24)
