#!/usr/bin/env python3
"""attnres.nn.ResidualHistory on the GPU: a Full AttnRes stack (layer i
reads the embedding and every earlier output, then a linear layer and a
tanh) built on the history, against the same stack on the list op
(attnres.attnres) and on float64 PyTorch (attnres.reference), in bf16, f16
and f32: the output and every parameter's and the embedding's gradient,
eagerly, replayed from a CUDA graph of the whole step, with activation
checkpointing (history.checkpoint, of a layer's read and layer, and of
whole layers that append), under torch.compile(fullgraph=True),
with outputs appended in a non-dense layout, in a second step after
the gradients were zeroed in place, and with consecutive reads' backwards
paired (one two-query pass over the rows for two reads: eagerly,
replayed, checkpointed, and with every partner refused, so that each
deferred read adds into its rows on its own); Block AttnRes (read_block
and layer by layer with an extra source) eagerly, replayed and compiled,
and eagerly with every torch.empty_like filled with NaN (the extra source's
gradient is written over by the accumulating backward, never read); then
the misuse the history refuses.

  here:  PYTHONPATH=python python3 test/Integration/GPU/history.py --prebuild DIR
  there: ATTNRES_BUNDLE_DIR=DIR PYTHONPATH=python python3 test/Integration/GPU/history.py

Prints a line per case and "history: N of N passed" last.
"""

import argparse
import contextlib
import pathlib
import sys
import zlib

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2] / "python"))

from attnres import _checks  # noqa: E402
from attnres._checks import TensorShape as _Shape  # noqa: E402

# (layers, tokens, width, rank, queries per read (None: a [R] query), dtype)
CASES = [
    (4, 300, 256, 256, None, "bf16"),
    (6, 77, 128, 32, None, "f16"),
    (3, 64, 64, 64, 3, "f32"),
    (9, 200, 512, 512, None, "bf16"),
    # Reads of 32 and 33 short rows at a decode-sized N: the runtime splits
    # them over a cluster of blocks (LaunchRules.h kClusteredMinSources;
    # sm_90), which the two-kernel split's rule would keep whole.
    (33, 16, 256, 256, None, "bf16"),
]
# Relative Frobenius distance to float64 allowed per dtype (bf16 rounding
# of every gradient, compounded over the layers), and to the list op.
TOLERANCE = {"bf16": 3e-2, "f16": 5e-3, "f32": 2e-5}
MODES = ["eager", "graph", "checkpoint", "checkpoint-layers", "compile",
         "strided", "zeroed", "paired", "paired-graph", "paired-checkpoint",
         "paired-flush"]
# The paired modes lower the history's pairing thresholds (to these rows,
# and to rows of any size) so that the small cases pair their reads
# (attnres.nn._PAIR_MIN_ROWS and _PAIR_MIN_ROW_BYTES; a
# read of at least that many rows leaves all its rows but the last to the
# next read's two-query pass); "paired-flush" refuses every partner, so
# that each deferred read adds its rows on its own.
PAIR_MIN_ROWS = 3
# Block AttnRes (read_block): (blocks, layers a block, tokens, width, rank,
# dtype). Layer m of block n reads the embedding, the n - 1 completed
# blocks' sums and the partial sum of its block (all its queries read the
# history once), with its own output norm.
BLOCK_CASES = [
    (3, 2, 300, 256, 256, "bf16"),
    (2, 4, 77, 128, 32, "f16"),
    (3, 3, 64, 64, 64, "f32"),
]
EPS = 1e-6


