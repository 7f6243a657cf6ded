"""attnres.nn.ResidualHistory on the CPU (the float64 formulas of
attnres.reference behind the same buffers and autograd structure as the
GPU kernels): a Full AttnRes stack built on it has the gradients of the
same stack built on the list op, every layer output's gradient comes back
once every later reader has added into it, activation checkpointing
recomputes what the first run read, and misuse is refused by rule. The
kernels themselves run on the GPU (test/Integration/GPU/history.py)."""

import pytest

torch = pytest.importorskip("torch")

from attnres.nn import HistoryError, ResidualHistory  # noqa: E402
from attnres.reference import attnres_reference  # noqa: E402


def _started(capacity, D=8):
    """A history started on a [4, D] leaf, and a [D] query: (history,
    query, first row)."""
    history = ResidualHistory(capacity=capacity)
    q = torch.randn(D, requires_grad=True)
    e = torch.randn(4, D, requires_grad=True)
    history.start(e)
    return history, q, e


class Stack(torch.nn.Module):
    """Full AttnRes: layer i reads the embedding and every earlier output,
    then a D x D linear layer (with a tanh, so that gradients depend on the
    values); a last read gives the output."""

    def __init__(self, layers, D, R, seed=0, M=None):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)

        def param(*shape, mean=0.0, std=1.0):
            return torch.nn.Parameter(
                torch.randn(*shape, generator=gen) * std + mean)
        lead = () if M is None else (M,)
        self.queries = torch.nn.ParameterList(
            [param(*lead, R, std=0.5) for _ in range(layers + 1)])
        self.key_norms = torch.nn.ParameterList(
            [param(R, mean=1.0, std=0.1) for _ in range(layers + 1)])
        self.weights = torch.nn.ParameterList(
            [param(D, D, std=D ** -0.5) for _ in range(layers)])

    def layer(self, i, x):
        if x.dim() == self.weights[i].dim() + 1:  # M queries: their mean
            x = x.mean(0)
        return torch.tanh(x @ self.weights[i])

    def with_list(self, embedding):
        outputs = [embedding]
        for i in range(len(self.weights)):
            x = attnres_reference(torch.stack(outputs), self.queries[i],
                                  key_norm_weight=self.key_norms[i])
            outputs.append(self.layer(i, x))
        return attnres_reference(torch.stack(outputs), self.queries[-1],
                                 key_norm_weight=self.key_norms[-1])

    def with_history(self, embedding, history, checkpointed=False):
        history.start(embedding)
        for i in range(len(self.weights)):
            def body(i=i):
                x = history.attend(self.queries[i],
                                   key_norm_weight=self.key_norms[i])
                return self.layer(i, x)
            y = history.checkpoint(body) if checkpointed else body()
            history.append(y)
        return history.attend(self.queries[-1],
                              key_norm_weight=self.key_norms[-1])


def _grads(model, embedding, run):
    model.zero_grad()
    leaf = embedding.detach().clone().requires_grad_()
    out = run(leaf)
    gen = torch.Generator().manual_seed(7)
    (out * torch.randn(out.shape, generator=gen)).sum().backward()
    return [p.grad.clone() for p in model.parameters()] + [leaf.grad], out


def _close(a, b, tol):
    """Relative to b, with b's norm floored at 1: a gradient that is zero
    by a softmax over one source (the first layer's query) comes out of the
    formulas as float32 rounding, not 0."""
    return (a - b).norm() <= tol * max(b.norm(), 1.0)


def _matches_the_list_op(model, embedding, run, out_tol=1e-6, tol=1e-5):
    """The output and every gradient of `run(embedding)` against the same
    model on the list op (the float64 formulas)."""
    expected, out_list = _grads(model, embedding, model.with_list)
    got, out = _grads(model, embedding, run)
    assert _close(out, out_list, out_tol)
    for g, e in zip(got, expected):
        assert _close(g, e, tol), (g - e).abs().max()


