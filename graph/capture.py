"""Trace a model's training step into one joint forward+backward torch.fx graph.

AOTAutograd's `aot_export_joint_with_descriptors` traces the module with fake
tensors (nothing runs, no state changes) and labels every graph input and
output: which parameter, buffer, user input, tangent, buffer update or
gradient it is. The same traced object later compiles into the runtime with a
partitioner of ours, so the graph we solve on is the graph we run.

The trace runs with `torch.compiler.is_compiling()` true, as under torch.compile, so that
libraries skip the eager-only shortcuts that read tensor values (transformers' attention-mask
and packed-sequence checks). Tensors the forward makes from Python data become constants of
the graph (`get_attr` nodes), which the compiled step holds. A failure says its cause: one
tensor passed to a model that needs more, data-dependent control flow (and where), a
data-dependent output shape, a non-tensor output (a transformers cache), an in-place
operation autograd refuses; anything else is PyTorch's message with the model and input.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import re
import traceback
from collections.abc import Mapping

import torch
from torch import nn
from torch._dynamo.backends.debugging import boxed_nop
from torch._functorch.aot_autograd import (
    aot_compile_joint_with_descriptors,
    aot_export_joint_with_descriptors,
)
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode
from torch.utils._pytree import tree_map_only

from monet.errors import MonetError
from monet.schedules import AUTOCAST_DTYPES, Inputs

from .causal_masks import fold_causal_masks
from .cudnn_batch_norm import match_eager_batch_norm
from .dropout_scale import match_eager_dropout
from .example import Example
from .pieces import compile_in_pieces
from .rnn import traced_as_trained


class TraceError(MonetError, RuntimeError):
    """The model's training step could not be traced into one graph; `reason` says why, in words."""

    def __init__(self, message: str, reason: str | None = None):
        super().__init__(message)
        self.reason = reason or message


def model_device(model: nn.Module) -> torch.device:
    for tensor in [*model.parameters(), *model.buffers()]:
        return tensor.device
    return torch.device("cpu")