def keys():
    """The kernel keys of every case (the checks read dtypes by name: no
    PyTorch needed to list them)."""
    dtypes = dict(bf16="torch.bfloat16", f16="torch.float16",
                  f32="torch.float32")
    result = set()
    for L, N, D, R, M, dtype in CASES:
        T = dtypes[dtype]
        for count in range(1, L + 1):
            call = _checks.check_attnres(
                _Shape((count, N, D), T),
                _Shape((R,) if M is None else (M, R), T), _Shape((R,), T),
                None, 1e-6, 1.0, "o_pre")
            result.add(call.spec())
            result.add(call.spec(accumulate=True))
            if M is None and 2 <= count < L:
                # A pair's pass: the products q * g of two reads, float32
                # ((key, kernel options) pairs).
                from attnres import nn
                result.update(nn.pair_keys(call))
    for blocks, S, N, D, R, dtype in BLOCK_CASES:
        T = dtypes[dtype]
        for count in range(1, blocks + 1):
            read = _checks.check_attnres(
                _Shape((count, N, D), T), _Shape((S, R), T), _Shape((R,), T),
                None, EPS, 1.0, "o_pre")
            result.add(read.spec(partial=True))
            result.add(read.spec(partial=True, accumulate=True))
            # The list op and the history's per-layer reads: the
            # summaries, and the block's partial sum.
            for extra in (0, 1):
                call = _checks.check_attnres(
                    _Shape((count + extra, N, D), T), _Shape((R,), T),
                    _Shape((R,), T), _Shape((D,), T), EPS, 1.0, "o_pre")
                result.add(call.spec())
                result.add(call.spec(accumulate=True))
                if extra:
                    # The history's accumulating backward of such a read,
                    # compiled with write-tags ((key, kernel options)).
                    from attnres import nn
                    result.update(nn.extra_source_keys(call))
        one = _checks.check_attnres(_Shape((1, N, D), T), _Shape((R,), T),
                                    _Shape((R,), T), None, EPS, 1.0, "o_pre")
        result.add(one.spec(partial=True))
        for P in (1, 2):
            result.add(f"merge:P={P},D={D},out={dtype},output_norm,"
                       f"eps={EPS!r}")
    # check_misuse's history: two bf16 rows of 64, a [64] query.
    call = _checks.check_attnres(
        _Shape((2, 4, 64), dtypes["bf16"]), _Shape((64,), dtypes["bf16"]),
        None, None, 1e-6, 1.0, "o_pre")
    result.add(call.spec())
    result.add(call.spec(accumulate=True))
    return sorted(result, key=str)


def make(case, dtype, device, seed):
    import torch
    L, N, D, R, M, _ = case
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def randn(*shape, mean=0.0, std=1.0):
        return (torch.randn(*shape, generator=gen, dtype=torch.float64) * std
                + mean).to(device)
    lead = () if M is None else (M,)
    params = dict(
        embedding=randn(N, D),
        weights=[randn(D, D, std=D ** -0.5) for _ in range(L)],
        queries=[randn(*lead, R, std=R ** -0.5) for _ in range(L)],
        key_norms=[randn(R, mean=1.0, std=0.1) for _ in range(L)],
        grad_out=randn(N, D))
    return params


def leaves(params, dtype):
    def leaf(value):  # a copy of its own, whatever the dtype
        return value.detach().to(dtype).clone().requires_grad_()
    out = {}
    for name, value in params.items():
        if isinstance(value, list):
            out[name] = [leaf(v) for v in value]
        elif name == "grad_out":
            out[name] = value.to(dtype)
        else:
            out[name] = leaf(value)
    return out


def flat(p):
    return [p["embedding"], *p["weights"], *p["queries"], *p["key_norms"]]


def layer(x, W):
    if x.dim() == 3:   # M queries: their mean
        x = x.mean(0)
    import torch
    return torch.tanh(x @ W)


def stack_on_list(p, op):
    outputs = [p["embedding"]]
    for i, W in enumerate(p["weights"]):
        outputs.append(layer(op(outputs, p["queries"][i],
                                p["key_norms"][i]), W))
    return outputs[-1]


def stack_on_history(p, history, checkpointed=False, strided=False):
    """`strided`: each output appended in a non-dense layout (the history
    keeps a dense copy; otherwise the row is the output itself).
    `checkpointed`: each layer's read and layer checkpointed, or with
    "layers", each checkpointed function reads, computes and appends two
    layers (the recomputation appends nothing)."""
    history.start(p["embedding"])
    weights = p["weights"]

    def body(i):
        return layer(history.attend(p["queries"][i],
                                    key_norm_weight=p["key_norms"][i]),
                     weights[i])
    if checkpointed == "layers":
        def layers(first):
            for i in range(first, min(first + 2, len(weights))):
                y = body(i)
                if i + 1 < len(weights):
                    history.append(y)
            return y
        for first in range(0, len(weights), 2):
            y = history.checkpoint(layers, first)
        return y
    y = None
    for i in range(len(weights)):
        y = history.checkpoint(body, i) if checkpointed else body(i)
        if i + 1 < len(weights):
            history.append(y.t().contiguous().t() if strided else y)
    return y