@pytest.mark.parametrize("M", [None, 3])
@pytest.mark.parametrize("checkpointed", [False, True])
def test_stack_matches_the_list_op(M, checkpointed):
    L, N, D = 5, 7, 16
    model = Stack(L, D, R=8, M=M)
    embedding = torch.randn(N, D, generator=torch.Generator().manual_seed(1))
    history = ResidualHistory(capacity=L + 1)
    _matches_the_list_op(
        model, embedding,
        lambda e: model.with_history(e, history, checkpointed))


def _checkpointed_layers(model, history, per_checkpoint):
    """A Full stack whose checkpointed functions each read, compute and
    append `per_checkpoint` whole layers."""
    L = len(model.weights)

    def layers(first):
        y = None
        for i in range(first, first + per_checkpoint):
            y = model.layer(i, history.attend(
                model.queries[i], key_norm_weight=model.key_norms[i]))
            history.append(y)
        return y

    def run(e):
        history.start(e)
        for first in range(0, L, per_checkpoint):
            history.checkpoint(layers, first)
        return history.attend(model.queries[-1],
                              key_norm_weight=model.key_norms[-1])
    return run


@pytest.mark.parametrize("per_checkpoint", [1, 2])
def test_checkpointed_layers_that_append(per_checkpoint):
    # A read after an append inside a checkpointed function reads the new
    # row too, and the recomputation reads what the first run read and
    # appends nothing.
    L, N, D = 4, 7, 16
    model = Stack(L, D, R=8)
    embedding = torch.randn(N, D, generator=torch.Generator().manual_seed(1))
    history = ResidualHistory(capacity=L + 1)
    _matches_the_list_op(model, embedding,
                         _checkpointed_layers(model, history, per_checkpoint))
    assert len(history) == L + 1


def test_a_recomputation_that_reads_more_is_refused():
    history, q, _ = _started(capacity=3)
    runs = []

    def body():
        runs.append(True)
        x = history.attend(q)
        if len(runs) > 1:
            x = x + history.attend(q)
        return torch.tanh(x)
    out = history.checkpoint(body)
    # (Raised in the checkpoint's unpack hook, which some PyTorch versions
    # wrap in a RuntimeError.)
    with pytest.raises((HistoryError, RuntimeError), match="more times in "
                       "its recomputation"):
        out.sum().backward()


def test_second_step_reuses_the_buffers():
    L, N, D = 3, 5, 8
    model = Stack(L, D, R=8)
    history = ResidualHistory(capacity=L + 1)
    for seed in (2, 3):
        embedding = torch.randn(N, D,
                                generator=torch.Generator().manual_seed(seed))
        expected, _ = _grads(model, embedding, model.with_list)
        got, _ = _grads(model, embedding,
                        lambda e: model.with_history(e, history))
        buffers = history._state._grads.data_ptr()
        if seed == 2:
            first = buffers
        for g, e in zip(got, expected):
            assert _close(g, e, 1e-5)
    assert buffers == first


