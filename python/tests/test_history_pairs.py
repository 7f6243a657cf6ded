"""The residual history's eager launch path on the CPU: which launches a
step makes, with what tables, and that the gradients they add up to are
the list op's. A stand-in for attnres.ops's launches (the compiled kernels
need a GPU) reads the sources and writes the gradient rows through the
tables of row addresses the history builds, by the float64 formulas; so
the bookkeeping of paired reads (attnres.nn._Deferred: the later read of
a pair adds only into the row the earlier one does not read, the earlier
read's two-query pass adds both reads' contributions to the rest, or the
later read's own flush does where its partner cannot take them) is
checked here, and the kernels on the GPU by
test/Integration/GPU/history.py."""

import ctypes
import re
import sys
import types

import pytest

torch = pytest.importorskip("torch")
numpy = pytest.importorskip("numpy")

from attnres import kernels, nn  # noqa: E402
from attnres.reference import (attnres_backward_reference,  # noqa: E402
                               attnres_reference)

from test_history import (BlockStack, Stack,  # noqa: E402
                          _matches_the_list_op, block_with_extra_source)


class FakeLaunches:
    """attnres.ops's eager launches on CPU tensors. A table is an int64
    tensor of data_ptr()s; the tensors behind them are those the history
    handed to dense() (its rows) and the rows of the gradient buffer
    (_packed_pointers). Each launch is logged as (kind, queries,
    accumulates, the sources read, the gradient rows written or added
    to)."""

    def __init__(self):
        self.tensors = {}
        self.log = []
        self.bundles = set()   # (key, kernel options) of the plans made
        # Whether the compiler knows write-tags: the manifest fact of the
        # bundles compiled with it.
        self.writes_tagged_gradients = True
        self.overwritten = []   # (sources, row) of each tagged entry written

    def _row_at(self, address, dtype, N, D):
        """The [N, D] row at `address`: one the history handed over, else
        memory the history allocated itself (an extra source's gradient),
        seen through its address as a kernel sees it."""
        row = self.tensors.get(address)
        if row is not None:
            return row
        element = {torch.float32: ctypes.c_float,
                   torch.float64: ctypes.c_double}[dtype]
        memory = ctypes.cast(address, ctypes.POINTER(element * (N * D)))
        return torch.from_numpy(
            numpy.frombuffer(memory.contents, dtype=numpy.dtype(element)))\
            .view(N, D)

    # --- tables -----------------------------------------------------------

    def dense(self, tensor):
        tensor = tensor.contiguous()
        self.tensors[tensor.data_ptr()] = tensor
        return tensor

    def _packed_pointers(self, packed):
        for row in packed.unbind(0):
            self.tensors[row.data_ptr()] = row
        return tuple(row.data_ptr() for row in packed.unbind(0))

    def _pointer_table(self, pointers, device, packed=None):
        return torch.tensor(pointers, dtype=torch.int64)

    def _packed_table(self, packed):
        return self._pointer_table(self._packed_pointers(packed), None)

    def _raw_stream(self, index):
        return 0

    def _weight_signature(self, tensor):
        return None if tensor is None else (tensor.shape, tensor.dtype, -1)

    # --- plans ------------------------------------------------------------

    def _runtime(self, key, device, kernel_options=""):
        self.bundles.add((key, kernel_options))
        return kernels.bundle_name(key, kernel_options)

    def _BackwardLaunch(self, name, N):
        return types.SimpleNamespace(
            accumulates="accumulate" in name, skips_null_gradients=True,
            writes_tagged_gradients=self.writes_tagged_gradients and
            "+write-tags=1" in name)

    def _Plan(self, call, device, kernel_options=""):
        self._runtime(call.spec(), device, kernel_options)
        return types.SimpleNamespace(
            call=call, device=device,
            backward=self._BackwardLaunch(call.spec(), call.N),
            keeps_o=call.save == "o_pre" and not call.output_norm)

    # --- launches ---------------------------------------------------------

    def _sources(self, plan, table):
        return torch.stack([self.tensors[int(p)] for p in
                            table[:plan.call.L]])

    def _launch_forward_from(self, plan, table, dtype, query, key_norm,
                             output_norm):
        sources = self._sources(plan, table)
        o, lse = attnres_reference(
            sources.double(), query.double(),
            key_norm_weight=None if key_norm is None else key_norm.double(),
            output_norm_weight=None if output_norm is None else
            output_norm.double(), eps=plan.call.eps, scale=plan.call.scale,
            return_lse=True)
        self.log.append(("forward", plan.call.M, False, plan.call.L, ()))
        return o.to(dtype), lse.float().reshape(plan.call.M, -1), None, None

    def _launch_backward_into(self, plan, launch, table, grad_table, dtype,
                              query, key_norm, output_norm, grad, lse, saved,
                              residual):
        sources = self._sources(plan, table)
        dv, dq, dg, dh = attnres_backward_reference(
            sources.double(), query.double(), grad.double(),
            key_norm_weight=None if key_norm is None else key_norm.double(),
            output_norm_weight=None if output_norm is None else
            output_norm.double(), eps=plan.call.eps, scale=plan.call.scale,
            lse=lse, o_pre=saved)
        written = []
        for s in range(plan.call.L):
            entry = int(grad_table[s])
            # Bit 0 tags a row to be written over; rows are 16-byte aligned.
            pointer, overwrite = entry & ~1, bool(entry & 1)
            if pointer == 0:   # a null entry: neither read nor written
                continue
            assert pointer % 16 == 0, "a gradient row's address is aligned"
            assert launch.writes_tagged_gradients or not overwrite
            row = self._row_at(pointer, dtype, plan.call.N, plan.call.D)
            if overwrite:
                self.overwritten.append((plan.call.L, s))
            adds = launch.accumulates and not overwrite
            row.copy_(dv[s] + row.double() if adds else dv[s])
            written.append(s)
        self.log.append(("backward", plan.call.M, launch.accumulates,
                         plan.call.L, tuple(written)))
        return dq.to(query.dtype), \
            None if dg is None else dg.to(key_norm.dtype), \
            None if dh is None else dh.to(output_norm.dtype)


