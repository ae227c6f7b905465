"""Every engine against the float64 reference on the GPU: random shapes (odd sizes included) and
activations, forced plans that reach every kernel code path, and the changed-input graph replay."""

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from kernellab.harness import validate
from kernellab.megakernel import bench, engines, model, planning, sanitize, validation

pytestmark = pytest.mark.gpu

KERNEL_ENGINES = ("conventional", "persistent", "persistent-global", "conventional-tc", "persistent-tc")
ODD_SIZES = st.sampled_from([1, 7, 13, 31, 47, 111, 127, 257, 299])
SIZES = st.one_of(st.integers(1, 300), ODD_SIZES)


def _check(engine, shape, activation, seed=0):
    problem = bench.ResidualMLP(shape, activation=activation)
    bound = engines.bind(engine, problem.model_shape, activation)
    report = validate.validate_call(problem, bound.call, seed)
    assert report["passed"], (engine, shape, activation, bound.served_by, report)
    return bound


def _check_plan(plan, activation, seed):
    """A forced plan's call against the float64 reference at the plan's shape."""
    problem = bench.ResidualMLP((plan.rows, plan.channels, plan.hidden), activation=activation)
    report = validate.validate_call(problem, engines.plan_call(plan, activation), seed)
    assert report["passed"], (plan.describe(), report)


@settings(deadline=None)
@given(rows=st.integers(1, 2000), channels=SIZES, hidden=SIZES, activation=st.sampled_from(model.ACTIVATIONS),
       engine=st.sampled_from(KERNEL_ENGINES), seed=st.integers(0, 2**31))
@example(rows=165, channels=300, hidden=1, activation="relu", engine="conventional", seed=0)  # a hidden rounding flip
def test_any_shape_any_engine(rows, channels, hidden, activation, engine, seed):
    bound = _check(engine, (rows, channels, hidden), activation, seed)
    assert bound.served_by in planning.FALLBACK_CHAINS[engine]


@settings(deadline=None)
@given(rows=st.integers(1, 2000), channels=st.integers(1, 64).map(lambda v: 8 * v),
       hidden=st.integers(1, 150).map(lambda v: 8 * v), activation=st.sampled_from(model.ACTIVATIONS),
       engine=st.sampled_from(["persistent-tc", "conventional-tc"]), seed=st.integers(0, 2**31))
def test_tensor_core_engines_on_aligned_shapes(rows, channels, hidden, activation, engine, seed):
    """Multiples of 8 up to 512 channels: the tensor-core engines serve them themselves."""
    bound = _check(engine, (rows, channels, hidden), activation, seed)
    assert bound.served_by == engine


@settings(deadline=None)
@given(rows=st.integers(1, 2000), channels=st.one_of(st.integers(1, 512), ODD_SIZES), hidden=SIZES,
       activation=st.sampled_from(model.ACTIVATIONS), seed=st.integers(0, 2**31))
def test_persistent_tc_serves_any_shape_up_to_512_channels(rows, channels, hidden, activation, seed):
    """Rows that are not 16-byte aligned load element by element: still persistent-tc, still exact."""
    bound = _check("persistent-tc", (rows, channels, hidden), activation, seed)
    assert bound.served_by == "persistent-tc"


@settings(deadline=None, max_examples=40)
@given(rows=st.integers(1, 3000), channels=st.integers(1, 64).map(lambda v: 8 * v),
       hidden=st.integers(1, 150).map(lambda v: 8 * v), tile_rows=st.sampled_from(planning.TC_ROW_TILES),
       mma=st.sampled_from(planning.TC_MMAS), split=st.sampled_from(planning.TC_SPLITS[1:]),
       clusters=st.one_of(st.none(), st.integers(1, 3)), activation=st.sampled_from(model.ACTIVATIONS),
       seed=st.integers(0, 2**31))
def test_persistent_tc_hidden_split_plans(rows, channels, hidden, tile_rows, mma, split, clusters, activation, seed):
    """persistent-tc with the hidden split over a cluster of 2, 4 or 8 CTAs, forced at random shapes and both
    row tiles, with several tiles per cluster where ``clusters`` is small, and CTAs of a cluster with no
    hidden chunk where the hidden is short."""
    device = planning.current_device()
    if mma == "wgmma":
        tile_rows = planning.WGMMA_ROW_TILES[0]
    try:
        plan = planning.forced("persistent-tc", rows, channels, hidden, device, tile_rows=tile_rows, mma=mma,
                               split=split, grid=None if clusters is None else split * clusters)
    except ValueError as e:  # no room for the peers' partial output tiles (64 x 512 tiles at any split), or
        # a fragment too short to deal out to the split (few channels)
        fits = planning.persistent_tc_smem_bytes(tile_rows, planning.channel_tile(channels), 1, split) <= \
            planning.usable_smem(device)
        assert ("does not fit" in str(e) and not fits) or (
            "does not deal" in str(e) and not planning.tc_split_fits(tile_rows, planning.channel_tile(channels),
                                                                     split)), e
        return
    assert plan.tile.split == split
    _check_plan(plan, activation, seed)


