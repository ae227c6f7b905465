"""Shape planning: which engine serves which shape, shared-memory arithmetic, grids and ownership."""

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernellab.megakernel import planning
from kernellab.megakernel.planning import H200
from kernellab.megakernel.planning.tensorcore import wide_split_fits

# requested engine -> engine that serves, at the example report's shapes (H200 numbers)
SERVED = {
    (1, 7, 13): {"persistent-tc": "persistent-tc", "conventional-tc": "conventional"},
    (33, 32, 64): {"persistent-tc": "persistent-tc", "conventional-tc": "conventional-tc"},
    (129, 31, 47): {"persistent-tc": "persistent-tc", "conventional-tc": "conventional"},
    (16384, 512, 2048): {"persistent-tc": "persistent-tc", "conventional-tc": "conventional-tc"},
    (128, 1024, 14336): {"persistent-tc": "persistent-global", "persistent": "persistent-global"},
    (8, 520, 64): {"persistent-tc": "persistent", "conventional-tc": "conventional-tc"},
}


@pytest.mark.parametrize("shape,expected", SERVED.items())
def test_fallback_choice(shape, expected):
    for requested, served in expected.items():
        choice = planning.choose(requested, *shape, H200)
        assert choice.served_by == served, (shape, requested, choice.skipped)
        assert [r.engine for r in choice.skipped] == list(
            planning.FALLBACK_CHAINS[requested][: planning.FALLBACK_CHAINS[requested].index(served)])


BAD_SIZES = [0, -3, 2.0, True, "4", None]


@pytest.mark.parametrize("argument", ["rows", "channels", "hidden"])
@pytest.mark.parametrize("value", BAD_SIZES, ids=repr)
def test_choose_and_forced_reject_bad_sizes_naming_the_argument(argument, value):
    sizes = {"rows": 33, "channels": 32, "hidden": 64, argument: value}
    with pytest.raises(ValueError, match=f"^{argument} must be an integer >= 1, got {value!r}"):
        planning.choose("persistent-tc", sizes["rows"], sizes["channels"], sizes["hidden"], H200)
    with pytest.raises(ValueError, match=f"^{argument} must be an integer >= 1, got {value!r}"):
        planning.forced("persistent", sizes["rows"], sizes["channels"], sizes["hidden"], H200)


@pytest.mark.parametrize("argument", ["grid", "tile_rows", "stages"])
@pytest.mark.parametrize("value", BAD_SIZES[:4], ids=repr)
def test_forced_rejects_bad_grid_and_tile_naming_the_argument(argument, value):
    with pytest.raises(ValueError, match=f"^{argument} must be an integer >= 1, got {value!r}"):
        planning.forced("persistent", 64, 32, 64, H200, **{argument: value})


def test_refusal_reasons_say_why():
    odd = planning.choose("conventional-tc", 129, 31, 47, H200)
    assert "multiples of 8" in odd.skipped[0].reason
    wide = planning.choose("persistent-tc", 8, 520, 64, H200)
    assert "channels=520 > 512" in wide.skipped[0].reason
    huge = planning.choose("persistent", 128, 1024, 14336, H200)
    assert "does not fit on chip" in huge.skipped[0].reason


def test_shared_memory_arithmetic():
    # persistent-tc: x tile + W1 chunk + W2 chunk + hidden chunk, fp16
    assert planning.persistent_tc_smem_bytes(64, 512) == 2 * (64 * 512 + 2 * 64 * 512 + 64 * 64) == 204800
    assert planning.persistent_tc_smem_bytes(32, 64) == 24576
    assert planning.persistent_tc_smem_bytes(32, 128, stages=2) == 2 * (32 * 128 + 4 * 64 * 128 + 32 * 64) == 77824
    # scalar: fp32 operand row (+ fp32 hidden row when on chip); fp16 weights staged by K step, odd chunk strides
    # (rows padded to whole K steps of planning.SCALAR_K_CLASSES elements)
    assert planning.scalar_row_bytes("persistent", 7, 13) == 4 * (8 + 16)
    assert planning.scalar_row_bytes("persistent-global", 7, 13) == 4 * 8
    assert planning.scalar_row_bytes("persistent", 32, 64) == 4 * (32 + 64)
    assert planning.weight_group_stride(13) == 13 and planning.weight_group_stride(64) == 65
    # W1 (13 x 7): one K step of 13 chunks; W2 (7 x 13): two K steps of 7 chunks; 16 bytes a chunk
    assert planning.scalar_weight_bytes(7, 13) == 16 * (1 * 13 + 2 * 7)
    plan = planning.choose("persistent", 100_000, 7, 13, H200).plan  # many rows a CTA: weights staged once
    assert plan.tile.rows > planning.ROW_BLOCK and plan.smem.weights == "smem"
    assert plan.smem.bytes == planning.scalar_weight_bytes(7, 13) + plan.tile.rows * 4 * (8 + 16)