@pytest.fixture
def launches(monkeypatch):
    """The history's CPU rows taken through its eager launch path, with
    FakeLaunches for attnres.ops (which needs PyTorch >= 2.4), and every
    read large enough to pair from three rows up."""
    fake = FakeLaunches()
    module = types.ModuleType("attnres.ops")
    for name in dir(fake):
        if not name.startswith("__"):
            setattr(module, name, getattr(fake, name))
    import attnres
    monkeypatch.setitem(sys.modules, "attnres.ops", module)
    monkeypatch.setattr(attnres, "ops", module, raising=False)
    monkeypatch.setattr(nn, "_launches_kernels", lambda row: True)
    monkeypatch.setattr(nn, "_PAIR_MIN_ROWS", 3)
    monkeypatch.setattr(nn, "_PAIR_MIN_ROW_BYTES", 0)
    return fake


def _backwards(log):
    return [entry[1:] for entry in log if entry[0] == "backward"]


def _grads_or_zeros(model, embedding, run):
    """The output and every gradient of `run(embedding)` (zeros for a
    parameter the loss does not use)."""
    model.zero_grad(set_to_none=True)
    leaf = embedding.detach().clone().requires_grad_()
    out = run(leaf)
    gen = torch.Generator().manual_seed(7)
    (out * torch.randn(out.shape, generator=gen)).sum().backward()
    return [torch.zeros_like(p) if p.grad is None else p.grad.clone()
            for p in model.parameters()] + [leaf.grad], out


def _step(L, N=7, D=16, R=8, seed=0):
    model = Stack(L, D, R=R, seed=seed)
    embedding = torch.randn(N, D, generator=torch.Generator().manual_seed(1))
    history = nn.ResidualHistory(capacity=L + 1)
    return model, embedding, history