@settings(deadline=None, max_examples=40)
@given(rows=st.integers(1, 700), channels=SIZES, hidden=SIZES,
       engine=st.sampled_from(["conventional", "persistent", "persistent-global"]),
       tile_rows=st.sampled_from([None, 4, 8, 12, 32]), clusters=st.one_of(st.none(), st.integers(1, 5)),
       weights=st.sampled_from([None, *planning.SCALAR_WEIGHTS]), activation=st.sampled_from(model.ACTIVATIONS),
       seed=st.integers(0, 2**31))
def test_cuda_core_engines_forced_tilings(rows, channels, hidden, engine, tile_rows, clusters, weights, activation,
                                          seed):
    """The CUDA-core engines at random sizes (odd ones included) with forced row tiles, grids (several tiles a
    CTA) and weight placements (shared or global memory, registers): against the reference."""
    device = planning.current_device()
    choices = {"tile_rows": tile_rows}
    if engine != "conventional":
        choices.update(grid=clusters, weights=weights)
    try:
        plan = planning.forced(engine, rows, channels, hidden, device, **choices)
    except ValueError as e:  # the tile (and weights) do not fit in shared memory, or the weights in registers
        assert any(why in str(e) for why in ("shared memory", "does not fit", "weights='registers' needs")), e
        return
    _check_plan(plan, activation, seed)


@settings(deadline=None, max_examples=40)
@given(rows=st.integers(1, 3000), channels=st.integers(1, 64).map(lambda v: 8 * v),
       hidden=st.integers(1, 150).map(lambda v: 8 * v), split=st.sampled_from(planning.TC_SPLITS),
       overlap=st.booleans(), clusters=st.one_of(st.none(), st.integers(1, 3)),
       activation=st.sampled_from(model.ACTIVATIONS), seed=st.integers(0, 2**31))
def test_persistent_tc_tma_load_plans(rows, channels, hidden, split, overlap, clusters, activation, seed):
    """persistent-tc's wgmma form with its weight chunks loaded by TMA (planning's choice for 64-row tiles),
    split or not, with the serial or the overlapped chunk schedule (GEMM1 of chunk j + 1 beside GEMM2 of
    chunk j, two hidden buffers), several tiles per CTA (or cluster) where ``clusters`` is small: a single
    chunk and partial chunks included."""
    device = planning.current_device()
    try:
        plan = planning.forced("persistent-tc", rows, channels, hidden, device, mma="wgmma", loads="tma",
                               split=split, overlap=overlap, grid=None if clusters is None else split * clusters)
    except ValueError as e:  # a split 64-row tile with no room for the peers' partial output tiles, or a
        # fragment too short to deal out; the overlapped schedule needs a chunk for each CTA of a split
        assert split > 1 and any(why in str(e) for why in ("does not fit", "does not deal")) or (
            "a hidden chunk for every CTA" in str(e) and hidden <= planning.TC_HIDDEN_CHUNK * (split - 1)), e
        return
    assert plan.tile.overlap == overlap
    _check_plan(plan, activation, seed)


@settings(deadline=None, max_examples=40)
@given(rows=st.integers(1, 3000), channels=st.integers(1, 64).map(lambda v: 8 * v),
       hidden=st.integers(1, 150).map(lambda v: 8 * v), multicast=st.sampled_from(planning.TC_MULTICASTS[1:]),
       clusters=st.one_of(st.none(), st.integers(1, 3)), activation=st.sampled_from(model.ACTIVATIONS),
       seed=st.integers(0, 2**31))
def test_persistent_tc_weight_multicast_plans(rows, channels, hidden, multicast, clusters, activation, seed):
    """persistent-tc's wgmma form with each weight chunk loaded by TMA once per cluster (forced: planning
    does not choose it yet), with several tiles per CTA and CTAs running an empty tile beside their peers
    where ``clusters`` is small."""
    device = planning.current_device()
    plan = planning.forced("persistent-tc", rows, channels, hidden, device, mma="wgmma", multicast=multicast,
                           grid=None if clusters is None else multicast * clusters)
    _check_plan(plan, activation, seed)


