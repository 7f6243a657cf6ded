#!/usr/bin/env python3
"""AttnRes in a whole model: a Full AttnRes stack's training step with the
residual history (attnres.nn.ResidualHistory), the list op
(attnres.attnres), PyTorch ops (attnres.reference) and FLA's fused_attnres
where it is importable, against the plain residual stream.

Layer i (i = 1..L) reads the embedding and the i - 1 earlier outputs by
AttnRes (a key norm, R = D, bf16), then a D x D linear layer; the last
layer's output is the model's. A step is the forward and backward of the
whole stack (torch.autograd, every parameter's gradient). Per shape:
step time (CUDA events over steady calls; the contenders take turns in
--rounds rounds, and a step's time is the median of its turns), peak
memory above what the inputs and parameters hold, AttnRes's share (the
median over the rounds of the step's turn less the plain residual step's
turn of the same round) and the sum of the layers' forward + backward byte
floors (common.py: layer i moves (3i + 3) N D elt bytes at least), over
the copy bandwidth of the same run. Gradients of every parameter and of the
embedding are compared with the list op's (relative Frobenius), and at
the first shape with a float32 PyTorch reference on the same bf16 values;
beside them there the PyTorch ops' bf16 step (AttnRes computed in float32,
its output rounded to bf16 once) and the plain stream against its own
float32 step: what the stack's bf16 rounding costs any AttnRes
(benchmarks/rounding.py measures the same two on the CPU).
At a tiny shape, where the step times the host, the plain and the history
step are also replayed from CUDA graphs (captured with their backward).
With --unpaired the history's Full step is also timed with its reads'
backwards unpaired (attnres.nn._PAIR_MIN_ROWS out of reach), the way it
ran before reads were paired, and with --pair-rows N,... with reads of N
rows or more paired. --without-torch-ops leaves out the PyTorch ops' step
(260-455 ms a step at these shapes: about a minute of a run).
With --kernels it instead profiles one Full history step per shape
(torch.profiler) and prints each kernel's GPU time, the history's
forward and backward kernels against their own floors (the reads'
forwards, the first backward run writing and the others accumulating).

  here:  PYTHONPATH=python python3 benchmarks/model.py --prebuild DIR
  there: ATTNRES_BUNDLE_DIR=DIR PYTHONPATH=python python3 benchmarks/model.py \\
             --json OUT.json

Prints a table last; exits 1 where a gradient is off.
"""

import argparse
import functools
import json
import pathlib
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "python"))
import common  # noqa: E402
from attnres import _checks  # noqa: E402
from attnres._checks import TensorShape as _Shape  # noqa: E402

SHAPES = [(16, 8192, 4096), (32, 4096, 4096), (16, 16384, 2048),
          (64, 2048, 4096)]
# A tiny shape: the GPU is idle there, the step times the host.
HOST_SHAPE = (64, 16, 256)
# Block AttnRes: the layers in this many blocks.
BLOCKS = 8
# The history's Full reads pair from attnres.nn._PAIR_MIN_ROWS rows; the
# pair bundles are prebuilt from this many rows up, for --pair-rows.
PAIR_ROWS_PREBUILT = 16
# Gradients within bf16 rounding (through every layer) of the list op's.
GRADIENT_TOLERANCE = 2e-2


def keys():
    """The kernel keys every contender of every shape needs: layer i reads
    i sources, the history's backward accumulating (but the first one run,
    which writes). (The checks read dtypes by name: no PyTorch needed.)"""
    bf16 = "torch.bfloat16"
    result = set()
    for L, N, D in SHAPES + [HOST_SHAPE]:
        for count in range(1, L + 1):
            call = _checks.check_attnres(
                _Shape((count, N, D), bf16), _Shape((D,), bf16),
                _Shape((D,), bf16), None, common.EPS, common.SCALE, "o_pre")
            result.add(call.spec())
            result.add(call.spec(accumulate=True))
            # The history's paired reads (attnres.nn._PAIR_MIN_ROWS): the
            # partner of a read of count + 1 rows passes the two queries'
            # products q * g (float32) over its count rows, with kernel
            # options of its own ((key, options) pairs).
            if count < L and pairs_at(count + 1, N * D * 2,
                                      rows_from=PAIR_ROWS_PREBUILT):
                from attnres import nn
                result.update(nn.pair_keys(call))
            # Block AttnRes (the shapes of SHAPES; the host shape is Full
            # only) reads at most BLOCKS + 1 sources a layer (keys above);
            # on the history, a read with its block's partial sum (an extra
            # source, 2 sources or more) accumulates through a bundle
            # compiled with write-tags.
            if (L, N, D) in SHAPES and 2 <= count <= BLOCKS + 1:
                from attnres import nn
                result.update(nn.extra_source_keys(call))
    return sorted(result, key=str)


