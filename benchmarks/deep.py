"""Deep models: monet against per-block checkpointing, Chen's sqrt(n) and torch.compile's memory budget.

Transformers built from configs (no download) at the depths people train, sized so that activations
dominate (hidden 64, batch 2, 256 tokens, labels, the loss inside): Llama with grouped-query attention
and GPT-2 at 8, 16, 32 and 80 layers, BERT (masked LM) and T5 at 24. For each: trace and profile once
(timed), then build every competitor over copies of the same weights and train them side by side in
one process (monet.training.compare_training: one peak-measured step each, then the median of timed
steps taken in rounds):

- `eager`: plain PyTorch; `per-block`: transformers' `gradient_checkpointing_enable()`;
- `chen-sqrt`: Chen's sqrt(n) on the blocks monet finds (solver/chain.py `segments`, dropout replayed),
  run by monet;
- `monet@50%`, `@33%`, `@20%`, `@least`: `monet.solve` at those shares of the unconstrained peak
  (solve seconds timed), and `monet@per-block` at per-block checkpointing's measured peak, run by
  MONeTWrapper;
- with `--compile`, `torch.compile@0.3`, `@0.5`, `@0.7`: torch.compile with that
  `activation_memory_budget`, each in a process of its own beside an eager copy (the budget is not
  among Dynamo's guards: compiled in one process, later budgets reuse the first one's graphs).

Writes MODEL.md (its table, with the date, commit, machine and command that made it) and MODEL.png per
model to `-o`, and README.md there: every model table in that folder.

    python -m benchmarks.deep                                  # every model; hours on two CPU cores
    python -m benchmarks.deep llama-8 llama-16 --compile
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import math
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from benchmarks.report import machine
from monet import MONeTWrapper
from monet.api import solve_traced, trace_problem
from monet.schedules import ScheduleFile, write_atomic
from monet.solver import SolverRecord, keep_all, simulate
from monet.solver.chain import find_chain, segments
from monet.solver.heuristics import rebuildable_options
from monet.training import compare_training

HIDDEN, HEADS, KV_HEADS, VOCAB, SHAPE = 64, 4, 2, 1000, (2, 256)
CONFIGS = {**{f"llama-{n}": ("llama", n) for n in (8, 16, 32, 80)},
           **{f"gpt2-{n}": ("gpt2", n) for n in (8, 16, 24, 32, 80)}, "bert-24": ("bert", 24), "t5-24": ("t5", 24)}
BUDGETS = ("50%", "33%", "20%", "least")
COMPILE_BUDGETS = (0.3, 0.5, 0.7)


class LM(nn.Module):
    """A transformers model of `kind` with `layers` layers, called with token ids, returning its loss."""

    def __init__(self, kind: str, layers: int):
        super().__init__()
        import transformers as tf

        self.kind = kind
        if kind == "llama":
            self.model = tf.LlamaForCausalLM(tf.LlamaConfig(
                vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=4 * HIDDEN, num_hidden_layers=layers,
                num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=SHAPE[1],
                use_cache=False))
        elif kind == "gpt2":
            self.model = tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=VOCAB, n_embd=HIDDEN, n_layer=layers, n_head=HEADS,
                                                          n_positions=SHAPE[1], use_cache=False))
        elif kind == "bert":
            self.model = tf.BertForMaskedLM(tf.BertConfig(
                vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=layers, num_attention_heads=HEADS,
                intermediate_size=4 * HIDDEN, max_position_embeddings=SHAPE[1]))
        else:
            self.model = tf.T5ForConditionalGeneration(tf.T5Config(
                vocab_size=VOCAB, d_model=HIDDEN, d_kv=HIDDEN // HEADS, d_ff=4 * HIDDEN, num_layers=layers,
                num_decoder_layers=layers, num_heads=HEADS, decoder_start_token_id=0, pad_token_id=0, use_cache=False))

    def forward(self, ids):
        return self.model(input_ids=ids, labels=ids).loss

    def checkpointed(self) -> LM:
        """A copy with transformers' per-block checkpointing."""
        other = copy.deepcopy(self)
        other.model.gradient_checkpointing_enable()
        return other


@dataclass
class Row:
    name: str
    peak: int | None = None  # measured bytes
    predicted: int | None = None
    seconds: float | None = None  # median step
    solve: float | None = None  # seconds to solve its schedule
    status: str = ""


def _ids() -> torch.Tensor:
    return torch.randint(0, VOCAB, SHAPE, generator=torch.Generator().manual_seed(1))


