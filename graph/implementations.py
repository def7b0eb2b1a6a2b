"""How ops can run: the families of alternative implementations (graph/families/, one module
each), applied to the joint graph.

A site is one place a family applies: a ReLU and its backward, a ReLU's forward (in
place or not), a max-pool and its backward, a dropout and its backward, a GELU and its
backward, one convolution.
For each site the family names a choice and its options (the first is PyTorch's
own), measures what the other options add or change on real tensors, describes
that to the solver (a ChoiceSpec), and rewrites the joint graph when a schedule
picks another option. Options that fail to run on this machine are left out, and so are
exact options whose kernels do not give PyTorch's result bit for bit on the profiling run.
"""

from __future__ import annotations

import torch
from torch import fx
from torch._guards import detect_fake_mode

from monet.solver import Problem
from monet.solver.edit import ChoiceSpec, add_choices

from .analyze import GraphAnalysis, input_values
from .cost_model import BANDWIDTH, LAUNCH
from .families import (
    RERUN,
    BatchNormFromOutput,
    BatchNormRerun,
    ConvAlgorithm,
    DropoutMask,
    GeluCodes,
    Measured,
    PoolOffsets,
    ReluInPlace,
    ReluMask,
    SiluCodes,
)
from .profile import Feed, run_graph

__all__ = ["RERUN", "choice_specs", "compiled_options", "families", "inductor_excluded", "inductor_fused",
           "not_compiled", "rewrite", "structure"]


def families(device: torch.device, *, times_measured: bool = True) -> list:
    """The families that apply on `device`. Convolution algorithms only compete on measured times
    (the analytic cost model cannot tell them apart)."""
    found = [ReluMask(), ReluInPlace(), DropoutMask(), PoolOffsets(), GeluCodes(), SiluCodes(), BatchNormFromOutput(),
             BatchNormRerun()]
    return found + [ConvAlgorithm(device)] if times_measured else found


def structure(analysis: GraphAnalysis, gm: fx.GraphModule) -> Problem:
    """The analysed problem with every site's choice, sized but not costed: what a schedule's
    names refer to, without running the model."""
    values = input_values(gm)
    fake_mode = detect_fake_mode(values)
    nodes = {n.name: n for n in gm.graph.nodes}
    specs = []
    for family in families(values[0].device):
        for site in family.find(gm, analysis):
            specs.append(family.spec(site, analysis.problem, family.shapes(site, nodes[site.nodes[-1]], fake_mode)))
    return add_choices(analysis.problem, specs)


def choice_specs(analysis: GraphAnalysis, gm: fx.GraphModule, feed: Feed, problem: Problem, *,
                 times_measured: bool = True) -> list[ChoiceSpec]:
    """Every site's choice, its options measured on real tensors (with analytic times for the new
    kernels unless `times_measured`). Options whose kernels fail here, or (exact options) do not
    give PyTorch's result bit for bit, are left out."""
    by_family = {f.name: f for f in families(feed.device, times_measured=times_measured)}
    sites = {site.nodes[-1]: site for f in by_family.values() for site in f.find(gm, analysis)}
    measured: dict[str, dict[str, Measured]] = {}

    def after(node, args, value):
        site = sites.get(node.name)
        if site is None:
            return
        try:
            found = by_family[site.family].measure(site, node, args, value, feed.device)
        except Exception:  # noqa: BLE001 - an option that does not run here is left out
            return
        if not times_measured:
            for m in found.values():
                _price_analytic(m, site, problem)
        measured[site.choice] = found

    run_graph(gm, feed, after)
    return [by_family[site.family].spec(site, problem, measured[site.choice])
            for site in sites.values() if site.choice in measured]


