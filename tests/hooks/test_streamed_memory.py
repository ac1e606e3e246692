"""The memory of a streamed pattern's pass on a CPU: tiles stay within the cache budget at
518 px (heads split where one image's queries would exceed it), a buffer kept between passes is
small, and a pass allocates little beyond its attention output and one tile (no scaled copy of
q, no copies of k and v)."""

from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile

from vitreg.hooks import streamed
from vitreg.hooks.softmax import softmax_pattern
from vitreg.hooks.streamed import StreamedPattern, column_mean


def _qkv(b: int, h: int, n: int, d: int = 64) -> tuple[torch.Tensor, ...]:
    """q, k, v ``[B, H, N, D]`` as a fused qkv projection gives them (strided views)."""
    g = torch.Generator().manual_seed(0)
    return torch.randn(b, n, 3, h, d, generator=g).permute(2, 0, 3, 1, 4).unbind(0)


def _peak_bytes(fn) -> int:
    """The most bytes torch held at once while ``fn`` ran (allocations less frees, in order)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    steps = []
    for e in prof.events():
        size = e.cpu_memory_usage if e.name == "[memory]" else e.self_cpu_memory_usage
        if size:
            steps.append((e.time_range.start, size))
    held = peak = 0
    for _, size in sorted(steps):
        held += size
        peak = max(peak, held)
    return peak


def test_tiles_at_518px_stay_within_the_budget() -> None:
    """ViT-L/14 at 518 px, one image: 16 heads x 1370 keys; every tile within the budget."""
    q = torch.empty(1, 16, 1370, 64)
    tiles = StreamedPattern(q, q, 0.125).tiles()
    sizes = [(hs.stop - hs.start) * (sl.stop - sl.start) * 1370 * 4 for _, hs, sl in tiles]
    assert max(sizes) <= streamed.CPU_CHUNK_BYTES
    assert min(sl.stop - sl.start for _, _, sl in tiles) >= 100  # products stay long
    assert len({(hs.start, hs.stop) for _, hs, _ in tiles}) > 1


def test_a_pass_allocates_its_output_and_one_tile() -> None:
    q, k, v = _qkv(1, 16, 600)
    out_bytes = q.numel() * 4
    tile = max(
        (hs.stop - hs.start) * (sl.stop - sl.start) * 600 * 4
        for _, hs, sl in StreamedPattern(q, k, 0.125).tiles()
    )
    with torch.inference_mode():
        StreamedPattern(q, k, 0.125).attend(v)
        peak = _peak_bytes(lambda: StreamedPattern(q, k, 0.125).attend(v))
    kept = getattr(streamed._SCRATCH, "buf", None)
    assert kept is None or kept.numel() * 4 <= streamed.SCRATCH_BYTES
    assert tile <= streamed.CPU_CHUNK_BYTES
    assert peak <= out_bytes + tile + out_bytes // 4  # a q tile and row sums; never q, k or v
    s = StreamedPattern(q, k, 0.125)
    torch.testing.assert_close(s.attend(v), softmax_pattern(q, k, 0.125) @ v, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(
        column_mean(s), column_mean(softmax_pattern(q, k, 0.125)), rtol=1e-5, atol=1e-6
    )