@pytest.mark.parametrize("path", ["itself", "added", "viewed", "cloned"])
@pytest.mark.parametrize("between", ["zero", "accumulate"])
def test_a_leaf_row_keeps_its_own_gradient_across_steps(between, path):
    # A gradient that reaches a leaf as it is (the leaf appended itself,
    # added to a constant as in an adversarial perturbation, viewed or
    # cloned) is kept as the leaf's .grad: it must not be the gradient
    # buffer's row, which the next step overwrites and adds into. "zero":
    # a training loop zeroing the gradients in place between steps;
    # "accumulate": two micro-batches summed into .grad.
    L, N, D = 3, 5, 8
    model = Stack(L, D, R=8)
    gen = torch.Generator().manual_seed(4)
    leaf = torch.nn.Parameter(torch.randn(N * D if path == "viewed" else
                                          (N, D), generator=gen))
    base = torch.randn(N, D, generator=gen)
    weights = torch.randn(N, D, generator=gen)
    history = ResidualHistory(capacity=L + 1)

    def first():
        return {"itself": lambda: leaf, "added": lambda: base + leaf,
                "viewed": lambda: leaf.view(N, D),
                "cloned": lambda: leaf.clone()}[path]()

    def step(run):
        (run(first()) * weights).sum().backward()

    step(model.with_list)
    once = leaf.grad.clone()
    leaf.grad = None
    step(lambda e: model.with_history(e, history))
    assert _close(leaf.grad, once, 1e-5)
    if between == "zero":
        leaf.grad.zero_()
    step(lambda e: model.with_history(e, history))
    expected = once if between == "zero" else 2 * once
    assert _close(leaf.grad, expected, 1e-5), \
        (leaf.grad - expected).abs().max()
    grads = history._state._grads
    start = grads.data_ptr()
    end = start + grads.numel() * grads.element_size()
    assert not start <= leaf.grad.data_ptr() < end


def test_a_layer_output_gets_a_view_of_the_buffer():
    # The copy above is for leaves only: a layer's output (here a linear
    # layer's, 2-D and 3-D, with a bias) gets its row of the buffer.
    from attnres.nn import _may_reach_a_leaf
    x = torch.randn(2, 3, 4, requires_grad=True)
    linear = torch.nn.Linear(4, 4)
    for output in (linear(x), linear(x[0]), torch.tanh(x[0] @ linear.weight),
                   x * 2):
        assert not _may_reach_a_leaf(output)
    for output in (x, x + 1, x.view(6, 4), x.permute(1, 0, 2),
                   torch.cat([x, x]), x - 1):
        assert _may_reach_a_leaf(output)


def _dropped_step(read, backward, release=False):
    """Weak references to a history and its embedding after one step that
    `read` builds on them (and its backward where `backward`, then
    history.release() where `release`), once nothing else holds them."""
    import weakref
    L, N, D = 3, 5, 8
    model = Stack(L, D, R=8)
    history = ResidualHistory(capacity=L + 1)
    embedding = torch.randn(N, D, requires_grad=True)
    out = read(model, embedding, history)
    if backward:
        out.sum().backward()
    if release:
        history.release()
    return weakref.ref(history), weakref.ref(embedding)


@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize("kind", ["full", "block", "extra source",
                                  "checkpointed"])
def test_a_dropped_history_frees_its_step(kind, backward):
    # The reads' autograd functions must not hold the history, which holds
    # the last read's link: a cycle through autograd's graph is one the
    # garbage collector cannot free, and it kept the step's graph, rows and
    # saved tensors for good. A checkpointed function that closes over the
    # history is held by the graph for its recomputation: a step dropped
    # without its backward needs release() (test_release_...).
    import gc

    def read(model, embedding, history):
        if kind == "full":
            return model.with_history(embedding, history)
        if kind == "checkpointed":
            return model.with_history(embedding, history, checkpointed=True)
        block = BlockStack(2, 2, embedding.shape[-1])
        if kind == "block":
            return block.with_history(embedding, history)
        return block_with_extra_source(block, embedding, history)
    history, embedding = _dropped_step(
        read, backward, release=kind == "checkpointed" and not backward)
    gc.collect()
    assert history() is None and embedding() is None


def test_release_frees_a_checkpointed_step_dropped_unrun():
    import gc

    def read(model, embedding, history):
        return model.with_history(embedding, history, checkpointed=True)
    history, embedding = _dropped_step(read, backward=False)
    gc.collect()
    # Without release the graph keeps the checkpointed function, which
    # keeps the history (what release is for: if this starts to hold,
    # autograd's graph became collectable and the docs can say so).
    assert history() is not None
    history, embedding = _dropped_step(read, backward=False, release=True)
    gc.collect()
    assert history() is None and embedding() is None