@settings(deadline=None, max_examples=40)
@given(rows=st.integers(1, 3000), channels=st.integers(1, 64).map(lambda v: 8 * v),
       hidden=st.integers(1, 150).map(lambda v: 8 * v), tile_rows=st.sampled_from(planning.WGMMA_ROW_TILES),
       activation=st.sampled_from(model.ACTIVATIONS), seed=st.integers(0, 2**31))
def test_persistent_tc_wgmma_plans(rows, channels, hidden, tile_rows, activation, seed):
    """The wgmma form of persistent-tc, forced at random shapes and both of its row tiles, against the
    reference."""
    device = planning.current_device()
    plan = planning.plan_engine("persistent-tc", rows, channels, hidden, device, tile_rows, "wgmma")
    if isinstance(plan, planning.Refusal):  # 128-row tiles past 256 channels
        assert tile_rows == 128 and channels > 256
        return
    _check_plan(plan, activation, seed)


@settings(deadline=None, max_examples=40)
@given(rows=st.integers(1, 3000), channels=st.integers(1, 64), hidden=st.integers(1, 128),
       clusters=st.one_of(st.none(), st.integers(1, 4)), activation=st.sampled_from(model.ACTIVATIONS),
       seed=st.integers(0, 2**31))
def test_persistent_tc_register_form_plans(rows, channels, hidden, clusters, activation, seed):
    """persistent-tc's register form forced at random sizes within its bounds, 16-byte rows or not (element
    loads), with several tiles per CTA where ``clusters`` is small."""
    assume(planning.register_form_fits(channels, hidden))
    plan = planning.forced("persistent-tc", rows, channels, hidden, planning.current_device(), registers=True,
                           grid=clusters)
    _check_plan(plan, activation, seed)


@pytest.mark.parametrize("case", sanitize.cases(), ids=lambda c: c[0])
@pytest.mark.parametrize("activation", model.ACTIVATIONS)
def test_forced_plans(case, activation):
    """Several tiles per CTA, weights from global memory, partial hidden chunks, 64-row tiles."""
    _, engine, shape, choices = case
    problem = bench.ResidualMLP(shape, activation=activation)
    plan = planning.forced(engine, *shape, planning.current_device(), **choices)
    report = validate.validate_call(problem, engines.plan_call(plan, activation), 11)
    assert report["passed"], (case, report)


SMALL = [s for s in bench.DEVELOPMENT_SHAPES + bench.ASSESSMENT_SHAPES if s[0] * s[1] * s[2] <= 2**25]
COMPILED = ("torch-compile", "torch-compile-graph")  # max-autotune takes a minute per shape: two shapes only
CASES = [(e, s) for e in engines.ENGINES if e not in COMPILED for s in SMALL] + [
    (e, s) for e in COMPILED for s in ((33, 32, 64), (5, 19, 37))]


@pytest.mark.parametrize("engine,shape", CASES, ids=lambda v: v if isinstance(v, str) else "x".join(map(str, v)))
def test_every_engine_at_the_report_shapes(engine, shape):
    """Validation and the changed-input replay, as the report does it (graph engines own their graph)."""
    problem = bench.ResidualMLP(shape)
    bound = engines.bind(engine, problem.model_shape, problem.activation)
    result = validation.check(problem, engine, bound.call)
    assert result["passed"] and result["replay_changed_input"], result


@pytest.mark.parametrize("shape", [(4096, 256, 1024), (16384, 512, 2048)])
def test_persistent_tc_at_the_large_shapes(shape):
    bound = _check("persistent-tc", shape, "gelu")
    assert bound.served_by == "persistent-tc"


def test_graph_engine_replays_changed_inputs_and_new_buffers():
    problem = bench.ResidualMLP((33, 32, 64))
    bound = engines.bind("persistent-tc-graph", problem.model_shape, problem.activation)
    first = validation.owned_graph_replay(problem, bound.call, 1, 2)
    second = validation.owned_graph_replay(problem, bound.call, 3, 4)  # new buffers: a second graph
    assert first["replay_changed_input"] and second["replay_changed_input"]
    assert len(bound.call.graphs) == 2