def pairs_at(rows, row_bytes, rows_from):
    """attnres.nn.pairs_at (imported here: attnres.nn needs PyTorch), with
    reads of `rows_from` rows or more paired (or the history's own
    threshold, where lower)."""
    from attnres import nn
    saved = nn._PAIR_MIN_ROWS
    nn._PAIR_MIN_ROWS = min(rows_from, saved)
    try:
        return nn.pairs_at(rows, row_bytes)
    finally:
        nn._PAIR_MIN_ROWS = saved


def reads(L, block):
    """The sources each layer reads: i for layer i of Full AttnRes; for
    Block AttnRes in BLOCKS blocks, the embedding, the completed blocks'
    sums and the partial sum of the layer's block (none for its first
    layer)."""
    if not block:
        return list(range(1, L + 1))
    S = L // BLOCKS
    return [n + 1 + (m > 0) for n in range(BLOCKS) for m in range(S)]


def floor_bytes(L, N, D, block=False, elt=2):
    return sum(common.forward_bytes(i, N, D, elt) +
               common.backward_bytes(i, N, D, elt) for i in reads(L, block))


class Model:
    """The stack's parameters and inputs (bf16 unless `dtype`)."""

    def __init__(self, L, N, D, dtype, seed=0, device="cuda"):
        import torch
        gen = torch.Generator(device=device).manual_seed(seed)

        def randn(*shape, mean=0.0, std=1.0):
            return (torch.randn(*shape, generator=gen, device=device) * std
                    + mean).to(dtype)

        self.L, self.N, self.D, self.dtype = L, N, D, dtype
        self.embedding = randn(N, D).requires_grad_()
        self.weights = [randn(D, D, std=D ** -0.5).requires_grad_()
                        for _ in range(L)]
        self.queries = [randn(D, std=D ** -0.5).requires_grad_()
                        for _ in range(L)]
        self.key_norms = [randn(D, mean=1.0, std=0.1).requires_grad_()
                          for _ in range(L)]
        self.grad_out = randn(N, D)

    def parameters(self):
        return [self.embedding, *self.weights, *self.queries,
                *self.key_norms]

    def stepping(self, run):
        """`run` as a training step: every parameter's gradient cleared
        first."""
        def one():
            for p in self.parameters():
                p.grad = None
            run()
        return one

    def converted(self, dtype):
        """The same values in `dtype` (a float32 reference of bf16 ones)."""
        other = Model.__new__(Model)
        other.L, other.N, other.D, other.dtype = self.L, self.N, self.D, \
            dtype
        for name in ("embedding",):
            setattr(other, name,
                    getattr(self, name).detach().to(dtype).requires_grad_())
        for name in ("weights", "queries", "key_norms"):
            setattr(other, name, [t.detach().to(dtype).requires_grad_()
                                  for t in getattr(self, name)])
        other.grad_out = self.grad_out.to(dtype)
        return other


def plain_step(m):
    h = m.embedding
    for W in m.weights:
        h = h + h @ W
    h.backward(m.grad_out)


def list_step(m, op):
    outputs = [m.embedding]
    for i, W in enumerate(m.weights):
        x = op(outputs, m.queries[i], key_norm_weight=m.key_norms[i])
        y = x @ W
        outputs.append(y)
    y.backward(m.grad_out)


def block_list_step(m, op):
    """Block AttnRes on a list op: layer j of block n reads the embedding,
    the n completed blocks' sums and its block's partial sum."""
    S = m.L // BLOCKS
    summaries = [m.embedding]
    for n in range(BLOCKS):
        partial = None
        for j in range(S):
            i = n * S + j
            sources = summaries + ([partial] if partial is not None else [])
            x = op(sources, m.queries[i], key_norm_weight=m.key_norms[n])
            y = x @ m.weights[i]
            partial = y if partial is None else partial + y
        summaries.append(partial)
    y.backward(m.grad_out)


