"""monet.wrap_blocks: a schedule per block, each block wrapped in place, on one process."""

import copy

import pytest
import torch
from conftest import rel_err

import monet
from monet.blocks import block_inputs
from monet.models import Transformer
from monet.wrapper import MONeTWrapper

CONFIG = {"dim": 64, "depth": 3, "heads": 4, "dropout": 0.1}
TOKENS = (4, 64, 64)


def test_wrapped_blocks_train_as_eager_and_their_schedules_reload(tmp_path):
    """Dropout included: the wrappers draw as the blocks did (the generators seeded alike)."""
    torch.manual_seed(0)
    model = Transformer(**CONFIG)
    reference = copy.deepcopy(model)
    x = torch.randn(*TOKENS)
    generator = torch.get_rng_state()
    examples = block_inputs(model, list(model.blocks), x)
    assert torch.equal(torch.get_rng_state(), generator), "capturing the blocks' inputs draws nothing"
    assert torch.equal(examples[0].args[0], x) and examples[1].args[0].shape == x.shape
    files = monet.wrap_blocks(model, model.blocks, x, "80%", cost_model="analytic", time_limit=5)
    assert len(files) == CONFIG["depth"] and all(isinstance(b, MONeTWrapper) for b in model.blocks)
    assert all(f.predicted.peak <= f.budget for f in files)
    assert files[1].input.args[0].requires_grad and not files[0].input.args[0].requires_grad
    for m in (model, reference):
        torch.manual_seed(3)
        m(x).pow(2).mean().backward()
    grads = dict(reference.named_parameters())
    for name, p in model.named_parameters():
        assert rel_err(p.grad, grads[name.replace(".model.", ".")].grad) <= 1e-6, name

    paths = []
    for i, file in enumerate(files):
        file.save(tmp_path / f"block{i}.json")
        paths.append(tmp_path / f"block{i}.json")
    again = Transformer(**CONFIG)
    reloaded = monet.wrap_blocks(again, again.blocks, x, schedules=paths)
    assert [f.schedule for f in reloaded] == [f.schedule for f in files]


def test_wrap_blocks_says_what_is_wrong():
    model = Transformer(**CONFIG)
    x = torch.randn(*TOKENS)
    with pytest.raises(TypeError, match="ModuleList or Sequential"):
        monet.wrap_blocks(model, list(model.blocks), x, "80%")
    with pytest.raises(ValueError, match="not both"):
        monet.wrap_blocks(model, model.blocks, x, "80%", schedules=[])
    with pytest.raises(ValueError, match="not both"):
        monet.wrap_blocks(model, model.blocks, x)
    with pytest.raises(ValueError, match="2 schedules for 3 blocks"):
        monet.wrap_blocks(model, model.blocks, x, schedules=["a.json", "b.json"])
    with pytest.raises(ValueError, match=r"blocks \[0\] were not called"):
        monet.wrap_blocks(model, torch.nn.ModuleList([torch.nn.Linear(64, 64)]), x, "80%")
    assert not any(isinstance(b, MONeTWrapper) for b in model.blocks), "nothing replaced after an error"