class TracedStep:
    """A model's joint training-step graph, kept open so it can be compiled once.

    Use as a context manager; `compile` must be called inside it.
    """

    def __init__(self, model: nn.Module, inputs, autocast: str | torch.dtype | None = None):
        """`inputs` as Example.of takes them (a spec's tensors are made on the model's device);
        `autocast` (torch.bfloat16 or torch.float16, or its name; None: off) the torch.autocast dtype to
        trace the step under: the graph holds its casts, and runs them with autocast off."""
        if isinstance(autocast, torch.dtype):
            autocast = str(autocast).removeprefix("torch.")
        if autocast is not None and autocast not in AUTOCAST_DTYPES:
            raise ValueError(f"autocast={autocast!r}: use one of {', '.join(f'torch.{d}' for d in AUTOCAST_DTYPES)} "
                             f"(or its name, {', '.join(map(repr, AUTOCAST_DTYPES))}), or None")
        self.model = model
        self.device = model_device(model)
        self.autocast = autocast
        self.example = Example.of(inputs, device=self.device)
        self.inputs = self.example.spec()
        problem = _sharded(model) or _call_problem(model, self.example, self.inputs)
        if problem:
            raise TraceError(problem)
        self._stack = contextlib.ExitStack()
        was_training = model.training
        model.train()
        try:
            with _compiling(), traced_as_trained(), _autocast_forward(model, self.device, autocast), \
                    _loss_only(model) as loss_only:
                self._joint = aot_export_joint_with_descriptors(self._stack, model, self.example.args,
                                                                self.example.kwargs)
            self.loss_only = bool(loss_only)
            fold_causal_masks(self._joint.graph_module)
            match_eager_dropout(self._joint.graph_module)
            match_eager_batch_norm(self._joint.graph_module)
        except Exception as exc:
            self._stack.close()
            reason = _explain(exc)
            raise TraceError(f"could not trace the training step of {type(model).__name__} at input "
                             f"{self.inputs.describe()}: {reason}", reason) from exc
        finally:
            model.train(was_training)

    @property
    def graph_module(self) -> torch.fx.GraphModule:
        return self._joint.graph_module

    @property
    def param_names(self) -> list[str]:
        return list(self._joint.params_spec)

    @property
    def buffer_names(self) -> list[str]:
        return list(self._joint.buffers_spec)

    def compile(self, partition_fn, *, inductor: bool = False, layout_optimization: bool = False):
        """The training step as one callable `f(*params, *buffers, *args, **kwargs)` split by `partition_fn`; its
        forward and backward run op by op as traced, or (`inductor`) compiled by Inductor, with its layout
        optimization where `layout_optimization` (inductor_compile)."""
        if not inductor:
            return aot_compile_joint_with_descriptors(self._joint, partition_fn=partition_fn, fw_compiler=boxed_nop,
                                                      bw_compiler=boxed_nop)
        return aot_compile_joint_with_descriptors(
            self._joint, partition_fn=partition_fn,
            fw_compiler=functools.partial(inductor_compile, layout_optimization=layout_optimization),
            bw_compiler=functools.partial(inductor_compile_backward, layout_optimization=layout_optimization))

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> TracedStep:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def inductor_compile(graph_module: torch.fx.GraphModule, example_inputs, *, layout_optimization: bool = False,
                     backward: bool = False):
    """One partitioned graph (the forward or the backward) compiled by Inductor, as torch.compile
    compiles it: first decomposed by Inductor's table (the joint graph was traced without it, so that
    the graph monet solves on has PyTorch's ops), then lowered and fused. Random ops draw from
    PyTorch's generator as in eager (Inductor's `fallback_random`), so dropout masks, and with them
    gradients, are eager's. `layout_optimization` lets Inductor run convolutions channels-last as
    torch.compile does: it copies convolution weights and inputs to channels-last and keeps the copies
    for the backward, memory a schedule counts only where its problem holds them
    (graph.channels_last_copies; GoogLeNet at 70 % without them counted: 126 MiB measured with the
    layout, 111 MiB without, 108 MiB predicted). A `backward` graph compiles as torch.compile's
    backward does (Inductor's `is_backward`: it may overwrite the inputs donated to it), in the layout of its
    forward: Inductor decides the layout per graph, by the forward convolutions in it, and in a backward
    without one it lays a depthwise convolution's backward inputs out in the stride order of its
    weight's gradient, which channels-last leaves ambiguous (the size-1 input-channel dimension): it
    wrote MobileNetV2's rerun ReLU6 output for it in a third order, one more 12 MiB copy live."""
    from torch._inductor import config
    from torch._inductor.compile_fx import compile_fx_inner
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.proxy_tensor import make_fx

    with config.patch(fallback_random=True, layout_optimization=layout_optimization,
                      force_layout_optimization=backward and layout_optimization):
        decomposed = make_fx(graph_module, decomposition_table=select_decomp_table(),
                             tracing_mode="fake")(*example_inputs)
        return compile_fx_inner(decomposed, example_inputs, is_backward=backward)


def inductor_compile_backward(graph_module: torch.fx.GraphModule, example_inputs, *,
                              layout_optimization: bool = False):
    """A backward that monet partitioned, compiled by Inductor in pieces cut where recomputations begin
    (graph.pieces), so that Inductor's fusion keeps the schedule's order of frees."""
    return compile_in_pieces(graph_module, example_inputs,
                             functools.partial(inductor_compile, layout_optimization=layout_optimization,
                                               backward=True))


