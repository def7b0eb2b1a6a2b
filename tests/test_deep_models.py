"""Deep models by their structure (solver/chain.py): the repeated blocks found in the problem, the
chain's schedules (per-block checkpointing, Chen's segments, selective checkpointing, Rotor's
dynamic programme), a 16-layer Llama from transformers' config solved at `least` and at per-block
checkpointing's measured peak, trained with eager's gradients and the predicted peak, HiGHS's answers
priced as the simulator replays them, and GPT-2, BERT and T5 at or below transformers' per-block
checkpointing."""

import copy
import time

import pytest
import torch
from conftest import gradient_errors
from synthetic import block_chain, encoder_decoder, random_dag
from torch import nn

from monet import MONeTWrapper
from monet.api import solve_traced, trace_problem
from monet.solver import InfeasibleBudgetError, keep_all, least_peak, simulate, solve
from monet.solver.chain import (
    Rotor,
    chain_schedules,
    covering,
    find_chain,
    find_chains,
    frontier,
    halves,
    per_block,
    ranked,
    rotor_schedules,
    segments,
    selected,
)
from monet.training import compare_training


def test_the_blocks_of_a_chain_are_found_where_fewest_bytes_cross():
    problem = block_chain(8)
    chain = find_chain(problem)
    assert len(chain) == 8
    ops = problem.forward_ops
    assert [ops[first].name for first, _ in chain.blocks] == [f"up{i}" for i in range(8)]  # cut at h, not inside
    assert all(stop - first == 4 for first, stop in chain.blocks)
    assert find_chain(random_dag(0)) is None  # nothing repeats
    assert find_chain(block_chain(2)) is None  # too few blocks to be a chain


def test_an_encoder_and_a_decoder_are_two_chains():
    problem = encoder_decoder(6, 5)
    chains = find_chains(problem)
    ops = problem.forward_ops
    assert [len(chain) for chain in chains] == [5, 6]  # the decoder's blocks cover more ops: it comes first
    assert ops[chains[0].blocks[0][0]].name == "cross0" and ops[chains[1].blocks[0][0]].name == "upe0"
    covered = covering(chains).blocks  # the blocks, and the runs of ops before and between them
    assert covered[0][0] == 0 and all(stop == first for (_, stop), (first, _) in zip(covered, covered[1:]))
    assert covered[-1][1] == max(chain.blocks[-1][1] for chain in chains)  # the tail is not a block
    both = chain_schedules(problem).checkpointed[1]
    first = simulate(problem, per_block(problem, chains[0])).peak
    assert both.peak < first  # per-block checkpointing of both stacks, not of the longer alone


def test_per_block_checkpointing_keeps_only_what_each_block_passes_on():
    problem = block_chain(8)
    chain = find_chain(problem)
    schedule = per_block(problem, chain)
    saved = {problem.tensors[t].name for t in schedule.saved}
    assert saved == {"s", "z", "h0", *(f"out{i}" for i in range(8))}  # the head's, the tail's, the blocks' outputs
    reruns = [problem.ops[i].name for i in schedule.recomputations(problem)]
    assert reruns.count("up3") == 1 and "add3" not in reruns  # each block rebuilt once, its output kept
    assert simulate(problem, schedule).peak < simulate(problem, keep_all(problem)).peak


def test_rotor_stores_fewer_block_outputs_than_per_block_checkpointing_on_a_long_chain():
    problem = block_chain(32)
    chain = find_chain(problem)
    kept_all = simulate(problem, keep_all(problem))
    blocks = simulate(problem, per_block(problem, chain))
    found = chain_schedules(problem)
    assert found.blocks == 32 and found.checkpointed[1].peak == blocks.peak
    peaks = [replay.peak for _, replay in found.schedules]
    times = [replay.time for _, replay in found.schedules]
    assert peaks == sorted(peaks) and times == sorted(times, reverse=True)  # a frontier
    assert peaks[0] < 0.5 * blocks.peak  # 2,411 against 5,012 bytes
    assert peaks[-1] == kept_all.peak and times[-1] == kept_all.time
    for schedule, replay in found.schedules:  # every schedule is what the simulator replays
        assert simulate(problem, schedule) == replay


