"""monet.backend: torch.compile(model, backend=monet.backend(budget)) trains by monet schedules."""

import copy
import json
import re

import pytest
import torch
from conftest import (
    compile_rounding,
    compiled_module,
    errors_within_rounding,
    gradient_errors,
    inductor_rounding,
    small_batch,
    small_model,
)

import monet
from monet import InputSpec, PeakMemory, resident_bytes

FAST = {"cost_model": "analytic", "time_limit": 8, "gap": 0.05, "progress": False}  # gap: tests that need no optimum


def _peak(module, model, x):
    """The measured peak of one training step of `module` (compiled on the step before)."""
    module(x).sum().backward()
    model.zero_grad(set_to_none=True)
    with PeakMemory("cpu", resident_bytes(model, x)) as meter:
        module(x).sum().backward()
    model.zero_grad(set_to_none=True)
    return meter.peak


def test_backend_trains_like_torch_compile_in_about_half_the_memory():
    """The CNN compiled with a 52 % monet backend: gradients within Inductor's own rounding of eager's,
    the measured peak at most 0.6 of torch.compile's own, and near the prediction, which counts ATen
    ops, not Inductor's buffers: 5.5 to 8.4 % under the measurement before the channels-last workspace
    was counted, 3.3 % over it since (README, "Compiled by Inductor"), so the bound is that with a
    margin, not the 3 % the uncompiled runtime meets. The
    solve runs to a 2 % gap or 120 s (34 s here; 196-213 s to the default 0.5 %; in a CI run of 2026-12-03
    on a machine 1.4x slower, beside the other test worker, it stopped at a 240 s limit instead): the
    schedule must be the ILP's, since the heuristic one it falls back on measured 17.5 % over. 52 %, not
    50 %: the region's peak holds Inductor's channels-last copies (0.86 MiB), and 52 % leaves the
    activations the room 50 % left without them; at 50 % the solve stopped at 240 s 4 % from its bound."""
    model, shape = small_model("cnn")
    reference, plain = copy.deepcopy(model), copy.deepcopy(model)
    spec, x = InputSpec(shape), small_batch("cnn")
    backend = monet.backend("52%", **{**FAST, "time_limit": 120, "gap": 0.02}, layout="inductor")
    compiled = compiled_module(model, spec, backend=backend)
    errors_within_rounding(gradient_errors(compiled, model, reference, x), inductor_rounding("cnn", spec))
    (region,) = backend.regions
    assert region.solver.status in ("optimal", "time_limit"), region.solver
    half, full = _peak(compiled, model, x), _peak(torch.compile(plain), plain, x)
    assert half <= 0.6 * full, (half, full)
    assert abs(half / region.predicted.peak - 1) <= 0.1, (half, region.predicted.peak)


def test_dropout_replay_is_left_out_and_masks_are_eagers():
    """Dropout replayed from the generator state cannot run under Inductor, so the backend's solve
    leaves it out (MONeTWrapper's uncompiled 50 % schedule of this transformer takes it): fixing it is
    refused as an option the choice does not have. The masks drawn in the compiled step are eager's, so
    gradients stay within Inductor's rounding."""
    model, shape = small_model("transformer")
    reference = copy.deepcopy(model)
    spec, x = InputSpec(shape), small_batch("transformer")
    backend = monet.backend("50%", **FAST)
    errors = gradient_errors(compiled_module(model, spec, backend=backend), model, reference, x)
    errors_within_rounding(errors, inductor_rounding("transformer", spec))
    dropouts = [name for name, target, _ in backend.regions[0].graph.ops if target == "aten.native_dropout.default"]
    assert dropouts and "replay" not in backend.regions[0].schedule.options.values()
    torch._dynamo.reset()
    replayed = monet.backend("50%", **FAST, options={f"{dropouts[0]}:mask": "replay"})
    with pytest.raises(Exception, match="has no option 'replay'; its options are \\['bytes', 'bits'\\]"):
        torch.compile(copy.deepcopy(reference), backend=replayed)(x).sum().backward()


