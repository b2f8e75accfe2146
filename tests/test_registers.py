"""Register layout: targets, validity, position ids and the visibility rule, against hand-computed
values and an independent brute-force reference."""
import subprocess
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from mutor2d import config as C
from mutor2d.model.attention import NEVER
from mutor2d.objectives.layout import Layout, dense_slots, make_layout, offset_targets, regular_position_ids
from mutor2d.objectives.spec import LayoutError, RegisterSpec, RegisterSpec1D, RegisterSpec2D
from mutor2d.objectives.spec import offset_pairs
from timeouts import limit


def g(seed=0):
    return torch.Generator().manual_seed(seed)


def reg_list(lay, b):
    v = lay.reg_valid[b]
    return lay.reg_anchor[b][v].tolist(), lay.reg_target[b][v].tolist()


def test_2d_hand_computed_offset_1_1_geometric():
    # 3x3 grid, offset (1,1): anchors on the last column or last row have no target.
    t, v = offset_targets((3, 3), torch.arange(0, 8), torch.tensor([1, 1]), "geometric")
    assert v.tolist() == [True, True, False, True, True, False, False, False]
    assert t[v].tolist() == [4, 5, 7, 8]


def test_2d_hand_computed_offset_raster_wraps():
    t, v = offset_targets((3, 3), torch.arange(0, 8), torch.tensor([1, 1]), "raster")
    assert v.tolist() == [True] * 5 + [False] * 3
    assert t[v].tolist() == [4, 5, 6, 7, 8]


def test_2d_hand_computed_below_last_row():
    t, v = offset_targets((3, 4), torch.arange(0, 11), torch.tensor([2, 0]), "geometric")
    assert v.tolist() == [True] * 4 + [False] * 7
    assert t[v].tolist() == [8, 9, 10, 11]


