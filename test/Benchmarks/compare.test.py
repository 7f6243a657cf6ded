"""Writes the run.py-like JSON files compare.test compares."""
import json
import pathlib
import sys

out = pathlib.Path(sys.argv[1])
# Keys sort by L: (4, ...), (10, ...), (64, ...).
BEFORE = {(4, 4096, 1024, "lse", "forward"): 0.60,
          (10, 32768, 4096, "o_pre", "fwd_bwd_graph"): 0.90,
          (10, 32768, 4096, "o_pre", "fwd_bwd_eager"): 0.50,
          (64, 8192, 8192, "o_pre", "backward"): 0.86}


def write(name, changed=None, copy=4.0, drop=()):
    records = []
    for key, fraction in BEFORE.items():
        if key in drop:
            continue
        L, N, D, variant, measure = key
        fraction = (changed or {}).get(measure, fraction)
        records.append(dict(L=L, N=N, D=D, variant=variant, measure=measure,
                            ms=1.0, floor_ms=fraction, fraction=fraction))
    (out / name).write_text(json.dumps(dict(copy_tbps=copy,
                                            records=records)))


write("before.json")
write("same.json", {"forward": 0.61, "backward": 0.85}, copy=4.1)
# -7 %, +10 %, +1 % in key order: the median (+1 %) is not the middle one.
write("slower.json", {"forward": 0.558, "fwd_bwd_graph": 0.99,
                      "backward": 0.8686})
write("eager.json", {"fwd_bwd_eager": 0.40})
write("nan.json", {"backward": float("nan")})
write("missing.json", drop=[(64, 8192, 8192, "o_pre", "backward")])
(out / "other.json").write_text(json.dumps(dict(copy_tbps=4.0, records=[
    dict(L=1, N=1, D=1, variant="x", measure="forward", fraction=1.0)])))