def block_history_step(m, history):
    block_history_forward(m, history).backward(m.grad_out)


def block_history_forward(m, history):
    """Block AttnRes on the history: layer j of block n reads the rows (the
    embedding and the completed blocks' sums) and its block's partial sum
    as an extra source; the block's sum is appended when it is done."""
    S = m.L // BLOCKS
    history.start(m.embedding)
    for n in range(BLOCKS):
        partial = None
        for j in range(S):
            i = n * S + j
            x = history.attend(m.queries[i], key_norm_weight=m.key_norms[n],
                               extra_source=partial)
            y = x @ m.weights[i]
            partial = y if partial is None else partial + y
        if n + 1 < BLOCKS:
            history.append(partial)
    return y


def history_step(m, history):
    history_forward(m, history).backward(m.grad_out)


def history_forward(m, history):
    history.start(m.embedding)
    for i, W in enumerate(m.weights):
        x = history.attend(m.queries[i], key_norm_weight=m.key_norms[i])
        y = x @ W
        if i + 1 < len(m.weights):
            history.append(y)
    return y


def compiled_history(m, block):
    """The history's step with its forward under torch.compile(fullgraph=
    True) (the backward is the compiled graph's)."""
    import torch
    from attnres.nn import ResidualHistory
    history = ResidualHistory(BLOCKS if block else m.L)
    forward = block_history_forward if block else history_forward
    compiled = torch.compile(lambda: forward(m, history), fullgraph=True)
    return lambda: compiled().backward(m.grad_out)


def graphed(m, step_of):
    """`step_of(model)` (forward and backward) captured in one CUDA graph
    on leaves of its own with `m`'s values (leaves the eager steps used
    keep their gradient accumulators on the default stream, which a capture
    may not wait on), after two runs on a side stream; the returned step
    replays it and hands each of `m`'s parameters its gradient (the graph's
    static one), as an eager step leaves them."""
    import torch
    static = m.converted(m.dtype)
    step = step_of(static)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            for p in static.parameters():
                p.grad = None
            step()
    torch.cuda.current_stream().wait_stream(stream)
    for p in static.parameters():
        p.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    grads = [p.grad for p in static.parameters()]

    def replay():
        graph.replay()
        for p, g in zip(m.parameters(), grads):
            p.grad = g
    return replay


def paired_from(rows, step):
    """`step` with reads of `rows` rows or more paired
    (attnres.nn._PAIR_MIN_ROWS; sys.maxsize leaves every read unpaired:
    its backward adds into all its rows)."""
    def run():
        from attnres import nn
        saved, nn._PAIR_MIN_ROWS = nn._PAIR_MIN_ROWS, rows
        try:
            step()
        finally:
            nn._PAIR_MIN_ROWS = saved
    return run


def contenders(block=False, compiled=False, graphs=False,
               unpaired_too=False, pair_rows=(), torch_ops=True):
    """(name, function(model) -> step function) of what is importable:
    the plain step first, then the history's and the list op's (whose
    gradients the others are compared with), then the rest."""
    import attnres
    from attnres.nn import ResidualHistory
    from attnres.reference import attnres_reference

    def torch_op(sources, query, key_norm_weight):
        return attnres_reference(torch_stack(sources), query,
                                 key_norm_weight=key_norm_weight)

    def torch_stack(sources):
        import torch
        return torch.stack(sources)

    on_list = block_list_step if block else list_step
    on_history = block_history_step if block else history_step
    capacity = (lambda m: BLOCKS) if block else (lambda m: m.L)
    found = [
        ("plain", lambda m: lambda: plain_step(m)),
        ("history", lambda m: (lambda h: lambda: on_history(m, h))(
            ResidualHistory(capacity(m)))),
        ("list op", lambda m: lambda: on_list(m, attnres.attnres)),
    ]
    if torch_ops:
        found.append(("PyTorch ops", lambda m: lambda: on_list(m, torch_op)))
    for rows in ([sys.maxsize] if unpaired_too else []) + list(pair_rows):
        if block:
            break
        found.append(("history, unpaired" if rows == sys.maxsize else
                      f"history, pairs from {rows} rows",
                      lambda m, rows=rows: (lambda h: paired_from(
                          rows, lambda: on_history(m, h)))(
                              ResidualHistory(capacity(m)))))
    if compiled:
        found.append(("history, compiled",
                      lambda m: compiled_history(m, block)))
    if graphs:
        # What the host costs the eager steps: the same steps replayed from
        # a CUDA graph, which launches them without it.
        found.append(("plain, CUDA graph", lambda m: graphed(
            m, lambda s: lambda: plain_step(s))))
        found.append(("history, CUDA graph", lambda m: graphed(
            m, lambda s: (lambda h: lambda: on_history(s, h))(
                ResidualHistory(capacity(s))))))
    fla = fla_op()
    if fla is not None:
        found.append(("FLA", lambda m: lambda: on_list(m, fla)))
    return found