def test_release_ends_the_step():
    history, q, e = _started(capacity=3)
    out = history.attend(q)
    history.release()
    assert len(history) == 0
    with pytest.raises(HistoryError, match="its rows were released"):
        out.sum().backward()
    with pytest.raises(HistoryError, match="before start"):
        history.attend(q)
    with pytest.raises(HistoryError, match="before start"):
        history.append(e)
    history.start(e)  # a new step after it
    history.append(torch.tanh(history.attend(q)))
    history.attend(q).sum().backward()
    assert e.grad is not None


def test_an_output_read_by_no_one_gets_no_history_gradient():
    # The last output is appended but never read: its gradient is the
    # model's alone.
    history, q, e = _started(capacity=3)
    y = (history.attend(q) * 2).requires_grad_()
    history.append(y)
    (y.sum() + e.sum()).backward()
    expected = torch.ones_like(e)
    o = attnres_reference(e.detach()[None], q.detach())
    assert torch.allclose(o, e.detach())  # one source: o is the source
    assert torch.allclose(e.grad, expected + 2 * torch.ones_like(e))


@pytest.mark.parametrize("unused", ["first", "middle", "last"])
def test_a_read_no_loss_uses_leaves_its_query_without_gradient(unused):
    # As autograd does for an unused output (an optimizer then skips the
    # query: no weight decay, no momentum on a zero gradient); the other
    # reads' gradients are the list op's.
    L, N, D = 3, 5, 8
    model = Stack(L, D, R=8)
    spare = torch.nn.Parameter(torch.randn(8))
    embedding = torch.randn(N, D, generator=torch.Generator().manual_seed(2))
    history = ResidualHistory(capacity=L + 1)
    at = {"first": 0, "middle": 1, "last": L}[unused]

    def run(e):
        history.start(e)
        for i in range(L + 1):
            if i == at:
                history.attend(spare)  # read, never used
            if i == L:
                break
            history.append(model.layer(i, history.attend(
                model.queries[i], key_norm_weight=model.key_norms[i])))
        return history.attend(model.queries[-1],
                              key_norm_weight=model.key_norms[-1])
    _matches_the_list_op(model, embedding, run)
    assert spare.grad is None


def _small_stack_values(seed, queries, D=8, N=3):
    """An embedding, a D x D weight and `queries` queries, for tests that
    build their own stack."""
    gen = torch.Generator().manual_seed(seed)
    e = torch.randn(N, D, generator=gen)
    W = torch.randn(D, D, generator=gen) * D ** -0.5
    return e, W, [torch.randn(D, generator=gen) for _ in range(queries)]


def _reader(history):
    """read(rows, q) on the history: a new step at a lone row, the rows not
    yet appended appended, then AttnRes over all of them."""
    def read(rows, q):
        if len(rows) == 1:
            history.start(rows[0])
        for row in rows[len(history):]:
            history.append(row)
        return history.attend(q)
    return read


def _list_read(rows, q):
    return attnres_reference(torch.stack(rows), q)


def test_reads_not_ordered_by_their_data_get_every_gradient():
    # Two reads of the same rows whose outputs meet only in the loss, and
    # a read whose output reaches the loss only through a later row: each
    # row's gradient is returned complete, whatever order autograd finds.
    e, W, qs = _small_stack_values(11, 4)

    def run(read):
        leaves = [t.clone().requires_grad_() for t in [e, W] + qs]
        e_, W_, q0, q1, q2, q3 = leaves
        rows = [e_]
        y = torch.tanh(read(rows, q0) @ W_)
        rows.append(y)
        a, b = read(rows, q1), read(rows, q2)
        unused_but_appended = torch.tanh(a @ W_)
        rows.append(unused_but_appended)
        out = read(rows, q3) * b
        (out * torch.arange(out.numel()).view(out.shape)).sum().backward()
        return [t.grad for t in leaves]

    history = ResidualHistory(capacity=3)
    for g, e_ in zip(run(_reader(history)), run(_list_read)):
        assert _close(g, e_, 1e-5), (g - e_).abs().max()


