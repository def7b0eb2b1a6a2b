"""Models by name: the bundled ones, or any `package.module:factory`.

Nothing here imports torch until a model is built, so the CLI can list names,
check arguments and print help at once.
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Bundled:
    factory: str  # "module:callable", imported when the model is built
    input_shape: tuple[int, ...]
    about: str
    input_dtype: str = "float32"


BUNDLED: dict[str, Bundled] = {
    "cnn": Bundled("monet.models:ResidualCNN", (32, 3, 64, 64),
                   "ResNet-style CNN: 7 residual blocks with conv, BN, ReLU, adds, max/avg pooling, linear"),
    "mlp": Bundled("monet.models:MLP", (2048, 32), "32-layer MLP with ReLU, dropout before the head"),
    "transformer": Bundled("monet.models:Transformer", (8, 128, 128),
                           "4 pre-norm transformer blocks (attention, GELU MLP, dropout)"),
    "distilbert": Bundled("monet.models:DistilBertQA", (8, 384),
                          "DistilBERT question answering (66 M parameters; int64 token ids)", "int64"),
}


def check_model_name(name: str) -> None:
    """Fail at once on a name that can name no model (before anything is imported)."""
    module_name, colon, attr = name.partition(":")
    if name not in BUNDLED and not (colon and module_name and attr):
        raise ValueError(f"unknown model {name!r}: use one of {', '.join(BUNDLED)} or package.module:factory "
                         "(a callable that returns an nn.Module)")


def input_dtype(name: str) -> str:
    """The dtype a model's input takes by default: the bundled model's, else float32."""
    return BUNDLED[name].input_dtype if name in BUNDLED else "float32"


def load_callable(name: str, what: str):
    """The callable `package.module:attr` names (`what` says what it is for, in errors). Modules are
    looked for in the installed packages and then in the current folder."""
    module_name, _, attr = name.partition(":")
    if os.getcwd() not in sys.path:  # console scripts do not put the current folder on the path
        sys.path.append(os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name.split(".")[0] and exc.name != module_name:
            raise ValueError(f"importing {module_name} for {what} failed: {exc}") from exc
        raise ValueError(f"cannot load {what}: no module {module_name!r} among the installed packages "
                         f"or in the current folder ({os.getcwd()})") from exc
    except Exception as exc:
        raise ValueError(f"importing {module_name} for {what} failed: {type(exc).__name__}: {exc}") from exc
    found = getattr(module, attr, None)
    if not callable(found):
        raise ValueError(f"cannot load {what}: {module_name} has no callable {attr!r}")
    return found


def load_model(name: str):
    """(model, example inputs or None): a bundled model by short name, or `package.module:factory`
    called with no arguments, which returns an nn.Module or (nn.Module, example inputs); example
    inputs are what monet.solve takes (a tensor, a tuple of positional inputs, a dict of keyword ones)."""
    from torch import nn

    check_model_name(name)
    made = load_callable(BUNDLED[name].factory if name in BUNDLED else name, f"model {name!r}")()
    model, inputs = made if isinstance(made, tuple) and len(made) == 2 else (made, None)
    if not isinstance(model, nn.Module):
        raise ValueError(f"{name} returned {type(made).__name__}, not an nn.Module or (nn.Module, example inputs)")
    return model, inputs


def load_inputs(name: str):
    """The example inputs `package.module:function` returns when called with no arguments."""
    module_name, colon, attr = name.partition(":")
    if not (colon and module_name and attr):
        raise ValueError(f"--inputs {name!r}: give package.module:function (a callable that returns the model's "
                         "example inputs: a tensor, a tuple of positional inputs or a dict of keyword inputs)")
    return load_callable(name, f"inputs {name!r}")()
