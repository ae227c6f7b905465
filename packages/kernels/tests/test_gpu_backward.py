"""GPU tests of the backward kernels against float64 autograd: random shapes, dtypes, weight dtypes, row
strides and base offsets (hypothesis, as the forward's tests), strided and expanded dy, the residual
gradient, NaN / inf rows, rows split over a cluster, streamed rows and persistent loops over many row
blocks; then the custom ops (opcheck), torch.compile of fwd+bwd with fullgraph, and a CUDA graph of a
training step."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kernellab.harness.suites import reference

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="skipped: no CUDA device")]
if torch.cuda.is_available():
    pytest.importorskip("cutlass", reason="CuTe DSL not installed")
    pytest.importorskip("tvm_ffi", reason="apache-tvm-ffi not installed")

from test_gpu_ops import DTYPES, check, matrices, vector  # noqa: E402

from kernellab.kernels import gpu  # noqa: E402
from kernellab.kernels.gpu import compiler, ops  # noqa: E402


def grads64(forward, inputs, dy):
    """float64 autograd of forward(*inputs) given dy: the gradients of the inputs that are not None."""
    leaves = [None if t is None else t.detach().double().requires_grad_() for t in inputs]
    y = forward(*leaves)
    found = iter(torch.autograd.grad(y, [t for t in leaves if t is not None], dy.double()))
    return [None if t is None else next(found) for t in leaves]


def gradient_of(x, seed, layout):
    """dy like x: contiguous, with a row stride of its own, or (layout "expanded") one row broadcast."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    if layout == "expanded":
        return torch.randn(x.shape[-1], device="cuda", generator=g).to(x.dtype).expand(x.shape)
    dy = torch.randn(x.shape, device="cuda", generator=g).to(x.dtype)
    if layout == "strided":
        wide = torch.randn(*x.shape[:-1], x.shape[-1] + 8, device="cuda", generator=g).to(x.dtype)
        dy = wide[..., :x.shape[-1]]
    return dy


def check_vector(got, want, dtype, rows, what):
    """A vector gradient sums M rows: allow its fp32 accumulation (16 units of sqrt(M) per unit of |dy|)."""
    assert got.dtype == dtype, f"{what}: dtype {got.dtype}, expected {dtype}"
    slack = 16 * 2.0**-24 * rows**0.5
    o, r = got.double(), want.double()
    tol = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 2e-2}[dtype]
    fin = torch.isfinite(r)
    assert torch.equal(torch.isnan(o), torch.isnan(r)), f"{what}: NaN pattern differs"
    err = ((o - r).abs() - tol * (1 + r.abs()) - 4 * slack * (1 + r.abs()))[fin]
    assert err.numel() == 0 or float(err.max()) <= 0, f"{what}: max excess error {float(err.max()):.3g}"


LAYOUTS = st.sampled_from(("contiguous", "contiguous", "strided", "expanded"))


@given(matrices(max_elements=3_000_000), LAYOUTS, st.integers(0, 1000))
def test_softmax_backward(case, layout, seed):
    x, what = case
    y = gpu.softmax(x)
    dy = gradient_of(y, seed, layout)
    dx = gpu.softmax_backward(y, dy)
    check(dx, reference.softmax_backward(y, dy), x.dtype, f"softmax dx {what} dy {layout}")


@given(matrices(max_elements=3_000_000), st.sampled_from((None, "x", "fp32")), LAYOUTS, st.booleans(),
       st.integers(0, 1000))