@contextlib.contextmanager
def _autocast_forward(model: nn.Module, device: torch.device, dtype: str | None):
    """torch.autocast on `device` at `dtype` inside `model`'s forward only, and off elsewhere,
    whatever the caller has on: as in eager's recipe (forward under autocast, `backward()`
    outside), the joint trace's backward runs without autocast. Traced under autocast, the
    backward's float32 matmuls were cast to `dtype` (SDPA's math path on CPU: GPT-2's gradients
    drifted 2.5e-3 from eager's through its attention alone)."""
    entered: list[torch.autocast] = []

    def enter(_module, _args, _kwargs):
        entered.append(torch.autocast(device.type, dtype=getattr(torch, dtype)))
        entered[-1].__enter__()

    def leave(_module, _args, _kwargs, _output):
        entered.pop().__exit__(None, None, None)

    with torch.autocast(device.type, enabled=False), contextlib.ExitStack() as hooks:
        if dtype is not None:
            hooks.callback(model.register_forward_pre_hook(enter, with_kwargs=True).remove)
            hooks.callback(model.register_forward_hook(leave, with_kwargs=True, always_call=True).remove)
        yield


def _returned_loss(output) -> torch.Tensor | None:
    """The loss a model returns in a mapping under "loss" (transformers' ModelOutput, a dict): a
    floating-point scalar; else None."""
    loss = output.get("loss") if isinstance(output, Mapping) else None
    return loss if isinstance(loss, torch.Tensor) and loss.dim() == 0 and loss.is_floating_point() else None


@contextlib.contextmanager
def _loss_only(model: nn.Module):
    """Where `model` returns its loss (see _returned_loss), the trace differentiates that alone: its
    other outputs (logits) are detached, so the backward takes no gradient for them. Differentiated,
    each would get one, zeros, when only the loss is backpropagated: a tensor of the logits' size that
    eager never makes (1 MiB of a small Llama's 25 MiB at 50 %). Yields a list that holds True once
    the forward has returned a loss."""
    found: list[bool] = []

    def detach_others(_module, _args, _kwargs, output):
        if _returned_loss(output) is not None:
            for key in [k for k in output.keys() if k != "loss"]:
                output[key] = tree_map_only(torch.Tensor, torch.Tensor.detach, output[key])
            found.append(True)
        return output

    handle = model.register_forward_hook(detach_others, with_kwargs=True)
    try:
        yield found
    finally:
        handle.remove()


def _compiling():
    """What torch.compile sets while it traces (`torch.compiler.is_compiling()` is True), so that
    library code skips the eager-only shortcuts that read tensor values (transformers checks
    `padding_mask.all()` to drop an attention mask, and whether position ids pack several
    sequences, only when not compiling). torch.export also sets `is_exporting()`; that one is
    left off, as under torch.compile, so that shortcuts decided from shapes alone stay as eager
    takes them (DistilBERT's mask-free attention) and traced graphs keep their fingerprints."""
    session = getattr(torch.compiler, "_compile_session_context", None)
    return session() if session is not None else contextlib.nullcontext()


def sharded_parameters(model: nn.Module) -> list[str]:
    """The names of `model`'s parameters that are sharded DTensors (FSDP2's fully_shard, tensor parallelism)."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch built without distributed support shards nothing
        return []
    return [name for name, p in model.named_parameters() if isinstance(p, DTensor)]


def _sharded(model: nn.Module) -> str | None:
    """Why monet cannot trace `model` if its parameters are sharded: a sharded parameter is gathered by
    hooks and collectives at run time, which the one-graph trace does not run through."""
    sharded = sharded_parameters(model)
    if not sharded:
        return None
    others = " and others" if len(sharded) > 1 else ""
    return (f"{type(model).__name__}'s parameters are sharded DTensors ({sharded[0]}{others}; FSDP2's fully_shard "
            "or tensor parallelism makes them), and monet does not run sharded models yet: its step is one traced "
            "graph over whole parameters, which FSDP2 gathers block by block with hooks and collectives the trace "
            "cannot run. Under FSDP2, wrap each block before sharding (monet.wrap_blocks(model, blocks, inputs, "
            "budget), then fully_shard each wrapper and the root); under DDP, wrap the unsharded model in "
            "MONeTWrapper and that in DistributedDataParallel (docs/guides/distributed.md)")


def _call_problem(model: nn.Module, example: Example, inputs: Inputs) -> str | None:
    """Why `model(*args, **kwargs)` cannot call the model's forward with `example`, if it cannot."""
    try:
        signature = inspect.signature(model.forward)
    except (TypeError, ValueError):  # no signature to read: let the trace say
        return None
    try:
        signature.bind(*example.args, **example.kwargs)
    except TypeError as exc:
        single = inputs.single
        hint = (" Pass every input the forward needs: a tuple of positional inputs or a dict of keyword inputs "
                "(monet.solve(model, {'input_ids': ids, 'attention_mask': mask}, ...))" if single is not None else "")
        return f"{type(model).__name__}.forward cannot take the inputs {inputs.describe()}: {exc}.{hint}"
    return None


