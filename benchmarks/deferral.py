#!/usr/bin/env python3
"""Would deferring a read's row gradients pay? A probe of the design in
docs/Performance.md ("A whole model"), on the kernels that exist today.

A Full AttnRes stack's reads run their backwards last read first; read i
(over rows 0..i-1) must hand back row i - 1's gradient complete, because
layer i - 1's backward takes it next, but nothing needs rows 0..i-2's
gradients before read i - 1's backward. Today every read's backward adds
into all of its rows (the accumulating kernel: a read-modify-write of each
gradient row per read). Paired, reads i and i - 1 share that pass:

  read i      its query's and key norm's gradients over all i rows, and
              its contribution to row i - 1 only: the accumulating kernel
              with null entries for rows 0..i-2 in its table of gradient
              rows (a null entry's row is neither read nor written), so
              the pass moves about the bytes of a read of the rows. (It
              is also timed with those entries pointing at one scratch
              row [N, D] instead, what the first version of this probe
              did before the kernels skipped null entries.)
  read i - 1  a two-query accumulating backward over rows 0..i-2 (queries
              i and i - 1): one read-modify-write of each row for both.
              The kernels' M queries share one key-norm weight, but a
              read's logits depend on its query q and key-norm weight g
              only through q * g (the key is g * v / rms(v)), so the pair
              runs with queries q_i g_i and q_{i-1} g_{i-1} (float32,
              exact products of bf16 values) and a weight of ones; read
              i - 1's gradients are then dq = g dq' and dg = q dq'.
              (Read i's dq' from this pass is not used: its dq is read
              i's own.) Its do, lse, o_pre and residual are the two reads'
              stacked ([2, N, D] ...): four row copies a pair here.

Per pair that moves about (4i + 8) N D elt bytes where the accumulating
backwards move (6i + 1). The pairs stop at read 3: a one-source backward
kernel takes its weight as exactly 1 (its own forward's lse), so read 2's
share of row 0 cannot be a pass over one source; reads 2 and 1 run
today's backward. This script runs both schedules of a whole Full
stack's reads (layer i reads rows 0..i-1, i = 1..L; the forwards once),
checks both against the float64 formulas at a small N (every row's
gradient, every query's and key norm's), and times each backward schedule
replayed from a CUDA graph at the model benchmark's Full shapes, with the
forwards, against the sum of the layers' forward + backward byte floors
(benchmarks/model.py's floors: (3i + 3) N D elt a layer). Each kind of
pass is also timed alone at a few source counts against its own floor,
the two-query pass also as compiled with other kernel options (VARIANTS;
each checked against the default's results first).

  here:  PYTHONPATH=python python3 benchmarks/deferral.py --prebuild DIR
  there: ATTNRES_BUNDLE_DIR=DIR PYTHONPATH=python python3 \\
             benchmarks/deferral.py

Exits 1 where a schedule's gradients are off the float64 ones, or a
variant's two-query pass off the default's.
"""

import argparse
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "python"))
import common  # noqa: E402
import model  # noqa: E402  (the Full stack's floors)
from attnres import _checks  # noqa: E402
from attnres._checks import TensorShape as _Shape  # noqa: E402

SHAPES = [(16, 8192, 4096), (32, 4096, 4096), (64, 2048, 4096)]
# The float64 check: every read of the deepest stack, few tokens.
CHECK_TOKENS = 64
# The two-query pass under other kernel choices (convert-attnres-to-gpu's
# options, attnres-opt --help): the defaults are measured for one query,
# where a backward stages its rows through shared memory; for M > 1 they
# keep them in registers (255 a thread at D = 4096, 256 lanes).
VARIANTS = {
    "staged": "backward-staged-batches=2",
    "lanes512": "backward-threads-per-row=512",
    "staged-lanes512": "backward-staged-batches=2 backward-threads-per-row=512",
}
# Relative Frobenius error against float64 (bf16 rounding of the rows'
# gradients summed over up to 64 reads; a wrong schedule is far above).
TOLERANCE = 2e-2