def test_a_row_is_the_appended_output_itself():
    history = ResidualHistory(capacity=2)
    e = torch.randn(3, 8)
    history.start(e)
    y = torch.randn(3, 8)
    history.append(y)
    assert [r.data_ptr() for r in history._state._rows] == [e.data_ptr(),
                                                     y.data_ptr()]


def test_a_row_modified_in_place_after_append_is_refused():
    history = ResidualHistory(capacity=2)
    q = torch.randn(8, requires_grad=True)
    history.start(torch.randn(3, 8, requires_grad=True))
    y = history.attend(q) * 2
    history.append(y)
    out = history.attend(q)
    with torch.no_grad():
        y.add_(1)
    with pytest.raises(HistoryError, match=r"row 1 of the residual history "
                       r"was modified in place after it was appended"):
        out.sum().backward()


def test_misuse_is_refused_by_rule():
    D = 8
    history = ResidualHistory(capacity=2)
    with pytest.raises(HistoryError, match="append before start"):
        history.append(torch.zeros(3, D))
    with pytest.raises(HistoryError, match="attend before start"):
        history.attend(torch.zeros(D))
    history.start(torch.zeros(3, D))
    with pytest.raises(HistoryError, match=r"row 1 must be a \[3, 8\] "
                       r"torch.float32 tensor on cpu \(as the first row\), "
                       r"got \[3, 4\] torch.float32"):
        history.append(torch.zeros(3, 4))
    with pytest.raises(HistoryError, match="got \\[3, 8\\] torch.float16"):
        history.append(torch.zeros(3, D, dtype=torch.float16))
    history.append(torch.zeros(3, D))
    with pytest.raises(HistoryError, match="append past the capacity: the "
                       "history holds 2 rows"):
        history.append(torch.zeros(3, D))
    for bad in (0, -1, 2.0, True):
        with pytest.raises(HistoryError, match="capacity must be an int"):
            ResidualHistory(bad)
    with pytest.raises(HistoryError, match="bf16, f16 or f32"):
        ResidualHistory(2).start(torch.zeros(3, D, dtype=torch.float64))


def test_a_backward_after_the_next_start_is_refused():
    history, q, _ = _started(capacity=3)
    out = history.attend(q)
    history.start(torch.randn(4, 8))   # overwrites the rows `out` read
    with pytest.raises(HistoryError, match="its rows were released"):
        out.sum().backward()


def test_a_backward_that_creates_a_graph_is_refused():
    # A gradient penalty through a read would differentiate its backward
    # with the rows as constants: a second derivative silently missing
    # the rows' part.
    history, q, x = _started(capacity=2)
    history.append(torch.tanh(x))
    out = history.attend(q)
    with pytest.raises(HistoryError, match="create_graph=True"):
        torch.autograd.grad(out.sum(), q, create_graph=True)


def test_a_second_backward_is_refused():
    history, q, e = _started(capacity=3)
    history.append(torch.tanh(history.attend(q)))
    out = history.attend(q)
    out.sum().backward(retain_graph=True)
    with pytest.raises(HistoryError, match="a second backward"):
        out.sum().backward()