def run(p, forward, flat_of=flat, zeroed=False):
    """The output and the gradients of the leaves `flat_of(p)` of one step
    of `forward` (`zeroed`: after their gradients are zeroed in place, not
    dropped)."""
    for t in flat_of(p):
        if zeroed:
            t.grad.zero_()
        else:
            t.grad = None
    out = forward()
    out.backward(p["grad_out"])
    return [out.detach().clone()] + [t.grad.detach().clone()
                                     for t in flat_of(p)]


def run_zeroed(p, forward):
    """The second of two steps with the leaves' gradients zeroed in place
    between them (optimizer.zero_grad(set_to_none=False)): a leaf's .grad
    must be a tensor of its own, not the history's gradient row, which the
    next step writes and the leaf's accumulation would add to itself."""
    run(p, forward)
    return run(p, forward, zeroed=True)


def replayed(params, dtype, values, flat_of, forward):
    """The output and the gradients of `forward(static)` (a step on leaves
    of its own) captured with its backward in one CUDA graph, after two
    runs on a side stream, and replayed once `values`' leaves are copied
    into the static ones."""
    import torch
    static = leaves(params, dtype)

    def step():
        for t in flat_of(static):
            t.grad = None
        out = forward(static)
        out.backward(static["grad_out"])
        return out
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    for t in flat_of(static):
        t.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = forward(static)
        out.backward(static["grad_out"])
    with torch.no_grad():
        for s, v in zip(flat_of(static), flat_of(values)):
            s.copy_(v)
    graph.replay()
    torch.cuda.synchronize()
    return [out.detach().clone()] + [t.grad.detach().clone()
                                     for t in flat_of(static)]


def distance(got, want):
    """The largest relative Frobenius distance over the tensors, each
    relative to its own norm floored at 1 % of the largest one's (the first
    layer's query gradient is zero: a softmax over one source)."""
    import torch
    floor = 1e-2 * max(w.double().norm().item() for w in want)
    worst = 0.0
    for g, w in zip(got, want):
        g, w = g.double(), w.double()
        if not torch.isfinite(g).all():
            return float("inf")
        worst = max(worst, (g - w).norm().item() / max(w.norm().item(),
                                                       floor, 1e-30))
    return worst


def check_case(case, mode):
    import torch
    import attnres
    from attnres.nn import ResidualHistory
    from attnres.reference import attnres_reference
    dtypes = dict(bf16=torch.bfloat16, f16=torch.float16, f32=torch.float32)
    T = dtypes[case[-1]]
    params = make(case, T, "cuda", seed=zlib.crc32(repr(case).encode()))

    def ref_op(outputs, q, g):
        return attnres_reference(torch.stack(outputs), q, key_norm_weight=g)

    def list_op(outputs, q, g):
        return attnres.attnres(outputs, q, key_norm_weight=g)

    p64 = leaves(params, torch.float64)
    exact = run(p64, lambda: stack_on_list(p64, ref_op))
    p = leaves(params, T)
    listed = run(p, lambda: stack_on_list(p, list_op))
    history = ResidualHistory(case[0])
    if mode.startswith("paired"):
        return check_paired(case, mode, p, params, T, history, exact, listed)
    if mode == "eager":
        got = run(p, lambda: stack_on_history(p, history))
    elif mode == "checkpoint":
        got = run(p, lambda: stack_on_history(p, history, True))
    elif mode == "checkpoint-layers":
        got = run(p, lambda: stack_on_history(p, history, "layers"))
    elif mode == "zeroed":
        got = run_zeroed(p, lambda: stack_on_history(p, history))
    elif mode == "strided":
        got = run(p, lambda: stack_on_history(p, history, strided=True))
    elif mode == "compile":
        torch._dynamo.reset()
        step = torch.compile(lambda: stack_on_history(p, history),
                             fullgraph=True)
        got = run(p, step)
    else:  # graph: the whole step captured, replayed on new values
        got = replayed(params, T, p, flat,
                       lambda static: stack_on_history(static, history))
    to_exact = distance(got, exact)
    to_list = distance(got, listed)
    list_to_exact = distance(listed, exact)
    # Within the dtype's tolerance of float64, and no further from it than
    # the list op is (with a margin for rounding in another order).
    ok = to_exact <= max(TOLERANCE[case[-1]], 1.5 * list_to_exact)
    return ok, f"vs float64 {to_exact:.2e} (list op {list_to_exact:.2e}), " \
        f"vs list op {to_list:.2e}"