def test_selective_checkpointing_keeps_what_saves_most_time_per_byte_first():
    problem = block_chain(8)
    chain = find_chain(problem)
    ops = problem.forward_ops
    order = [ops[chain.blocks[0][0] + offset].outputs[index] for offset, index in ranked(problem, chain)]
    # what the backward reads: u (up, 4 s per 400 bytes) before v (act, 0.5 s per 400 bytes); d it never reads
    assert [problem.tensors[t].name for t in order] == ["u0", "v0"]
    keep = selected(problem, chain, 0.5)
    assert {problem.tensors[t].name for t in keep} == {f"u{i}" for i in range(8)} and not selected(problem, chain, 0)
    schedule = per_block(problem, chain, keep=keep)
    assert {f"u{i}" for i in range(8)} <= {problem.tensors[t].name for t in schedule.saved}
    assert simulate(problem, schedule).time < simulate(problem, per_block(problem, chain)).time


def test_chens_segments_keep_every_lengthth_output():
    problem = block_chain(8)
    chain = find_chain(problem)
    saved = {problem.tensors[t].name for t in segments(problem, chain, 3).saved}
    assert {name for name in saved if name.startswith(("h", "out"))} == {"h0", "out2", "out5", "out7"}


def test_rotor_needs_more_memory_for_fewer_reruns():
    problem = block_chain(16)
    chain = find_chain(problem)
    from monet.solver.chain import _costs, _parts

    rotor = Rotor(_costs(problem, chain, _parts(problem, chain)), 16, 1, 0, 0)
    levels = rotor.units()
    times = rotor.spine[16, levels]
    assert len(levels) > 3 and list(times) == sorted(times, reverse=True)
    plan = rotor.plan(int(levels[0]))
    assert [k for action, k in plan if action == "backward"] == list(reversed(range(16)))
    assert sum(action == "forward" for action, _ in plan) > 16  # the least memory reruns blocks more than once


def test_solve_on_a_chain_is_never_above_per_block_checkpointing():
    problem = block_chain(16)
    checkpointed = simulate(problem, per_block(problem, find_chain(problem)))
    least = least_peak(problem, time_limit=5)
    assert least.found <= checkpointed.peak
    assert simulate(problem, least.schedule).peak == least.found
    at = solve(problem, checkpointed.peak, time_limit=5)  # the ILP poses per-block checkpointing here: it runs
    assert at.replay.peak <= checkpointed.peak and at.replay.time <= checkpointed.time


def test_where_no_horizon_poses_per_block_checkpointing_the_chain_stands_alone():
    problem = block_chain(16)
    checkpointed = simulate(problem, per_block(problem, find_chain(problem)))
    least = least_peak(problem, time_limit=5, horizon=0)  # no rerun ahead of its use: per-block is not posed
    assert least.found < checkpointed.peak and least.bound == 0  # Rotor's; no bound is claimed for it
    at = solve(problem, checkpointed.peak, time_limit=5, horizon=0)
    assert at.formulation == "chain" and at.status == "heuristic" and at.bound == 0
    assert at.replay.peak <= checkpointed.peak and at.replay.time <= checkpointed.time
    assert solve(problem, least.found, time_limit=5, horizon=0).replay.peak <= least.found
    with pytest.raises(InfeasibleBudgetError) as below:  # said at once, with the least peak found (not proven)
        solve(problem, least.found - 1, time_limit=5, horizon=0)
    assert below.value.least_peak == least.found and "least peak found" in str(below.value)


