"""A matrix of models nobody in this project wrote, built from configs with no download: each traced,
solved at its least peak and at a budget between that and keeping everything, and trained one step
under monet beside eager PyTorch. A new architecture joins by one `Entry` in MATRIX.

Each model here returns its loss (transformers with labels, the others through `Loss`), so that the
budget covers the whole step. The quick form of the matrix (the entries marked `quick`) runs in the
test command (tests/test_matrix.py); the full form is this benchmark, which writes
benchmarks/results/matrix/README.md: per model whether it traced (or why not), its least peak in
activation terms, the measured peak against the prediction, the gradients' error against eager's, and
step times against eager and torch.compile.

    python -m benchmarks.matrix                       # every entry
    python -m benchmarks.matrix --models bert lstm --time-limit 20
    python -m benchmarks.matrix --models llama t5 --optimizer adam -o benchmarks/results/matrix-adam
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from monet.api import solve_traced, trace_problem
from monet.memory import PeakMemory, resident_bytes
from monet.schedules import OptimizerSpec, ScheduleFile
from monet.solver import SolveSettings, format_bytes
from monet.wrapper import MONeTWrapper

BATCH, LENGTH, VOCAB, HIDDEN = 2, 32, 128, 32
RESULTS = Path(__file__).parent / "results" / "matrix"


@dataclass(frozen=True)
class Entry:
    """One model of the matrix: `build()` returns the model (returning a scalar loss) and its inputs (a
    dict of keyword arguments or a tuple of positional ones), seeded; `quick`: in the test command's form."""

    name: str
    library: str
    build: Callable[[], tuple[nn.Module, dict | tuple]]
    quick: bool = False


class Loss(nn.Module):
    """`model`'s output reduced to a loss inside the step: `loss(model(*args), target)`."""

    def __init__(self, model: nn.Module, loss: Callable, pick: Callable = lambda out: out):
        super().__init__()
        self.model, self.loss, self.pick = model, loss, pick

    def forward(self, *args, target):
        return self.loss(self.pick(self.model(*args)), target)