def test_pairs_match_the_list_op(launches):
    """L = 5 layers and a last read: reads of 6 ... 1 rows. Reads 6 and 5
    pair, then 4 and 3; 2 and 1 run alone. The gradients are the list
    op's."""
    model, embedding, history = _step(5)
    _matches_the_list_op(model, embedding,
                         lambda e: model.with_history(e, history))
    # (M, accumulates, rows read, gradient rows written) of each backward
    # of the history's step, the last read's first.
    assert _backwards(launches.log)[-6:] == [
        (1, False, 6, (5,)),                 # read 6: row 5 only, writing
        (2, False, 5, (0, 1, 2, 3, 4)),      # reads 6 + 5 write rows 0..4
        (1, True, 4, (3,)),                  # read 4: row 3 only
        (2, True, 3, (0, 1, 2)),             # reads 4 + 3 add to rows 0..2
        (1, True, 2, (0, 1)),
        (1, True, 1, (0,)),
    ]
    # The pairs' passes run the bundles attnres.nn.pair_keys lists for
    # prebuilding, and the reads theirs, without kernel options.
    paired = set()
    for count in (5, 3):
        call = nn._check(torch.zeros(count, 7, 16), model.queries[0],
                         model.key_norms[0], None, 1e-6, 1.0, "o_pre")
        paired.update(nn.pair_keys(call))
    assert {b for b in launches.bundles if "M=2" in b[0]} == paired
    assert all(options == "" for key, options in launches.bundles
               if "M=1" in key)


@pytest.mark.parametrize("tagged", [True, False])
def test_an_extra_sources_gradient_is_written_over_not_zeroed(launches,
                                                             tagged):
    """A Block read's extra source (its block's partial sum) gets its
    gradient from the accumulating backward that adds into the rows. Where
    the bundle takes tagged entries (compiled with write-tags, which only
    these reads' accumulating backwards are), that entry (the last) is
    tagged and the row written over: no zeros filled and read back. A
    bundle without the manifest fact adds into zeros. Both give the list
    op's gradients."""
    launches.writes_tagged_gradients = tagged
    blocks, S, N, D = 3, 3, 6, 16
    model = BlockStack(blocks, S, D)
    embedding = torch.randn(N, D, generator=torch.Generator().manual_seed(5))
    history = nn.ResidualHistory(capacity=blocks)
    _matches_the_list_op(
        model, embedding,
        lambda e: block_with_extra_source(model, e, history))
    # Reads 2 and 3 of each block have a partial sum: six reads, of which
    # the step's last (its first backward) writes every row anyway. The
    # other five, last first, read 3, 3, 2, 2 and 1 rows, and their partial
    # sum is the last entry of each table.
    if tagged:
        assert launches.overwritten == [(4, 3), (3, 2), (3, 2), (2, 1),
                                        (2, 1)]
    else:
        assert launches.overwritten == []
    # The reads with a partial sum accumulate through bundles compiled with
    # write-tags (nn.extra_source_keys); every other bundle without it.
    # (nn.extra_source_keys lists them for prebuilding.)
    tagging = {key for key, options in launches.bundles
               if options == nn._TAG_KERNEL_OPTIONS}
    assert all(",accumulate," in key for key in tagging)
    assert {int(re.search(r"L=(\d+),", key).group(1))
            for key in tagging} == {2, 3, 4}
    assert all(options in ("", nn._TAG_KERNEL_OPTIONS)
               for _, options in launches.bundles)


def test_a_refused_partner_gets_the_reads_flushed(launches, monkeypatch):
    """Where the next backward cannot take a deferred read's rows (here:
    every partner refused), the deferred read adds into them on its own
    first (its flush: every row but the last)."""
    monkeypatch.setattr(nn._Deferred, "pairs_with", lambda self, ctx: False)
    model, embedding, history = _step(4)
    _matches_the_list_op(model, embedding,
                         lambda e: model.with_history(e, history))
    assert _backwards(launches.log)[-8:] == [
        (1, False, 5, (4,)),                 # read 5 defers rows 0..3
        (1, False, 5, (0, 1, 2, 3)),         # its flush, writing
        (1, True, 4, (3,)),                  # read 4 defers rows 0..2
        (1, True, 4, (0, 1, 2)),             # its flush
        (1, True, 3, (2,)),
        (1, True, 3, (0, 1)),
        (1, True, 2, (0, 1)),                # under three rows: alone
        (1, True, 1, (0,)),
    ]