def test_frontier_drops_dominated_schedules():
    problem = block_chain(4)
    chain = find_chain(problem)
    pairs = [(s, simulate(problem, s)) for s in (keep_all(problem), per_block(problem, chain),
                                                 per_block(problem, chain, keep_last=4))]
    assert [replay.peak for _, replay in frontier(pairs)] == sorted({pairs[1][1].peak, pairs[0][1].peak})


# ---- a 16-layer Llama from transformers' config ------------------------------------------------------------

transformers = pytest.importorskip("transformers")

LLAMA = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 16,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256, "use_cache": False}
SHAPE = (2, 128)
TIME_LIMIT = 20


class LlamaLM(nn.Module):
    """Llama causal LM with labels, the loss inside; `checkpointed`: transformers' per-block checkpointing."""

    def __init__(self, checkpointed: bool = False):
        super().__init__()
        self.model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA))
        if checkpointed:
            self.model.gradient_checkpointing_enable()

    def forward(self, ids):
        return self.model(input_ids=ids, labels=ids).loss


@pytest.fixture(scope="module")
def llama():
    torch.manual_seed(0)
    model = LlamaLM()
    checkpointed = LlamaLM(checkpointed=True)
    checkpointed.load_state_dict(model.state_dict())
    ids = torch.randint(0, LLAMA["vocab_size"], SHAPE, generator=torch.Generator().manual_seed(1))
    measured = compare_training({"eager": copy.deepcopy(model), "checkpointed": checkpointed}, ids, lambda out: out,
                                steps=1)
    problem = trace_problem(model, ids, cost_model="analytic")
    return model, ids, problem, measured


def _trains_as_predicted(model, schedule, ids) -> int:
    """Gradients as eager's, and the measured peak as predicted (on a copy of `model`); the measured peak."""
    model = copy.deepcopy(model)
    reference = copy.deepcopy(model)
    wrapped = MONeTWrapper(model, schedule, ids)
    errors = gradient_errors(wrapped, model, reference, ids)
    assert errors.pop("output") < 1e-6
    assert max(errors.values()) <= 1e-5, errors
    measured = compare_training({"monet": wrapped}, ids, lambda out: out, steps=1)["monet"].peak
    assert measured <= schedule.predicted.peak + 64  # + the loss scalar the caller holds
    assert abs(measured - schedule.predicted.peak) <= 0.01 * schedule.predicted.peak, (measured, schedule.predicted)
    return measured


def test_a_16_layer_llama_is_a_chain_of_16_blocks(llama):
    _, _, problem, _ = llama
    assert len(find_chain(problem)) == 16


def test_least_on_a_16_layer_llama_is_below_per_block_checkpointing_and_trains_as_predicted(llama):
    model, ids, problem, measured = llama
    began = time.perf_counter()
    schedule = solve_traced(problem, "least", "LlamaLM", time_limit=TIME_LIMIT)
    assert time.perf_counter() - began < TIME_LIMIT
    assert schedule.predicted.peak <= measured["checkpointed"].peak
    assert _trains_as_predicted(model, schedule, ids) <= measured["checkpointed"].peak


def test_a_16_layer_llama_at_per_block_checkpointings_measured_peak(llama):
    model, ids, problem, measured = llama
    budget = measured["checkpointed"].peak
    began = time.perf_counter()
    schedule = solve_traced(problem, budget, "LlamaLM", time_limit=TIME_LIMIT)
    assert time.perf_counter() - began < TIME_LIMIT
    chain = find_chain(problem)
    blocks = simulate(problem, per_block(problem, chain))
    assert schedule.predicted.peak <= budget
    assert schedule.predicted.time <= blocks.time  # no slower than per-block checkpointing as monet runs it
    _trains_as_predicted(model, schedule, ids)