def _price_analytic(m: Measured, site, problem: Problem) -> None:
    """An option's kernels priced as analytic_times prices an op: the roofline of the bytes each reads
    and writes. The new forward op reads the site's last tensor and writes its compact form (`m.out`);
    the alternative reads the site's tensors, the compact form in place of the last one, and writes
    what the site's last op writes (its outputs that are not among those tensors)."""
    bytes_of = {t: problem.tensor_named(t).bytes for t in site.tensors}
    reads = sum(bytes_of.values())
    if m.out:
        m.new = (_roofline(m.out.bytes + bytes_of[site.tensors[-1]]), m.new[1])
        reads += m.out.bytes - bytes_of[site.tensors[-1]]
    writes = sum(problem.tensors[t].bytes for t in problem.op_named(site.nodes[-1]).outputs
                 if problem.tensors[t].name not in bytes_of)
    m.alt = (_roofline(reads + writes), m.alt[1])


def _roofline(moved: int) -> float:
    return moved / BANDWIDTH + LAUNCH


def _chosen(gm: fx.GraphModule, analysis: GraphAnalysis, options: dict[str, str]):
    """(family, site, option) for every site of `gm` whose option in `options` is not PyTorch's own."""
    device = input_values(gm)[0].device
    for family in families(device):
        for site in family.find(gm, analysis):
            option = options.get(site.choice, family.options[0])
            if option != family.options[0]:
                yield family, site, option


def not_compiled(gm: fx.GraphModule, analysis: GraphAnalysis, options: dict[str, str]) -> dict[str, str]:
    """{choice: "option, which why"} for the choices whose option in `options` cannot run under
    Inductor (a family's `not_compiled` names such options and why)."""
    return {site.choice: f"{option}, which {family.not_compiled[option]}"
            for family, site, option in _chosen(gm, analysis, options)
            if option in getattr(family, "not_compiled", {})}


def compiled_options(gm: fx.GraphModule, analysis: GraphAnalysis, options: dict[str, str]) -> dict[str, str]:
    """`options` as a compiled step runs them: an option a family runs as PyTorch's under Inductor
    (`pytorch_when_compiled`: ReLU in place) is left out."""
    dropped = {site.choice for family, site, option in _chosen(gm, analysis, options)
               if option in getattr(family, "pytorch_when_compiled", ())}
    return {choice: option for choice, option in options.items() if choice not in dropped}


def inductor_excluded(gm: fx.GraphModule, analysis: GraphAnalysis) -> dict[str, tuple[str, ...]]:
    """{choice: its options that cannot run under Inductor, or run there as PyTorch's} for every site of
    `gm` that has such options: what a solve for a compiled step leaves out."""
    device = input_values(gm)[0].device
    return {site.choice: excluded for family in families(device)
            for excluded in [(*getattr(family, "not_compiled", {}), *getattr(family, "pytorch_when_compiled", ()))]
            if excluded for site in family.find(gm, analysis)}


def inductor_fused(gm: fx.GraphModule, analysis: GraphAnalysis) -> dict[str, tuple[str, ...]]:
    """{choice: its options whose rerun Inductor fuses into the kernel that reads it} for every site of
    `gm` that has such options: what a solve for a compiled step prices as free reruns (fused_reruns)."""
    device = input_values(gm)[0].device
    return {site.choice: fused for family in families(device) if hasattr(family, "fused_reruns")
            for fused in [family.fused_reruns(device)] if fused for site in family.find(gm, analysis)}


def rewrite(gm: fx.GraphModule, analysis: GraphAnalysis, options: dict[str, str]) -> None:
    """Rewrite the joint graph of `gm` (as analysed) so that every site runs as `options` says."""
    graph = gm.graph
    nodes = {n.name: n for n in graph.nodes}
    fake_mode = detect_fake_mode(input_values(gm))
    for family, site, option in _chosen(gm, analysis, options):  # each family finds its sites after the last rewrote
        for new in family.rewrite(graph, nodes, site, option):
            args = fx.node.map_arg(new.args, lambda n: n.meta["val"])
            with fake_mode:
                new.meta["val"] = new.target(*args)
            nodes[new.name] = new