def test_rmsnorm_backward(case, wdt, layout, with_dh, seed):
    x, what = case
    w = vector(x, wdt, seed)
    rstd = torch.rsqrt(x.float().pow(2).mean(-1) + 1e-6)
    dy = gradient_of(x, seed, layout)
    dh = gradient_of(x, seed + 1, "contiguous") if with_dh else None
    dx, dw = gpu.rmsnorm_backward(x, w, dy, rstd, dh=dh)
    want_dx, want_dw = grads64(lambda a, b: reference.rmsnorm(a, b, 1e-6)[0], (x, w), dy)
    if dh is not None:
        want_dx = want_dx + dh.double()
    check(dx, want_dx, x.dtype, f"rmsnorm dx {what} dy {layout}")
    if w is None:
        assert dw is None
    else:
        check_vector(dw, want_dw, w.dtype, x.numel() // x.shape[-1], f"rmsnorm dweight {what}")


@given(matrices(max_elements=3_000_000), st.sampled_from((None, "x", "fp32")), st.sampled_from((None, "x", "fp32")),
       LAYOUTS, st.integers(0, 1000))
def test_layernorm_backward(case, wdt, bdt, layout, seed):
    x, what = case
    w, b = vector(x, wdt, seed), vector(x, bdt, seed + 1, shift=0.0)
    xf = x.float()
    mean = xf.mean(-1)
    rstd = torch.rsqrt((xf - mean[..., None]).pow(2).mean(-1) + 1e-5)
    dy = gradient_of(x, seed, layout)
    dx, dw, db = gpu.layernorm_backward(x, w, dy, mean, rstd, bias=b if b is not None else False)
    want_dx, want_dw, want_db = grads64(lambda a, c, d: reference.layernorm(a, c, d, 1e-5), (x, w, b), dy)
    check(dx, want_dx, x.dtype, f"layernorm dx {what} dy {layout}")
    rows = x.numel() // x.shape[-1]
    for got, want, v, name in ((dw, want_dw, w, "dweight"), (db, want_db, b, "dbias")):
        if v is None:
            assert got is None, name
        else:
            check_vector(got, want, v.dtype, rows, f"layernorm {name} {what}")


@pytest.mark.parametrize("n", [65537, 140000, 300001])
@pytest.mark.parametrize("dtype", DTYPES)
def test_long_rows(n, dtype):
    """Rows past a cluster's registers, streamed on one CTA in tiles: both passes, the partials kept in global
    memory."""
    x = torch.randn(5, n, device="cuda").to(dtype)
    w = vector(x, "x", 3)
    dy = torch.randn_like(x)
    x.requires_grad_()
    w.requires_grad_()
    got = torch.autograd.grad(gpu.rmsnorm(x, w, 1e-6), (x, w), dy)
    want = grads64(lambda a, b: reference.rmsnorm(a, b, 1e-6)[0], (x, w), dy)
    check(got[0], want[0], dtype, "rmsnorm dx")
    check_vector(got[1], want[1], dtype, 5, "rmsnorm dweight")
    b = vector(x, "x", 4, shift=0.0).requires_grad_()
    got = torch.autograd.grad(gpu.layernorm(x, w, b), (x, w, b), dy)
    want = grads64(lambda a, c, d: reference.layernorm(a, c, d, 1e-5), (x, w, b), dy)
    check(got[0], want[0], dtype, "layernorm dx")
    check_vector(got[1], want[1], dtype, 5, "layernorm dweight")
    check_vector(got[2], want[2], dtype, 5, "layernorm dbias")
    y = gpu.softmax(x.detach())
    check(gpu.softmax_backward(y, dy), reference.softmax_backward(y, dy), dtype, "softmax dx")


@pytest.mark.parametrize("n", [8193, 12289, 16384, 40000, 65536])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_split_over_a_cluster(n, dtype):
    """Rows past one CTA's registers, held by a cluster of CTAs: the row sums exchanged between the CTAs,
    each cluster looping over more rows than a wave holds (both phases of its transaction barriers), the
    vector gradients' partials summed by a second launch."""
    name = str(dtype).removeprefix("torch.")
    vec = compiler.widest_vector(n, name)
    for op in ("softmax_backward", "rmsnorm_backward", "layernorm_backward"):
        plan = compiler.Variant(op, name, n, vec, weight=None if op == "softmax_backward" else name).kernel()
        assert plan.ctas > 1 and plan.tiles == 1, (op, plan.describe())
    m = 9 * torch.cuda.get_device_properties(0).multi_processor_count + 5
    x = torch.randn(m, n, device="cuda").to(dtype)
    w, b = vector(x, "fp32", 1), vector(x, "x", 2, shift=0.0)
    dy, dh = torch.randn_like(x), torch.randn_like(x)
    rstd = torch.rsqrt(x.float().pow(2).mean(-1) + 1e-6)
    dx, dw = gpu.rmsnorm_backward(x, w, dy, rstd, dh=dh)
    want = grads64(lambda a, c: reference.rmsnorm(a, c, 1e-6)[0], (x, w), dy)
    check(dx, want[0] + dh.double(), dtype, "rmsnorm dx")
    check_vector(dw, want[1], torch.float32, m, "rmsnorm dweight")
    xf = x.float()
    mean = xf.mean(-1)
    rstd = torch.rsqrt((xf - mean[:, None]).pow(2).mean(-1) + 1e-5)
    dx, dw, db = gpu.layernorm_backward(x, None, dy, mean, rstd, bias=b)
    want = grads64(lambda a, d: reference.layernorm(a, None, d, 1e-5), (x, b), dy)
    check(dx, want[0], dtype, "layernorm dx")
    assert dw is None
    check_vector(db, want[1], dtype, m, "layernorm dbias")
    y = gpu.softmax(x)
    check(gpu.softmax_backward(y, dy), reference.softmax_backward(y, dy), dtype, "softmax dx")


@pytest.mark.parametrize("shape", [(70000, 64), (66000, 1000), (20000, 4096), (3, 1)])
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
def test_many_rows_loop_the_persistent_grid(shape, dtype):
    """More row blocks than one wave of CTAs: each CTA loops, alternating its reduction buffer halves."""
    x = torch.randn(shape, device="cuda").to(dtype)
    w, b = vector(x, "fp32", 1), vector(x, "x", 2, shift=0.0)
    dy = torch.randn_like(x)
    xf = x.float()
    mean = xf.mean(-1)
    rstd = torch.rsqrt((xf - mean[:, None]).pow(2).mean(-1) + 1e-5)
    dx, dw, db = gpu.layernorm_backward(x, w, dy, mean, rstd, bias=b)
    want = grads64(lambda a, c, d: reference.layernorm(a, c, d, 1e-5), (x, w, b), dy)
    check(dx, want[0], dtype, "dx")
    check_vector(dw, want[1], torch.float32, shape[0], "dweight")
    check_vector(db, want[2], dtype, shape[0], "dbias")


@pytest.mark.parametrize("n", [96, 1000, 1024, 8192, 16384])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("stages", [2, 3, 4])
def test_ring_of_row_blocks(n, dtype, stages):
    """Held rows read through a shared-memory ring that cp.async fills ahead (``Tuning.ring_stages``): on a
    grid of a few CTAs (each visits many row blocks, wrapping the ring many times), the full wave, and a row
    count that leaves the last blocks partly past M; N with and without column predicates, a row over a
    cluster (16384)."""
    import dataclasses

    from kernellab.kernels.gpu.base import BACKWARD, WIDE_BACKWARD

    name = str(dtype).removeprefix("torch.")
    vec = compiler.widest_vector(n, name)
    wide = dtype != torch.float32 and n >= 8192
    tuning = dataclasses.replace(WIDE_BACKWARD if wide else BACKWARD, ring_stages=stages)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for op in ("rmsnorm_backward", "layernorm_backward"):
        variant = compiler.Variant(op, name, n, vec, weight=name, bias=name if op == "layernorm_backward" else None,
                                   tuning=tuning)
        assert variant.kernel().ring, variant.kernel().describe()
        fn = compiler.call_of(compiler.compiled(variant))
        rows_per_cta, per_wave = compiler.wave(variant, sms)
        for m, grid in ((37 * rows_per_cta - 1, 3), (5 * per_wave * rows_per_cta + 3, per_wave)):
            x = torch.randn(m, n, device="cuda").to(dtype)
            w, b = vector(x, "x", 1), vector(x, "x", 2, shift=0.0)
            dy = torch.randn_like(x)
            xf = x.float()
            mean = xf.mean(-1)
            dx = torch.full_like(x, float("nan"))
            pw, dw = torch.empty(grid * rows_per_cta, n, device="cuda"), torch.full_like(w, float("nan"))
            sync = ops._grid_sync(x.device)
            if op == "rmsnorm_backward":
                rstd = torch.rsqrt(xf.pow(2).mean(-1) + 1e-6)
                fn(x, w, dy, rstd, None, dx, pw, dw, sync, grid)
                want = grads64(lambda a, c: reference.rmsnorm(a, c, 1e-6)[0], (x, w), dy)
            else:
                rstd = torch.rsqrt((xf - mean[:, None]).pow(2).mean(-1) + 1e-5)
                pb, db = torch.empty_like(pw), torch.full_like(w, float("nan"))
                fn(x, w, dy, mean, rstd, dx, pw, pb, dw, db, sync, grid)
                want = grads64(lambda a, c, d: reference.layernorm(a, c, d, 1e-5), (x, w, b), dy)
                check_vector(db, want[2], dtype, m, f"{op} dbias (m={m}, grid={grid})")
            check(dx, want[0], dtype, f"{op} dx (m={m}, grid={grid})")
            check_vector(dw, want[1], dtype, m, f"{op} dweight (m={m}, grid={grid})")


@pytest.mark.parametrize("shape", [(65536, 1024), (50000, 1537), (30011, 96)])
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
def test_many_partial_rows_are_summed_by_every_warp_of_a_cta(shape, dtype):
    """Past a warp's lanes at PARTIAL_ROWS_PER_LANE rows each, the partials' sum spreads a CTA's warps over the
    rows of the same columns and adds their sums in shared memory: one column group a CTA (1024 bf16) and a batch
    of single-column groups (odd N), RMSNorm's one pair."""
    x = torch.randn(shape, device="cuda").to(dtype)
    w = vector(x, "fp32", 3)
    dy = torch.randn_like(x)
    rstd = torch.rsqrt(x.float().pow(2).mean(-1) + 1e-6)
    dx, dw = gpu.rmsnorm_backward(x, w, dy, rstd)
    assert any(key[0] == "rmsnorm_backward" and key[1] == dtype and key[2] == shape[1] and key[-1]
               for key in ops._GRADS), "the variant that sums by CTAs ran"
    want = grads64(lambda a, b: reference.rmsnorm(a, b, 1e-6)[0], (x, w), dy)
    check(dx, want[0], dtype, "dx")
    check_vector(dw, want[1], torch.float32, shape[0], "dweight")


@given(st.sampled_from(DTYPES), st.sampled_from((1, 5, 1537, 4096, 40000)), st.integers(0, 2**31 - 1))
def test_special_rows_give_what_torch_gives(dtype, n, seed):
    """-inf, NaN and inf in rows, through forward and backward: the NaN / inf pattern of float64 autograd."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(6, n, device="cuda", generator=g).to(dtype)
    col = int(torch.randint(n, (1,), generator=g, device="cuda"))
    x[0] = float("-inf")
    x[1, col] = float("nan")
    x[2, col] = float("inf")
    x[3, col] = float("-inf")
    dy = torch.randn(6, n, device="cuda", generator=g).to(dtype)
    w = vector(x, "x", seed % 1000)
    for name, ours, truth, inputs in (
            ("softmax", lambda a: gpu.softmax(a), reference.softmax, (x,)),
            ("rmsnorm", lambda a, b: gpu.rmsnorm(a, b, 1e-6), lambda a, b: reference.rmsnorm(a, b, 1e-6)[0], (x, w)),
            ("layernorm", lambda a, b: gpu.layernorm(a, b, None, 1e-5),
             lambda a, b: reference.layernorm(a, b, None, 1e-5), (x, w))):
        leaves = [t.detach().requires_grad_() for t in inputs]
        got = torch.autograd.grad(ours(*leaves), leaves, dy)
        want = grads64(truth, inputs, dy)
        check(got[0], want[0], dtype, f"{name} dx")
        if len(got) > 1:
            assert torch.equal(torch.isnan(got[1]), torch.isnan(want[1])), f"{name} dweight NaN pattern"


def test_backward_arguments_are_checked_by_name():
    x = torch.randn(4, 64, device="cuda")
    rstd = torch.ones(4, device="cuda")
    with pytest.raises(ValueError, match="dy must have shape"):
        gpu.rmsnorm_backward(x, None, x[:3], rstd)
    with pytest.raises(TypeError, match="rstd must have dtype"):
        gpu.rmsnorm_backward(x, None, x, rstd.double())
    with pytest.raises(ValueError, match="mean must have shape"):
        gpu.layernorm_backward(x, None, x, rstd[:2], rstd)
    with pytest.raises(TypeError, match="dy must have dtype"):
        gpu.softmax_backward(x, x.half())


CASES = {
    "softmax": lambda x, w, b, r: (ops._softmax, (x,)),
    "rmsnorm": lambda x, w, b, r: (ops._rmsnorm, (x, w, 1e-6)),
    "rmsnorm_residual": lambda x, w, b, r: (ops._rmsnorm_residual, (x, r, w, 1e-6)),
    "layernorm": lambda x, w, b, r: (ops._layernorm, (x, w, b, 1e-5)),
}


@pytest.mark.parametrize("op", sorted(CASES))
@pytest.mark.parametrize("dtype", DTYPES)
def test_opcheck(op, dtype):
    """torch.library.opcheck of each forward op (with its autograd) and each backward op, every dtype."""
    x = torch.randn(6, 40, device="cuda").to(dtype).requires_grad_()
    w = torch.randn(40, device="cuda").to(dtype).requires_grad_()
    b = torch.randn(40, device="cuda").to(dtype).requires_grad_()
    r = torch.randn(6, 40, device="cuda").to(dtype).requires_grad_()
    fn, args = CASES[op](x, w, b, r)
    torch.library.opcheck(fn, args)
    xd, wd, dy = x.detach(), w.detach(), torch.randn(6, 40, device="cuda").to(dtype)
    stats = torch.rand(6, device="cuda") + 0.5
    torch.library.opcheck(ops._softmax_backward, (torch.softmax(xd.float(), -1).to(dtype), dy))
    torch.library.opcheck(ops._rmsnorm_backward, (xd, wd, dy, stats, dy))
    torch.library.opcheck(ops._rmsnorm_backward, (xd, None, dy, stats, None))
    torch.library.opcheck(ops._layernorm_backward, (xd, wd, dy, stats - 0.5, stats, b.detach()))
    torch.library.opcheck(ops._layernorm_backward, (xd, None, dy, stats - 0.5, stats, None))


class Block(torch.nn.Module):
    """rmsnorm with a residual, softmax, layernorm: every op's autograd in one module."""

    def __init__(self, n, dtype):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(n, device="cuda").to(dtype))
        self.b = torch.nn.Parameter(torch.randn(n, device="cuda").to(dtype))

    def forward(self, x, r):
        y, h = gpu.rmsnorm(x, self.w, 1e-6, r)
        return gpu.layernorm(gpu.softmax(y) * 4 + h, self.w, self.b)


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
def test_torch_compile_fullgraph_runs_forward_and_backward(dtype):
    block = Block(1537, dtype)
    x = torch.randn(64, 1537, device="cuda").to(dtype).requires_grad_()
    r = torch.randn(64, 1537, device="cuda").to(dtype).requires_grad_()
    dy = torch.randn(64, 1537, device="cuda").to(dtype)
    compiled = torch.compile(block, fullgraph=True)
    got = torch.autograd.grad(compiled(x, r), (x, r, block.w, block.b), dy)
    want = torch.autograd.grad(block(x, r), (x, r, block.w, block.b), dy)
    for a, e in zip(got, want, strict=True):
        torch.testing.assert_close(a, e)