def _calls(count, D, N=1, pair=False):
    """The checked call of one read (bf16 query and key norm) or of a
    pair's two-query pass (float32 queries q * g, float32 ones)."""
    if pair:
        query, weight = _Shape((2, D), "torch.float32"), \
            _Shape((D,), "torch.float32")
    else:
        query, weight = _Shape((D,), "torch.bfloat16"), \
            _Shape((D,), "torch.bfloat16")
    return _checks.check_attnres(
        _Shape((count, N, D), "torch.bfloat16"), query, weight, None,
        common.EPS, common.SCALE, "o_pre")


def pass_counts(L):
    """The source counts each kind of pass is timed alone at."""
    return sorted({max(2, L // 4), L // 2, L - 1})


def keys():
    result = set()
    for L, _, D in SHAPES:
        for count in range(1, L + 1):
            # (The pairs' passes read 2 to L - 1 sources.)
            for pair in (False, True) if 2 <= count < L else (False,):
                call = _calls(count, D, pair=pair)
                result.add(call.spec())
                result.add(call.spec(accumulate=True))
    return sorted(result)


def _variant_folder(root, name, key):
    from attnres import kernels
    return pathlib.Path(root) / "variants" / name / \
        kernels.bundle_name(kernels.canonical_key(key))


def _pair_key(count, D):
    return _calls(count, D, pair=True).spec(accumulate=True)


def prebuild_variants(target, root):
    """The accumulating two-query pass of every count timed alone, compiled
    with each of VARIANTS' options, into root/variants/NAME/."""
    from attnres.compiler import compile as compile_bundle
    built = 0
    for name, options in VARIANTS.items():
        for L, _, D in SHAPES:
            for count in pass_counts(L):
                key = _pair_key(count, D)
                folder = _variant_folder(root, name, key)
                if not (folder / "manifest.json").is_file():
                    compile_bundle(key, target=target, output=folder,
                                   kernel_options=options)
                    built += 1
    print(f"{built} variant bundles in {pathlib.Path(root) / 'variants'}")


def variant_launches(root, count, D, N):
    """{name: the accumulating two-query backward of `count` sources built
    with that variant's options} for the variants found under root."""
    from attnres import ops
    from attnres.runtime import load
    import torch
    found = {}
    for name in VARIANTS if root is not None else ():
        folder = _variant_folder(root, name, _pair_key(count, D))
        if (folder / "manifest.json").is_file():
            # As ops._runtime: the runtime loads into the current context.
            with torch.cuda.device(torch.cuda.current_device()):
                found[name] = ops._BackwardLaunch(load(folder), N)
    return found


class Stack:
    """The rows, queries, key norms, forwards' results and output
    gradients of a Full stack's L reads (read i: rows 0..i-1), the
    gradient buffer and the launches of both schedules."""

    def __init__(self, L, N, D, seed=0):
        import torch
        from attnres import ops
        self.L, self.N, self.D = L, N, D
        device = torch.device("cuda", torch.cuda.current_device())
        gen = torch.Generator(device="cuda").manual_seed(seed)

        def randn(*shape, mean=0.0, std=1.0):
            return (torch.randn(*shape, generator=gen, device="cuda") * std
                    + mean).bfloat16()
        # Each row its own allocation, as the history's appended outputs.
        self.rows = [randn(N, D) for _ in range(L)]
        self.queries = [randn(D, std=D ** -0.5) for _ in range(L)]
        self.key_norms = [randn(D, mean=1.0, std=0.1) for _ in range(L)]
        self.grad_o = [randn(N, D) for _ in range(L)]
        self.grads = torch.empty((L, N, D), dtype=torch.bfloat16,
                                 device=device)
        self.scratch = torch.empty((N, D), dtype=torch.bfloat16,
                                   device=device)
        self.ones = torch.ones(D, dtype=torch.float32, device=device)
        grad_rows = ops._packed_pointers(self.grads)
        row_pointers = tuple(r.data_ptr() for r in self.rows)
        self.plans, self.accumulating, self.tables = {}, {}, {}
        self.pair_plans, self.pair_accumulating = {}, {}
        for count in range(1, L + 1):
            call = _calls(count, D, N)
            self.plans[count] = ops._Plan(call, device)
            self.accumulating[count] = ops._BackwardLaunch(
                ops._runtime(call.spec(accumulate=True), device), N)
            if not self.accumulating[count].skips_null_gradients:
                raise SystemExit(
                    f"the accumulating backward of {count} sources does not "
                    f"skip null gradient entries (a bundle from an older "
                    f"compiler): prebuild the bundles again")
            self.tables[count] = (
                ops._pointer_table(row_pointers[:count], device),
                ops._pointer_table(grad_rows[:count], device),
                # Read i's pass of the pairs: no gradient of rows 0..i-2.
                ops._pointer_table((0,) * (count - 1)
                                   + grad_rows[count - 1:count], device),
                # The same into a scratch row.
                ops._pointer_table((self.scratch.data_ptr(),) * (count - 1)
                                   + grad_rows[count - 1:count], device))
            if 2 <= count < L:
                pair = _calls(count, D, N, pair=True)
                self.pair_plans[count] = ops._Plan(pair, device)
                self.pair_accumulating[count] = ops._BackwardLaunch(
                    ops._runtime(pair.spec(accumulate=True), device), N)
        self.saved = [None] * (L + 1)
        self.forward()
        # The pairs' stacked inputs, and their products q * g.
        self.stacked_do = torch.empty((2, N, D), dtype=torch.bfloat16,
                                      device=device)
        self.stacked_o = torch.empty_like(self.stacked_do)
        self.stacked_lse = torch.empty((2, N), dtype=torch.float32,
                                       device=device)
        self.stacked_residual = torch.empty(
            (2, N, D // 2), dtype=torch.int8, device=device)
        self.products = {}
        for i in range(2, L + 1):
            self.products[i] = torch.stack(
                [self.queries[i - 1].float() * self.key_norms[i - 1].float(),
                 self.queries[i - 2].float() * self.key_norms[i - 2].float()])

    def forward(self):
        """Every read's forward (o, lse, residual), read i at index i."""
        from attnres import ops
        import torch
        for i in range(1, self.L + 1):
            o, lse, _, residual = ops._launch_forward_from(
                self.plans[i], self.tables[i][0], torch.bfloat16,
                self.queries[i - 1], self.key_norms[i - 1], None)
            self.saved[i] = (o, lse, residual)

    def _backward(self, i, launch, grad_table):
        from attnres import ops
        import torch
        o, lse, residual = self.saved[i]
        return ops._launch_backward_into(
            self.plans[i], launch, self.tables[i][0], grad_table,
            torch.bfloat16, self.queries[i - 1], self.key_norms[i - 1], None,
            self.grad_o[i - 1], lse, o, residual)

    def accumulating_schedule(self):
        """Today's: read i's backward adds into rows 0..i-1 (the last read
        writes them). Returns each read's (dq, dg)."""
        grads = {}
        for i in range(self.L, 0, -1):
            launch = self.plans[i].backward if i == self.L else \
                self.accumulating[i]
            grads[i] = self._backward(i, launch, self.tables[i][1])[:2]
        return grads

    def paired_schedule(self):
        """Reads L, L - 1 as a pair, then L - 2, L - 3, ...; the last reads
        left (fewer than three) run today's backward. (The pair pass needs
        two sources or more: a backward kernel of one source takes its
        weight as 1, the lse of a one-source forward, which read 2's is
        not.)"""
        grads = {}
        i = self.L
        while i >= 3:
            first = i == self.L
            # Read i: its dq and dg over all rows, its contribution to row
            # i - 1 (the table's other entries are null).
            launch = self.plans[i].backward if first else self.accumulating[i]
            grads[i] = self._backward(i, launch, self.tables[i][2])[:2]
            # Read i - 1 with read i's deferred contributions to rows 0..i-2.
            grads[i - 1] = self._pair_pass(i, first)
            i -= 2
        for read in range(i, 0, -1):
            launch = self.plans[read].backward if read == self.L else \
                self.accumulating[read]
            grads[read] = self._backward(read, launch,
                                         self.tables[read][1])[:2]
        return grads

    def _pair_pass(self, i, first):
        """The two-query pass of reads i and k = i - 1 over rows 0..k-1:
        adds (or writes, the first) both reads' contributions; returns read
        k's (dq, dg)."""
        from attnres import ops
        k = i - 1
        for slot, read in enumerate((i, k)):
            o, lse, residual = self.saved[read]
            self.stacked_do[slot].copy_(self.grad_o[read - 1])
            self.stacked_o[slot].copy_(o)
            self.stacked_lse[slot].copy_(lse[0])
            self.stacked_residual[slot].copy_(residual[0])
        plan = self.pair_plans[k]
        launch = plan.backward if first else self.pair_accumulating[k]
        dq = self._pair_launch(k, launch, self.products[i])
        g, q = self.key_norms[k - 1].float(), self.queries[k - 1].float()
        return (dq[1] * g).bfloat16(), (dq[1] * q).bfloat16()

    def _pair_launch(self, k, launch, products):
        from attnres import ops
        dq, _, _ = ops._launch_backward_into(
            self.pair_plans[k], launch, self.tables[k][0], self.tables[k][1],
            self.stacked_do.dtype, products, self.ones, None,
            self.stacked_do, self.stacked_lse, self.stacked_o,
            self.stacked_residual)
        return dq

    def expected(self):
        """The float64 formulas: the rows' gradients summed over the reads,
        each read's dq and dg."""
        import torch
        from attnres.reference import attnres_backward_reference
        grads = torch.zeros((self.L, self.N, self.D), dtype=torch.float64,
                            device="cuda")
        per_read = {}
        for i in range(1, self.L + 1):
            dv, dq, dg, _ = attnres_backward_reference(
                torch.stack(self.rows[:i]).double(),
                self.queries[i - 1].double(), self.grad_o[i - 1].double(),
                key_norm_weight=self.key_norms[i - 1].double(),
                eps=common.EPS, scale=common.SCALE)
            grads[:i] += dv
            per_read[i] = (dq, dg)
        return grads, per_read


def check(L, D, root):
    """Both schedules against float64 at CHECK_TOKENS tokens: the largest
    relative error of the rows' gradients, the queries' and key norms';
    and each variant's two-query pass against the default's (what it adds
    to the rows, and its dq) at every count it is timed at."""
    import torch
    stack = Stack(L, CHECK_TOKENS, D, seed=1)
    rows, per_read = stack.expected()
    result = {}
    for name, schedule in (("accumulating", stack.accumulating_schedule),
                           ("paired", stack.paired_schedule)):
        stack.grads.fill_(float("nan"))
        got = schedule()
        errors = dict(rows=common.relative_error(stack.grads, rows))
        for kind, index in (("queries", 0), ("key_norms", 1)):
            errors[kind] = max(common.relative_error(
                got[i][index], per_read[i][index]) for i in per_read)
        result[name] = errors
    start = torch.randn(stack.grads.shape, device="cuda").bfloat16()
    for count in pass_counts(L):
        def added(launch):
            stack.grads.copy_(start)
            dq = stack._pair_launch(count, launch, stack.products[count + 1])
            return stack.grads.float() - start.float(), dq
        rows_added, dq = added(stack.pair_accumulating[count])
        for name, launch in variant_launches(root, count, D,
                                             CHECK_TOKENS).items():
            got_rows, got_dq = added(launch)
            result.setdefault(f"variant {name}", {})[f"c={count}"] = max(
                common.relative_error(got_rows, rows_added),
                common.relative_error(got_dq, dq))
    return result


def time_shape(L, N, D, bandwidth, repeats, root):
    """Both schedules (and the forwards) of a whole stack, and each kind
    of pass alone at a few source counts, against its own bytes."""
    import torch
    from attnres import ops
    stack = Stack(L, N, D)
    row = dict(L=L, N=N, D=D,
               floor_ms=model.floor_bytes(L, N, D) / bandwidth * 1e3)
    row["forward_ms"] = common.time_graph([stack.forward], repeats=repeats)
    row["accumulating_ms"] = common.time_graph(
        [stack.accumulating_schedule], repeats=repeats)
    row["paired_ms"] = common.time_graph([stack.paired_schedule],
                                         repeats=repeats)
    row_ms = N * D * 2 / bandwidth * 1e3   # one [N, D] row read or written
    passes = []
    for count in pass_counts(L):
        kinds = [
            # (name, launch, the rows it moves at least)
            ("accumulating", lambda: stack._backward(
                count, stack.accumulating[count], stack.tables[count][1]),
             3 * count + 2),
            ("one row", lambda: stack._backward(
                count, stack.accumulating[count], stack.tables[count][2]),
             count + 4),
            # The same with the writing kernel (no read of the row).
            ("one row, writing", lambda: stack._backward(
                count, stack.plans[count].backward, stack.tables[count][2]),
             count + 3),
            ("scratch", lambda: stack._backward(
                count, stack.accumulating[count], stack.tables[count][3]),
             count + 4),
            ("forward", lambda: ops._launch_forward_from(
                stack.plans[count], stack.tables[count][0], torch.bfloat16,
                stack.queries[count - 1], stack.key_norms[count - 1], None),
             count + 1),
            ("pair", lambda: stack._pair_launch(
                count, stack.pair_accumulating[count],
                stack.products[count + 1]), 3 * count + 4),
        ]
        for name, launch in variant_launches(root, count, D, N).items():
            kinds.append((f"pair {name}", lambda launch=launch:
                          stack._pair_launch(count, launch,
                                             stack.products[count + 1]),
                          3 * count + 4))
        for name, launch, rows in kinds:
            ms = common.time_graph([launch], repeats=repeats)
            passes.append(dict(sources=count, kind=name, ms=ms,
                               floor_ms=rows * row_ms))
    row["passes"] = passes
    del stack
    torch.cuda.empty_cache()
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_prebuild_arguments(parser)
    parser.add_argument("--shapes", default="",
                        help="L,N,D;... (default: the model benchmark's "
                        "Full shapes of D = 4096)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--json", type=pathlib.Path)
    args = parser.parse_args()
    if args.prebuild:
        common.prebuild(args, keys())
        prebuild_variants(args.target, args.prebuild)
        return 0

    import json
    import torch
    shapes = SHAPES
    if args.shapes:
        shapes = [tuple(int(x) for x in s.split(","))
                  for s in args.shapes.split(";")]
    from attnres.kernels import prebuilt_dir
    root = prebuilt_dir()
    bandwidth = common.copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}; "
          f"copy {bandwidth / 1e12:.3f} TB/s")
    failed = False
    checks = {}
    for L, D in sorted({(L, D) for L, _, D in shapes}):
        checks[f"{L},{D}"] = errors = check(L, D, root)
        for name, kinds in errors.items():
            bad = max(kinds.values()) > TOLERANCE
            failed |= bad
            against = "the default's" if name.startswith("variant") else \
                "float64"
            print(f"check L={L} D={D} N={CHECK_TOKENS} {name}: relative "
                  f"error vs {against} " + ", ".join(
                      f"{k} {v:.1e}" for k, v in kinds.items())
                  + (" FAILED" if bad else ""))
    rows = []
    for L, N, D in shapes:
        rows.append(time_shape(L, N, D, bandwidth, args.repeats, root))
        print(json.dumps(rows[-1]), flush=True)
    print("\nbackward of every read of a Full stack, from a CUDA graph; "
          "share = (forwards + backwards) / the layers' f+b floors")
    print(f"{'L, N, D':>18} {'floor':>7} {'forwards':>9} "
          f"{'accumulating':>17} {'paired':>17}")
    for row in rows:
        cells = []
        for name in ("accumulating", "paired"):
            ms = row[f"{name}_ms"]
            cells.append(f"{ms:7.2f} {(ms + row['forward_ms']) / row['floor_ms']:5.2f}x")
        print(f"{str((row['L'], row['N'], row['D'])):>18} "
              f"{row['floor_ms']:7.2f} {row['forward_ms']:9.2f} "
              + " ".join(f"{c:>17}" for c in cells))
    print("\neach pass alone (ms, fraction of its own floor, in rows of "
          "[N, D]): the accumulating backward 3c + 2, the one-row pass c + 4 "
          "(writing: c + 3; into a scratch row: c + 4), the forward c + 1, "
          "the two-query pass 3c + 4")
    for row in rows:
        for p in row["passes"]:
            print(f"{str((row['L'], row['N'], row['D'])):>18} "
                  f"c={p['sources']:<3} {p['kind']:>20} {p['ms']:7.3f} "
                  f"{p['floor_ms'] / p['ms']:.3f}")
    if args.json:
        args.json.write_text(json.dumps(dict(
            device=common.device_facts(), bandwidth=bandwidth,
            checks=checks, rows=rows), indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