class LossOf(nn.Module):
    """A transformers model called with labels: its `.loss`."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, **inputs):
        return self.model(**inputs).loss


def _generator() -> torch.Generator:
    return torch.Generator().manual_seed(1)


def _ids(vocab: int = VOCAB, shape=(BATCH, LENGTH)) -> torch.Tensor:
    return torch.randint(1, vocab, shape, generator=_generator())


def _padded_mask(left: bool = False) -> torch.Tensor:
    mask = torch.ones(BATCH, LENGTH, dtype=torch.int64)
    if left:
        mask[0, : LENGTH // 4] = 0
    else:
        mask[0, -LENGTH // 4:] = 0
    return mask


def _transformers(config: str, model: str, inputs: Callable[[], dict], **options):
    def build():
        import transformers

        torch.manual_seed(0)
        made = getattr(transformers, model)(getattr(transformers, config)(**options))
        return LossOf(made), inputs()

    return build


def _lm_inputs(mask: bool = False, left: bool = False) -> Callable[[], dict]:
    def inputs():
        ids = _ids()
        return {"input_ids": ids, "labels": ids, **({"attention_mask": _padded_mask(left)} if mask else {})}
    return inputs


def _classifier_inputs() -> dict:
    return {"input_ids": _ids(), "attention_mask": _padded_mask(), "labels": _ids(3, (BATCH,))}


def _seq2seq_inputs() -> dict:
    return {"input_ids": _ids(), "attention_mask": _padded_mask(), "labels": _ids(shape=(BATCH, LENGTH // 2))}


def _pixels() -> dict:
    return {"pixel_values": torch.randn(BATCH, 3, 32, 32, generator=_generator()),
            "labels": _ids(10, (BATCH,))}


def _audio() -> dict:
    return {"input_values": torch.randn(BATCH, 4000, generator=_generator()), "labels": _ids(20, (BATCH, 8))}


WAV2VEC2 = {"vocab_size": 20, "hidden_size": HIDDEN, "num_hidden_layers": 2, "num_attention_heads": 4,
            "intermediate_size": 2 * HIDDEN, "conv_dim": (16, 16), "conv_stride": (5, 4), "conv_kernel": (10, 4),
            "num_conv_pos_embeddings": 16, "num_conv_pos_embedding_groups": 4, "ctc_zero_infinity": True}
DECODER = {"vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": 2 * HIDDEN, "num_hidden_layers": 2,
           "max_position_embeddings": LENGTH, "use_cache": False}
ENCODER = {"vocab_size": VOCAB, "hidden_size": HIDDEN, "num_hidden_layers": 2, "num_attention_heads": 4,
           "intermediate_size": 2 * HIDDEN, "max_position_embeddings": LENGTH}


class Positional(nn.Module):
    """A module taking its input by keyword `x` (the matrix's vision, MONAI and plain models)."""

    def __init__(self, model: nn.Module, loss: Callable, pick: Callable = lambda out: out):
        super().__init__()
        self.inner = Loss(model, loss, pick)

    def forward(self, x, target):
        return self.inner(x, target=target)


def _plain(model: Callable[[], nn.Module], x: Callable[[], torch.Tensor], loss: Callable = F.mse_loss,
           pick: Callable = lambda out: out):
    def build():
        torch.manual_seed(0)
        made, inputs = model(), x()
        with torch.no_grad():
            target = torch.randn_like(pick(made.eval()(inputs)).float(), memory_format=torch.contiguous_format)
        made.train()
        return Positional(made, loss, pick), {"x": inputs, "target": target}

    return build


class Attention(nn.Module):
    """nn.MultiheadAttention in a pre-norm residual block, twice."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.MultiheadAttention(HIDDEN, 4, dropout=0.1, batch_first=True) for _ in range(2))
        self.norms = nn.ModuleList(nn.LayerNorm(HIDDEN) for _ in range(2))

    def forward(self, x):
        for attention, norm in zip(self.blocks, self.norms, strict=True):
            y = norm(x)
            x = x + attention(y, y, y, need_weights=False)[0]
        return x


class Recurrent(nn.Module):
    def __init__(self, cell: type[nn.RNNBase]):
        super().__init__()
        self.rnn = cell(HIDDEN, HIDDEN, num_layers=2, dropout=0.2, batch_first=True)
        self.head = nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x):
        return self.head(self.rnn(x)[0])


class CausalSelfAttention(nn.Module):
    """scaled_dot_product_attention with is_causal, its projections and an MLP, twice."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.ModuleList(nn.Linear(HIDDEN, 3 * HIDDEN) for _ in range(2))
        self.mlp = nn.ModuleList(nn.Sequential(nn.Linear(HIDDEN, 4 * HIDDEN), nn.GELU(), nn.Linear(4 * HIDDEN, HIDDEN))
                                 for _ in range(2))

    def forward(self, x):
        b, n, _ = x.shape
        for qkv, mlp in zip(self.qkv, self.mlp, strict=True):
            q, k, v = qkv(x).view(b, n, 3, 4, HIDDEN // 4).permute(2, 0, 3, 1, 4)
            x = x + F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, n, HIDDEN)
            x = x + mlp(x)
        return x


def _depthwise() -> nn.Module:
    def block(c):
        return nn.Sequential(nn.Conv2d(c, c, 3, padding=1, groups=c), nn.BatchNorm2d(c), nn.ReLU6(),
                             nn.Conv2d(c, c, 1), nn.BatchNorm2d(c), nn.ReLU6())
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), block(16), block(16), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(16, 10))