def test_cuda_graph_of_a_training_step_replays():
    block = Block(4096, torch.bfloat16)
    x = torch.randn(256, 4096, device="cuda", dtype=torch.bfloat16)
    r = torch.randn_like(x)
    dy = torch.randn_like(x)
    params = (block.w, block.b)

    def step():
        leaf = x.detach().requires_grad_()
        return torch.autograd.grad(block(leaf, r), (leaf, *params), dy)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # compile and warm up off the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    x.copy_(torch.randn_like(x))
    dy.copy_(torch.randn_like(dy))
    graph.replay()
    torch.cuda.synchronize()
    for a, e in zip(captured, step(), strict=True):
        torch.testing.assert_close(a, e)


def test_grid_barrier_word_is_per_stream_and_left_at_rest():
    """Two streams get a barrier word of their own; every launch leaves the word's low 31 bits at 0 and flips its
    top bit once; the vector gradients come out bitwise alike on every run (a fixed order of sums)."""
    x = torch.randn(5000, 1024, device="cuda")
    w, dy = torch.randn(1024, device="cuda"), torch.randn_like(x)
    rstd = torch.rsqrt(x.pow(2).mean(-1) + 1e-6)
    first = gpu.rmsnorm_backward(x, w, dy, rstd)[1]  # an eager call: the device's word table exists from here
    streams = [torch.cuda.Stream() for _ in range(2)]
    table = ops._SYNC[x.device.index]
    found = []
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            gpu.rmsnorm_backward(x, w, dy, rstd)  # takes the stream's slot
            slot = ops._SYNC_WORD[(x.device.index, s.cuda_stream)].storage_offset() // ops._SYNC_SECTOR
            before = table[slot, 0].item()
            found += [(slot, before, [gpu.rmsnorm_backward(x, w, dy, rstd)[1] for _ in range(3)])]
    torch.cuda.synchronize()
    assert found[0][0] != found[1][0], "each stream its own barrier word"
    for slot, before, grads in found:
        word = table[slot, 0].item()
        assert word & 0x7FFFFFFF == 0, "the arrivals' low bits back at zero after every barrier"
        assert (word ^ before) & 0x80000000, "the top bit flipped once a launch: three launches, flipped"
        assert not table[slot, 1:].any(), "the rest of the slot's sector untouched"
        assert all(torch.equal(g, first) for g in grads), "dweight bitwise alike run to run"


def test_cuda_graph_captured_first_zeroes_its_own_barrier_word(monkeypatch):
    """A graph captured before any eager backward on the device: its barrier word is zeroed in the graph,
    so replays hold; the gradients match an eager call."""
    monkeypatch.setattr(ops, "_SYNC", {})
    monkeypatch.setattr(ops, "_SYNC_WORD", {})
    x = torch.randn(3000, 2048, device="cuda", dtype=torch.bfloat16)
    w, b = torch.randn(2048, device="cuda", dtype=torch.bfloat16), torch.randn(2048, device="cuda")
    dy = torch.randn_like(x)
    xf = x.float()
    mean = xf.mean(-1)
    rstd = torch.rsqrt((xf - mean[:, None]).pow(2).mean(-1) + 1e-5)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side):
        ops._grad_function("layernorm_backward", x, 16, w, False, torch.float32)  # compile off the capture
        with torch.cuda.graph(graph, stream=side):
            captured = gpu.layernorm_backward(x, w, dy, mean, rstd, bias=b)
    assert not ops._SYNC, "no eager call: the words were made inside the graph"
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    for a, e in zip(captured, gpu.layernorm_backward(x, w, dy, mean, rstd, bias=b), strict=True):
        assert torch.equal(a, e)