def _explain(exc: BaseException) -> str:
    """The trace failure `exc` in words: its cause where it is one monet knows, else PyTorch's message."""
    text = f"{type(exc).__name__}: {str(exc).strip().rstrip('.')}"
    where = _user_frame(exc)
    at = f" at {where}" if where else ""
    if isinstance(exc, (DataDependentOutputException, GuardOnDataDependentSymNode)):
        text = text.splitlines()[0]  # PyTorch's advice that follows is for torch.export users
        return (f"data-dependent Python control flow{at}: the code reads a tensor's value ({text}). monet "
                "traces with fake tensors, which have shapes but no values, so the forward must not branch "
                "on tensor values (as for torch.export); compute both branches with torch.where, or move the "
                "decision out of the model")
    if isinstance(exc, DynamicOutputShapeException):
        return (f"an op whose output shape depends on tensor values{at} ({text}); boolean-mask indexing, "
                "nonzero and unique make such shapes, and monet needs every shape known from the input's shape: "
                "use torch.where or a fixed-size mask instead")
    message = str(exc)
    found = re.search(r"Found <class '([^']+)'> in output", message)
    if found:
        cls = found.group(1)
        hint = (" A transformers model returns its key/value cache when it uses one: call it with "
                "use_cache=False (or set model.config.use_cache = False), or return only the logits or the loss."
                if "Cache" in cls else "")
        return (f"the model's output holds a {cls}, which is not a tensor (nor a structure of tensors that "
                f"PyTorch's pytree knows); return tensors.{hint}")
    if isinstance(exc, RuntimeError) and re.search(r"in-?place (operation|op)|modified inplace", message):
        text = text.split(" Hint:")[0].rstrip(".")  # autograd's hint points at a backtrace this error does not show
        return (f"autograd refuses an in-place operation{at} ({text}); this is autograd's own check, which "
                "eager PyTorch's model(x).sum().backward() makes too: make that operation out-of-place")
    return f"{text}{at}"


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_STDLIB_DIR = os.path.dirname(os.__file__) + os.sep


def _ours(filename: str) -> bool:
    """Whether a frame in `filename` is PyTorch's or the standard library's (not the model's code)."""
    if filename.startswith(_TORCH_DIR):
        return True
    return filename.startswith(_STDLIB_DIR) and not {"site-packages", "dist-packages"} & set(filename.split(os.sep))


def _user_frame(exc: BaseException) -> str | None:
    """`file:line in function` of the innermost frame of `exc` outside PyTorch (the model's code
    or a library's), or None."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not _ours(f.filename)]
    if not frames or frames[-1].filename == __file__:
        return None
    frame = frames[-1]
    path = frame.filename
    parts = path.split(os.sep)
    if "site-packages" in parts:
        path = os.path.join(*parts[parts.index("site-packages") + 1:])
    return f"{path}:{frame.lineno} in {frame.name}"