class BlockStack(torch.nn.Module):
    """Block AttnRes: blocks of S layers; layer m of block n reads the
    embedding, the sums of the n - 1 completed blocks and the partial sum of
    block n's earlier outputs (none for m = 0), with its own query and
    output-norm weight and the block's key norm; the block's sum is its
    summary."""

    def __init__(self, blocks, S, D, seed=0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)

        def param(*shape, mean=0.0, std=1.0):
            return torch.nn.Parameter(
                torch.randn(*shape, generator=gen) * std + mean)
        self.S = S
        self.queries = torch.nn.ParameterList(
            [param(S, D, std=0.5) for _ in range(blocks)])
        self.key_norms = torch.nn.ParameterList(
            [param(D, mean=1.0, std=0.1) for _ in range(blocks)])
        self.pre_norms = torch.nn.ParameterList(
            [param(S, D, mean=1.0, std=0.1) for _ in range(blocks)])
        self.weights = torch.nn.ParameterList(
            [param(D, D, std=D ** -0.5) for _ in range(blocks * S)])

    def with_list(self, embedding):
        summaries = [embedding]
        for n in range(len(self.queries)):
            partial = None
            for m in range(self.S):
                sources = summaries + ([partial] if partial is not None
                                       else [])
                x = attnres_reference(
                    torch.stack(sources), self.queries[n][m],
                    key_norm_weight=self.key_norms[n],
                    output_norm_weight=self.pre_norms[n][m])
                y = torch.tanh(x @ self.weights[n * self.S + m])
                partial = y if partial is None else partial + y
            summaries.append(partial)
        return partial

    def with_history(self, embedding, history):
        history.start(embedding)
        for n in range(len(self.queries)):
            read = history.read_block(self.queries[n],
                                      key_norm_weight=self.key_norms[n])
            partial = None
            for m in range(self.S):
                x = read.input(m, partial,
                               output_norm_weight=self.pre_norms[n][m])
                y = torch.tanh(x @ self.weights[n * self.S + m])
                partial = y if partial is None else partial + y
            if n + 1 < len(self.queries):
                history.append(partial)
        return partial


def block_with_extra_source(model, embedding, history):
    """Block AttnRes read layer by layer: the history's rows (embedding and
    completed blocks' sums) and the block's partial sum as an extra
    source."""
    history.start(embedding)
    for n in range(len(model.queries)):
        partial = None
        for m in range(model.S):
            x = history.attend(model.queries[n][m],
                               key_norm_weight=model.key_norms[n],
                               output_norm_weight=model.pre_norms[n][m],
                               extra_source=partial)
            y = torch.tanh(x @ model.weights[n * model.S + m])
            partial = y if partial is None else partial + y
        if n + 1 < len(model.queries):
            history.append(partial)
    return partial


def test_block_stack_with_an_extra_source_matches_the_list_op():
    blocks, S, N, D = 4, 3, 6, 16
    model = BlockStack(blocks, S, D)
    embedding = torch.randn(N, D, generator=torch.Generator().manual_seed(5))
    history = ResidualHistory(capacity=blocks)
    expected, out_list = _grads(model, embedding, model.with_list)
    got, out = _grads(model, embedding,
                      lambda e: block_with_extra_source(model, e, history))
    assert _close(out, out_list, 1e-5)
    for g, e in zip(got, expected):
        assert _close(g, e, 1e-5), (g - e).abs().max()


def test_an_extra_source_must_be_like_a_row():
    history = ResidualHistory(capacity=2)
    history.start(torch.zeros(3, 8))
    with pytest.raises(HistoryError, match=r"extra_source must be a \[3, 8\] "
                       r"torch.float32 tensor on cpu \(a row's\), got "
                       r"\[3, 4\]"):
        history.attend(torch.zeros(8), extra_source=torch.zeros(3, 4))


def test_block_stack_matches_the_list_op():
    blocks, S, N, D = 4, 3, 6, 16
    model = BlockStack(blocks, S, D)
    embedding = torch.randn(N, D, generator=torch.Generator().manual_seed(4))
    history = ResidualHistory(capacity=blocks)
    expected, out_list = _grads(model, embedding, model.with_list)
    got, out = _grads(model, embedding,
                      lambda e: model.with_history(e, history))
    assert _close(out, out_list, 1e-5)
    for g, e in zip(got, expected):
        assert _close(g, e, 1e-5), (g - e).abs().max()