class TiedLM(nn.Module):
    """An embedding and an output layer sharing one weight, an MLP between."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.mlp = nn.Sequential(nn.Linear(HIDDEN, 4 * HIDDEN), nn.GELU(), nn.Linear(4 * HIDDEN, HIDDEN))
        self.out = nn.Linear(HIDDEN, VOCAB, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, ids):
        return self.out(self.embed(ids) + self.mlp(self.embed(ids)))


def _tokens_loss(logits, target):
    return F.cross_entropy(logits.flatten(0, 1), target.flatten())


def _tied():
    torch.manual_seed(0)
    ids = _ids()
    return Positional(TiedLM(), _tokens_loss), {"x": ids, "target": ids}


def _sequence(length: int = LENGTH) -> torch.Tensor:
    return torch.randn(BATCH, length, HIDDEN, generator=_generator())


def _steps() -> torch.Tensor:
    """A short sequence for the RNNs, whose traced step holds each time step's ops."""
    return _sequence(8)


def _diffusers(model: str, sample: tuple[int, ...], **options):
    def build():
        import diffusers

        torch.manual_seed(0)
        made = getattr(diffusers, model)(**options)
        x = torch.randn(*sample, generator=_generator())
        extra = {}
        if model == "UNet2DConditionModel":
            extra = {"encoder_hidden_states": torch.randn(sample[0], 8, options["cross_attention_dim"],
                                                          generator=_generator())}
        return Denoiser(made), {"x": x, "timestep": torch.tensor([10] * sample[0]), **extra,
                                "target": torch.randn(*sample, generator=_generator())}

    return build


class Denoiser(nn.Module):
    """A diffusers UNet's predicted noise against a target: a diffusion model's training loss."""

    def __init__(self, unet: nn.Module):
        super().__init__()
        self.unet = unet

    def forward(self, x, timestep, target, encoder_hidden_states=None):
        extra = {} if encoder_hidden_states is None else {"encoder_hidden_states": encoder_hidden_states}
        return F.mse_loss(self.unet(x, timestep, **extra).sample, target)


