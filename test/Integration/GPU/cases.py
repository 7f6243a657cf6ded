"""The GPU case matrix: the reference matrix of the numerics suite
(test/Numerics/driver), the edge cases, and partition_reduce cases.

Each case is a dict; `spec` is what attnres-compile --spec takes (forward and
backward cases share one `train:` bundle per configuration), `module` the
.mlir text of a partition_reduce case.
"""

LS = [1, 2, 7, 33, 129]
DS = [8, 64, 769, 2048]


def _tokens(L, D):
    # Enough tokens for several blocks, within a few MB per tensor.
    return max(1, min(512, (1 << 21) // (L * D)))


def _spec(c):
    items = [f"L={c['L']}", f"D={c['D']}", f"R={c['R']}", f"M={c['M']}",
             f"dtype={c['dtype']}", f"param_dtype={c['param_dtype']}",
             f"save={c['save']}", f"eps={c['eps']!r}", f"scale={c['scale']!r}"]
    if c["M"] > 1 or c["multi_query"]:
        items.append("multi_query")
    if c["key_norm"]:
        items.append("key_norm")
    if c["output_norm"]:
        items.append("output_norm=per_query" if c["per_query"]
                     else "output_norm")
    if c["packed"]:
        items.append("packed")
    return "train:" + ",".join(items)


def matrix():
    cases = []
    index = 0
    for dtype in ["f32", "bf16"]:
        for L in LS:
            for D in DS:
                for R in sorted({1, D // 4, D}):
                    combo = (index * 3 + L) % 8
                    M = 3 if combo & 1 else 1
                    c = dict(
                        L=L, D=D, R=R, M=M, dtype=dtype,
                        param_dtype="f32" if dtype == "bf16" and index % 3 == 0
                        else dtype,
                        key_norm=bool(combo & 2), output_norm=bool(combo & 4),
                        multi_query=M > 1 or index % 4 == 1,
                        packed=index % 3 == 0,
                        save="lse" if index % 5 == 2 else
                        "o_pre_residual" if dtype == "bf16" and D % 2 == 0
                        and index % 4 in (0, 3) else "o_pre",
                        scale=0.5 if index % 7 == 3 else 1.0, eps=1e-6,
                        inputs="normal", N=_tokens(L, D), seed=1000 + index)
                    c["per_query"] = c["output_norm"] and c["multi_query"] \
                        and index % 2 == 1
                    c["id"] = f"m{index:03d}"
                    cases.append(c)
                    index += 1
    return cases


def edge_cases():
    cases = []
    index = 0
    for dtype in ["f32", "bf16"]:
        def base():
            return dict(L=7, D=64, R=16, M=3, dtype=dtype, param_dtype=dtype,
                        key_norm=True, output_norm=True, multi_query=True,
                        per_query=False, packed=False, save="o_pre",
                        scale=1.0, eps=1e-6, inputs="normal", N=300)
        variants = [
            dict(eps=1e-30), dict(eps=1e4), dict(inputs="near_zero"),
            dict(inputs="near_zero", eps=1e-30), dict(inputs="large_logits"),
            dict(inputs="large_logits", L=33, output_norm=False, M=1,
                 multi_query=False),
            dict(inputs="zero_query"), dict(scale=-2.5), dict(scale=0.0),
            dict(M=16, per_query=True), dict(save="lse", packed=True),
            dict(D=4096, R=4096, L=10, N=200), dict(D=8192, R=1024, L=4, N=64),
        ]
        if dtype == "bf16":
            # o_pre's residual: with an [M, D] output norm, near-zero rows,
            # and a benchmark shape without the norm.
            variants += [
                dict(save="o_pre_residual", per_query=True, M=16),
                dict(save="o_pre_residual", inputs="near_zero"),
                dict(save="o_pre_residual", D=4096, R=4096, L=10, N=200,
                     output_norm=False, M=1, multi_query=False)]
        for variant in variants:
            c = base()
            c.update(variant)
            c["id"] = f"e{index:03d}"
            c["seed"] = 5000 + index
            cases.append(c)
            index += 1
    return cases + one_source_cases()


def one_source_cases():
    """One source, whose softmax weight is 1: o is the source, dq and dg
    are zero and the source's gradient is do, exactly, in every save mode
    (Report.one_source); f16 with the shapes a user tried with save=lse,
    and large logits, where a recomputed logit is furthest from the saved
    lse."""
    shapes = [
        dict(dtype="f16", save="lse", N=1000, D=4096, R=4096),
        dict(dtype="f16", save="lse", N=4096, D=1024, R=1024, key_norm=True),
        dict(dtype="f16", save="o_pre", N=300, D=769, R=192, key_norm=True),
        dict(dtype="bf16", save="lse", inputs="large_logits", M=3,
             multi_query=True, key_norm=True, output_norm=True),
        dict(dtype="bf16", save="o_pre_residual", D=2048, R=512,
             key_norm=True),
        dict(dtype="f32", save="lse", inputs="large_logits", packed=True),
        dict(dtype="f32", save="o_pre", inputs="large_logits", M=3,
             multi_query=True, output_norm=True, per_query=True),
    ]
    cases = []
    for index, shape in enumerate(shapes):
        c = dict(L=1, D=64, R=16, M=1, key_norm=False, output_norm=False,
                 multi_query=False, per_query=False, packed=False,
                 scale=1.0, eps=1e-6, inputs="normal", N=300)
        c.update(shape)
        c["param_dtype"] = c["dtype"]
        c["id"] = f"o{index:03d}"
        c["seed"] = 6000 + index
        cases.append(c)
    return cases


def merge_cases():
    cases = []
    index = 0
    for P in [1, 2, 3, 8, 64]:
        for sink in ["none", "-inf", "+inf", "finite"]:
            for empty in ["none", "some", "rows", "all"]:
                if index % 2 and not (P == 1 or empty == "all"):
                    index += 1
                    continue
                kept = len(cases)
                c = dict(kind="merge", P=P, sink=sink, empty=empty,
                         D=769 if kept % 3 == 0 else 64,
                         rows=37, dtype="bf16" if kept % 2 else "f32",
                         output_norm=kept % 3 == 1, seed=7000 + index,
                         id=f"r{index:03d}")
                # The residual of the merged o_pre (16-bit, even D).
                c["residual"] = c["dtype"] == "bf16" and c["D"] % 2 == 0
                c["module"] = _merge_module(c)
                cases.append(c)
                index += 1
    for P in [1, 2, 64, 257]:
        for dtype in ["f32", "bf16"]:
            c = dict(kind="sum", P=P, S=1000, dtype=dtype, seed=9000 + P,
                     id=f"s{P:03d}{dtype}")
            c["module"] = (
                f"func.func @sum(%p: tensor<{P}x?xf32>) -> tensor<?x{dtype}> {{\n"
                f"  %s = attnres.partition_reduce sum %p : tensor<{P}x?xf32>"
                f" -> tensor<?x{dtype}>\n"
                f"  return %s : tensor<?x{dtype}>\n}}\n")
            cases.append(c)
    return cases


def _merge_module(c):
    P, D, t = c["P"], c["D"], c["dtype"]
    args = [f"%p: tensor<{P}x?x{D}xf32>", f"%l: tensor<{P}x?xf32>"]
    operands = f"%p : tensor<{P}x?x{D}xf32> lse(%l : tensor<{P}x?xf32>)"
    if c["sink"] != "none":
        args.append("%s: tensor<?xf32>")
        operands += " sink(%s : tensor<?xf32>)"
    results = f"tensor<?x{D}x{t}>, tensor<?xf32>"
    if c["output_norm"]:
        args.append(f"%h: tensor<{D}x{t}>")
        operands += f" output_norm(%h : tensor<{D}x{t}>)"
        results += f", tensor<?x{D}x{t}>"
    if c["residual"]:
        results += f", tensor<?x{D // 2}xi8>"
    count = 2 + bool(c["output_norm"]) + bool(c["residual"])
    return (f"func.func @merge({', '.join(args)}) {{\n"
            f"  %r:{count} = attnres.partition_reduce softmax {operands}"
            f" -> {results}\n  return\n}}\n")


def all_cases():
    cases = []
    for c in matrix() + edge_cases():
        c["kind"] = "attnres"
        c["spec"] = _spec(c)
        cases.append(c)
    return cases + merge_cases()


if __name__ == "__main__":
    cases = all_cases()
    print(len(cases), "cases")
    print(sum(1 for c in cases if c["kind"] == "attnres"), "attnres")