def test_small_reads_do_not_pair(launches, monkeypatch):
    """Below _PAIR_MIN_ROWS rows, or rows under _PAIR_MIN_ROW_BYTES, every
    read's backward adds into all its rows."""
    for name, value in (("_PAIR_MIN_ROWS", 7), ("_PAIR_MIN_ROW_BYTES",
                                                7 * 16 * 4 + 1)):
        monkeypatch.setattr(nn, "_PAIR_MIN_ROWS", 3)
        monkeypatch.setattr(nn, "_PAIR_MIN_ROW_BYTES", 0)
        monkeypatch.setattr(nn, name, value)
        launches.log.clear()
        model, embedding, history = _step(5)
        _matches_the_list_op(model, embedding,
                             lambda e: model.with_history(e, history))
        backwards = _backwards(launches.log)[-6:]
        assert [b[:2] for b in backwards] == [(1, False)] + [(1, True)] * 5
        assert [b[3] for b in backwards] == [
            tuple(range(count)) for count in range(6, 0, -1)]


def test_a_read_without_a_gradient_flushes_its_partner(launches):
    """A read whose output no loss uses gets no gradient: the deferred read
    before it in the backward adds its rows on its own, and the read adds
    nothing. (Layer 4 here takes layer 3's output, not its read's.)"""
    from test_history import _close
    model, embedding, history = _step(4)
    q, g = model.queries, model.key_norms

    def with_history(e):
        history.start(e)
        y = e
        for i in range(4):
            x = history.attend(q[i], key_norm_weight=g[i])
            y = model.layer(i, x if i < 3 else y)
            history.append(y)
        return history.attend(q[-1], key_norm_weight=g[-1])

    def with_list(e):
        outputs = [e]
        for i in range(4):
            x = attnres_reference(torch.stack(outputs), q[i],
                                  key_norm_weight=g[i])
            outputs.append(model.layer(i, x if i < 3 else outputs[-1]))
        return attnres_reference(torch.stack(outputs), q[-1],
                                 key_norm_weight=g[-1])
    expected, out_list = _grads_or_zeros(model, embedding, with_list)
    got, out = _grads_or_zeros(model, embedding, with_history)
    assert _close(out, out_list, 1e-6)
    for a, b in zip(got, expected):
        assert _close(a, b, 1e-5), (a - b).abs().max()
    assert _backwards(launches.log)[-5:] == [
        (1, False, 5, (4,)),                 # the last read defers 0..3
        (1, False, 5, (0, 1, 2, 3)),         # read 4 has no gradient
        (1, True, 3, (2,)),                  # read 3 defers rows 0..1
        (2, True, 2, (0, 1)),                # and pairs with read 2
        (1, True, 1, (0,)),
    ]


def test_an_entry_of_the_row_table_is_written_when_its_address_changes(
        launches, monkeypatch):
    """An append whose row is at the address its entry of the row table
    holds already (a training loop's rows come back at the same addresses)
    writes nothing; one at another address writes its entry. The reads
    find every row either way."""
    model, embedding, history = _step(3)
    rows = [torch.randn(7, 16) for _ in range(3)]
    history.start(embedding)
    written = []

    class Entry:
        def __init__(self, index, entry):
            self.index, self.entry = index, entry

        def fill_(self, pointer):
            written.append(self.index)
            self.entry.fill_(pointer)
    history._row_entries = tuple(
        Entry(i, e) for i, e in enumerate(history._row_entries))

    def step(rows):
        history.start(embedding)
        with torch.no_grad():
            for row in rows:
                history.attend(model.queries[0],
                               key_norm_weight=model.key_norms[0])
                history.append(row)
            out = history.attend(model.queries[0],
                                 key_norm_weight=model.key_norms[0])
        sources = [embedding] + rows
        assert history._state._row_table[:4].tolist() == [
            s.data_ptr() for s in sources]
        expected = attnres_reference(
            torch.stack(sources).double(), model.queries[0].double(),
            key_norm_weight=model.key_norms[0].double())
        assert torch.allclose(out.double(), expected, atol=1e-6)
    step(rows)
    assert written == [1, 2, 3]
    written.clear()
    step(rows)
    assert written == []
    step([rows[0], torch.randn(7, 16), rows[2]])
    assert written == [2]
    written.clear()
    step(rows)
    assert written == [2]
    # Entries written during a CUDA graph capture are written every time
    # after: the graph's replays write them too, unseen.
    written.clear()
    monkeypatch.setattr(nn, "_capturing", lambda tensor: True)
    step(rows)
    monkeypatch.setattr(nn, "_capturing", lambda tensor: False)
    for _ in range(2):
        step(rows)
    assert written == [0, 1, 2, 3] * 3
