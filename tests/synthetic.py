"""Small framework-free problems for solver tests: chains and random DAGs."""

from __future__ import annotations

import random
from dataclasses import replace

from monet.solver import Choice, Impl, Op, Problem, Tensor


class _Builder:
    def __init__(self):
        self.tensors: list[Tensor] = []
        self.ops: list[Op] = []
        self.choices: list[Choice] = []

    def tensor(self, name, nbytes, role, producer=None) -> int:
        self.tensors.append(Tensor(len(self.tensors), name, nbytes, role, producer))
        return len(self.tensors) - 1

    def op(self, name, phase, inputs, outputs, time=1.0, workspace=0, recomputable=True, *, runs=True,
           choice=None, others=(), target=None) -> int:
        """outputs: list of (name, bytes, role); `target` names the operator (default: the op's name)."""
        op_id = len(self.ops)
        outs = tuple(self.tensor(n, b, r, op_id) for n, b, r in outputs)
        impl = Impl(tuple(inputs), time, workspace, runs, recomputable=recomputable)
        self.ops.append(Op(op_id, name, f"test.{target or name}", phase, outs, impl, choice, tuple(others)))
        return op_id

    def problem(self) -> Problem:
        return Problem(self.tensors, self.ops, {"name": "synthetic"}, self.choices)


def chain(n: int, size: int = 100, time: float = 1.0, param: int = 0) -> Problem:
    """n identical layers: f_i reads a_{i-1}; b_i reads a_{i-1} and the gradient of a_i."""
    b = _Builder()
    x = b.tensor("x", size, "input")
    w = b.tensor("w", param, "param")
    acts = [x]
    for i in range(n):
        role = "output" if i == n - 1 else "activation"
        f = b.op(f"f{i}", "forward", [acts[-1], w], [(f"a{i}", size, role)], time)
        acts.append(b.ops[f].outputs[0])
    grad = b.tensor("dy", size, "tangent")
    for i in reversed(range(n)):
        outs = [(f"g{i}", size, "temp" if i else "grad")]
        op = b.op(f"b{i}", "backward", [grad, acts[i]], outs, time)
        grad = b.ops[op].outputs[0]
    return b.problem()


def random_dag(seed: int, n_forward: int = 8) -> Problem:
    """A random forward DAG with its mirrored backward, random sizes and costs."""
    rng = random.Random(seed)
    b = _Builder()
    x = b.tensor("x", rng.randint(10, 100), "input")
    w = b.tensor("w", rng.randint(0, 50), "param")
    acts = [x]
    fwd_ops = []
    for i in range(n_forward):
        k = rng.randint(1, min(2, len(acts)))
        ins = sorted(set(rng.sample(acts, k)))
        role = "output" if i == n_forward - 1 else "activation"
        outs = [(f"a{i}", rng.randint(10, 200), role)]
        if rng.random() < 0.2:
            outs.append((f"aux{i}", rng.randint(1, 20), "activation"))
        f = b.op(f"f{i}", "forward", ins + [w], outs, rng.uniform(0.1, 2.0),
                 workspace=rng.choice([0, 0, rng.randint(1, 100)]), recomputable=rng.random() > 0.1)
        fwd_ops.append(f)
        acts.extend(b.ops[f].outputs)
    grads = {b.ops[fwd_ops[-1]].outputs[0]: b.tensor("dy", b.tensors[b.ops[fwd_ops[-1]].outputs[0]].bytes, "tangent")}
    for f in reversed(fwd_ops):
        op = b.ops[f]
        gin = [grads[t] for t in op.outputs if t in grads]
        if not gin:
            continue
        reads = [t for t in op.inputs if b.tensors[t].role != "param"]
        saved = [t for t in op.outputs if rng.random() < 0.5]
        outs = [(f"g_{b.tensors[t].name}_{op.name}", b.tensors[t].bytes, "temp") for t in reads]
        outs.append((f"gw_{op.name}", 5, "grad"))
        bid = b.op(f"b_{op.name}", "backward", gin + reads + saved, outs, rng.uniform(0.1, 2.0),
                   workspace=rng.choice([0, rng.randint(1, 50)]))
        for t, g in zip(reads, b.ops[bid].outputs):
            grads.setdefault(t, g)
    return b.problem()