def check_paired(case, mode, p, params, T, history, exact, listed):
    """A mode of check_case with the reads paired (PAIR_MIN_ROWS): the
    gradients as close to float64 as the list op's, and as many pairs as
    the stack has: reads L and L - 1, L - 2 and L - 3, ... while the first
    reads PAIR_MIN_ROWS rows or more and its partner two or more (none
    with M queries a read); with "paired-flush", a flush of every read of
    PAIR_MIN_ROWS rows or more."""
    from attnres import nn
    L, M = case[0], case[4]
    counts = dict(pair=0, flush=0)
    saved = nn._PAIR_MIN_ROWS, nn._PAIR_MIN_ROW_BYTES, nn._Deferred.pair, \
        nn._Deferred.flush, nn._Deferred.pairs_with

    def counted(name, function):
        def wrapper(self, *args):
            counts[name] += 1
            return function(self, *args)
        return wrapper
    nn._PAIR_MIN_ROWS, nn._PAIR_MIN_ROW_BYTES = PAIR_MIN_ROWS, 0
    nn._Deferred.pair = counted("pair", saved[2])
    nn._Deferred.flush = counted("flush", saved[3])
    if mode == "paired-flush":
        nn._Deferred.pairs_with = lambda self, ctx: False
    try:
        if mode == "paired-graph":
            got = replayed(params, T, p, flat,
                           lambda static: stack_on_history(static, history))
            # Two steps on a side stream and the capture run the Python;
            # the replay runs what the capture recorded.
            steps = 3
        else:
            got = run(p, lambda: stack_on_history(
                p, history, mode == "paired-checkpoint"))
            steps = 1
    finally:
        nn._PAIR_MIN_ROWS, nn._PAIR_MIN_ROW_BYTES, nn._Deferred.pair, \
            nn._Deferred.flush, nn._Deferred.pairs_with = saved
    kind = "flush" if mode == "paired-flush" else "pair"
    if M is not None:
        expected = 0
    elif kind == "pair":
        firsts = range(L, PAIR_MIN_ROWS - 1, -2)
        expected = steps * len([i for i in firsts if i - 1 >= 2])
    else:
        # Every read of PAIR_MIN_ROWS rows or more defers, and flushes.
        expected = steps * len(range(PAIR_MIN_ROWS, L + 1))
    other = "pair" if kind == "flush" else "flush"
    to_exact = distance(got, exact)
    to_list = distance(got, listed)
    list_to_exact = distance(listed, exact)
    ok = to_exact <= max(TOLERANCE[case[-1]], 1.5 * list_to_exact) and \
        counts[kind] == expected and counts[other] == 0
    return ok, f"vs float64 {to_exact:.2e} (list op {list_to_exact:.2e}), " \
        f"vs list op {to_list:.2e}; {counts[kind]} {kind} passes " \
        f"({expected} expected), {counts[other]} {other} passes"


def make_block(case, device, seed):
    import torch
    blocks, S, N, D, R, _ = case
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def randn(*shape, mean=0.0, std=1.0):
        return (torch.randn(*shape, generator=gen, dtype=torch.float64) * std
                + mean).to(device)
    return dict(
        embedding=randn(N, D),
        weights=[randn(D, D, std=D ** -0.5) for _ in range(blocks * S)],
        queries=[randn(S, R, std=R ** -0.5) for _ in range(blocks)],
        key_norms=[randn(R, mean=1.0, std=0.1) for _ in range(blocks)],
        pre_norms=[randn(S, D, mean=1.0, std=0.1) for _ in range(blocks)],
        grad_out=randn(N, D))


def block_flat(p):
    return [p["embedding"], *p["weights"], *p["queries"], *p["key_norms"],
            *p["pre_norms"]]