def test_rotor_over_the_blocks_halves_goes_below_per_block_checkpointing(llama):
    """Cut in two (attention, MLP), a block's first half can be rebuilt twice rather than held through the
    second half's backward: Rotor over the halves reaches a lower peak than over whole blocks."""
    _, _, problem, _ = llama
    chain = find_chain(problem)
    split = halves(problem, chain)
    assert len(split) == 2 * len(chain) and all(a[1] == b[0] for a, b in zip(split.blocks[::2], split.blocks[1::2]))

    def least(blocks):
        schedule = per_block(problem, blocks)
        return min(simulate(problem, s).peak for s in rotor_schedules(problem, blocks, schedule,
                                                                       simulate(problem, schedule)))

    assert least(split) < min(least(chain), simulate(problem, per_block(problem, chain)).peak)


def test_highs_answers_on_a_16_layer_llama_are_priced_as_the_simulator_replays_them(llama):
    """One price: the schedule HiGHS returns costs, as the ILP's objective says, what the simulator's
    replay says, and its bound is below it (no warnings: the simulator contradicted nothing)."""
    _, _, problem, _ = llama
    budget = int(0.7 * simulate(problem, keep_all(problem)).peak)
    began = time.perf_counter()
    solution = solve(problem, budget, time_limit=TIME_LIMIT)
    assert time.perf_counter() - began < TIME_LIMIT * 1.1
    assert solution.status in ("optimal", "time_limit") and not solution.warnings  # HiGHS's answer, as HiGHS said
    assert solution.objective == pytest.approx(solution.replay.time, rel=1e-6)
    assert solution.bound <= solution.objective and solution.replay.peak <= budget


class Small(nn.Module):
    """A transformers model of `kind` (GPT-2 and BERT with their dropout, 0.1; T5 with 4 + 4 layers) from
    its config, labels in, the loss out; `checkpointed`: transformers' per-block checkpointing."""

    def __init__(self, kind: str, checkpointed: bool = False):
        super().__init__()
        if kind == "gpt2":
            self.model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
                vocab_size=256, n_embd=32, n_layer=8, n_head=4, n_positions=64, use_cache=False))
        elif kind == "bert":
            self.model = transformers.BertForMaskedLM(transformers.BertConfig(
                vocab_size=256, hidden_size=32, num_hidden_layers=6, num_attention_heads=4, intermediate_size=64,
                max_position_embeddings=64))
        else:
            self.model = transformers.T5ForConditionalGeneration(transformers.T5Config(
                vocab_size=256, d_model=32, d_kv=8, d_ff=64, num_layers=4, num_decoder_layers=4, num_heads=4,
                decoder_start_token_id=0, pad_token_id=0, use_cache=False))
        if checkpointed:
            self.model.gradient_checkpointing_enable()

    def forward(self, ids):
        return self.model(input_ids=ids, labels=ids).loss


@pytest.mark.parametrize("kind", ["gpt2", "bert", "t5"])
def test_least_is_at_most_transformers_per_block_checkpointing_with_dropout_replayed(kind):
    """GPT-2 and BERT rebuild their blocks whole by replaying dropout from its generator state; T5's
    first blocks (which make the position bias, unlike the rest) are rebuilt as blocks of their own.
    The least peak is at most what transformers' per-block checkpointing measures, and trains so."""
    torch.manual_seed(0)
    model = Small(kind)
    checkpointed = Small(kind, checkpointed=True)
    checkpointed.load_state_dict(model.state_dict())
    ids = torch.randint(1, 256, (2, 64), generator=torch.Generator().manual_seed(1))
    measured = compare_training({"checkpointed": checkpointed}, ids, lambda out: out, steps=1)["checkpointed"].peak
    problem = trace_problem(model, ids, cost_model="analytic")
    schedule = solve_traced(problem, "least", kind, time_limit=10)
    if kind != "t5":
        replayed = [c for c, option in schedule.schedule.options.items() if option == "replay"]
        assert len(replayed) >= 6  # the blocks' dropout masks replayed from their generator state
    assert schedule.predicted.peak <= measured
    assert _trains_as_predicted(model, schedule, ids) <= measured  # the same dropout masks: eager's gradients