def test_results_do_not_depend_on_the_tiling():
    """Scalar engines sum in one fixed order per row: any tile size and weight placement gives identical bits."""
    import torch

    shape = (70, 31, 47)
    problem = bench.ResidualMLP(shape)
    inputs = problem.make_inputs(5)
    outs = []
    for tile_rows, grid, weights in ((4, None, "registers"), (4, 5, "global"), (8, 3, None), (32, 1, None)):
        plan = planning.forced("persistent", *shape, planning.current_device(), tile_rows=tile_rows, grid=grid,
                               weights=weights)
        y = problem.make_outputs(inputs)["y"]
        engines.launcher("persistent", plan, "gelu")(inputs["x"], inputs["x"], inputs["w1"], inputs["b1"],
                                                     inputs["w2"], inputs["b2"], y)
        outs.append(y)
    torch.cuda.synchronize()
    assert all(torch.equal(outs[0], o) for o in outs[1:])


def test_launch_floor_kernel_launches_and_writes_nothing():
    """The report's empty kernel runs through TVM-FFI, on the stream and in a CUDA graph, and leaves y as it was."""
    import torch

    from kernellab.megakernel.engines import floor

    y = torch.full((33, 32), float("nan"), dtype=torch.float32, device="cuda")
    poison = y.view(torch.int32).clone()
    run = floor.launcher()
    run(y)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run(y)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.isnan(y).all() and torch.equal(y.view(torch.int32), poison)


@settings(deadline=None, max_examples=20)
@given(rows=st.integers(1, 3000), channels=st.integers(1, 64).map(lambda v: 8 * v),
       hidden=st.integers(1, 150).map(lambda v: 8 * v), activation=st.sampled_from(model.ACTIVATIONS),
       seed=st.integers(0, 2**31))
def test_programmatic_dependent_launches_read_what_the_launch_before_wrote(rows, channels, hidden, activation, seed):
    """persistent-tc launched with programmatic dependent launch (forced): the next launch of the stream starts
    early and waits ahead of its first tile, so four chained calls, each adding onto the fp32 stream the call
    before wrote (its ``residual``), give bitwise what the same plan launched plainly gives, in the stream and in
    a CUDA graph. A launch that read before the one ahead of it had finished would read its poisoned output."""
    import torch

    device = planning.current_device()
    early = planning.forced("persistent-tc", rows, channels, hidden, device, pdl=True)
    _check_plan(early, activation, seed)
    plain = planning.forced("persistent-tc", rows, channels, hidden, device, pdl=False)
    inputs = model.make_problem_tensors(model.Shape(rows, channels, hidden), seed=seed, device="cuda")
    u = inputs["x"]
    weights = (inputs["w1"], inputs["b1"], inputs["w2"], inputs["b2"])

    def chain(plan, streams):
        run = engines.launcher(plan.engine, plan, activation, residual="float32")
        for k in range(4):  # poisoned outputs: a read ahead of the write before it sees NaN
            streams[k + 1].fill_(float("nan"))
        for k in range(4):
            run(u, streams[k], *weights, streams[k + 1])

    start = u.float()
    want = [start] + [torch.empty_like(start) for _ in range(4)]
    chain(plain, want)
    got = [start] + [torch.empty_like(start) for _ in range(4)]
    chain(early, got)
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(want, got, strict=True)), "in the stream"
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.cuda.graph(graph, stream=side):
        chain(early, got)
    for _ in range(2):
        for t in got[1:]:
            t.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert all(torch.equal(a, b) for a, b in zip(want, got, strict=True)), "in a CUDA graph"


def test_the_clusters_planning_counts_are_those_its_wide_split_kernels_get():
    """``DeviceSpec.clusters_at_once`` (the driver's count for an empty kernel holding a block's shared memory) is
    the count for persistent-tc's own kernels of a split over 4 and 8 CTAs, so that ``wide_split_fits`` limits what
    planning launches by what runs at once."""
    from kernellab.megakernel.engines import common, persistent_tc

    device = planning.current_device()
    assert [size for size, _ in device.clusters_at_once] == list(planning.CLUSTER_SIZES)
    for split in (4, 8):
        plan = planning.forced("persistent-tc", 1024, 128, 1024, device, split=split, mma="wgmma")
        cubin = common.compiled(persistent_tc.variant(plan)).__cubin__
        got = planning.max_active_clusters(cubin, plan.owners.grid, plan.tile.threads, split, plan.smem.bytes)
        assert 1 <= got == device.clusters_held(split), (split, got, device.clusters_at_once)