def fla_op():
    """FLA's fused_attnres as (sources, query, key_norm_weight) -> o, or
    None (and a line saying so) where FLA is not importable. FLA 0.6
    takes the query first and the sources as a list (read in place
    through a table of their addresses, as attnres's list op does);
    earlier releases took the sources stacked first."""
    try:
        import inspect
        from fla.ops.attnres import fused_attnres
        first = next(iter(inspect.signature(fused_attnres).parameters))
    except Exception as error:  # not installed, or another API
        print(f"FLA: not importable ({type(error).__name__}: {error}); "
              f"skipped")
        return None

    if first == "query":
        def op(sources, query, key_norm_weight):
            return fused_attnres(query, sources, key_norm_weight)
    else:
        def op(sources, query, key_norm_weight):
            import torch
            return fused_attnres(torch.stack(sources), query,
                                 key_norm_weight=key_norm_weight)
    return op


def gradients(m, step):
    for p in m.parameters():
        p.grad = None
    step()
    # (Block AttnRes uses one key norm a block: the rest have none.)
    return [p.grad.detach().clone() if p.grad is not None else
            torch_zeros_like(p) for p in m.parameters()]


def torch_zeros_like(tensor):
    import torch
    return torch.zeros_like(tensor)


KINDS = ("embedding", "weights", "queries", "key_norms")


def compare(got, expected, L):
    """The largest relative (Frobenius) error of each kind of gradient: the
    embedding's, the linear layers', the queries', the key norms'. (The
    first layer's query reads one source: its gradient is zero, and is
    compared with the largest query gradient's norm as its scale.)"""
    groups = [(0, 1), (1, 1 + L), (1 + L, 1 + 2 * L), (1 + 2 * L, 1 + 3 * L)]
    result = {}
    for kind, (first, last) in zip(KINDS, groups):
        scale = max(e.double().norm().item() for e in expected[first:last])
        result[kind] = max(
            (g.double() - e.double()).norm().item() /
            max(e.double().norm().item(), 1e-2 * scale, 1e-30)
            for g, e in zip(got[first:last], expected[first:last]))
    return result


def peak_of(m, step):
    """Peak memory of one step above what is allocated before it (after a
    first step, which leaves whatever the step keeps from one call to the
    next: a history's buffers, a graph's pool)."""
    import torch

    one = m.stepping(step)
    one()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    one()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def timed_in_rounds(m, steps, rounds, repeats, out_of_memory):
    """Each step's time (common.time_steady, `repeats` steps a turn) in
    `rounds` rounds in which the steps take turns, so that a drift of the
    machine's speed over the seconds a shape takes (a few percent, which is
    0.5 ms of a 30 ms step and decides a share's ratio to another) falls on
    every step alike. Returns, per name, the median of its turns, the
    median of its turns less the plain step's turn of the same round (the
    share of the step the plain stream does not pay; for a step replayed
    from a CUDA graph, the plain step's replayed from one) and its turns.
    A step that runs out of memory beside what the others keep (the
    PyTorch ops' step peaks at 65 GB) leaves the rounds, and its name is
    appended to `out_of_memory`."""
    import statistics
    import torch
    turns = {name: [] for name in steps}
    for _ in range(rounds):
        for name in list(turns):
            try:
                turns[name].append(common.time_steady(
                    m.stepping(steps[name]), repeats=repeats, warmup=1))
            except torch.OutOfMemoryError:
                if name == "plain":
                    raise
                del turns[name]
                out_of_memory.append(name)
                release(m)
    def plain(name):
        # A step replayed from a CUDA graph against the plain one replayed
        # from its graph, where that one is timed too.
        graph = "plain, CUDA graph"
        return turns[graph if name.endswith(", CUDA graph") and
                     graph in turns else "plain"]
    return {name: (statistics.median(times), statistics.median(
        t - p for t, p in zip(times, plain(name))), times)
        for name, times in turns.items()}