def test_scalar_weights_are_held_in_registers_or_staged_where_a_cta_reuses_them_or_they_are_many():
    """A persistent CTA of one row block a tile holds its lanes' weights in registers where they fit
    (``planning.register_weights_fit``). Else it stages them in shared memory where their rows are whole K steps
    (16-byte cp.async copies); reading each weight once (one tile), it reads few others from global memory, and
    stages them where it has more rows or they are many (``planning.SCALAR_GLOBAL_WEIGHTS_MAX``)."""
    for engine in ("persistent", "persistent-global"):
        one = planning.choose(engine, 1, 7, 13, H200).plan  # one and two K steps: too short to hold
        assert (one.smem.weights, one.owners.tiles_per_cta) == ("global", 1)
        assert one.smem.bytes == one.tile.rows * planning.scalar_row_bytes(engine, 7, 13)
        held = planning.choose(engine, 4 * H200.sm_count, 32, 64, H200).plan  # 8 elements of each weight a lane
        assert (held.tile.rows, held.smem.weights, held.owners.grid) == (planning.ROW_BLOCK, "registers", H200.sm_count)
        assert held.owners.occupancy == planning.SCALAR_REGISTER_WEIGHTS_OCCUPANCY
        assert held.smem.bytes == held.tile.rows * planning.scalar_row_bytes(engine, 32, 64)
        assert planning.choose(engine, 33, 40, 129, H200).plan.smem.weights == "global"  # 40 of W1 a lane
        largest = planning.choose(engine, 129, 15, planning.SCALAR_GLOBAL_WEIGHTS_MAX // 30, H200).plan
        assert largest.smem.weights == "global"  # 477 outputs: beyond one pass
        over = planning.choose(engine, 129, 15, planning.SCALAR_GLOBAL_WEIGHTS_MAX // 30 + 1, H200).plan
        assert over.smem.weights == "smem" and over.owners.tiles_per_cta == 1
        whole = planning.choose(engine, 129, 16, planning.SCALAR_GLOBAL_WEIGHTS_MAX // 32, H200).plan
        assert planning.scalar_weights_whole_steps(16, 448) and whole.smem.weights == "smem"
        assert whole.owners.tiles_per_cta == 1
        for rows in (4 * H200.sm_count + 1, 40_000):  # 8-row tiles; 304-row tiles
            reused = planning.choose(engine, rows, 7, 13, H200).plan
            assert reused.tile.rows > planning.ROW_BLOCK and reused.smem.weights == "smem"


@given(st.integers(1, 300), st.integers(1, 300))
def test_register_weights_count_each_lanes_share(k_dim, n_dim):
    """A lane's share at one row block: its classes (K_CLASSES / lanes) of every K step; lanes as the device's
    ``linear_rows`` takes them (the most, up to K_CLASSES, with every output's group within the CTA)."""
    lanes = planning.scalar_group_lanes(n_dim)
    assert lanes in (1, 2, 4, 8)
    assert n_dim * lanes <= planning.SCALAR_THREADS or lanes == 1
    assert lanes == planning.SCALAR_K_CLASSES or n_dim * lanes * 2 > planning.SCALAR_THREADS
    per_lane = planning.SCALAR_K_CLASSES // lanes
    assert planning.scalar_lane_weights(k_dim, n_dim) == -(-k_dim // planning.SCALAR_K_CLASSES) * per_lane
    fits = planning.register_weights_fit(planning.ROW_BLOCK, k_dim, n_dim)
    assert not planning.register_weights_fit(2 * planning.ROW_BLOCK, k_dim, n_dim)  # a lane's column varies
    steps = planning.SCALAR_REGISTER_WEIGHTS_MIN_STEPS
    assert fits == (max(k_dim, n_dim) <= planning.SCALAR_THREADS
                    and -(-min(k_dim, n_dim) // planning.SCALAR_K_CLASSES) >= steps
                    and planning.scalar_lane_weights(k_dim, n_dim) <= planning.SCALAR_WEIGHT_REGISTERS
                    and planning.scalar_lane_weights(n_dim, k_dim) <= planning.SCALAR_WEIGHT_REGISTERS)
    if fits:
        plan = planning.forced("persistent", 9, k_dim, n_dim, H200, tile_rows=planning.ROW_BLOCK, weights="registers")
        assert plan.owners.occupancy == planning.SCALAR_REGISTER_WEIGHTS_OCCUPANCY
    else:
        with pytest.raises(ValueError, match="weights='registers' needs"):
            planning.forced("persistent", 9, k_dim, n_dim, H200, tile_rows=planning.ROW_BLOCK, weights="registers")


@given(st.integers(1, 10_000))
def test_weight_group_stride_is_the_least_odd_count_of_chunks_that_holds_every_output(n):
    """Odd: the 16-byte chunks of eight neighbouring K steps of one output (the staging copy's eight lanes of a
    bank phase) then fall in distinct banks."""
    g = planning.weight_group_stride(n)
    assert g >= n and g % 2 == 1 and g - 2 < n


@given(st.integers(1, 2000), st.integers(1, 2000), st.integers(1, 64))
def test_shared_memory_sizes_hold_the_layouts_the_kernels_address(n, k, blocks):
    """The bytes planning reserves cover every element the device layouts address (``scalar.smem_weight``:
    (n, k) at half (k // 8 * G + n) * 8 + k % 8; ``scalar.smem_rows``: (r, k) at float (r // 4 * S + k) * 4 +
    r % 4, read up to the row's padding by a lane's vector run), and each region is whole 16-byte units, so the
    next one starts aligned."""
    classes, block = planning.SCALAR_K_CLASSES, planning.ROW_BLOCK
    g = planning.weight_group_stride(n)
    last_weight_half = ((k - 1) // classes * g + n - 1) * classes + classes - 1  # the last step's chunk, padding too
    assert 2 * (last_weight_half + 1) <= planning.staged_weight_bytes(n, k)
    assert planning.staged_weight_bytes(n, k) % 16 == 0
    stride = planning.scalar_row_stride(k)
    rows = blocks * block
    last_row_float = ((rows - 1) // block * stride + stride - 1) * block + block - 1
    assert stride >= k and stride % classes == 0
    assert 4 * (last_row_float + 1) == rows * planning.scalar_row_bytes("persistent-global", k, n)
    assert rows * planning.scalar_row_bytes("persistent", k, n) % 16 == 0


@pytest.mark.parametrize("rows,channels,hidden,tile,split,stages,grid,occupancy", [
    (16384, 512, 1024, 64, 1, 1, 132, 1),  # 256 tiles of 64 rows, 200 KB each: one CTA per SM, 2 tiles for most
    (4096, 256, 1024, 64, 2, 2, 128, 1),  # 64 tiles split in two: 64-row tiles on 128 SMs, half the hidden each
    (8192, 256, 1024, 64, 1, 2, 128, 1),  # 128 tiles of 64 rows already fill the SMs
    (1024, 128, 1024, 64, 4, 4, 64, 1),  # 16 tiles of 64 rows split in four: 4 chunks each, as many stages
    (768, 128, 512, 32, 4, 2, 96, 2),  # 24 tiles of 32 rows split in four (8 chunks over 4 CTAs each), 96 CTAs
    (33, 32, 1024, 64, 8, 2, 8, 2),  # one 64-row tile split over 8 CTAs, 2 chunks each, where 32-row tiles need 2
    (513, 96, 192, 32, 1, 3, 17, 2),  # three chunks (a split needs two per CTA): three stages, every load of
    (1, 7, 61, 32, 1, 1, 1, 2),  # one chunk                                     a tile issued at its start
])
def test_persistent_tc_tiles_and_grid(rows, channels, hidden, tile, split, stages, grid, occupancy):
    plan = planning.choose("persistent-tc", rows, channels, hidden, H200).plan
    assert plan.engine == "persistent-tc"
    assert (plan.tile.rows, plan.tile.split, plan.tile.stages, plan.owners.grid, plan.owners.occupancy) == (
        tile, split, stages, grid, occupancy)
    loads = "tma" if tile == 64 else "cp.async"  # 64-row tiles are wgmma's, which loads weights by TMA
    assert (plan.tile.mma, plan.tile.loads) == ("wgmma" if tile == 64 else "mma.sync", loads)
    overlap = loads == "tma" and split == 1 and plan.tile.channels_tile == 512  # planning.tc_overlap
    assert plan.tile.overlap == overlap
    assert plan.smem.bytes == planning.persistent_tc_smem_bytes(tile, plan.tile.channels_tile, stages, split, loads,
                                                                overlap)
    assert plan.tile.channels_tile >= channels and plan.tile.hidden_chunk == planning.TC_HIDDEN_CHUNK


@pytest.mark.parametrize("shape,layout", [
    # the H200 sweeps' fastest layouts (reports/h200/sweeps/megakernel-sweep*.json): a split where whole tiles
    # leave SMs idle or where it lets 64-row tiles fill them; none where every SM is busy already
    ((1024, 128, 256), (32, 2)), ((2048, 512, 1024), (32, 2)), ((4096, 256, 1024), (64, 2)),
    ((4096, 128, 512), (64, 2)), ((2048, 256, 2048), (32, 2)),
    ((16384, 256, 1024), (64, 1)), ((8192, 256, 1024), (64, 1)), ((16384, 512, 2048), (64, 1)),
    ((8448, 512, 512), (64, 1)), ((385, 72, 200), (32, 2)),
    ((257, 64, 128), (32, 1)),  # two chunks: unsplit measured faster (4.1 against 4.4 us)
    # the H100's sweeps of splits over 4 and 8 CTAs (reports/h100/tc-split/): a wide split where its clusters fill
    # at most TC_WIDE_SPLIT_SHARE of the SMs, of 64-row wgmma tiles where it costs less (half the weight traffic
    # of two 32-row tiles); 2 where more tiles share the L2
    ((65, 128, 512), (32, 4)), ((640, 256, 768), (32, 4)), ((1, 512, 2048), (32, 8)),
    ((16, 256, 1024), (32, 8)), ((256, 512, 2048), (32, 8)), ((1024, 512, 2048), (32, 2)),
    ((4096, 512, 2048), (32, 1)), ((768, 128, 512), (32, 4)), ((2048, 256, 1024), (32, 2)),
    ((1024, 64, 1024), (64, 4)), ((1024, 128, 512), (64, 4)), ((1024, 256, 1024), (64, 4)),
    ((1024, 256, 2048), (64, 4)), ((1024, 128, 1024), (64, 4)), ((1536, 256, 1024), (64, 4)),
    ((512, 256, 1024), (64, 8)), ((768, 256, 1024), (64, 8)),
    ((33, 32, 1024), (64, 8)), ((1, 64, 1024), (64, 8)),  # tied with the 32-row tile's split of 4 (6.3, 6.2 us)
])
def test_tc_layout_takes_the_measured_fastest(shape, layout):
    rows, channels, hidden = shape
    assert planning.tc_layout(rows, planning.channel_tile(channels), hidden, True, H200) == layout


H100_CLUSTERS = dataclasses.replace(H200, name="H100 as counted", clusters_at_once=((4, 30), (8, 15)))
"""The planning default with the clusters the H100 ran at once
(reports/h100/tc-split/cluster-occupancy-f531dd4.json)."""


@pytest.mark.parametrize("shape,layout", [
    # a split of 8 on 64-row tiles won at 896 rows (14 clusters, 8.3 against the old plan's 10.2 us) and lost at
    # 1024 (16 clusters where 15 run at once); the share of the SMs (TC_WIDE_SPLIT_SHARE) had refused both
    ((896, 128, 1024), (64, 8)), ((1024, 128, 1024), (64, 4)), ((768, 256, 1024), (64, 8)),
    ((1024, 256, 1024), (64, 4)), ((1536, 256, 1024), (64, 4)), ((640, 256, 768), (32, 4)),
])
def test_wide_splits_fit_where_the_gpu_runs_every_cluster_at_once(shape, layout):
    rows, channels, hidden = shape
    assert planning.tc_layout(rows, planning.channel_tile(channels), hidden, True, H100_CLUSTERS) == layout


def test_a_wide_split_past_the_clusters_at_once_is_refused_and_the_share_rules_only_where_unknown():
    assert wide_split_fits(15, 8, H100_CLUSTERS) and not wide_split_fits(16, 8, H100_CLUSTERS)
    assert wide_split_fits(30, 4, H100_CLUSTERS) and not wide_split_fits(31, 4, H100_CLUSTERS)
    assert H200.clusters_held(8) is None  # no count: a share of the SMs
    assert wide_split_fits(12, 8, H200) and not wide_split_fits(14, 8, H200)
    with pytest.raises(ValueError, match="clusters_at_once"):
        dataclasses.replace(H200, clusters_at_once=((0, 4),))


def test_a_driver_that_does_not_count_clusters_leaves_the_share_rule_with_a_warning(monkeypatch):
    from kernellab.megakernel.planning import common

    def refuse(device_index):
        raise RuntimeError("CUDA driver error CUDA_ERROR_INVALID_PTX")

    monkeypatch.setattr(common, "probe_clusters", refuse)
    with pytest.warns(RuntimeWarning, match="CUDA_ERROR_INVALID_PTX"):
        assert common.resident_clusters.__wrapped__(0) == ()


def test_tc_layout_splits_only_aligned_rows_with_two_chunks_a_cta_and_room():
    assert planning.tc_layout(1024, 128, 255, False, H200) == (32, 1)  # element loads: no split
    assert planning.tc_layout(1024, 128, 192, True, H200) == (32, 1)  # three chunks: one CTA would get one
    assert planning.tc_layout(1024, 128, 256, True, H200) == (32, 2)
    assert planning.tc_layout(4096, 512, 2048, True, H200)[0] == 32  # 64 x 512 has no room for the peer's half
    # the cost: the busiest SM's share of CTAs x its chunks x (rows + the weight traffic's price)
    assert planning.tc_cost(64, 64, 1024, 2, H200) == 1 * 8 * (64 + planning.TC_WEIGHT_ROWS)
    assert planning.tc_cost(32, 512, 1024, 1, H200) == 4 * 16 * (32 + planning.TC_WEIGHT_ROWS)


@given(rows=st.integers(1, 20000), channels=st.integers(1, 1200), hidden=st.integers(1, 4000),
       requested=st.sampled_from(sorted(planning.FALLBACK_CHAINS)))
def test_every_shape_is_served_by_a_consistent_plan(rows, channels, hidden, requested):
    choice = planning.choose(requested, rows, channels, hidden, H200)
    plan = choice.plan
    assert plan.engine in planning.FALLBACK_CHAINS[requested]
    assert plan.tile.rows * plan.tile.num_tiles >= rows > plan.tile.rows * (plan.tile.num_tiles - 1)
    assert 0 <= plan.smem.bytes <= H200.smem_per_block
    assert 1 <= plan.owners.grid <= plan.tile.num_tiles * plan.tile.split  # a split: clusters of CTAs per tile
    assert plan.owners.grid // plan.tile.split * plan.owners.tiles_per_cta >= plan.tile.num_tiles
    if plan.engine.startswith("persistent"):  # never more CTAs than can be resident
        assert plan.owners.grid <= H200.sm_count * plan.owners.occupancy
    if plan.engine == "conventional-tc":
        assert channels % 8 == 0 and hidden % 8 == 0
    if plan.engine == "persistent-tc":  # 16-byte loads only where every row is 16-byte aligned
        assert plan.tile.vector == (8 if channels % 8 == 0 and hidden % 8 == 0 else 1)
        assert plan.tile.mma == ("wgmma" if plan.tile.vector == 8 and plan.tile.rows == 64 else "mma.sync")
        assert plan.tile.loads == ("tma" if plan.tile.mma == "wgmma" else "cp.async")
        if plan.tile.split > 1:  # whole clusters, each CTA at least two hidden chunks
            assert plan.tile.vector == 8 and plan.owners.grid % plan.tile.split == 0
            assert planning.ceil_div(hidden, planning.TC_HIDDEN_CHUNK) >= 2 * plan.tile.split
    if plan.engine == "persistent":
        assert plan.smem.hidden == "smem"


@given(rows=st.integers(1, 20000), channels=st.integers(1, 64).map(lambda v: 8 * v),
       hidden=st.integers(1, 500).map(lambda v: 8 * v))
def test_aligned_persistent_tc_plans_split_consistently(rows, channels, hidden):
    """16-byte rows, where the planner may split the hidden: the plan is the cheapest layout, and a split
    plan is whole clusters that fit, each CTA with two hidden chunks at least."""
    plan = planning.plan_engine("persistent-tc", rows, channels, hidden, H200)
    tile = plan.tile
    if tile.registers:  # the register form where it fits (test_register_form_plans)
        assert planning.register_form_fits(channels, hidden)
        return
    assert (tile.rows, tile.split) == planning.tc_layout(rows, tile.channels_tile, hidden, True, H200)
    assert tile.loads == ("tma" if tile.mma == "wgmma" else "cp.async")
    assert plan.smem.bytes == planning.persistent_tc_smem_bytes(tile.rows, tile.channels_tile, tile.stages,
                                                                tile.split, tile.loads, tile.overlap)
    assert plan.smem.bytes <= H200.smem_per_block
    assert plan.owners.grid % tile.split == 0
    assert plan.owners.grid <= H200.sm_count * plan.owners.occupancy
    if tile.split > 1:
        assert planning.ceil_div(hidden, planning.TC_HIDDEN_CHUNK) >= 2 * tile.split
        unsplit = planning.tc_cost(tile.rows, tile.num_tiles, hidden, 1, H200)
        assert planning.tc_cost(tile.rows, tile.num_tiles, hidden, tile.split, H200) <= unsplit


def test_occupancy_limits():
    assert planning.occupancy(256, 0, H200) == 8  # threads
    assert planning.occupancy(256, 204800, H200) == 1  # shared memory
    assert planning.occupancy(256, 24576, H200, limit=2) == 2  # registers (the kernel's launch bound)


def test_forced_plans_reach_other_code_paths():
    plan = planning.forced("persistent", 67, 19, 37, H200, tile_rows=8, grid=3, weights="global")
    assert (plan.tile.rows, plan.tile.num_tiles, plan.owners.grid, plan.owners.tiles_per_cta) == (8, 9, 3, 3)
    assert plan.smem.weights == "global" and plan.smem.bytes == 8 * 4 * (24 + 40)
    with pytest.raises(ValueError, match="no weights="):
        planning.forced("persistent-tc", 33, 32, 64, H200, weights="global")
    with pytest.raises(ValueError, match="tile_rows must be one of"):
        planning.forced("persistent-tc", 33, 32, 64, H200, tile_rows=48)


def test_unknown_engine_and_bad_device():
    with pytest.raises(ValueError, match="unknown engine"):
        planning.choose("megakernel", 1, 1, 1, H200)
    with pytest.raises(ValueError, match="sm_count must be >= 1"):
        planning.DeviceSpec(name="x", sm_count=0, smem_per_block=1, smem_per_sm=1)


def test_ceil_div_and_round_up_agree_with_python():
    for a in range(0, 50):
        for b in (1, 3, 8, 16):
            assert planning.ceil_div(a, b) == -(-a // b)
            assert planning.round_up(a, b) % b == 0 and 0 <= planning.round_up(a, b) - a < b


def test_planning_takes_wgmma_for_aligned_64_row_tiles():
    assert planning.plan_engine("persistent-tc", 16384, 512, 2048, H200).tile.mma == "wgmma"
    assert planning.plan_engine("persistent-tc", 16384, 384, 1536, H200).tile.mma == "wgmma"  # 512-channel tile
    assert planning.plan_engine("persistent-tc", 16384, 64, 1024, H200).tile.mma == "wgmma"  # 64-channel tile
    assert planning.plan_engine("persistent-tc", 1024, 512, 2048, H200).tile.rows == 32  # few rows: 32-row tiles
    assert planning.plan_engine("persistent-tc", 1024, 512, 2048, H200).tile.mma == "mma.sync"
    assert planning.plan_engine("persistent-tc", 16384, 511, 2048, H200).tile.mma == "mma.sync"  # element loads
    forced_sync = planning.forced("persistent-tc", 16384, 512, 2048, H200, mma="mma.sync")
    assert (forced_sync.tile.mma, forced_sync.tile.rows) == ("mma.sync", 64)
    assert planning.forced("persistent-tc", 4096, 256, 1024, H200, tile_rows=32).tile.split == 1  # forced tile


def test_forced_hidden_split_plans():
    plan = planning.forced("persistent-tc", 4096, 256, 1024, H200, tile_rows=64, split=2)
    assert (plan.tile.split, plan.tile.rows, plan.owners.grid, plan.owners.tiles_per_cta) == (2, 64, 128, 1)
    assert plan.smem.bytes == planning.persistent_tc_smem_bytes(64, 256, plan.tile.stages, 2, "tma")
    assert plan.smem.bytes == planning.persistent_tc_smem_bytes(64, 256, plan.tile.stages, loads="tma") + (
        4 * 64 * 128 + 16)
    assert plan.smem.bytes <= H200.smem_per_block
    many = planning.forced("persistent-tc", 16384, 256, 1024, H200, split=2)
    assert many.owners.grid % 2 == 0 and many.owners.grid <= H200.sm_count * many.owners.occupancy
    assert (many.owners.grid // 2) * many.owners.tiles_per_cta >= many.tile.num_tiles
    assert planning.forced("persistent-tc", 200, 64, 200, H200, split=2, grid=6).owners.tiles_per_cta == 3
    with pytest.raises(ValueError, match="multiple of the cluster size 2"):
        planning.forced("persistent-tc", 200, 64, 200, H200, split=2, grid=5)
    with pytest.raises(ValueError, match="does not fit on chip"):  # the 64 x 512 tile has no room for the peer's half
        planning.forced("persistent-tc", 16384, 512, 2048, H200, split=2)
    with pytest.raises(ValueError, match="multiples of 8"):
        planning.forced("persistent-tc", 100, 63, 111, H200, split=2)
    with pytest.raises(ValueError, match="split must be one of"):
        planning.forced("persistent-tc", 100, 64, 128, H200, split=3)
    with pytest.raises(ValueError, match="no mma, split, loads, multicast, overlap, registers or pdl choice"):
        planning.forced("persistent", 100, 64, 128, H200, split=2)
    unsplit = planning.forced("persistent-tc", 4096, 256, 1024, H200, split=1)  # the planner splits this one
    assert (unsplit.tile.split, unsplit.owners.grid) == (1, 64)


@given(rows=st.integers(1, 20000), channels=st.integers(1, 64).map(lambda v: 8 * v),
       hidden=st.integers(1, 500).map(lambda v: 8 * v), multicast=st.sampled_from(planning.TC_MULTICASTS[1:]))
def test_weight_multicast_plans_are_whole_resident_clusters(rows, channels, hidden, multicast):
    """Every CTA of a cluster runs as many tiles as the cluster's first (the kernel's loop bound), and those
    cover every row tile; the grid is whole clusters that can all be resident."""
    plan = planning.forced("persistent-tc", rows, channels, hidden, H200, mma="wgmma", multicast=multicast)
    grid, tiles = plan.owners.grid, plan.tile.num_tiles
    assert grid % multicast == 0 and grid <= H200.sm_count * plan.owners.occupancy
    assert plan.smem.bytes <= H200.smem_per_block
    for cta in range(grid):
        first = cta - cta % multicast
        assert len(range(cta, tiles + cta % multicast, grid)) == len(range(first, tiles, grid))
    assert sorted(t for cta in range(grid) for t in range(cta, tiles, grid)) == list(range(tiles))


def test_forced_weight_multicast_plans():
    plan = planning.forced("persistent-tc", 16384, 512, 2048, H200, mma="wgmma", multicast=2)
    assert (plan.tile.multicast, plan.tile.stages, plan.owners.grid, plan.owners.tiles_per_cta) == (2, 1, 132, 2)
    assert plan.smem.bytes == planning.persistent_tc_smem_bytes(64, 512, 1) + planning.TMA_BARRIER_BYTES
    assert plan.tile.loads == "tma"  # a multicast loads by TMA
    odd = planning.forced("persistent-tc", 130, 136, 200, H200, mma="wgmma", multicast=2)  # 3 tiles, 2 clusters
    assert (odd.tile.num_tiles, odd.owners.grid, odd.owners.tiles_per_cta) == (3, 4, 1)
    several = planning.forced("persistent-tc", 130, 64, 200, H200, mma="wgmma", multicast=2, grid=2)
    assert several.owners.tiles_per_cta == 2
    four = planning.forced("persistent-tc", 16384, 512, 2048, H200, mma="wgmma", multicast=4)
    assert (four.owners.grid, four.owners.tiles_per_cta) == (132, 2)  # 33 clusters of 4
    assert planning.forced("persistent-tc", 130, 64, 200, H200, mma="wgmma", multicast=4).owners.grid == 4
    with pytest.raises(ValueError, match="multiple of the cluster size 2"):
        planning.forced("persistent-tc", 130, 64, 200, H200, mma="wgmma", multicast=2, grid=3)
    with pytest.raises(ValueError, match="needs the wgmma form"):
        planning.forced("persistent-tc", 4096, 256, 1024, H200, mma="mma.sync", multicast=2)
    with pytest.raises(ValueError, match="needs the wgmma form"):
        planning.forced("persistent-tc", 4096, 256, 1024, H200, mma="wgmma", split=2, multicast=2)
    with pytest.raises(ValueError, match="multicast must be one of"):
        planning.forced("persistent-tc", 4096, 256, 1024, H200, mma="wgmma", multicast=8)
    with pytest.raises(ValueError, match="no mma, split, loads, multicast, overlap, registers or pdl choice"):
        planning.forced("persistent", 100, 64, 128, H200, multicast=2)
    assert planning.plan_engine("persistent-tc", 16384, 512, 2048, H200).tile.multicast == 1  # until measured


def test_programmatic_dependent_launch_only_when_forced():
    """``pdl`` changes how a plan is launched, nothing of its tile, grid or shared memory; planning never takes it
    until measured (``megakernel_sweep.py``'s ``pdl`` label), and neither the register form nor another engine
    has it."""
    for shape in [(1024, 256, 1024), (16, 512, 2048), (257, 64, 128)]:
        planned = planning.choose("persistent-tc", *shape, H200).plan
        launched_early = planning.forced("persistent-tc", *shape, H200, pdl=True)
        assert not planned.tile.pdl and launched_early.tile.pdl
        assert dataclasses.replace(launched_early.tile, pdl=False) == planned.tile
        assert (launched_early.smem, launched_early.owners) == (planned.smem, planned.owners)
    with pytest.raises(ValueError, match="register form has no split, multicast, loads, overlap, stages or pdl"):
        planning.forced("persistent-tc", 64, 32, 64, H200, registers=True, pdl=True)
    with pytest.raises(ValueError, match="no mma, split, loads, multicast, overlap, registers or pdl choice"):
        planning.forced("persistent", 100, 64, 128, H200, pdl=True)


def test_tma_loads_planned_for_wgmma_and_forced_either_way():
    plan = planning.choose("persistent-tc", 4096, 256, 1024, H200).plan  # the planner's wgmma split
    assert (plan.tile.loads, plan.tile.mma, plan.tile.split) == ("tma", "wgmma", 2)
    assert plan.smem.bytes == planning.persistent_tc_smem_bytes(64, 256, plan.tile.stages, 2) + (
        planning.TMA_BARRIER_BYTES * plan.tile.stages)
    unsplit = planning.choose("persistent-tc", 16384, 512, 2048, H200).plan
    assert (unsplit.tile.loads, unsplit.tile.multicast, unsplit.owners.grid) == ("tma", 1, 132)
    by_cp_async = planning.forced("persistent-tc", 16384, 512, 2048, H200, loads="cp.async")
    assert (by_cp_async.tile.loads, by_cp_async.tile.mma, unsplit.tile.overlap) == ("cp.async", "wgmma", True)
    assert not by_cp_async.tile.overlap  # the overlapped schedule needs TMA: cp.async tiles run the serial one
    assert by_cp_async.smem.bytes == unsplit.smem.bytes - planning.TMA_BARRIER_BYTES * unsplit.tile.stages - (
        2 * 64 * planning.TC_HIDDEN_CHUNK)  # and have one hidden buffer
    assert planning.forced("persistent-tc", 4096, 256, 1024, H200, mma="wgmma", tile_rows=128).tile.loads == (
        "cp.async")  # 128-row wgmma tiles: cp.async unless forced
    for rows, channels, hidden in [(1024, 128, 256), (16384, 511, 2048), (1, 7, 13)]:  # mma.sync tiles
        assert planning.choose("persistent-tc", rows, channels, hidden, H200).plan.tile.loads == "cp.async"
    with pytest.raises(ValueError, match="TMA loads need the wgmma form"):
        planning.forced("persistent-tc", 1024, 128, 256, H200, loads="tma")  # 32-row mma.sync tiles
    with pytest.raises(ValueError, match="TMA loads need the wgmma form"):
        planning.forced("persistent-tc", 16384, 511, 2048, H200, loads="tma")  # element loads
    with pytest.raises(ValueError, match="loads must be one of"):
        planning.forced("persistent-tc", 16384, 512, 2048, H200, loads="ldg")
    with pytest.raises(ValueError, match="multicast loads by TMA"):
        planning.forced("persistent-tc", 16384, 512, 2048, H200, multicast=2, loads="cp.async")


def test_forced_wgmma_plans_and_their_limits():
    plan = planning.forced("persistent-tc", 16384, 512, 2048, H200, mma="wgmma")
    assert (plan.tile.mma, plan.tile.rows, plan.tile.channels_tile, plan.owners.grid) == ("wgmma", 64, 512, 132)
    wide = planning.forced("persistent-tc", 4096, 256, 1024, H200, mma="wgmma", tile_rows=128)
    assert (wide.tile.rows, wide.owners.grid) == (128, 32)
    with pytest.raises(ValueError, match="at most 256 channels"):
        planning.forced("persistent-tc", 4096, 512, 1024, H200, mma="wgmma", tile_rows=128)
    with pytest.raises(ValueError, match="multiples of 8"):
        planning.forced("persistent-tc", 100, 63, 111, H200, mma="wgmma")
    with pytest.raises(ValueError, match="one of"):
        planning.forced("persistent-tc", 100, 64, 128, H200, mma="wgmma", tile_rows=32)
    with pytest.raises(ValueError, match="no mma, split, loads, multicast, overlap, registers or pdl choice"):
        planning.forced("persistent", 100, 64, 128, H200, mma="wgmma")
    with pytest.raises(ValueError, match="unknown mma"):
        planning.forced("persistent-tc", 100, 64, 128, H200, mma="tcgen05")


def test_overlapped_schedule_plans():
    """The overlapped schedule adds a second hidden buffer; it needs wgmma with TMA loads, and a chunk for
    every CTA of a split."""
    base = planning.forced("persistent-tc", 16384, 512, 2048, H200, overlap=False)
    assert (base.tile.stages, base.tile.overlap) == (1, False)
    overlapped = planning.forced("persistent-tc", 16384, 512, 2048, H200, overlap=True)
    assert overlapped.tile.overlap and overlapped.smem.bytes == base.smem.bytes + 2 * 64 * planning.TC_HIDDEN_CHUNK
    split = planning.forced("persistent-tc", 4096, 256, 1024, H200, split=2, overlap=True)
    assert (split.tile.split, split.tile.overlap) == (2, True)
    assert split.smem.bytes == planning.tc_tile_smem_bytes(split.tile) <= H200.smem_per_block
    with pytest.raises(ValueError, match="overlapped chunk schedule needs the wgmma form with TMA"):
        planning.forced("persistent-tc", 1, 7, 13, H200, overlap=True)  # element loads, mma.sync
    with pytest.raises(ValueError, match="overlapped chunk schedule needs the wgmma form with TMA"):
        planning.forced("persistent-tc", 16384, 512, 2048, H200, loads="cp.async", overlap=True)
    with pytest.raises(ValueError, match="a hidden chunk for every CTA"):
        planning.forced("persistent-tc", 100, 64, 64, H200, mma="wgmma", split=2, overlap=True)
    with pytest.raises(ValueError, match="no mma, split, loads, multicast, overlap, registers or pdl choice"):
        planning.forced("conventional", 100, 64, 128, H200, overlap=True)


@given(rows=st.integers(1, 20_000), channels=st.integers(1, 64).map(lambda v: 8 * v),
       hidden=st.integers(1, 600).map(lambda v: 8 * v), split=st.sampled_from(planning.TC_SPLITS),
       overlap=st.booleans())
def test_overlapped_plans_fit_and_keep_their_choices(rows, channels, hidden, split, overlap):
    try:
        plan = planning.forced("persistent-tc", rows, channels, hidden, H200, mma="wgmma", loads="tma", split=split,
                               overlap=overlap)
    except ValueError as e:  # a split 64-row tile without room for the peers' partial output tiles, a
        # fragment too short to deal out, or fewer hidden chunks than the split's CTAs for the overlap
        cols = planning.channel_tile(channels)
        assert split > 1 and (
            "does not fit" in str(e) and planning.persistent_tc_smem_bytes(64, cols, 1, split, "tma", overlap)
            > planning.usable_smem(H200)
            or "does not deal" in str(e) and not planning.tc_split_fits(64, cols, split)
            or "a hidden chunk for every CTA" in str(e) and planning.ceil_div(hidden, 64) < split), e
        return
    tile = plan.tile
    assert (tile.overlap, tile.split, tile.loads, tile.mma) == (overlap, split, "tma", "wgmma")
    assert plan.smem.bytes == planning.tc_tile_smem_bytes(tile) <= H200.smem_per_block
    assert tile.stages == 1 or tile.stages <= min(planning.TC_MAX_STAGES,
                                                  planning.ceil_div(planning.ceil_div(hidden, 64), split))
    assert plan.owners.grid >= 1 and plan.owners.grid % tile.split == 0


@pytest.mark.parametrize("count,split", [(count, split) for count in (4, 8, 16, 32, 64, 128) for split in (2, 4, 8)
                                         if count % (2 * split) == 0])  # whole pair runs: tc_split_fits
def test_split_exchange_pairs_each_element_with_one_slot(count, split):
    """A hidden split's exchange (persistent_tc): each CTA finishes whole pairs of neighbouring columns (so its
    y stores stay 8-byte vectors), the CTAs finish disjoint shares of a fragment, and what the split - 1 peers
    send a CTA fills its receive buffer's (split - 1) * count / split slots once each, every slot holding an
    element the CTA finishes, the one it reads back for that element."""
    pytest.importorskip("cutlass", reason="engines.tensorcore needs nvidia-cutlass-dsl")
    from kernellab.megakernel.engines.tensorcore import split_owner, split_recv_slot, split_slot

    per = count // split
    assert all(split_owner(i, 1) == 0 for i in range(count))
    assert all(split_owner(2 * p, split) == split_owner(2 * p + 1, split) for p in range(count // 2))
    for owner in range(split):
        finished = [i for i in range(count) if split_owner(i, split) == owner]
        assert sorted(split_slot(i, split) for i in finished) == list(range(per))
        received = {}
        for sender in set(range(split)) - {owner}:
            for i in finished:  # the sender's partial of every element the owner finishes
                slot = split_recv_slot(i, count, split, sender)
                assert slot not in received and 0 <= slot < (split - 1) * per
                received[slot] = i
        assert len(received) == (split - 1) * per
        for i in finished:  # the owner reads run p's slot of the element for each peer p
            assert [received[p * per + split_slot(i, split)] for p in range(split - 1)] == [i] * (split - 1)


@pytest.mark.parametrize("padded", [16, 32, 48, 64, 80, 128])
def test_register_slots_name_each_index_once_in_per_thread_runs(padded):
    """The register form's memory order: every (n-tile, slot) of a padded dimension names its own index below
    it, and the slots thread t holds of a group (slot 2t + e of each of its n-tiles, which is also k-slot
    2t + e0 + 8 e1 of its k-blocks) are its run, in the order the kernel fills its fragments from the run."""
    indices = [planning.register_slot(j, s, padded) for j in range(padded // 8) for s in range(8)]
    assert sorted(indices) == list(range(padded))
    for first, blocks in planning.register_groups(padded):
        for t in range(4):
            start = planning.register_run_start(first, blocks, t)
            for i in range(4 * blocks):  # run element i: e0 = i % 2, e1 (n-tile of the pair) = i // 2 % 2, block i // 4
                n_tile = 2 * (first + i // 4) + i // 2 % 2
                assert planning.register_slot(n_tile, 2 * t + i % 2, padded) == start + i
    assert planning.register_groups(80) == [(0, 2), (2, 2), (4, 1)]


def test_register_form_plans():
    one = planning.choose("persistent-tc", 1, 7, 13, H200).plan
    tile = one.tile
    assert tile.registers and (tile.rows, tile.channels_tile, tile.hidden_chunk, tile.threads, tile.vector) == (
        16, 16, 16, 32, 1)
    assert (one.smem.bytes, one.smem.weights, one.smem.hidden) == (0, "registers", "registers")
    assert (one.owners.grid, one.owners.occupancy) == (1, planning.REGISTER_FORM_OCCUPANCY)
    aligned = planning.choose("persistent-tc", 33, 32, 64, H200).plan
    assert aligned.tile.registers and (aligned.tile.vector, aligned.tile.num_tiles, aligned.owners.grid) == (8, 3, 3)
    many = planning.choose("persistent-tc", 40_000, 32, 64, H200).plan
    assert many.owners.grid == H200.sm_count * planning.REGISTER_FORM_OCCUPANCY and many.owners.tiles_per_cta == 3
    assert planning.choose("persistent-tc", 3, 16, 128, H200).plan.tile.registers  # 16 x 128: 2048 elements
    assert planning.choose("persistent-tc", 20, 13, 20, H200).plan.tile.registers  # unaligned 16 x 32: 512
    assert not planning.choose("persistent-tc", 20, 13, 40, H200).plan.tile.registers  # unaligned 16 x 48
    for shape in [(3, 16, 129), (3, 48, 48), (3, 72, 16), (49, 48, 96), (129, 31, 47)]:
        # past a bound (hidden 144, 2304 elements, channels 80, both), and unaligned past REGISTER_FORM_UNALIGNED
        assert not planning.choose("persistent-tc", *shape, H200).plan.tile.registers
    forced = planning.forced("persistent-tc", 129, 31, 47, H200, registers=True)
    assert forced.tile.registers and (forced.tile.channels_tile, forced.tile.hidden_chunk) == (32, 48)
    assert planning.forced("persistent-tc", 100, 13, 7, H200, registers=True, grid=3).owners.tiles_per_cta == 3
    shared = planning.forced("persistent-tc", 1, 7, 13, H200, registers=False)
    assert not shared.tile.registers and (shared.tile.rows, shared.tile.threads) == (32, planning.TC_THREADS)
    assert not planning.forced("persistent-tc", 1, 7, 13, H200, stages=1).tile.registers  # a shared-form choice
    assert not planning.plan_engine("persistent-tc", 1, 7, 13, H200, tile_rows=32).tile.registers
    refused = planning.plan_tile("persistent-tc", 1, 8, 8, H200, mma="wgmma", registers=True)
    assert isinstance(refused, planning.Refusal) and "16-row tiles and mma.sync" in refused.reason
    with pytest.raises(ValueError, match="the register form holds"):
        planning.forced("persistent-tc", 49, 48, 96, H200, registers=True)
    with pytest.raises(ValueError, match="no split, multicast, loads, overlap, stages or pdl choice"):
        planning.forced("persistent-tc", 33, 32, 64, H200, registers=True, split=2)
    with pytest.raises(ValueError, match="no mma, split, loads, multicast, overlap, registers or pdl choice"):
        planning.forced("persistent", 33, 32, 64, H200, registers=True)