def relu_chain(n: int, size: int = 100, *, in_place: bool = False) -> Problem:
    """n layers of lin -> relu. Each relu's backward reads its output, or (choice "mask_i") a 1/32-size
    mask made in the forward; each lin runs "fast" (big workspace) or "lean" (slower, none);
    an approximate option "sketch" of each mask choice is cheaper still. With `in_place`, each relu
    may also overwrite its input (choice "place_i": "out" or "in", a little faster)."""
    b = _Builder()
    x = b.tensor("x", size, "input")
    w = b.tensor("w", 0, "param")
    acts, zs, masks = [x], [], []
    for i in range(n):
        b.choices.append(Choice(f"algo{i}", ("fast", "lean")))
        lin = b.op(f"lin{i}", "forward", [acts[-1], w], [(f"z{i}", size, "activation")], 1.0, workspace=2 * size,
                   choice=f"algo{i}", others=[Impl((acts[-1], w), 1.5, 0)])
        zs.append(b.ops[lin].outputs[0])
        role = "output" if i == n - 1 else "activation"
        if in_place:
            b.choices.append(Choice(f"place{i}", ("out", "in")))
        relu = b.op(f"relu{i}", "forward", [zs[-1]], [(f"a{i}", size, role)], 0.2,
                    choice=f"place{i}" if in_place else None,
                    others=[Impl((zs[-1],), 0.19, overwrites=zs[-1])] if in_place else ())
        acts.append(b.ops[relu].outputs[0])
        b.choices.append(Choice(f"mask{i}", ("output", "mask", "sketch"), approximate=("sketch",)))
        pack = b.op(f"pack{i}", "forward", [acts[-1]], [(f"m{i}", size // 32, "activation")], 0.05,
                    recomputable=False, runs=False, choice=f"mask{i}",
                    others=[Impl((acts[-1],), 0.05), Impl((acts[-1],), 0.01)])
        masks.append(b.ops[pack].outputs[0])
    grad = b.tensor("dy", size, "tangent")
    for i in reversed(range(n)):
        relu_b = b.op(f"relu_b{i}", "backward", [grad, acts[i + 1]], [(f"gz{i}", size, "temp")], 0.2,
                      choice=f"mask{i}", others=[Impl((grad, masks[i]), 0.25), Impl((grad, masks[i]), 0.1)])
        gz = b.ops[relu_b].outputs[0]
        lin_b = b.op(f"lin_b{i}", "backward", [gz, acts[i], w], [(f"g{i}", size, "temp" if i else "grad")], 2.0,
                     workspace=2 * size, choice=f"algo{i}", others=[Impl((gz, acts[i], w), 3.0, 0)])
        grad = b.ops[lin_b].outputs[0]
    return b.problem()


def norm_chain(n: int, size: int = 100) -> Problem:
    """n norm layers: norm_i reads a_{i-1} and makes a_i and small statistics s_i; its backward
    reads a_{i-1} and s_i. Each norm reruns as it runs (choice "rerun_i", option "full") or, for a
    fifth of the time, from its saved statistics ("stats", which keeps s_i saved)."""
    b = _Builder()
    x = b.tensor("x", size, "input")
    acts, stats = [x], []
    for i in range(n):
        b.choices.append(Choice(f"rerun{i}", ("full", "stats")))
        role = "output" if i == n - 1 else "activation"
        norm = b.op(f"norm{i}", "forward", [acts[-1]], [(f"a{i}", size, role), (f"s{i}", 1, "activation")], 1.0,
                    choice=f"rerun{i}", others=[Impl((acts[-1],), 1.0, 0, True, 0.2, (len(b.tensors) + 1,))])
        acts.append(b.ops[norm].outputs[0])
        stats.append(b.ops[norm].outputs[1])
    grad = b.tensor("dy", size, "tangent")
    for i in reversed(range(n)):
        op = b.op(f"norm_b{i}", "backward", [grad, acts[i], stats[i]], [(f"g{i}", size, "temp" if i else "grad")])
        grad = b.ops[op].outputs[0]
    return b.problem()


def _forward_block(b: _Builder, name: str, h: int, side: int, w: int, size: int) -> tuple[int, int, int]:
    """One residual block's forward (up, act, down, add; named with `name`): its u, v and output."""
    u = b.ops[b.op(f"up{name}", "forward", [h, side, w], [(f"u{name}", 4 * size, "activation")], 4.0,
                   target="up")].outputs[0]
    v = b.ops[b.op(f"act{name}", "forward", [u], [(f"v{name}", 4 * size, "activation")], 0.5,
                   target="act")].outputs[0]
    d = b.ops[b.op(f"down{name}", "forward", [v, w], [(f"d{name}", size, "activation")], 4.0,
                   target="down")].outputs[0]
    out = b.ops[b.op(f"add{name}", "forward", [h, d], [(f"out{name}", size, "activation")], 0.1,
                     target="add")].outputs[0]
    return u, v, out


def _backward_block(b: _Builder, name: str, grad: int, u: int, v: int, h: int, side: int, w: int,
                    size: int) -> int:
    """The backward of a block made by _forward_block from `h`: the gradient of its input."""
    gv = b.ops[b.op(f"down_b{name}", "backward", [grad, v, w], [(f"gv{name}", 4 * size, "temp")], 4.0,
                    target="down_b")].outputs[0]
    gu = b.ops[b.op(f"act_b{name}", "backward", [gv, u], [(f"gu{name}", 4 * size, "temp")], 0.5,
                    target="act_b")].outputs[0]
    gin = b.ops[b.op(f"up_b{name}", "backward", [gu, h, side, w], [(f"gin{name}", size, "temp")], 4.0,
                     target="up_b")].outputs[0]
    return b.ops[b.op(f"res_b{name}", "backward", [grad, gin], [(f"gh{name}", size, "temp")], 0.1,
                      target="res_b")].outputs[0]


def _embedded_blocks(b: _Builder, n: int, first: str, prefix: str, size: int) -> tuple[int, int, int, list[tuple]]:
    """x, w, the side tensor s and n _forward_blocks (named `prefix` and their number) after an embedding
    that makes `first` (the first block's input) and s: per block (its input, u, v, output)."""
    x, w = b.tensor("x", size, "input"), b.tensor("w", 0, "param")
    h, s = b.ops[b.op("embed", "forward", [x, w], [(first, size, "activation"), ("s", size // 10, "activation")],
                      1.0)].outputs
    made = []
    for i in range(n):
        made.append((h, *_forward_block(b, f"{prefix}{i}", h, s, w, size)))
        h = made[-1][-1]
    return x, w, s, made


def block_chain(n: int, size: int = 100) -> Problem:
    """n identical residual blocks between a head and a tail, as in a transformer: the head makes h0 and
    a small side tensor s (rotary tables) that every block reads; block i makes u_i = up(h, s) and
    v_i = act(u_i) (each 4 x size), d_i = down(v_i) and out_i = h + d_i (h: h0 or out_{i-1}); the tail makes logits
    (8 x size) and the loss. The backward mirrors it, last block first."""
    b = _Builder()
    x, w, s, made = _embedded_blocks(b, n, "h0", "", size)
    h = made[-1][-1]
    z = b.ops[b.op("logits", "forward", [h, w], [("z", 8 * size, "activation")], 2.0)].outputs[0]
    b.op("loss", "forward", [z], [("loss", 1, "output")], 1.0)
    grad = b.tensor("dloss", 1, "tangent")
    gz = b.ops[b.op("loss_b", "backward", [grad, z], [("gz", 8 * size, "temp")], 1.0)].outputs[0]
    grad = b.ops[b.op("logits_b", "backward", [gz, h, w], [("gh", size, "temp")], 2.0)].outputs[0]
    for i in reversed(range(n)):
        into, u, v, _ = made[i]
        grad = _backward_block(b, str(i), grad, u, v, into, s, w, size)
    b.op("embed_b", "backward", [grad, x], [("gw", 0, "grad")], 1.0)
    return b.problem()


def encoder_decoder(encoder: int, decoder: int, size: int = 100) -> Problem:
    """An encoder of `encoder` block_chain blocks, then a decoder of `decoder` blocks that each first mix
    in the encoder's output e (cross_i = cross(h_i, e)) and then run as an encoder block; the loss reads
    the decoder's output. The backward mirrors it; e's gradient flows back into the encoder."""
    b = _Builder()
    x, w, s, encoded = _embedded_blocks(b, encoder, "e0", "e", size)
    e, h = encoded[-1][-1], b.ops[b.op("start", "forward", [x, w], [("d0", size, "activation")], 1.0)].outputs[0]
    decoded = []
    for i in range(decoder):
        c = b.ops[b.op(f"cross{i}", "forward", [h, e, w], [(f"c{i}", 2 * size, "activation")], 2.0,
                       target="cross")].outputs[0]
        decoded.append((c, *_forward_block(b, f"d{i}", c, s, w, 2 * size)))
        h = b.ops[b.op(f"proj{i}", "forward", [decoded[-1][-1], w], [(f"p{i}", size, "activation")], 1.0,
                       target="proj")].outputs[0]
    b.op("loss", "forward", [h], [("loss", 1, "output")], 1.0)
    grad = b.ops[b.op("loss_b", "backward", [b.tensor("dloss", 1, "tangent"), h], [("gp", size, "temp")],
                      1.0)].outputs[0]
    for i in reversed(range(decoder)):
        c, u, v, out = decoded[i]
        gout = b.ops[b.op(f"proj_b{i}", "backward", [grad, out, w], [(f"go{i}", 2 * size, "temp")], 1.0,
                          target="proj_b")].outputs[0]
        gc = _backward_block(b, f"d{i}", gout, u, v, c, s, w, 2 * size)
        grad = b.ops[b.op(f"cross_b{i}", "backward", [gc, e, w], [(f"gd{i}", size, "temp")], 2.0,
                          target="cross_b")].outputs[0]
    grad = e_grad = b.ops[b.op("e_grad", "backward", [grad], [("ge", size, "temp")], 0.1)].outputs[0]
    for i in reversed(range(encoder)):
        into, u, v, _ = encoded[i]
        grad = _backward_block(b, f"e{i}", grad, u, v, into, s, w, size)
    b.op("embed_b", "backward", [grad, x, e_grad], [("gw", 0, "grad")], 1.0)
    return b.problem()


def scaled(problem: Problem, factor: int) -> Problem:
    """`problem` with every tensor and workspace `factor` times larger (times and structure unchanged):
    a problem of GPU size from a small one."""
    tensors = [replace(t, bytes=t.bytes * factor) for t in problem.tensors]
    ops = [replace(op, pytorch=replace(op.pytorch, workspace=op.workspace * factor),
                   others=tuple(replace(impl, workspace=impl.workspace * factor) for impl in op.others))
           for op in problem.ops]
    return Problem(tensors, ops, problem.meta, problem.choices)