def release(m):
    """Drops the parameters' gradients and the allocator's cached blocks."""
    import torch
    for p in m.parameters():
        p.grad = None
    torch.cuda.empty_cache()


def run_shape(L, N, D, bandwidth, reference, repeats, rounds, block=False,
              compiled=False, graphs=False, unpaired_too=False,
              pair_rows=(), torch_ops=True):
    import torch
    m = Model(L, N, D, torch.bfloat16)
    row = dict(L=L, N=N, D=D, block=block,
               floor_ms=floor_bytes(L, N, D, block) / bandwidth * 1e3)
    found = contenders(block, compiled, graphs, unpaired_too, pair_rows,
                       torch_ops)
    expected = gradients(m, found[2][1](m))   # the list op's
    errors, steps = {}, {}
    for name, make in found:
        step = make(m)
        try:
            if not name.startswith("plain"):
                errors[name] = compare(gradients(m, step), expected, L)
            row[name] = dict(peak_gb=peak_of(m, step) / 1e9)
            steps[name] = step
        except torch.OutOfMemoryError:
            row[name] = dict(ms=float("nan"), peak_gb=float("nan"),
                             note="out of memory")
        release(m)
    # The steps are kept together for the rounds: what they keep from one
    # call to the next (a history's two buffers, 2 GB at most at these
    # shapes, four histories at most) is small beside an H100's memory.
    # One that runs out of it there is timed alone after the rounds.
    alone = []
    for name, (ms, share, turns) in timed_in_rounds(
            m, steps, rounds, repeats, alone).items():
        row[name].update(ms=ms, share_ms=share, turns_ms=turns)
    steps = {name: steps[name] for name in alone}   # (the others released)
    for name in alone:
        step = steps.pop(name)
        release(m)
        try:
            ms = common.time_steady(m.stepping(step), repeats=repeats * rounds,
                                    warmup=1)
            row[name].update(ms=ms, share_ms=ms - row["plain"]["ms"],
                             note_rounds="timed alone: out of memory beside "
                             "the others")
        except torch.OutOfMemoryError:
            row[name].update(ms=float("nan"), note="out of memory")
        del step
    release(m)
    row["errors_vs_list"] = errors
    if reference:
        f32 = m.converted(torch.float32)
        from attnres.reference import attnres_reference
        on_list = block_list_step if block else list_step
        exact = gradients(f32, lambda: on_list(
            f32, lambda s, q, key_norm_weight: attnres_reference(
                torch.stack(s), q, key_norm_weight=key_norm_weight)))
        row["errors_vs_f32"] = {
            name: compare(gradients(m, make(m)), exact, L)
            for name, make in found if name in (
                "history", "history, unpaired", "list op", "PyTorch ops",
                "FLA")}
        # The plain stack's own bf16 rounding (its linear layers' and
        # residual adds'), against the plain stack in float32: the
        # embedding's and the weights' gradients (it has no queries).
        row["errors_vs_f32"]["plain"] = compare(
            gradients(m, functools.partial(plain_step, m)),
            gradients(f32, functools.partial(plain_step, f32)), L)
        del f32, exact
    del m
    torch.cuda.empty_cache()
    return row