def block_on_list(p, op, S):
    import torch
    summaries = [p["embedding"]]
    partial = None
    for n, queries in enumerate(p["queries"]):
        partial = None
        for m in range(S):
            sources = summaries + ([partial] if partial is not None else [])
            x = op(sources, queries[m], p["key_norms"][n], p["pre_norms"][n][m])
            y = torch.tanh(x @ p["weights"][n * S + m])
            partial = y if partial is None else partial + y
        summaries.append(partial)
    return partial


def block_on_history(p, history, S):
    import torch
    history.start(p["embedding"])
    partial = None
    for n, queries in enumerate(p["queries"]):
        read = history.read_block(queries, key_norm_weight=p["key_norms"][n],
                                  eps=EPS)
        partial = None
        for m in range(S):
            x = read.input(m, partial, output_norm_weight=p["pre_norms"][n][m])
            y = torch.tanh(x @ p["weights"][n * S + m])
            partial = y if partial is None else partial + y
        if n + 1 < len(p["queries"]):
            history.append(partial)
    return partial


def block_on_history_per_layer(p, history, S):
    """The same, each layer reading the history's rows and its block's
    partial sum as an extra source."""
    import torch
    history.start(p["embedding"])
    partial = None
    for n, queries in enumerate(p["queries"]):
        partial = None
        for m in range(S):
            x = history.attend(queries[m], key_norm_weight=p["key_norms"][n],
                               output_norm_weight=p["pre_norms"][n][m],
                               eps=EPS, extra_source=partial)
            y = torch.tanh(x @ p["weights"][n * S + m])
            partial = y if partial is None else partial + y
        if n + 1 < len(p["queries"]):
            history.append(partial)
    return partial


@contextlib.contextmanager
def empty_like_nan(torch):
    """Every tensor torch.empty_like makes inside starts as NaN: an extra
    source's gradient (its entry tagged to be written over by the
    accumulating backward) that were added to instead, or any other row
    read before it is written, turns the gradients NaN."""
    real = torch.empty_like

    def poisoned(tensor, *args, **kwargs):
        made = real(tensor, *args, **kwargs)
        return made.fill_(float("nan")) if made.is_floating_point() else made
    torch.empty_like = poisoned
    try:
        yield
    finally:
        torch.empty_like = real


def check_block_case(case, mode):
    import torch
    import attnres
    from attnres.nn import ResidualHistory
    from attnres.reference import attnres_reference
    dtypes = dict(bf16=torch.bfloat16, f16=torch.float16, f32=torch.float32)
    T = dtypes[case[-1]]
    S = case[1]
    params = make_block(case, "cuda", seed=zlib.crc32(repr(case).encode()))

    def ref_op(sources, q, g, h):
        return attnres_reference(torch.stack(sources), q, key_norm_weight=g,
                                 output_norm_weight=h, eps=EPS)

    def list_op(sources, q, g, h):
        return attnres.attnres(sources, q, key_norm_weight=g,
                               output_norm_weight=h, eps=EPS)

    p64 = leaves(params, torch.float64)
    exact = run(p64, lambda: block_on_list(p64, ref_op, S), block_flat)
    p = leaves(params, T)
    listed = run(p, lambda: block_on_list(p, list_op, S), block_flat)
    history = ResidualHistory(case[0])
    if mode in ("eager", "poisoned"):
        with empty_like_nan(torch) if mode == "poisoned" else \
                contextlib.nullcontext():
            got = run(p, lambda: block_on_history(p, history, S), block_flat)
    elif mode == "per-layer":
        got = run(p, lambda: block_on_history_per_layer(p, history, S),
                  block_flat)
    elif mode in ("compile", "compile per-layer"):
        torch._dynamo.reset()
        on_history = block_on_history if mode == "compile" else \
            block_on_history_per_layer
        step = torch.compile(lambda: on_history(p, history, S),
                             fullgraph=True)
        got = run(p, step, block_flat)
    else:  # graph
        got = replayed(params, T, p, block_flat,
                       lambda static: block_on_history(static, history, S))
    to_exact = distance(got, exact)
    list_to_exact = distance(listed, exact)
    ok = to_exact <= max(TOLERANCE[case[-1]], 1.5 * list_to_exact)
    return ok, f"vs float64 {to_exact:.2e} (list op {list_to_exact:.2e}), " \
        f"vs list op {distance(got, listed):.2e}"


