"""The runtime's limits through the Python wrappers, without a GPU: integers
that do not fit the C types they are passed as are refused by name (ctypes
would wrap them around silently), counts whose sizes do not fit in 64 bits
are refused by the runtime, and loading from memory has the folder loaders'
caps."""

import types

import numpy as np
import pytest

import attnres


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    """A forward and a backward with two queries, as PTX (no ptxas needed)."""
    folder = tmp_path_factory.mktemp("bundles") / "train"
    attnres.compile("train:L=64,D=1024,M=2,dtype=bf16,key_norm,output_norm",
                    target="sm_90", format="isa", output=folder)
    return folder


@pytest.fixture
def runtime(bundle, monkeypatch):
    monkeypatch.setenv("ATTNRES_NUM_MULTIPROCESSORS", "132")
    return attnres.inspect(bundle)


def test_counts_at_the_edge_of_int64(runtime):
    forward, backward = runtime.op("forward"), runtime.op("backward")
    largest = (1 << 63) - 1
    # The blocks the device holds (2 * 132), not ceil(N / rows) wrapped.
    assert runtime.backward_blocks(backward, largest) == 264
    assert runtime.forward_partitions(forward, largest) == 1
    assert runtime.forward_workspace_size(forward, largest) == 0
    # numpy integers are ints too.
    assert runtime.backward_blocks(backward, np.int64(largest)) == 264


@pytest.mark.parametrize("call, message", [
    (lambda r: r.forward_workspace_size(0, 1 << 62, 4),
     "num_tokens = 4611686018427387904 with partitions = 4: the split "
     "forward's workspace"),
    (lambda r: r.backward_workspace_size(1, 1, blocks=1 << 58, partitions=1),
     "blocks = 288230376151711744 with partitions = 1 (num_tokens = 1): the "
     "backward's workspace"),
    (lambda r: r.forward(0, num_tokens=1 << 62, sources=0, query=0, o=0,
                         lse=0, partitions=1),
     "num_tokens = 4611686018427387904: its M * N rows do not fit in 64 bits"),
])
def test_sizes_past_64_bits_are_refused(runtime, call, message):
    with pytest.raises(attnres.InvalidArgumentError) as raised:
        call(runtime)
    assert message in str(raised.value)


@pytest.mark.parametrize("call, message", [
    (lambda r: r.backward_blocks(1, 1 << 64), "num_tokens = 18446744073709551616"
     " does not fit an int64_t"),
    (lambda r: r.forward_partitions(0, -(1 << 63) - 1),
     "num_tokens = -9223372036854775809 does not fit an int64_t"),
    (lambda r: r.forward_workspace_size(0, 16, partitions=(1 << 64) + 4),
     "partitions = 18446744073709551620 does not fit an int64_t"),
    (lambda r: r.backward_partitions(1, 1 << 70), "blocks = "),
    (lambda r: r.forward_partitions(1 << 31, 4), "op = 2147483648 does not "
     "fit a C int"),
    (lambda r: r.forward_partitions(-1, 4), "op = -1 does not fit a C int"),
    (lambda r: r.forward(0, num_tokens=4, sources=1 << 64, query=0, o=0,
                         lse=0), "sources = 18446744073709551616 does not fit "
     "64 bits"),
    (lambda r: r.forward(0, num_tokens=4, sources=-8, query=0, o=0, lse=0),
     "sources = -8 does not fit 64 bits"),
    (lambda r: r.backward(1, num_tokens=4, sources=0, query=0, grad=0,
                          grad_sources=0, dq=0, workspace_size=1 << 64),
     "workspace_size = 18446744073709551616 does not fit 64 bits"),
    (lambda r: r.backward(1, num_tokens=4, sources=0, query=0, grad=0,
                          grad_sources=0, dq=0, blocks=1 << 63),
     "blocks = 9223372036854775808 does not fit an int64_t"),
    (lambda r: r.merge(0, num_rows=1 << 63, partials=0, partial_lse=0, o=0,
                       lse=0), "num_rows = 9223372036854775808"),
    (lambda r: r.sum(0, partials=0, output=0, num_elements=1 << 64),
     "num_elements = 18446744073709551616"),
    (lambda r: r.forward(0, num_tokens=4, sources=0, query=0, o=0, lse=0,
                         stream=1 << 64), "stream = 18446744073709551616"),
    (lambda r: r.forward_partitions(0, 2.5), "num_tokens must be an int, got "
     "float"),
    (lambda r: r.forward_partitions(0, True), "num_tokens must be an int, "
     "got True"),
])
def test_integers_are_checked_before_ctypes(runtime, call, message):
    with pytest.raises(attnres.InvalidArgumentError) as raised:
        call(runtime)
    assert message in str(raised.value)


def test_loading_from_memory_has_the_folder_caps(bundle):
    manifest = (bundle / "manifest.json").read_text()
    binary = (bundle / "attnres_kernels.sm_90.ptx").read_bytes()
    # Past 16 MiB (spaces, which JSON allows, after the real manifest):
    # refused before it is parsed.
    big = types.SimpleNamespace(
        manifest_text=manifest.ljust((16 << 20) + 1),
        files={"attnres_kernels.sm_90.ptx": binary})
    with pytest.raises(attnres.BundleError,
                       match="the manifest is 16777217 bytes; a bundle's "
                             "manifest may be at most 16777216 bytes"):
        attnres.load(big)
    # The folder loaders' check of the manifest's binaries.
    none = types.SimpleNamespace(
        manifest_text=manifest.replace('"binaries"', '"binarieZ"'),
        files={"attnres_kernels.sm_90.ptx": binary})
    with pytest.raises(attnres.BundleError,
                       match="exactly one binary expected"):
        attnres.load(none)


def test_the_backward_says_it_skips_null_gradient_entries(runtime):
    # The eager op passes null entries of the gradient table (sources that
    # need no gradient) only to a backward whose op entry says this; one
    # from an older compiler stores through every entry.
    assert runtime.op("backward").get("skips_null_gradients") is True
    assert runtime.op("forward").get("skips_null_gradients") is None


def test_only_write_tags_backwards_say_they_take_tagged_entries(
        runtime, tmp_path):
    # The history tags an entry (bit 0) to have an accumulating backward
    # write that row over only where the op entry says so: a backward
    # compiled without write-tags (the default) would store at the odd
    # address.
    assert runtime.op("backward").get("writes_tagged_gradients") is None
    assert runtime.op("forward").get("writes_tagged_gradients") is None
    attnres.compile("train:L=2,D=64,dtype=bf16,accumulate", target="sm_90",
                    format="isa", output=tmp_path / "tags",
                    kernel_options="write-tags=1")
    tags = attnres.inspect(tmp_path / "tags")
    assert tags.op("backward").get("writes_tagged_gradients") is True
    assert tags.op("forward").get("writes_tagged_gradients") is None