class LastHidden(nn.Module):
    """A transformers encoder's last hidden state, as a tensor."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x).last_hidden_state


def _wav2vec2_encoder() -> nn.Module:
    import transformers

    return LastHidden(transformers.Wav2Vec2Model(transformers.Wav2Vec2Config(**WAV2VEC2)))


def _monai_net(factory: str, **options) -> nn.Module:
    from monai.networks import nets

    return getattr(nets, factory)(**options)


MATRIX = {entry.name: entry for entry in [
    Entry("bert", "transformers", _transformers("BertConfig", "BertForSequenceClassification",
                                                _classifier_inputs, **ENCODER, num_labels=3), quick=True),
    Entry("roberta", "transformers", _transformers("RobertaConfig", "RobertaForMaskedLM", _lm_inputs(mask=True),
                                                   **{**ENCODER, "max_position_embeddings": LENGTH + 2})),
    Entry("distilbert", "transformers", _transformers(
        "DistilBertConfig", "DistilBertForSequenceClassification", _classifier_inputs, vocab_size=VOCAB, dim=HIDDEN,
        n_layers=2, n_heads=4, hidden_dim=2 * HIDDEN, max_position_embeddings=LENGTH, num_labels=3)),
    Entry("gpt2", "transformers", _transformers(
        "GPT2Config", "GPT2LMHeadModel", _lm_inputs(), vocab_size=VOCAB, n_embd=HIDDEN, n_layer=2, n_head=4,
        n_positions=LENGTH, use_cache=False, bos_token_id=0, eos_token_id=0)),
    Entry("llama", "transformers", _transformers("LlamaConfig", "LlamaForCausalLM", _lm_inputs(),
                                                 **DECODER, num_attention_heads=4, num_key_value_heads=4)),
    Entry("qwen2-gqa", "transformers", _transformers("Qwen2Config", "Qwen2ForCausalLM",
                                                     _lm_inputs(mask=True, left=True), **DECODER,
                                                     num_attention_heads=4, num_key_value_heads=2), quick=True),
    Entry("mistral-gqa", "transformers", _transformers("MistralConfig", "MistralForCausalLM", _lm_inputs(),
                                                       **DECODER, num_attention_heads=4, num_key_value_heads=1)),
    Entry("mixtral-moe", "transformers", _transformers("MixtralConfig", "MixtralForCausalLM", _lm_inputs(),
                                                       **DECODER, num_attention_heads=4, num_key_value_heads=2,
                                                       num_local_experts=4, num_experts_per_tok=2)),
    Entry("t5", "transformers", _transformers("T5Config", "T5ForConditionalGeneration", _seq2seq_inputs,
                                              vocab_size=VOCAB, d_model=HIDDEN, d_kv=8, d_ff=2 * HIDDEN, num_layers=2,
                                              num_heads=4, decoder_start_token_id=0)),
    Entry("bart", "transformers", _transformers("BartConfig", "BartForConditionalGeneration", _seq2seq_inputs,
                                                vocab_size=VOCAB, d_model=HIDDEN, encoder_layers=2, decoder_layers=2,
                                                encoder_attention_heads=4, decoder_attention_heads=4,
                                                encoder_ffn_dim=2 * HIDDEN, decoder_ffn_dim=2 * HIDDEN,
                                                max_position_embeddings=LENGTH)),
    Entry("vit", "transformers", _transformers("ViTConfig", "ViTForImageClassification", _pixels,
                                               image_size=32, patch_size=8, hidden_size=HIDDEN, num_hidden_layers=2,
                                               num_attention_heads=4, intermediate_size=2 * HIDDEN, num_labels=10)),
    Entry("wav2vec2-ctc", "transformers", _transformers("Wav2Vec2Config", "Wav2Vec2ForCTC", _audio, **WAV2VEC2)),
    Entry("wav2vec2-encoder", "transformers", _plain(
        _wav2vec2_encoder, lambda: torch.randn(BATCH, 4000, generator=_generator()))),
    Entry("monai-resnet", "monai", _plain(
        lambda: _monai_net("resnet10", spatial_dims=2, n_input_channels=1, num_classes=4),
        lambda: torch.randn(BATCH, 1, 32, 32, generator=_generator()))),
    Entry("monai-densenet", "monai", _plain(
        lambda: _monai_net("DenseNet121", spatial_dims=2, in_channels=1, out_channels=4),
        lambda: torch.randn(BATCH, 1, 32, 32, generator=_generator()))),
    Entry("monai-unet", "monai", _plain(
        lambda: _monai_net("UNet", spatial_dims=2, in_channels=1, out_channels=2, channels=(8, 16, 32), strides=(2, 2),
                           num_res_units=1),
        lambda: torch.randn(BATCH, 1, 32, 32, generator=_generator())), quick=True),
    Entry("monai-unetr", "monai", _plain(
        lambda: _monai_net("UNETR", in_channels=1, out_channels=2, img_size=(16, 16, 16), feature_size=8,
                           hidden_size=HIDDEN, mlp_dim=2 * HIDDEN, num_heads=4),
        lambda: torch.randn(1, 1, 16, 16, 16, generator=_generator()))),
    Entry("diffusers-unet2d", "diffusers", _diffusers(
        "UNet2DModel", (BATCH, 3, 16, 16), sample_size=16, block_out_channels=(16, 32), layers_per_block=1,
        down_block_types=("DownBlock2D", "AttnDownBlock2D"), up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        norm_num_groups=8), quick=True),
    Entry("diffusers-unet2d-cond", "diffusers", _diffusers(
        "UNet2DConditionModel", (BATCH, 4, 16, 16), sample_size=16, block_out_channels=(16, 32), layers_per_block=1,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=16, attention_head_dim=4, norm_num_groups=8)),
    Entry("multihead-attention", "torch", _plain(Attention, _sequence)),
    Entry("lstm", "torch", _plain(lambda: Recurrent(nn.LSTM), _steps)),  # quick form: tests/test_rnn.py
    Entry("gru", "torch", _plain(lambda: Recurrent(nn.GRU), _steps)),
    Entry("sdpa", "torch", _plain(CausalSelfAttention, _sequence)),
    Entry("depthwise", "torch", _plain(_depthwise, lambda: torch.randn(BATCH, 3, 32, 32, generator=_generator()))),
    Entry("tied-weights", "torch", _tied, quick=True),
]}


@dataclass(frozen=True)
class Trained:
    """One step under a schedule beside eager: predicted and measured peak (bytes), the worst relative
    error of a parameter's gradient against eager's, and the loss's."""

    budget: str
    schedule: ScheduleFile
    measured: int
    gradient_error: float
    loss_error: float

    @property
    def predicted(self) -> int:
        return self.schedule.predicted.peak