def _compiled(config: str, budget: float) -> dict:
    """torch.compile at `budget` beside eager, measured in this process (run as a child, see --compiled)."""
    import torch._functorch.config as functorch_config

    torch.manual_seed(0)
    model = LM(*CONFIGS[config])
    compiled = torch.compile(copy.deepcopy(model))
    functorch_config.activation_memory_budget = budget
    stats = compare_training({"eager": model, "compiled": compiled}, _ids(), lambda out: out, steps=3)
    return {name: {"peak": s.peak, "seconds": s.step_time} for name, s in stats.items()}


def run(config: str, time_limit: float, cost_model: str, compile_budgets: bool, log) -> tuple[list[Row], dict]:
    torch.manual_seed(0)
    model = LM(*CONFIGS[config])
    ids = _ids()
    began = time.perf_counter()
    problem = trace_problem(model, ids, cost_model=cost_model)
    traced = time.perf_counter() - began
    unconstrained = simulate(problem, keep_all(problem))
    log(f"{config}: {len(problem.ops)} ops traced and profiled in {traced:.1f} s")
    runs: dict[str, nn.Module] = {"eager": copy.deepcopy(model), "per-block": model.checkpointed()}
    rows = {name: Row(name) for name in runs}
    rows["eager"].predicted = unconstrained.peak
    options = rebuildable_options(problem)  # dropout replayed: blocks rebuild whole
    plain = problem.resolve(options)
    chain = find_chain(plain)
    if chain is not None:
        schedule = segments(plain, chain, max(1, round(math.sqrt(len(chain))))).remap(plain, problem, options)
        replay = simulate(problem, schedule)
        file = ScheduleFile.of(problem, schedule, config, budget=replay.peak, replay=replay,
                               solver=SolverRecord("chen-sqrt", "heuristic"), unconstrained=unconstrained)
        runs["chen-sqrt"] = MONeTWrapper(copy.deepcopy(model), file, ids)
        rows["chen-sqrt"] = Row("chen-sqrt", predicted=replay.peak)
    checkpointed = compare_training({"per-block": runs["per-block"]}, ids, lambda out: out, steps=1)["per-block"].peak
    for budget in (*BUDGETS, checkpointed):
        name = f"monet@{budget}" if isinstance(budget, str) else "monet@per-block"
        began = time.perf_counter()
        try:
            file = solve_traced(problem, budget, config, time_limit=time_limit)
        except Exception as exc:  # no schedule: the row says why
            rows[name] = Row(name, solve=time.perf_counter() - began, status=f"{type(exc).__name__}: {exc}"[:200])
            continue
        rows[name] = Row(name, predicted=file.predicted.peak, solve=time.perf_counter() - began,
                         status=f"{file.solver.formulation}, {file.solver.status}")
        runs[name] = MONeTWrapper(copy.deepcopy(model), file, ids)
        log(f"  {name}: {file.predicted.peak / 2**20:.2f} MiB predicted, solved in {rows[name].solve:.1f} s "
            f"({rows[name].status})")
    stats = compare_training(runs, ids, lambda out: out, steps=3)
    for name, s in stats.items():
        rows[name].peak, rows[name].seconds = s.peak, s.step_time
    compiled = {}
    if compile_budgets:
        for budget in COMPILE_BUDGETS:
            out = subprocess.run([sys.executable, "-m", "benchmarks.deep", "--compiled", config, str(budget)],
                                 capture_output=True, text=True)
            try:
                compiled[budget] = json.loads(out.stdout.strip().splitlines()[-1])
            except (IndexError, json.JSONDecodeError):
                compiled[budget] = {"error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "failed"}
            log(f"  torch.compile@{budget}: {compiled[budget]}")
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    info = {"ops": len(problem.ops), "traced": traced, "blocks": len(chain) if chain else 0,
            "held": 2 * params + buffers, "eager_seconds": rows["eager"].seconds}
    return list(rows.values()), {"info": info, "compiled": compiled}


def _mib(n: int | None) -> str:
    return "" if n is None else f"{n / 2**20:.2f}"


def write(config: str, rows: list[Row], extra: dict, out: Path, made: str) -> None:
    """MODEL.md (`made`: when, where and how) and MODEL.png."""
    info, compiled = extra["info"], extra["compiled"]
    eager = next(r for r in rows if r.name == "eager")
    held = info["held"]
    lines = [f"### {config}", "",
             f"{info['ops']} ops, {info['blocks']} repeated blocks found; traced and profiled in "
             f"{info['traced']:.1f} s. "
             f"Parameters, gradients and buffers: {held / 2**20:.2f} MiB (activation memory: the peak above them). "
             f"{made}", "",
             "| run | measured peak MiB | activation MiB | predicted MiB | step s | vs eager | solve s | how |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = f"{r.seconds / eager.seconds:.2f}" if r.seconds and eager.seconds else ""
        act = _mib(r.peak - held) if r.peak is not None else ""
        lines.append(f"| {r.name} | {_mib(r.peak)} | {act} | {_mib(r.predicted)} | "
                     f"{'' if r.seconds is None else f'{r.seconds:.4f}'} | {ratio} | "
                     f"{'' if r.solve is None else f'{r.solve:.1f}'} | {r.status} |")
    for budget, found in compiled.items():
        if "error" in found:
            lines.append(f"| torch.compile@{budget} | | | | | | | {found['error'][:120]} |")
            continue
        c, e = found["compiled"], found["eager"]
        lines.append(f"| torch.compile@{budget} | {_mib(c['peak'])} | {_mib(c['peak'] - held)} | | "
                     f"{c['seconds']:.4f} | {c['seconds'] / e['seconds']:.2f} | | own process, beside eager "
                     f"({_mib(e['peak'])} MiB) |")
    write_atomic(out / f"{config}.md", "\n".join(lines) + "\n")
    _plot(config, rows, compiled, out / f"{config}.png")


def _plot(config: str, rows: list[Row], compiled: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    eager = next(r for r in rows if r.name == "eager")
    fig, ax = plt.subplots(figsize=(6, 4))
    monet = sorted((r.peak / 2**20, r.seconds / eager.seconds) for r in rows
                   if r.name.startswith("monet") and r.peak and r.seconds)
    if monet:
        ax.plot(*zip(*monet), "o-", label="monet")
    for r in rows:
        if not r.name.startswith("monet") and r.peak and r.seconds:
            ax.plot(r.peak / 2**20, r.seconds / eager.seconds, "s", label=r.name)
    points = [(f["compiled"]["peak"] / 2**20, f["compiled"]["seconds"] / f["eager"]["seconds"])
              for f in compiled.values() if "compiled" in f]
    if points:
        ax.plot(*zip(*sorted(points)), "^--", label="torch.compile budget")
    ax.set_xlabel("measured peak (MiB)")
    ax.set_ylabel("step time / eager's")
    ax.set_title(config)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("configs", nargs="*", default=list(CONFIGS), help=f"of {', '.join(CONFIGS)}")
    parser.add_argument("--time-limit", type=float, default=60.0, help="solver seconds per budget")
    parser.add_argument("--cost-model", default="measured", choices=("measured", "analytic"))
    parser.add_argument("--compile", action="store_true", help="also torch.compile's memory budgets")
    parser.add_argument("--compiled", nargs=2, metavar=("CONFIG", "BUDGET"), help=argparse.SUPPRESS)
    parser.add_argument("-o", "--out", type=Path, default=Path("benchmarks/results/deep"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.compiled:
        print(json.dumps(_compiled(args.compiled[0], float(args.compiled[1]))))
        return
    unknown = [c for c in args.configs if c not in CONFIGS]
    if unknown:
        parser.error(f"unknown configs {unknown}: choose from {', '.join(CONFIGS)}")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    command = " ".join(argv if argv is not None else sys.argv[1:])
    for config in args.configs:
        rows, extra = run(config, args.time_limit, args.cost_model, args.compile, lambda text: print(text, flush=True))
        made = (f"Made {datetime.date.today()} at commit {commit} on {machine('cpu')}, one thread, by "
                f"`python -m benchmarks.deep {command}` (cost model {args.cost_model}, time limit "
                f"{args.time_limit:g} s per solve).")
        write(config, rows, extra, args.out, made)
        tables = [(args.out / f"{name}.md").read_text() for name in CONFIGS if (args.out / f"{name}.md").exists()]
        write_atomic(args.out / "README.md", HEADER + "\n".join(tables))


HEADER = f"""# Deep models

`python -m benchmarks.deep` (benchmarks/deep.py): transformers built from configs, batch {SHAPE[0]}, {SHAPE[1]} tokens,
hidden {HIDDEN}, vocabulary {VOCAB}, labels (the loss inside). Measured peaks and step times side by side in one
process (torch.compile's each in its own, beside eager); `activation` is the peak above parameters, gradients
and buffers; `predicted` is monet's simulator's. Each table says when, where and how it was made.

"""


if __name__ == "__main__":
    main()