def test_region_schedules_are_saved_and_reused(tmp_path):
    """With `schedules`, each region's schedule file is written under its graph's fingerprint; a
    later compile of the same graph at the same budget reuses it (no profiling, no solve) and trains
    as the first did; another budget solves again and replaces it, and so does 'least' (the least peak
    the search finds), whose file a later 'least' reuses."""
    model, shape = small_model("mlp")
    x = small_batch("mlp")
    stages = []
    first = monet.backend("50%", **FAST | {"progress": lambda stage, *_: stages.append(stage)}, schedules=tmp_path)
    torch.compile(copy.deepcopy(model), backend=first)(x).sum().backward()
    (path,) = tmp_path.iterdir()
    assert path.name == f"{first.regions[0].graph.fingerprint}.json"
    assert any("solving" in s for s in stages)

    stages.clear()
    again = monet.backend("50%", **FAST | {"progress": lambda stage, *_: stages.append(stage)}, schedules=tmp_path)
    torch._dynamo.reset()
    torch.compile(copy.deepcopy(model), backend=again)(x).sum().backward()
    assert again.regions == first.regions
    assert stages and all("reusing" in s for s in stages), stages

    stages.clear()
    other = monet.backend("45%", **FAST | {"progress": lambda stage, *_: stages.append(stage)}, schedules=tmp_path)
    torch._dynamo.reset()
    torch.compile(copy.deepcopy(model), backend=other)(x).sum().backward()
    assert any("solving" in s for s in stages)
    assert json.loads(path.read_text())["budget"] == other.regions[0].budget < first.regions[0].budget

    # 'least' reuses only a file solved at 'least': the 45 % one is solved again, the least one is reused
    for reused in (False, True):
        stages.clear()
        least = monet.backend("least", **FAST | {"progress": lambda stage, *_: stages.append(stage)},
                              schedules=tmp_path)
        torch._dynamo.reset()
        torch.compile(copy.deepcopy(model), backend=least)(x).sum().backward()
        assert all("reusing" in s for s in stages) == reused, stages
        (region,) = least.regions
        assert region.solver.least and region.predicted.peak <= region.budget <= other.regions[0].budget