def kernel_times(L, N, D, bandwidth):
    """One Full history step at (L, N, D) under torch.profiler: the GPU
    time of each kernel (microseconds, launches) and the history's forward
    and backward kernels against their floors."""
    import collections
    import torch
    from torch.profiler import ProfilerActivity, profile
    from attnres.nn import ResidualHistory
    m = Model(L, N, D, torch.bfloat16)
    history = ResidualHistory(L)

    def step():
        for p in m.parameters():
            p.grad = None
        history_step(m, history)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    times, launches = collections.Counter(), collections.Counter()
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            times[event.name] += event.device_time
            launches[event.name] += 1
    counts = reads(L, False)
    floors = {
        "forward": sum(common.forward_bytes(c, N, D) for c in counts),
        # The last read's backward runs first and writes; the others add.
        "backward": common.backward_bytes(counts[-1], N, D) + sum(
            common.backward_accumulate_bytes(c, N, D) for c in counts[:-1]),
    }
    parts = collections.Counter()
    for name, us in times.items():
        if name.startswith("attnres"):
            parts["forward" if any(k in name for k in (
                "forward", "partial", "merge")) else "backward"] += us
    print(f"\nFull {(L, N, D)}: kernels of one history step (us)")
    for name, us in times.most_common(12):
        print(f"{us:10.0f} {launches[name]:5d}x  {name[:72]}")
    print(f"{sum(times.values()):10.0f}        all kernels")
    result = dict(L=L, N=N, D=D, kernels_us=dict(times))
    for part, floor in floors.items():
        floor_us = floor / bandwidth * 1e6
        print(f"history {part}: {parts[part]:.0f} us, floor {floor_us:.0f} us"
              f" ({floor_us / parts[part]:.3f} of it)")
        result[part] = dict(us=parts[part], floor_us=floor_us)
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_prebuild_arguments(parser)
    parser.add_argument("--json", type=pathlib.Path)
    parser.add_argument("--repeats", type=int, default=5,
                        help="steps timed in a row, a contender's turn")
    parser.add_argument("--rounds", type=int, default=5,
                        help="rounds in which the contenders take turns")
    parser.add_argument("--shapes", default="",
                        help="L,N,D;... (default: the four of the issue)")
    parser.add_argument("--compiled", action="store_true",
                        help="time the history's step under torch.compile "
                        "too (its forward compiled, fullgraph)")
    parser.add_argument("--unpaired", action="store_true",
                        help="time the history's Full step with its reads "
                        "unpaired too (attnres.nn._PAIR_MIN_ROWS)")
    parser.add_argument("--pair-rows", default="",
                        help="N,M,...: time the history's Full step with "
                        "reads of N rows or more paired too (each of at "
                        f"least {PAIR_ROWS_PREBUILT} rows: bundles are "
                        "prebuilt from there)")
    parser.add_argument("--without-torch-ops", action="store_true",
                        help="leave out the PyTorch ops' step (260-455 ms "
                        "a step, the longest part of a run)")
    parser.add_argument("--host-only", action="store_true",
                        help=f"only the host shape {HOST_SHAPE} (the step "
                        f"eagerly and from CUDA graphs)")
    parser.add_argument("--kernels", action="store_true",
                        help="instead, each kernel's GPU time in one Full "
                        "history step per shape (torch.profiler)")
    args = parser.parse_args()
    pair_rows = [int(n) for n in args.pair_rows.split(",") if n]
    if any(n < PAIR_ROWS_PREBUILT for n in pair_rows):
        parser.error(f"--pair-rows: {PAIR_ROWS_PREBUILT} rows at least")
    if args.prebuild:
        common.prebuild(args, keys())
        return 0

    import torch
    shapes = SHAPES
    if args.shapes:
        shapes = [tuple(int(x) for x in s.split(","))
                  for s in args.shapes.split(";")]
    start = time.time()
    bandwidth = common.copy_bandwidth()
    if args.kernels:
        print(f"copy {bandwidth / 1e12:.3f} TB/s; "
              f"{torch.cuda.get_device_name()}; torch {torch.__version__}")
        found = []
        for L, N, D in shapes:
            found.append(kernel_times(L, N, D, bandwidth))
            torch.cuda.empty_cache()
        if args.json:
            args.json.write_text(json.dumps(dict(
                copy_tbps=bandwidth / 1e12,
                gpu=torch.cuda.get_device_name(), kernels=found), indent=1))
        return 0
    rows = []
    for block in () if args.host_only else (False, True):
        for index, (L, N, D) in enumerate(shapes):
            rows.append(run_shape(L, N, D, bandwidth, reference=index == 0,
                                  repeats=args.repeats, rounds=args.rounds,
                                  block=block,
                                  compiled=args.compiled,
                                  unpaired_too=args.unpaired,
                                  pair_rows=pair_rows,
                                  torch_ops=not args.without_torch_ops))
            print(json.dumps(rows[-1]), flush=True)
    host = run_shape(*HOST_SHAPE, bandwidth, reference=False,
                     repeats=max(args.repeats, 10), rounds=args.rounds,
                     graphs=True, torch_ops=not args.without_torch_ops)
    print(json.dumps(host), flush=True)

    failed = False
    print(f"\ncopy {bandwidth / 1e12:.3f} TB/s; {torch.cuda.get_device_name()}"
          f"; torch {torch.__version__}; {time.time() - start:.0f} s")
    names = [n for n in rows[0] if isinstance(rows[0][n], dict) and
             "ms" in rows[0][n]] if rows else []
    print("Full, then Block AttnRes (8 blocks): step (ms) / AttnRes share "
          "(ms, x floor) / peak GB")
    header = f"{'L, N, D':>24} {'floor':>6}" + "".join(
        f" {n:>22}" for n in names)
    print(header)
    for row in rows:
        cells = []
        for n in names:
            if n not in row:   # (--unpaired: Full AttnRes only)
                cells.append("")
                continue
            ms, share = row[n]["ms"], row[n].get("share_ms", float("nan"))
            cells.append(f"{ms:6.1f} {share:5.1f} {share / row['floor_ms']:4.2f}x"
                         f" {row[n]['peak_gb']:4.1f}" if n != "plain" else
                         f"{ms:6.1f} {'':>15}")
            if "note" in row[n]:
                cells[-1] = row[n]["note"]
        kind = "block " if row["block"] else "full "
        print(f"{kind + str((row['L'], row['N'], row['D'])):>24} "
              f"{row['floor_ms']:6.2f}" + "".join(f" {c:>22}" for c in cells))
    for row in rows:
        # The goals against FLA: the history's share of the step at most
        # 0.65x FLA's, its peak memory at most 1.10x FLA's.
        if "FLA" in row and "share_ms" in row["FLA"]:
            kind = "block " if row["block"] else "full "
            ours, fla = row["history"], row["FLA"]
            print(f"{kind}{(row['L'], row['N'], row['D'])}: history / FLA:"
                  f" share {ours['share_ms'] / fla['share_ms']:.2f}x,"
                  f" peak {ours['peak_gb'] / fla['peak_gb']:.2f}x")

    def kinds(errors):
        return "/".join(f"{errors[k]:.1e}" for k in KINDS)
    print("gradients, relative Frobenius (" + "/".join(KINDS) + "):")
    for row in rows + [host]:
        for name, errors in row["errors_vs_list"].items():
            if name.startswith("history") and \
                    not max(errors.values()) <= GRADIENT_TOLERANCE:
                failed = True
        kind = "block " if row["block"] else "full "
        print(f"{kind}{(row['L'], row['N'], row['D'])}: vs the list op: "
              + ", ".join(f"{n} {kinds(e)}"
                          for n, e in row["errors_vs_list"].items())
              + ("; vs float32: " + ", ".join(
                  f"{n} {kinds(e)}" for n, e in row["errors_vs_f32"].items())
                 if "errors_vs_f32" in row else ""))
    host_names = [n for n in host if isinstance(host[n], dict) and
                  "ms" in host[n]]

    def ratio(history, plain):
        return host[history]["ms"] / host[plain]["ms"]
    print(f"host shape {HOST_SHAPE}: step " + ", ".join(
        f"{n} {host[n]['ms']:.2f} ms" for n in host_names)
        + f"; history / plain {ratio('history', 'plain'):.2f}, in CUDA "
        f"graphs {ratio('history, CUDA graph', 'plain, CUDA graph'):.2f}")
    if args.json:
        args.json.write_text(json.dumps(dict(
            bandwidth=bandwidth, device=common.device_facts(), rows=rows,
            host=host), indent=1))
    if failed:
        print(f"FAILED: a history gradient is off the list op's by more "
              f"than {GRADIENT_TOLERANCE}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