def check_misuse():
    import torch
    from attnres.nn import HistoryError, ResidualHistory
    failures = []
    h = ResidualHistory(2)
    x = torch.randn(4, 64, device="cuda", dtype=torch.bfloat16,
                    requires_grad=True)
    q = torch.randn(64, device="cuda", dtype=torch.bfloat16,
                    requires_grad=True)
    h.start(x)
    h.append(torch.randn(4, 64, device="cuda", dtype=torch.bfloat16))
    for what, call, message in [
            ("past capacity", lambda: h.append(x), "append past the capacity"),
            ("dtype", lambda: h.append(x.float()), "row 2 must be"),
    ]:
        try:
            call()
            failures.append(f"{what}: not refused")
        except HistoryError as error:
            if message not in str(error):
                failures.append(f"{what}: {error}")
    out = h.attend(q)
    h.start(x)
    try:
        out.float().sum().backward()
        failures.append("backward after the next start: not refused")
    except HistoryError as error:
        if "its rows were released" not in str(error):
            failures.append(f"backward after start: {error}")
    # The in-place backwards refuse a gradient buffer unlike the sources'
    # rows (here a slice with gaps) before anything is launched.
    from attnres import InvalidArgumentError
    rows = [torch.randn(4, 64, device="cuda", dtype=torch.bfloat16)
            for _ in range(2)]
    lse = torch.zeros(4, device="cuda")
    wide = torch.zeros(2, 4, 128, device="cuda", dtype=torch.bfloat16)
    for name, call in [
            ("backward_into", lambda buffer: torch.ops.attnres.backward_into(
                rows, q.detach(), None, None, rows[0], lse, rows[0], None,
                1e-6, 1.0, "o_pre", buffer, True)),
            ("partial_backward_into",
             lambda buffer: torch.ops.attnres.partial_backward_into(
                 rows, q.detach(), None, rows[0], lse, lse, rows[0], 1e-6,
                 1.0, buffer, True))]:
        try:
            call(wide[..., :64])
            failures.append(f"{name} with a strided buffer: not refused")
        except InvalidArgumentError as error:
            if "grad_sources must be a dense, 16-byte aligned [2, 4, 64]" \
                    not in str(error):
                failures.append(f"{name}: {error}")
    return failures


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prebuild", type=pathlib.Path)
    parser.add_argument("--target", default="sm_90")
    parser.add_argument("--modes", default=",".join(MODES))
    args = parser.parse_args()
    if args.prebuild:
        import attnres
        needed = keys()
        attnres.prebuild(needed, args.target, args.prebuild)
        print(f"{len(needed)} bundles in {args.prebuild / args.target}")
        return 0
    import torch
    import attnres.ops  # noqa: F401  (registers torch.ops.attnres)
    torch._dynamo.config.cache_size_limit = 256
    total = passed = 0
    for case in CASES:
        for mode in args.modes.split(","):
            total += 1
            try:
                ok, detail = check_case(case, mode)
            except Exception as error:  # a failing case must not stop the run
                ok, detail = False, f"exception: {type(error).__name__}: " \
                    f"{str(error)[:300]}"
            passed += ok
            print(f"{'PASS' if ok else 'FAIL'} {case} {mode}: {detail}",
                  flush=True)
    for case in BLOCK_CASES:
        modes = args.modes.split(",")
        for mode in [m for m in modes if m in ("eager", "graph", "compile")] \
                + ["per-layer"] + \
                (["poisoned"] if "eager" in modes else []) + \
                (["compile per-layer"] if "compile" in modes else []):
            total += 1
            try:
                ok, detail = check_block_case(case, mode)
            except Exception as error:  # a failing case must not stop the run
                ok, detail = False, f"exception: {type(error).__name__}: " \
                    f"{str(error)[:300]}"
            passed += ok
            print(f"{'PASS' if ok else 'FAIL'} block {case} {mode}: {detail}",
                  flush=True)
    total += 1
    failures = check_misuse()
    passed += not failures
    print(f"{'PASS' if not failures else 'FAIL'} misuse"
          + ("" if not failures else ": " + "; ".join(failures)))
    print(f"history: {passed} of {total} passed")
    return 0 if passed == total else 1


if __name__ == "__main__":
    sys.exit(main())