class _TwoRegions(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.second = (torch.nn.Sequential(*(m for _ in range(4) for m in (torch.nn.Linear(32, 32),
                                                                                      torch.nn.Tanh())))
                                   for _ in range(2))

    def forward(self, x):
        x = self.first(x)
        torch._dynamo.graph_break()
        return self.second(x)


def test_graph_breaks_are_warned_about():
    """Each region is solved within the budget on its own; with a graph break a warning says that
    the step's peak can then exceed it, and how to find the breaks."""
    torch._dynamo.reset()
    backend = monet.backend("90%", **FAST)
    with pytest.warns(UserWarning, match=r"several regions.*torch\._dynamo\.explain"):
        torch.compile(_TwoRegions(), backend=backend)(torch.randn(256, 32)).sum().backward()
    assert len(backend.regions) == 2


def test_a_recompile_for_new_shapes_solves_again_and_says_so():
    """With static shapes, a batch of another size makes torch.compile compile the region again: monet
    says so (not that the model has graph breaks) and trains the new shape by a schedule solved for it;
    the first shape's compiled step is reused when it comes back."""
    torch._dynamo.reset()
    model = _TwoRegions().first
    reference = copy.deepcopy(model)
    backend = monet.backend("90%", **FAST)
    compiled = torch.compile(model, backend=backend, dynamic=False)
    compiled(torch.randn(256, 32)).sum().backward()
    x = torch.randn(384, 32)
    with pytest.warns(UserWarning, match=r"compiles this code again \(input shapes changed \(\[256, 32\] -> "
                                         r"\[384, 32\]\)\); monet solves its schedule again") as caught:
        model.zero_grad(set_to_none=True)
        compiled(x).sum().backward()
    assert not [w for w in caught if "several regions" in str(w.message)]
    assert [tuple(r.input.single.shape) for r in backend.regions] == [(256, 32), (384, 32)]
    reference(x).sum().backward()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    compiled(torch.randn(256, 32)).sum().backward()
    assert len(backend.regions) == 2


def test_bad_arguments_say_what_to_do():
    with pytest.raises(ValueError, match="not a size like 4GiB"):
        monet.backend("half")
    with pytest.raises(TypeError):
        monet.backend("50%", time_limt=3)
    with pytest.raises(ValueError, match="'priced', 'inductor', 'off'"):
        monet.backend("50%", layout="channels_last")
    torch._dynamo.reset()
    compiled = torch.compile(torch.nn.Linear(4, 2), backend=monet.backend("50%", **FAST), dynamic=True)
    with pytest.raises(Exception, match="dynamic=False"):
        compiled(torch.randn(3, 4, requires_grad=True))


def test_pointwise_reruns_are_free_under_fusion():
    """fused_reruns: on the CNN's joint graph, a recomputed ReLU or add (pointwise: Inductor fuses it into
    its reader) costs no time where no convolution or max-pool reads it (they read their input from
    memory, so the rerun is a kernel of its own), and its price where one does; convolutions and batch norms keep
    their price, except a batch norm rerun from its saved statistics (elementwise once Inductor
    decomposes it), which inductor_fused names on CPU."""
    from monet.graph import TracedStep, analyze, costed_problem, fused_reruns, inductor_fused

    model, shape = small_model("cnn")
    with TracedStep(model, InputSpec(shape)) as step:
        analysis = analyze(step.graph_module)
    problem = costed_problem(step, analysis, "analytic", implementations=True)
    options = inductor_fused(step.graph_module, analysis)
    batch_norms = [op for op in problem.forward_ops if op.target == "aten._native_batch_norm_legit_functional.default"]
    assert batch_norms and {options.get(op.choice) for op in batch_norms} == {("stats",)}
    fused = fused_reruns(problem, step.graph_module, options)
    by_target, unfused = {}, ("aten.convolution.default", "aten.convolution_backward.default",
                              "aten.max_pool2d_with_indices.default", "aten.max_pool2d_with_indices_backward.default")
    for before, after in zip(problem.forward_ops, fused.forward_ops):
        read_unfused = any(problem.ops[r].target in unfused for t in before.outputs for r in problem.readers[t])
        free = after.pytorch.recompute_time == 0 < before.time
        by_target.setdefault(before.target, set()).add(free)
        if before.target in ("aten.relu.default", "aten.add.Tensor"):
            assert free != read_unfused
            assert free or after == before
    assert by_target["aten.relu.default"] == {True, False} and by_target["aten.add.Tensor"] == {True}
    assert by_target["aten.convolution.default"] == by_target["aten._native_batch_norm_legit_functional.default"] \
        == {False}
    for before in batch_norms:
        after = fused.op_named(before.name)
        stats = problem.choice_named[before.choice].options.index("stats") - 1
        assert before.others[stats].recompute_time > 0 == after.others[stats].recompute_time
        assert after.pytorch.recompute_time == before.pytorch.recompute_time > 0
    assert fused_reruns(problem, step.graph_module).op_named(batch_norms[0].name) == batch_norms[0]


def test_saving_what_only_fused_kernels_read_costs_its_write():
    """fused_reruns with a write price: on the CNN's joint graph, a batch norm's output that only a ReLU
    reads in the forward (Inductor writes it only to save it) costs its bytes times the price when saved;
    what a convolution reads (written anyway) and what a convolution makes cost nothing to save."""
    from monet.graph import TracedStep, analyze, costed_problem, fused_reruns, inductor_fused

    model, shape = small_model("cnn")
    with TracedStep(model, InputSpec(shape)) as step:
        analysis = analyze(step.graph_module)
    problem = costed_problem(step, analysis, "analytic", implementations=True)
    priced = fused_reruns(problem, step.graph_module, inductor_fused(step.graph_module, analysis), 1e-10)
    ops, normalised = priced.ops, 0
    for t in priced.tensors:
        if t.role != "activation":
            continue
        made_by, read_by = ops[t.producer].target, {ops[r].target for r in priced.readers[t.id]
                                                    if ops[r].phase == "forward"}
        if made_by == "aten._native_batch_norm_legit_functional.default" and read_by == {"aten.relu.default"}:
            assert t.keep_time == pytest.approx(t.bytes * 1e-10) and t.bytes > 1000
            normalised += 1
        elif made_by == "aten.convolution.default" or "aten.convolution.default" in read_by:
            assert t.keep_time == 0
    assert normalised
    assert not any(t.keep_time for t in fused_reruns(problem, step.graph_module).tensors)


def test_channels_last_copies_count_the_convolution_inputs_inductor_copies():
    """channels_last_copies: on the CNN's joint graph (CPU: Inductor optimizes the layout of any graph with a
    convolution), the bytes of every 4-D weight and batch a convolution reads that is not channels-last
    already (a 1x1 weight is: it needs no copy); none for the MLP, which has no convolution. The backend
    holds them for the whole step (the compiled forward makes them first and returns them for the backward)."""
    from monet.graph import TracedStep, channels_last_copies

    model, shape = small_model("cnn")
    with TracedStep(model, InputSpec(shape)) as step:
        copies = channels_last_copies(step.graph_module)
    convolutions = [m.weight for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    wide = [w for w in convolutions if w.shape[2] * w.shape[3] > 1]
    assert len(wide) < len(convolutions)  # the CNN has 1x1 shortcut convolutions, which need no copy
    batch = torch.Size(shape).numel() * 4
    assert copies == batch + sum(w.numel() * w.element_size() for w in wide)
    mlp, mlp_shape = small_model("mlp")
    with TracedStep(mlp, InputSpec(mlp_shape)) as step:
        assert channels_last_copies(step.graph_module) == 0


def test_layout_optimization_is_turned_off_where_its_copies_do_not_fit(tmp_path):
    """Inductor's layout optimization stays on where the budget fits its channels-last copies held, and
    a saved schedule says so and is reused so; at 'least', and at a budget that the least peak with the
    copies held exceeds (a warning says so), the backend turns it off and holds no copies. Gradients
    stay within Inductor's rounding either way, and the schedule fits the budget. The last two cases run
    on a wide CNN at a batch of 2, whose copies (its weights) outweigh what running channels-last saves
    in workspace; on the small CNN channels-last convolution backwards allocate 18 KiB where
    contiguous ones allocate 2 MiB, more than its copies (0.86 MiB)."""
    from monet.graph import TracedStep, channels_last_copies
    from monet.models import ResidualCNN

    def train(model, spec, x, rounding, backend):
        torch._dynamo.reset()
        trained = copy.deepcopy(model)
        errors_within_rounding(gradient_errors(compiled_module(trained, spec, backend=backend), trained,
                                               copy.deepcopy(model), x), rounding)
        (region,) = backend.regions
        assert region.predicted.peak <= region.budget
        return region

    model, shape = small_model("cnn")
    spec, x = InputSpec(shape), small_batch("cnn")
    rounding = inductor_rounding("cnn", spec)
    laid_out = train(model, spec, x, rounding, monet.backend("70%", **FAST, schedules=tmp_path, layout="inductor"))
    assert laid_out.layout_optimization and json.loads(next(tmp_path.iterdir()).read_text())["layout_optimization"]
    stages = []
    assert train(model, spec, x, rounding, monet.backend(
        "70%", **FAST | {"progress": lambda s, *_: stages.append(s)}, schedules=tmp_path,
        layout="inductor")) == laid_out
    assert all("reusing" in s for s in stages)

    torch.manual_seed(0)
    wide, spec = ResidualCNN(widths=(16, 32, 128)), InputSpec((2, 3, 16, 16))
    x = torch.randn(spec.shape, generator=torch.Generator().manual_seed(1))
    with TracedStep(wide, spec) as step:
        copies = channels_last_copies(step.graph_module)
    rounding = compile_rounding(wide, spec, x)
    least = train(wide, spec, x, rounding, monet.backend("least", **FAST, layout="inductor"))
    assert not least.layout_optimization
    between = least.predicted.peak + copies // 2  # fits without the copies; the least with them held is above it
    with pytest.warns(UserWarning, match="with that optimization off"):
        region = train(wide, spec, x, rounding, monet.backend(between, **FAST, layout="inductor"))
    assert not region.layout_optimization and region.budget == between


def test_the_layout_optimization_is_on_where_its_measured_price_says():
    """layout='priced' (the default) times the CNN's convolutions contiguous and channels-last and runs
    Inductor's layout optimization only where channels-last saves more than its copies cost, as its
    progress line says: the region's schedule file agrees with the figures shown. Either way gradients
    stay within Inductor's rounding and the schedule fits its budget; 'off' never times nor turns it on."""
    model, shape = small_model("cnn")
    spec, x = InputSpec(shape), small_batch("cnn")
    rounding = inductor_rounding("cnn", spec)
    for layout in ("priced", "off"):
        torch._dynamo.reset()
        trained, stages = copy.deepcopy(model), []
        backend = monet.backend("70%", **FAST | {"progress": lambda s, *_, seen=stages: seen.append(s)}, layout=layout)
        errors_within_rounding(gradient_errors(compiled_module(trained, spec, backend=backend), trained,
                                               copy.deepcopy(model), x), rounding)
        (region,) = backend.regions
        assert region.predicted.peak <= region.budget
        priced = [re.search(r"convolutions ([\d.]+) ms contiguous, ([\d.]+) ms channels-last, copies ([\d.]+) ms: "
                            r"layout optimization (on|off)", s) for s in stages]
        priced = [m for m in priced if m]
        if layout == "off":
            assert not priced and not region.layout_optimization
            continue
        (price,) = priced
        contiguous, channels_last, copies = (float(price[i]) for i in (1, 2, 3))
        assert contiguous > 0 and channels_last > 0 and copies > 0
        assert (price[4] == "on") == region.layout_optimization
        if abs(channels_last + copies - contiguous) > 0.02:  # (the figures are shown to 0.01 ms)
            assert (price[4] == "on") == (channels_last + copies < contiguous)


def test_a_flattened_feature_map_compiles_with_the_layout_optimization():
    """VGG-16's classifier flattens its last feature map, a view in the joint graph. Measured channels-last
    (the layout Inductor gives convolution outputs) that view needs a copy, which eager's view refuses: the
    workspace measurement runs views as reshapes, as Inductor's lowering copies (before, it raised). Here a
    convolution's output, pooled to 4x4, is flattened into a linear layer: compiled with the layout
    optimization on, gradients within Inductor's rounding, and the measured peak within 10 % of the
    prediction, as on the CNN."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(4),
                                torch.nn.Flatten(), torch.nn.Linear(16 * 4 * 4, 10))
    spec = InputSpec((8, 3, 16, 16))
    x = torch.randn(spec.shape, generator=torch.Generator().manual_seed(1))
    rounding = compile_rounding(model, spec, x)
    backend = monet.backend("100%", **FAST, layout="inductor")
    compiled = compiled_module(model, spec, backend=backend)
    errors_within_rounding(gradient_errors(compiled, model, copy.deepcopy(model), x), rounding)
    (region,) = backend.regions
    assert region.layout_optimization
    measured = _peak(compiled, model, x)
    assert abs(measured / region.predicted.peak - 1) <= 0.1, (measured, region.predicted.peak)


def test_the_embedding_gradient_is_made_where_the_schedule_makes_it(monkeypatch):
    """A one-layer DistilBERT of real width (768; 30,522 tokens: a 89 MiB embedding gradient) at its least
    peak: compiled with a cut before the embedding backward (graph.pieces.CUT_BEFORE), the step measures
    its prediction (229,309,464 bytes against 229,317,648 here on 2026-12-02); compiled in one piece with
    the ops before it, Inductor's zero-filled gradient buffer was live with buffers the schedule had
    freed: 249,379,864 bytes, +8.7 %."""
    import monet.graph.pieces
    from monet.models import DistilBertQA

    def measured() -> tuple[int, int]:
        torch.manual_seed(0)
        model = DistilBertQA(n_layers=1, dim=768, hidden_dim=1536, n_heads=4, vocab_size=30522,
                             max_position_embeddings=128)
        x = torch.randint(0, 30522, (8, 128))
        backend = monet.backend("least", **FAST)
        peak = _peak(torch.compile(model, backend=backend), model, x)
        return peak, backend.regions[0].predicted.peak

    peak, predicted = measured()
    assert abs(peak / predicted - 1) <= 0.03, (peak, predicted)
    monkeypatch.setattr(monet.graph.pieces, "CUT_BEFORE", ())
    peak, predicted = measured()
    assert peak > 1.03 * predicted, (peak, predicted)