def test_read_block_takes_one_query_tensor():
    history = ResidualHistory(capacity=2)
    history.start(torch.zeros(3, 8))
    with pytest.raises(HistoryError, match=r"one \[S, R\] tensor"):
        history.read_block(torch.zeros(8))


@pytest.fixture
def traced(monkeypatch):
    """Every start as if torch.compile were tracing it: the traced path
    runs eagerly (attnres::history_forward, or the list op where PyTorch
    has no custom ops; the compile tests below and the GPU run compile
    it)."""
    import attnres.nn
    monkeypatch.setattr(attnres.nn, "_tracing", lambda: True)


@pytest.mark.parametrize("M", [None, 3])
def test_a_traced_step_matches_the_list_op(traced, M):
    L, N, D = 4, 5, 16
    model = Stack(L, D, R=8, M=M)
    embedding = torch.randn(N, D, generator=torch.Generator().manual_seed(6))
    history = ResidualHistory(capacity=L + 1)
    _matches_the_list_op(model, embedding,
                         lambda e: model.with_history(e, history))
    # No eager gradient buffer: the chain's is the backward's own.
    assert history._state._grads is None


def test_a_traced_block_stack_matches_the_list_op(traced):
    blocks, S, N, D = 3, 2, 4, 16
    model = BlockStack(blocks, S, D)
    embedding = torch.randn(N, D, generator=torch.Generator().manual_seed(8))
    for run in (model.with_history,
                lambda e, h: block_with_extra_source(model, e, h)):
        history = ResidualHistory(capacity=blocks)
        expected, out_list = _grads(model, embedding, model.with_list)
        got, out = _grads(model, embedding, lambda e: run(e, history))
        assert _close(out, out_list, 1e-5)
        for g, e in zip(got, expected):
            assert _close(g, e, 1e-5), (g - e).abs().max()


def test_a_traced_step_keeps_the_rules(traced):
    history = ResidualHistory(capacity=2)
    history.start(torch.zeros(3, 8))
    assert len(history) == 1 and history.rows.shape == (1, 3, 8)
    with pytest.raises(HistoryError, match=r"row 1 must be a \[3, 8\]"):
        history.append(torch.zeros(3, 8, dtype=torch.float64))
    history.append(torch.ones(3, 8))
    with pytest.raises(HistoryError, match="append past the capacity"):
        history.append(torch.zeros(3, 8))


def test_a_step_started_eagerly_is_not_read_in_a_traced_region(
        monkeypatch):
    import attnres.nn
    history = ResidualHistory(capacity=2)
    history.start(torch.zeros(3, 8))
    monkeypatch.setattr(attnres.nn, "_tracing", lambda: True)
    for call in (lambda: history.attend(torch.zeros(8)),
                 lambda: history.append(torch.zeros(3, 8)),
                 lambda: history.read_block(torch.zeros(1, 8))):
        with pytest.raises(HistoryError, match=r"under torch.compile in a "
                           r"step started outside it"):
            call()


_compiles = pytest.mark.skipif(
    not hasattr(torch, "compile") or not hasattr(torch.library, "custom_op"),
    reason="torch.compile of the history needs PyTorch >= 2.4")


@_compiles
@pytest.mark.parametrize("M", [None, 3])
def test_a_compiled_step_matches_the_list_op(M):
    # torch.compile(fullgraph=True) on the CPU: the reads chain through
    # attnres::history_forward, whose backward adds into one buffer.
    L, N, D = 4, 5, 16
    model = Stack(L, D, R=8, M=M)
    embedding = torch.randn(N, D, generator=torch.Generator().manual_seed(9))
    history = ResidualHistory(capacity=L + 1)
    step = torch.compile(lambda e: model.with_history(e, history),
                         fullgraph=True)
    for _ in range(2):  # the second step replays the compiled graph
        _matches_the_list_op(model, embedding, step, out_tol=1e-5)