@dataclass(frozen=True)
class Outcome:
    """An entry's result: `trained` per budget, or `error` (why it could not be traced, solved or run)."""

    entry: Entry
    autocast: str | None
    compiled: bool = False
    trained: tuple[Trained, ...] = ()
    eager_peak: int = 0
    floor: int = 0
    compile_error: float | None = None  # torch.compile's own gradient error against eager's
    error: str | None = None

    def activation_share(self, peak: int) -> float:
        """`peak` in activation terms: its part above the floor (parameters, gradients, buffers and inputs)
        over eager's."""
        return (peak - self.floor) / max(1, self.eager_peak - self.floor)


def _tensors(inputs: dict | tuple) -> list[torch.Tensor]:
    values = inputs.values() if isinstance(inputs, dict) else inputs
    return [v for v in values if isinstance(v, torch.Tensor)]


def step(module: nn.Module, model: nn.Module, inputs: dict | tuple, autocast: str | None,
         optimizer: torch.optim.Optimizer | None = None) -> tuple[int, torch.Tensor, list[torch.Tensor | None]]:
    """One forward and backward of `module` (training `model`), seeded (the same dropout masks each time),
    its forward under CPU autocast at `autocast` where given, and `optimizer`'s step where given (its state
    counted as held from before): the measured peak, the loss, the gradients."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(2)
    state = [] if optimizer is None else [value for held in optimizer.state.values() for value in held.values()
                                          if isinstance(value, torch.Tensor)]
    with PeakMemory("cpu", resident_bytes(model, *_tensors(inputs), *state)) as meter:
        with torch.autocast("cpu", getattr(torch, autocast)) if autocast else contextlib.nullcontext():
            loss = module(**inputs) if isinstance(inputs, dict) else module(*inputs)
        loss.backward()
        if optimizer is not None:
            optimizer.step()
    return meter.peak, loss.detach(), [None if p.grad is None else p.grad.clone() for p in model.parameters()]


def trained(module: nn.Module, model: nn.Module, inputs: dict | tuple, autocast: str | None,
            optimizer: str | None = None, steps: int = 1) -> tuple[int, torch.Tensor, list[torch.Tensor | None]]:
    """`step` `steps` times (twice with an `optimizer`, 'sgd', 'adam' or 'adamw' with PyTorch's defaults, so
    that its state exists in the step measured): the last one's."""
    stepper = None if optimizer is None else OptimizerSpec.of(optimizer).build(model.parameters())
    for _ in range(max(steps, 1 if optimizer is None else 2)):
        measured = step(module, model, inputs, autocast, stepper)
    return measured


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def gradient_error(grads: list[torch.Tensor | None], expected: list[torch.Tensor | None]) -> float:
    """The worst parameter's relative error of `grads` against `expected`; a gradient below 1e-6 of the whole
    gradient's norm (zero in exact arithmetic, as attention's key bias has: its rounding alone) is measured
    against that norm instead."""
    pairs = [(g.float(), e.float()) for g, e in zip(grads, expected, strict=True) if e is not None]
    whole = torch.stack([e.norm() for _, e in pairs]).norm()
    return max(((g - e).norm() / e.norm().clamp_min(1e-6 * whole).clamp_min(1e-30)).item() for g, e in pairs)


