"""Deep models by their structure (solver/chain.py): the repeated blocks found in the problem, the
chain's schedules (per-block checkpointing, Chen's segments, selective checkpointing, Rotor's
dynamic programme), and a 16-layer Llama from transformers' config solved at `least` and at
per-block checkpointing's measured peak, trained with eager's gradients and the predicted peak."""

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
    find_chain,
    find_chains,
    frontier,
    per_block,
    ranked,
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


class GPT2LM(nn.Module):
    """GPT-2 with its dropout (0.1) and labels, the loss inside."""

    def __init__(self):
        super().__init__()
        self.model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=256, n_embd=32, n_layer=8, n_head=4, n_positions=64, use_cache=False))

    def forward(self, ids):
        return self.model(input_ids=ids, labels=ids).loss


def test_an_8_layer_gpt2_with_dropout_rebuilds_its_blocks_by_replaying_dropout():
    torch.manual_seed(0)
    model = GPT2LM()
    ids = torch.randint(0, 256, (2, 64), generator=torch.Generator().manual_seed(1))
    problem = trace_problem(model, ids, cost_model="analytic")
    schedule = solve_traced(problem, "least", "GPT2LM", time_limit=10)
    assert schedule.solver.formulation == "chain"
    replayed = [c for c, option in schedule.schedule.options.items() if option == "replay"]
    assert len(replayed) >= 8  # the blocks' dropout masks replayed from their generator state: blocks rebuild whole
    blocks = chain_schedules(problem).checkpointed[1]
    assert schedule.predicted.peak <= blocks.peak < 0.5 * simulate(problem, keep_all(problem)).peak
    _trains_as_predicted(model, schedule, ids)  # the same dropout masks as eager's: the same gradients
