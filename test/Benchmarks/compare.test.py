"""Writes the run.py-like JSON files compare.test compares."""
import json
import pathlib
import sys

out = pathlib.Path(sys.argv[1])
BEFORE = [((64, 8192, 8192, "o_pre", "backward"), 0.86),
          ((4, 4096, 1024, "lse", "forward"), 0.60),
          ((10, 32768, 4096, "o_pre", "fwd_bwd_graph"), 0.90),
          ((10, 32768, 4096, "o_pre", "fwd_bwd_eager"), 0.50)]


def write(name, changed, copy):
    records = []
    for (L, N, D, variant, measure), fraction in BEFORE:
        fraction = changed.get(measure, fraction)
        records.append(dict(L=L, N=N, D=D, variant=variant, measure=measure,
                            ms=1.0, floor_ms=fraction, fraction=fraction))
    (out / name).write_text(json.dumps(dict(copy_tbps=copy,
                                            records=records)))


write("before.json", {}, 4.0)
write("same.json", {"forward": 0.61, "backward": 0.85}, 4.1)
write("slower.json", {"backward": 0.80, "forward": 0.66}, 4.0)
write("eager.json", {"fwd_bwd_eager": 0.40}, 4.0)
(out / "other.json").write_text(json.dumps(dict(copy_tbps=4.0, records=[
    dict(L=1, N=1, D=1, variant="x", measure="forward", fraction=1.0)])))