@_compiles
def test_a_compiled_block_stack_and_checkpoint_match_the_list_op():
    blocks, S, N, D = 3, 2, 4, 16
    model = BlockStack(blocks, S, D)
    embedding = torch.randn(N, D, generator=torch.Generator().manual_seed(10))
    history = ResidualHistory(capacity=blocks)
    _matches_the_list_op(model, embedding, torch.compile(
        lambda e: block_with_extra_source(model, e, history), fullgraph=True),
        out_tol=1e-5)
    # history.checkpoint inside a compiled step (its reads take the list
    # op: the chain may not change inside the checkpoint's region).
    model = Stack(3, D, R=8)
    history = ResidualHistory(capacity=4)
    _matches_the_list_op(model, embedding, torch.compile(
        lambda e: model.with_history(e, history, True), fullgraph=True),
        out_tol=1e-5)


def test_a_traced_append_inside_a_checkpoint_is_refused(traced):
    L, N, D = 2, 5, 16
    model = Stack(L, D, R=8)
    history = ResidualHistory(capacity=L + 1)
    with pytest.raises(HistoryError, match="append inside history."
                       "checkpoint under torch.compile"):
        _checkpointed_layers(model, history, 1)(torch.randn(N, D))


@pytest.mark.parametrize("traced", [False, True])
def test_a_read_without_autograd_leaves_the_gradients_to_the_others(
        monkeypatch, traced):
    # A read under no_grad (a diagnostic, say) takes no pending rows and
    # leaves the chain alone, eagerly and in a traced step: the next read
    # with autograd returns them.
    if traced:
        import attnres.nn
        monkeypatch.setattr(attnres.nn, "_tracing", lambda: True)
    e0, W0, qs0 = _small_stack_values(12, 3)

    def run(read, diagnose):
        e, W = e0.clone().requires_grad_(), W0.clone().requires_grad_()
        qs = [q.clone().requires_grad_() for q in qs0]
        rows = [e]
        y = torch.tanh(read(rows, qs[0]) @ W)
        rows.append(y)
        if diagnose:
            with torch.no_grad():
                read(rows, qs[1])
        read(rows, qs[2]).sum().backward()
        return [e.grad, W.grad, qs[0].grad, qs[2].grad]

    expected = run(_list_read, False)
    for g, e_ in zip(run(_reader(ResidualHistory(capacity=2)), True),
                     expected):
        assert g is not None and _close(g, e_, 1e-5)


def test_inference_mode_reads_and_a_later_training_step():
    model = Stack(2, 8, R=8)
    embedding = torch.randn(3, 8)
    history = ResidualHistory(capacity=3)
    with torch.inference_mode():
        out = model.with_history(embedding, history)
    assert _close(out, model.with_list(embedding).detach(), 1e-6)
    expected, _ = _grads(model, embedding, model.with_list)
    got, _ = _grads(model, embedding,
                    lambda e: model.with_history(e, history))
    for g, e in zip(got, expected):
        assert _close(g, e, 1e-5)


def test_an_eager_backward_after_a_traced_start_is_refused(monkeypatch):
    import attnres.nn
    history = ResidualHistory(capacity=2)
    q = torch.randn(8, requires_grad=True)
    history.start(torch.randn(3, 8, requires_grad=True))
    out = history.attend(q)
    monkeypatch.setattr(attnres.nn, "_tracing", lambda: True)
    history.start(torch.randn(3, 8))
    with pytest.raises(HistoryError, match=r"after a step under "
                       r"torch.compile started: its rows were released"):
        out.sum().backward()


def test_a_row_no_read_read_may_change_in_place():
    history = ResidualHistory(capacity=2)
    q = torch.randn(8, requires_grad=True)
    history.start(torch.randn(3, 8, requires_grad=True))
    out = history.attend(q)
    y = (out * 2).detach()
    history.append(y)
    y.add_(1)  # appended last, read by no one
    out.sum().backward()
    assert q.grad is not None