def check(entry: Entry, *, autocast: str | None = None, compiled: bool = False, optimizer: str | None = None,
          time_limit: float = 10.0) -> Outcome:
    """Trace `entry`'s model (analytic costs), solve its least peak and a budget midway between that and
    keeping everything, and train one step under each beside eager (under `autocast` where given; with
    `compiled`, the schedule compiled by Inductor, and torch.compile's own error against eager measured;
    with `optimizer`, the whole step with it, solved for and measured from the second step on)."""
    try:
        model, inputs = entry.build()
        original = copy.deepcopy(model)
        compile_error = None
        if compiled:
            compiled_model = copy.deepcopy(original)
            _, _, by_compile = trained(torch.compile(compiled_model), compiled_model, inputs, autocast, optimizer)
        problem = trace_problem(model, inputs, autocast=autocast, optimizer=optimizer, cost_model="analytic")
        settings = SolveSettings(time_limit=time_limit)
        least = solve_traced(problem, "least", entry.name, settings)
        middle = (least.predicted.peak + least.predicted.unconstrained_peak) // 2
        schedules = [("least", least), ("middle", solve_traced(problem, middle, entry.name, settings))]
        reference = copy.deepcopy(original)
        eager_peak, eager_loss, expected = trained(reference, reference, inputs, autocast, optimizer)
        if compiled:
            compile_error = gradient_error(by_compile, expected)
        runs = []
        for budget, schedule in schedules:
            owner = copy.deepcopy(original)  # each from the same weights: an optimizer's steps change them
            wrapped = MONeTWrapper(owner, schedule, inputs, compile=compiled)
            measured, loss, grads = trained(wrapped, owner, inputs, autocast, optimizer,
                                            steps=2 if compiled else 1)  # a compiled module's first step compiles
            runs.append(Trained(budget, schedule, measured, gradient_error(grads, expected),
                                relative_error(loss, eager_loss)))
        return Outcome(entry, autocast, compiled, tuple(runs), eager_peak, problem.floor, compile_error)
    except Exception as exc:  # noqa: BLE001 (the benchmark reports every model, whatever failed)
        detail = "".join(traceback.format_exception_only(exc)).strip().splitlines()
        return Outcome(entry, autocast, compiled, error=f"{type(exc).__name__}: {detail[-1][:300]}")


