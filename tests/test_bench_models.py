"""The benchmark models: torchvision-sized, a CPU training step at the quick shape, blocks in
forward order, and a training step monet can trace and analyse."""

import sys
from pathlib import Path

import pytest
import torch

from monet.graph import InputSpec, TracedStep, analyze

sys.path.insert(0, str(Path(__file__).parents[1]))  # benchmarks/ is not a package
from benchmarks.models import MODELS  # noqa: E402

# Parameters at 1000 classes: torchvision's figures (resnet50: torchvision's, built by MONAI;
# unet: the classic UNet with 3 in and 2 out channels; transformers: their base configs; cnn: monet's
# bundled CNN, 10 classes).
PARAMS = {
    "resnet50": 25_557_032, "vgg16": 138_357_544, "mobilenet_v2": 3_504_872, "googlenet": 6_624_904,
    "unet": 31_037_698, "distilbert": 66_364_418, "gpt2": 124_439_808, "cnn": 179_930,
}
BLOCKS = {"resnet50": 16, "vgg16": 5, "mobilenet_v2": 17, "googlenet": 9, "unet": 9, "distilbert": 6, "gpt2": 12,
          "cnn": 7}
NEEDS = {"resnet50": "monai", "distilbert": "transformers", "gpt2": "transformers"}


@pytest.fixture(scope="module", params=list(MODELS))
def bench(request):
    """(BenchModel, model): each model is built once for all the tests on it."""
    name = request.param
    if name in NEEDS:
        pytest.importorskip(NEEDS[name])
    torch.manual_seed(0)
    return MODELS[name], MODELS[name].build()


def quick_input(bench_model):
    return InputSpec(bench_model.quick_shape, bench_model.input_dtype).example()


def expected_output_shape(bench_model) -> tuple[int, ...]:
    shape = bench_model.quick_shape
    return {
        "unet": (shape[0], 2, *shape[2:]),
        "distilbert": (shape[0], 2, shape[1]),
        "gpt2": (*shape, 50257),
        "cnn": (shape[0], 10),
    }.get(bench_model.name, (shape[0], 1000))


def test_parameter_count(bench):
    bench_model, model = bench
    count = sum(p.numel() for p in model.parameters())
    assert count == pytest.approx(PARAMS[bench_model.name], rel=0.01)


def test_quick_training_step(bench):
    bench_model, model = bench
    model.train()
    out = model(quick_input(bench_model))
    assert out.shape == expected_output_shape(bench_model)
    out.sum().backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    model.zero_grad(set_to_none=True)


def test_blocks_are_submodules_in_forward_order(bench):
    bench_model, model = bench
    blocks = bench_model.blocks(model)
    assert len(blocks) == BLOCKS[bench_model.name]
    submodules = {id(m) for m in model.modules() if m is not model}
    assert all(id(b) in submodules and any(True for _ in b.parameters()) for b in blocks)
    order = []
    hooks = [b.register_forward_hook(lambda m, *_: order.append(id(m))) for b in blocks]
    try:
        with torch.no_grad():
            model.eval()(quick_input(bench_model))
    finally:
        for hook in hooks:
            hook.remove()
    assert order == [id(b) for b in blocks]


def test_monet_traces_quick_step(bench):
    bench_model, model = bench
    with TracedStep(model, InputSpec(bench_model.quick_shape, bench_model.input_dtype)) as step:
        analysis = analyze(step.graph_module)
    assert analysis.problem.ops


def test_chain_computes_the_forward(bench):
    """The chain that checkpoint_sequential runs is the model's forward, function by function."""
    bench_model, model = bench
    if bench_model.chain is None:
        pytest.skip(f"{bench_model.name} has no chain")
    x = quick_input(bench_model)
    with torch.no_grad():
        model.eval()
        expected, y = model(x), x
        for step in bench_model.chain(model):
            y = step(y)
    assert torch.equal(y, expected)
