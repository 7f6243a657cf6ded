"""What every benchmark here shares: the byte floors of an AttnRes call, the
copy ceiling measured in the same run, and timing by CUDA events around
CUDA-graph replays.

Floors (bytes moved at least, elt the element size of the sources):
  forward           (L + 1) * N * D * elt   (read every source, write o)
  backward          (2L + 2) * N * D * elt  (read every source, do and the
                                             saved o_pre; write every dv)
  forward+backward  their sum
A floor in milliseconds is those bytes over the copy bandwidth of the same
run (a large device-to-device copy, bytes read + written).
"""

import pathlib
import statistics
import sys

# The package's own rules (attnres._checks needs no PyTorch and no library).
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent /
                       "python"))
from attnres import _checks  # noqa: E402

try:  # the shapes and floors need no PyTorch (bundles are compiled without)
    import torch
except ImportError:
    torch = None

# The shapes (L, N, D) every speed claim is made on: training shapes, one
# small shape, and decode (few tokens, many sources).
SHAPES = [(10, 32768, 4096), (10, 8192, 4096), (64, 8192, 8192),
          (8, 32768, 2048), (8, 8192, 2048), (4, 4096, 1024),
          (64, 128, 4096), (32, 16, 8192)]
LARGE = SHAPES[:5]
DECODE = SHAPES[6:]

# The variants of a call: what the forward saves, and the output norm.
VARIANTS = ["o_pre", "lse", "o_pre+onorm", "lse+onorm"]
# Tiny shapes (L, N, D) whose calls time the host: the GPU is idle there.
HOST_SHAPES = [(4, 16, 256), (64, 16, 256)]
EPS, SCALE = 1e-6, 1.0
# The largest relative error (Frobenius, against float32 on the same bf16
# inputs) a timed result may have: bf16 rounding of sums over L sources
# stays near 2e-3; a wrong kernel is far above.
TOLERANCE = 2e-2

# Inputs smaller than this are rotated among copies so that replays read
# device memory, not the 60 MB L2.
ROTATE_BYTES = 512 << 20


def forward_bytes(L, N, D, elt=2):
    return (L + 1) * N * D * elt


def backward_bytes(L, N, D, elt=2):
    return (2 * L + 2) * N * D * elt


def key_for(L, D, variant):
    """The kernel key (compiler spec) the PyTorch op asks for on a bf16 call
    with R = D, a key norm and a 1-D query (attnres._checks.Call.spec)."""
    save = variant.split("+")[0]
    if _checks.keeps_residual("torch.bfloat16", D, save):
        save = "o_pre_residual"
    items = [f"L={L}", f"D={D}", f"R={D}", "M=1", "dtype=bf16",
             "multi_query", "key_norm"]
    if variant.endswith("+onorm"):
        items.append("output_norm")
    items += [f"save={save}", f"eps={EPS!r}", f"scale={SCALE!r}"]
    return "train:" + ",".join(items)


def accumulate_key_for(L, D):
    """The key of the accumulating backward of key_for(L, D, "o_pre"): the
    one a residual history's reads launch (it adds the source gradients
    into the caller's buffer)."""
    call = _checks.check_attnres(
        _checks.TensorShape((L, 1, D), "torch.bfloat16"),
        _checks.TensorShape((D,), "torch.bfloat16"),
        _checks.TensorShape((D,), "torch.bfloat16"), None, EPS, SCALE,
        "o_pre")
    return call.spec(accumulate=True)


def backward_accumulate_bytes(L, N, D, elt=2):
    """backward_bytes and one more read of each source's gradient row."""
    return (3 * L + 2) * N * D * elt


def benchmark_keys():
    """Every key benchmarks/run.py needs."""
    keys = {key_for(L, D, v) for L, _, D in SHAPES for v in VARIANTS}
    keys |= {key_for(L, D, "o_pre") for L, _, D in HOST_SHAPES}
    keys |= {accumulate_key_for(L, D) for L, _, D in SHAPES}
    return sorted(keys)


def add_prebuild_arguments(parser, what="every bundle this needs"):
    """--prebuild DIR and --target: a benchmark's bundles compiled on a
    machine with the compiler, for ATTNRES_BUNDLE_DIR on the GPU's."""
    parser.add_argument("--prebuild", type=pathlib.Path,
                        help=f"compile {what} into this folder (on a machine "
                        f"with the compiler) and exit")
    parser.add_argument("--target", default="sm_90")


def prebuild(args, keys):
    """Compiles `keys` into args.prebuild for args.target."""
    import attnres
    attnres.prebuild(keys, args.target, args.prebuild)
    print(f"{len(keys)} bundles in {args.prebuild / args.target}")


def copies_for(bytes_per_call):
    """How many input sets a replay cycles through."""
    return max(1, -(-ROTATE_BYTES // max(1, bytes_per_call)))


def copy_bandwidth(size=4 << 30, repeats=20):
    """Bytes read + written per second of a large device-to-device copy."""
    src = torch.empty(size, dtype=torch.uint8, device="cuda")
    src.random_()
    dst = torch.empty_like(src)
    ms = time_events(lambda: dst.copy_(src), repeats=repeats)
    del src, dst
    return 2 * size / (ms * 1e-3)


def time_steady(fn, repeats=20, warmup=3):
    """Median milliseconds of `fn` called back to back, as a training loop
    calls it: an event between consecutive calls and one synchronization at
    the end, so the host enqueues ahead of the GPU wherever it is faster
    (the way triton.testing.do_bench times). Where the host is slower than
    the GPU, the queue drains and the host's time is what shows."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    events = [torch.cuda.Event(enable_timing=True)
              for _ in range(repeats + 1)]
    events[0].record()
    for i in range(repeats):
        fn()
        events[i + 1].record()
    events[-1].synchronize()
    return statistics.median(events[i].elapsed_time(events[i + 1])
                             for i in range(repeats))


def time_events(fn, repeats=20, warmup=3):
    """Median milliseconds of `fn` between CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def time_graph(calls, repeats=20, min_ms=2.0):
    """Median milliseconds per call of `calls` (a list of functions, one call
    each, on distinct inputs) captured in one CUDA graph and replayed: launch
    gaps as small as the GPU makes them, inputs rotated."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for call in calls:
            call()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    graph.replay()
    torch.cuda.synchronize()
    # Enough replays per sample that one sample lasts min_ms.
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    per_replay = max(start.elapsed_time(end), 1e-3)
    replays = max(1, int(min_ms / per_replay))
    times = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / (replays * len(calls)))
    del graph
    return statistics.median(times)


def relative_error(got, ref):
    """||got - ref|| / ||ref|| (Frobenius), in float64; inf when not
    finite."""
    got = got.double()
    ref = ref.double()
    if not torch.isfinite(got).all():
        return float("inf")
    norm = ref.norm().item()
    return (got - ref).norm().item() / (norm if norm > 0 else 1.0)


def device_facts():
    props = torch.cuda.get_device_properties(0)
    try:
        import subprocess
        driver = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version",
             "--format=csv,noheader"], capture_output=True,
            text=True).stdout.strip().splitlines()[0]
    except Exception:  # no nvidia-smi: the driver version stays unknown
        driver = "unknown"
    return dict(gpu=props.name, multiprocessors=props.multi_processor_count,
                driver=driver, torch=torch.__version__)