def step_times(modules: dict[str, nn.Module], model_of: dict[str, nn.Module], inputs: dict | tuple,
               rounds: int = 5) -> dict[str, float]:
    """Median seconds of a training step of each module, in rounds (one step of each per round, after one
    warm-up each), so that all see the same machine load."""
    samples: dict[str, list[float]] = {name: [] for name in modules}
    for name, module in modules.items():
        step(module, model_of[name], inputs, None)
    for _ in range(rounds):
        for name, module in modules.items():
            began = time.perf_counter()
            step(module, model_of[name], inputs, None)
            samples[name].append(time.perf_counter() - began)
    return {name: sorted(times)[len(times) // 2] for name, times in samples.items()}


def timed(outcome: Outcome) -> dict[str, float]:
    """Step times of `outcome`'s schedules and torch.compile's over eager's, measured side by side."""
    model, inputs = outcome.entry.build()
    eager, compiled = copy.deepcopy(model), copy.deepcopy(model)
    modules = {"eager": eager, "torch.compile": torch.compile(compiled)}
    owners = {"eager": eager, "torch.compile": compiled}
    for run in outcome.trained:
        modules[run.budget], owners[run.budget] = MONeTWrapper(model, run.schedule, inputs), model
    times = step_times(modules, owners, inputs)
    return {name: seconds / times["eager"] for name, seconds in times.items() if name != "eager"}


def _row(outcome: Outcome, times: dict[str, float] | None) -> str:
    entry = outcome.entry
    if outcome.error:
        return f"| {entry.name} | {entry.library} | no: {outcome.error.replace('|', '/')} |" + " |" * 7
    least, middle = outcome.trained
    worst = max(abs(run.measured / run.predicted - 1) for run in outcome.trained)
    over = max(run.measured - run.predicted for run in outcome.trained)
    error = max(run.gradient_error for run in outcome.trained)
    time_cells = (f"{times['least']:.2f} / {times['middle']:.2f} | {times['torch.compile']:.2f}" if times
                  else "- | -")
    return (f"| {entry.name} | {entry.library} | yes | {format_bytes(outcome.eager_peak)} "
            f"| {format_bytes(outcome.floor)} "
            f"| {format_bytes(least.predicted)} ({outcome.activation_share(least.predicted):.2f}) "
            f"| {worst:.2%}{' (over by ' + str(over) + ' B)' if over > 64 else ''} | {error:.1e} | {time_cells} |")


def _commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          cwd=Path(__file__).parent)
    return done.stdout.strip() or "unknown"


def write_page(rows: dict[str, list[str]], command: str, folder: Path = RESULTS) -> Path:
    """The results page: one table per form (float32 with step times; bfloat16 autocast), with the date,
    commit, machine and command that made it. Written whole or not at all."""
    from monet.schedules import write_atomic

    header = ("| model | library | traced | eager peak (measured) | floor | least peak (activation share) "
              "| measured vs predicted, worst | gradient error, worst | step time / eager: least / middle "
              "| torch.compile / eager |\n|---|---|---|---|---|---|---|---|---|---|")
    lines = ["# Model matrix", "",
             f"Made {datetime.date.today()} at commit {_commit()} on {platform.machine()} "
             f"({platform.processor() or 'CPU'}, torch {torch.__version__}, one thread), by `{command}`.", "",
             "Each model is built from a config (no download) and returns its loss; it is traced with analytic "
             "costs, solved at its least peak (`least`) and at the budget midway between that and keeping "
             "everything (`middle`), and one step of each is trained beside eager PyTorch from the same seed. "
             "The floor is what no schedule frees (parameters, their gradients, buffers and inputs); the "
             "activation share is the least peak's part above the floor over eager's. Measured vs predicted: "
             "the measured peak's distance from the prediction (the caller's 4-byte loss aside). Gradient "
             "error: the worst parameter's relative error against eager's (a gradient below 1e-6 of the whole "
             "gradient's norm, zero in exact arithmetic, against that norm). Step times are medians of 5 "
             "steps taken in rounds beside eager's. A whole step with an optimizer (`--optimizer`) is solved for "
             "as one and measured from its second step, when the optimizer's state exists.", ""]
    for title, body in rows.items():
        lines += [f"## {title}", "", header, *body, ""]
    folder.mkdir(parents=True, exist_ok=True)
    return write_atomic(folder / "README.md", "\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MATRIX), choices=list(MATRIX), metavar="MODEL",
                        help=f"default: all ({' '.join(MATRIX)})")
    parser.add_argument("--time-limit", type=float, default=10.0, help="solver seconds per solve. Default: 10")
    parser.add_argument("--optimizer", choices=("sgd", "adam", "adamw"),
                        help="solve and measure the whole step with this optimizer (PyTorch's defaults), from the "
                             "second step on; no step times then. Default: forward and backward only")
    parser.add_argument("-o", "--output", type=Path, default=RESULTS, help=f"folder. Default: {RESULTS}")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    forms = (("float32", None), ("bfloat16 autocast", "bfloat16"))
    if args.optimizer:
        forms = tuple((f"{title}, whole step with {args.optimizer}", autocast) for title, autocast in forms)
    rows: dict[str, list[str]] = {title: [] for title, _ in forms}
    for name in args.models:
        for title, autocast in forms:
            began = time.perf_counter()
            outcome = check(MATRIX[name], autocast=autocast, optimizer=args.optimizer, time_limit=args.time_limit)
            times = timed(outcome) if autocast is None and not args.optimizer and outcome.error is None else None
            rows[title].append(_row(outcome, times))
            print(f"{name} ({title}, {time.perf_counter() - began:.0f} s): {rows[title][-1]}", flush=True)
    given = sys.argv[1:] if argv is None else argv
    command = "python -m benchmarks.matrix" + (" " + " ".join(given) if given else "")
    print(f"wrote {write_page(rows, command, args.output)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