def test_2d_layout_positions_and_limits_hand_computed():
    spec = RegisterSpec2D(d_max=2)  # candidates (0,1), (1,0), (1,1)
    for seed in range(20):
        lay = make_layout(1, (3, 3), 1, spec, g(seed))
        off = tuple(lay.reg_offset[0, 0].tolist())
        if off != (1, 1):
            continue
        assert reg_list(lay, 0) == ([0, 1, 3, 4], [4, 5, 7, 8])
        T = lay.num_regular
        assert T == 9
        # dense R is fixed by the grid: the best offsets (0,1) and (1,0) have 6 valid anchors each,
        # so (1,1)'s 4 registers come first and 2 padding slots follow, seeing nothing
        assert lay.num_registers == 6
        assert lay.reg_valid[0].tolist() == [True] * 4 + [False] * 2
        # register position = cell of the target's NTP predictor x_{target-1}
        assert lay.position_ids[0, T:T + 4].tolist() == [[1, 0], [1, 1], [2, 0], [2, 1]]
        assert lay.query_limit[0, T:].tolist() == [1, 2, 4, 5, -1, -1]
        assert (lay.key_rank[0, T:] == NEVER).all()
        # regular positions: class token has no cell, x_t at (t // 3, t % 3)
        assert lay.position_ids[0, :T].tolist() == [[-1, -1]] + [[t // 3, t % 3] for t in range(8)]
        assert lay.ntp_target[0].tolist() == list(range(9))
        return
    pytest.fail("offset (1,1) never drawn")


def test_1d_hand_computed_with_prefix_anchor():
    spec = RegisterSpec1D(d_min=3, d_max=3)
    lay = make_layout(2, (1, 6), 2, spec, g(), lengths=torch.tensor([6, 4]))
    T = lay.num_regular
    assert T == 2 + 5
    assert reg_list(lay, 0) == ([-1, 0, 1, 2], [2, 3, 4, 5])
    assert reg_list(lay, 1) == ([-1, 0], [2, 3])           # padded: targets must be < 4
    v = lay.reg_valid[0]
    assert lay.position_ids[0, T:][v].tolist() == [[0, 3], [0, 4], [0, 5], [0, 6]]
    assert lay.query_limit[0, T:][v].tolist() == [1, 2, 3, 4]
    assert lay.position_ids[0, :T].tolist() == [[0, i] for i in range(T)]
    # NTP: regular input 1 (last prompt token) predicts x_0; padding has no loss
    assert lay.ntp_valid[0].tolist() == [False, True, True, True, True, True, True]
    assert lay.ntp_valid[1].tolist() == [False, True, True, True, True, False, False]
    assert lay.ntp_target[0, 1:].tolist() == [0, 1, 2, 3, 4, 5]
    # invalid register slots see only themselves
    assert (lay.query_limit[1, T:][~lay.reg_valid[1]] == -1).all()


def test_1d_d1_register_sits_on_last_prefix_position():
    lay = make_layout(1, (1, 5), 3, RegisterSpec1D(d_min=1, d_max=1), g())
    assert reg_list(lay, 0) == ([-1, 0, 1, 2, 3], [0, 1, 2, 3, 4])
    T = lay.num_regular
    assert lay.position_ids[0, T:, 1].tolist() == [2, 3, 4, 5, 6]


def test_mutor1d_on_2d_grid_uses_class_position_for_x0():
    lay = make_layout(1, (2, 3), 1, RegisterSpec1D(d_min=1, d_max=1), g())
    T = lay.num_regular
    a, t = reg_list(lay, 0)
    assert a == [-1, 0, 1, 3, 4] and t == [0, 1, 2, 4, 5]   # geometric: no wrap from x2 to x3
    assert lay.position_ids[0, T].tolist() == [-1, -1]       # predictor of x_0 is the class token


def _reference(grid, P, off, edge, length):
    """Brute force: list of (anchor, target) pairs for one sample and one offset."""
    H, W = grid
    N = H * W
    out = []
    start = -1 if off[0] == 0 and "1d" in edge else 0
    for t in range(start, N - 1):
        if edge.startswith("raster"):
            j = t + off[0] * W + off[1]
            ok = j < N
        else:
            r, c = (0, -1) if t == -1 else divmod(t, W)
            rr, cc = r + off[0], c + off[1]
            ok = rr < H and cc < W
            j = rr * W + cc
        if ok and j < length:
            out.append((t, j))
    return out


@pytest.mark.parametrize("grid", [(4, 4), (3, 5), (5, 2), (1, 9)])
@pytest.mark.parametrize("edge", ["geometric", "raster"])
def test_dense_layout_matches_brute_force(grid, edge):
    H, W = grid
    objective = "mutor-1d" if H == 1 else "mutor-2d"
    spec = RegisterSpec1D(2, 4, edge=edge) if H == 1 else RegisterSpec2D(min(3, H), edge=edge)
    B = 6
    lengths = torch.tensor([H * W - (i % 3) for i in range(B)]) if H == 1 else None
    lay = make_layout(B, grid, 1, spec, g(3), lengths=lengths)
    T = lay.num_regular
    for b in range(B):
        off = tuple(lay.reg_offset[b, 0].tolist())
        length = int(lengths[b]) if lengths is not None else H * W
        tag = edge + ("1d" if objective == "mutor-1d" else "")
        assert list(zip(*reg_list(lay, b))) == _reference(grid, 1, off, tag, length)
        for r in torch.nonzero(lay.reg_valid[b]).flatten().tolist():
            j = int(lay.reg_target[b, r])
            assert lay.position_ids[b, T + r].tolist() == lay.position_ids[b, 1 - 1 + j].tolist()


def test_sparse_draws_k_valid_anchors_and_varies():
    spec = RegisterSpec2D(d_max=3, placement="sparse", num_registers=5)
    lay = make_layout(8, (4, 4), 1, spec, g(0))
    assert lay.num_registers == 5
    lay2 = make_layout(8, (4, 4), 1, spec, g(1))
    assert not torch.equal(lay.reg_anchor, lay2.reg_anchor)
    for b in range(8):
        a = lay.reg_anchor[b].tolist()
        assert a == sorted(set(a))
        full = _reference((4, 4), 1, tuple(lay.reg_offset[b, 0].tolist()), "geometric", 16)
        assert set(zip(*reg_list(lay, b))) <= set(full)
        assert int(lay.reg_valid[b].sum()) == min(5, len(full))


def test_sparse_fewer_valid_than_k_marks_rest_invalid():
    # 3x3 grid, offset (2,2) has a single valid anchor
    spec = RegisterSpec2D(d_max=3, placement="sparse", num_registers=6)
    for seed in range(60):
        lay = make_layout(1, (3, 3), 1, spec, g(seed))
        if tuple(lay.reg_offset[0, 0].tolist()) == (2, 2):
            assert reg_list(lay, 0) == ([0], [8])
            assert int(lay.reg_valid.sum()) == 1 and lay.num_registers == 6
            return
    pytest.fail("offset (2,2) never drawn")


def test_one_offset_per_sequence_by_default_and_per_register_option():
    spec = RegisterSpec2D(d_max=4)
    lay = make_layout(16, (6, 6), 1, spec, g(0))
    for b in range(16):
        offs = lay.reg_offset[b][lay.reg_valid[b]]
        assert (offs == offs[0]).all()
    assert len({tuple(lay.reg_offset[b, 0].tolist()) for b in range(16)}) > 3
    lay = make_layout(2, (6, 6), 1, RegisterSpec2D(d_max=4, per_register_offsets=True), g(0))
    offs = lay.reg_offset[0][lay.reg_valid[0]]
    assert len({tuple(o) for o in offs.tolist()}) > 3
    for b in range(2):
        for r in torch.nonzero(lay.reg_valid[b]).flatten().tolist():
            a, (dr, dc) = int(lay.reg_anchor[b, r]), lay.reg_offset[b, r].tolist()
            assert int(lay.reg_target[b, r]) == (a // 6 + dr) * 6 + a % 6 + dc


def test_dense_mask_rule():
    lay = make_layout(2, (3, 3), 1, RegisterSpec2D(d_max=3), g(5))
    m = lay.dense_mask()
    T = lay.num_regular
    assert torch.equal(m[:, :T, :T], torch.tril(torch.ones(T, T, dtype=torch.bool)).expand(2, T, T))
    assert not m[:, :T, T:].any()                               # regular tokens never see registers
    for b in range(2):
        for r in range(lay.num_registers):
            row = m[b, T + r]
            if lay.reg_valid[b, r]:
                a = int(lay.reg_anchor[b, r]) + 1
                assert row[: a + 1].all() and not row[a + 1:T].any()
            else:
                assert not row[:T].any()
            regs = row[T:].clone()
            assert regs[r] and int(regs.sum()) == 1             # itself only


def test_interleaved_order_puts_register_after_anchor():
    lay = make_layout(1, (3, 3), 1, RegisterSpec2D(d_max=2), g(0))
    order = lay.interleaved_order()[0].tolist()
    T = lay.num_regular
    for r in range(lay.num_registers):
        if lay.reg_valid[0, r]:
            pos = order.index(T + r)
            assert order[pos - 1] == 1 + int(lay.reg_anchor[0, r])


def test_regular_position_ids_line_and_grid():
    assert regular_position_ids((1, 4), 2).tolist() == [[0, i] for i in range(5)]
    assert regular_position_ids((2, 2), 1).tolist() == [[-1, -1], [0, 0], [0, 1], [1, 0]]


@pytest.mark.parametrize("spec,grid,msg", [
    (RegisterSpec2D(), (1, 16), "need a 2D grid"),
    (RegisterSpec2D(placement="sparse", num_registers=300), (16, 16), "num_registers=300"),
    (RegisterSpec2D(d_max=9), (4, 4), "d_max=9 exceeds the grid 4x4"),
    (RegisterSpec1D(d_min=7, d_max=8), (4, 4), "d_min=7"),
])
def test_impossible_combinations_are_one_line_errors(spec, grid, msg):
    with pytest.raises(LayoutError, match=msg) as e:
        make_layout(1, grid, 1, spec, g())
    assert "\n" not in str(e.value)


def test_bad_lengths_error():
    with pytest.raises(LayoutError, match="lengths"):
        make_layout(2, (1, 5), 1, RegisterSpec1D(), g(), lengths=torch.tensor([5, 9]))


def test_mask_picture_command(tmp_path):
    out = tmp_path / "mask.png"
    r = subprocess.run([sys.executable, "-m", "mutor2d.objectives.figure", "--grid", "4x4", "--dmax2d", "3",
                        "--out", str(out)], capture_output=True, text=True, timeout=limit(120))
    assert r.returncode == 0, r.stderr
    assert out.stat().st_size > 1000 and out.read_bytes()[:4] == b"\x89PNG"
    r = subprocess.run([sys.executable, "-m", "mutor2d.objectives.figure", "--grid", "1x8", "--dmax2d", "3",
                        "--objective", "mutor-2d", "--out", str(out)], capture_output=True, text=True)
    assert r.returncode != 0 and "need a 2D grid" in r.stderr and "Traceback" not in r.stderr


def test_spec_from_tagged_config():
    cfg = C.make("objective", name="mutor-2d", d_max=3, placement="sparse", num_registers=5, edge="raster")
    spec = cfg.register_spec()
    assert spec is cfg and isinstance(spec, RegisterSpec2D)                  # the section is its spec
    assert (spec.d_max, spec.placement, spec.num_registers, spec.per_register_offsets, spec.edge) == \
        (3, "sparse", 5, False, "raster")
    spec = C.make("objective", name="mutor-1d", d_min=2, d_max=3).register_spec()
    assert (spec.kind, spec.d_min, spec.d_max) == ("mutor-1d", 2, 3)
    assert not C.make("objective", name="ntp").register_spec().uses_registers()
    heads = C.make("objective", name="multihead", layout="1d", d_min=1, d_max=3).register_spec()
    assert heads == RegisterSpec1D(2, 3) and not C.make("objective", name="multihead").uses_registers()


@pytest.mark.parametrize("spec,drafts", [
    (RegisterSpec2D(d_max=4), [(0, 2), (0, 3)]),          # D = 4: two useful drafts per row
    (RegisterSpec2D(d_max=2), []),
    (RegisterSpec1D(d_min=1, d_max=4), [(0, 2), (0, 3), (0, 4)]),
    (RegisterSpec1D(d_min=3, d_max=5), []),               # no (0, 2): no contiguous drafts
    (RegisterSpec(), []),
])
def test_draft_offsets_are_the_contiguous_same_row_offsets(spec, drafts):
    assert spec.draft_offsets() == drafts


def test_offset_pairs_2d_excludes_origin_and_1d_is_inclusive():
    assert offset_pairs("mutor-2d", 1, 2) == [(0, 1), (1, 0), (1, 1)]
    assert offset_pairs("mutor-1d", 2, 4) == [(0, 2), (0, 3), (0, 4)]
    assert offset_pairs("ntp", 1, 4) == []


def test_ntp_layout_has_no_registers_and_plain_causal_visibility():
    lay = make_layout(2, (3, 3), 1, RegisterSpec(), g())
    assert lay.num_registers == 0 and lay.visibility is None and lay.num_regular == 9
    lay = make_layout(2, (3, 3), 1, RegisterSpec2D(d_max=2), g())
    assert lay.visibility.num_regular == lay.num_regular == 9
    assert not hasattr(Layout, "mask_mod")


@pytest.mark.parametrize("spec,grid,want", [
    (RegisterSpec2D(d_max=2), (3, 3), 6),                      # (0,1) or (1,0): 3 x 2 anchors
    (RegisterSpec2D(d_max=4), (16, 16), 16 * 15),             # (0,1) best
    (RegisterSpec2D(d_max=3, edge="raster"), (4, 4), 15),     # (0,1): targets 1..15 from 0..14
    (RegisterSpec1D(d_min=2, d_max=4), (1, 9), 8),            # d=2 from the prefix anchor -1..6
    (RegisterSpec2D(d_max=2, per_register_offsets=True), (3, 3), 8),   # all but the last cell
])
def test_dense_slots_hand_computed(spec, grid, want):
    assert dense_slots(spec, grid) == want


def test_dense_register_count_never_changes_between_batches():
    """R is the grid's maximum whatever offsets are drawn (compiled graphs keep one shape)."""
    spec = RegisterSpec2D(d_max=3)
    counts, shapes = set(), set()
    for seed in range(12):
        lay = make_layout(2, (4, 5), 1, spec, g(seed))
        counts.add(tuple(lay.reg_valid.sum(1).tolist()))
        shapes.add(tuple(lay.position_ids.shape))
    assert len(counts) > 1, "the draws should differ in valid registers (else the test proves nothing)"
    assert shapes == {(2, 1 + 19 + dense_slots(spec, (4, 5)), 2)}


class _DeviceLog(TorchDispatchMode):
    """Records the device of every tensor an aten op returns."""

    def __init__(self):
        super().__init__()
        self.devices = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.devices.add(t.device.type)
        return out


@pytest.mark.parametrize("spec", [RegisterSpec2D(d_max=3),
                                  RegisterSpec2D(d_max=3, placement="sparse", num_registers=5),
                                  RegisterSpec1D(d_min=1, d_max=3, per_register_offsets=True),
                                  RegisterSpec()])
def test_layout_builds_on_the_device_without_host_work(spec):
    """Asked for another device (meta here, a GPU in training), every op of the layout runs there: no
    tensor is made on the host and copied per batch, and nothing is read back (meta tensors have no
    values, so an ``int(t)`` would raise). Per-spec constants are made once (warmed first)."""
    grid = (1, 9) if spec.kind == "mutor-1d" else (4, 4)
    make_layout(3, grid, 1, spec, device="meta")                 # warm the per-spec caches
    with _DeviceLog() as log:
        lay = make_layout(3, grid, 1, spec, device="meta")
    assert log.devices == {"meta"}, log.devices
    want = make_layout(3, grid, 1, spec, g(0))
    for name, value in vars(lay).items():
        if isinstance(value, torch.Tensor):
            assert value.device.type == "meta", name
            assert value.shape == getattr(want, name).shape and value.dtype == getattr(want, name).dtype, name


def test_layout_draws_on_the_generators_device():
    """The draws follow the generator: a CPU generator with a meta target device draws on the CPU
    (the values equal the plain CPU layout) and only then moves."""
    spec = RegisterSpec2D(d_max=3, placement="sparse", num_registers=4)
    cpu = make_layout(2, (4, 4), 1, spec, g(5))
    moved = make_layout(2, (4, 4), 1, spec, g(5), device="meta")
    assert moved.reg_target.device.type == "meta" and moved.reg_target.shape == cpu.reg_target.shape


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_layout_with_cuda_generator_cuda():
    """A CUDA generator draws on the GPU and the whole layout lives there (gpu.sh runs this)."""
    spec = RegisterSpec2D(d_max=4, placement="sparse", num_registers=80)
    lay = make_layout(4, (16, 16), 1, spec, torch.Generator("cuda").manual_seed(0), device="cuda")
    assert lay.reg_target.is_cuda and lay.position_ids.is_cuda
    assert lay.reg_valid.sum(1).tolist() == [80] * 4
    dense = make_layout(4, (16, 16), 1, RegisterSpec2D(d_max=4), torch.Generator("cuda").manual_seed(0))
    assert dense.reg_target.is_cuda and dense.num_registers == 240
