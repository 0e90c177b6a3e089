"""`zeroed_cpu_tensor`, the memory of the CPU KV cache: zeros, committed only where touched."""

import mmap
import resource

import torch

from wedlm.model import KVCache
from wedlm.model.memory import HUGE_PAGE, zeroed_cpu_tensor


def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def test_zeroed_tensors_are_zeros_of_the_shape_and_dtype_and_writable():
    for shape, dtype in [((3, 5, 7), torch.float32), ((HUGE_PAGE // 2 + 3,), torch.bfloat16), ((0, 4), torch.float32)]:
        t = zeroed_cpu_tensor(shape, dtype)
        assert t.shape == shape and t.dtype == dtype and t.is_contiguous()
        assert t.count_nonzero().item() == 0
        t.fill_(3)
        assert t.sum(dtype=torch.float64).item() == 3 * t.numel()


def test_huge_page_tensors_start_on_a_huge_page_boundary():
    t = zeroed_cpu_tensor((HUGE_PAGE // 4 + 1,), torch.float32, huge_pages=True)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        assert t.data_ptr() % HUGE_PAGE == 0
    assert t.count_nonzero().item() == 0


def test_a_large_kv_cache_commits_only_the_blocks_written():
    """A 1 GiB cache costs no resident memory until written; writing one block of every layer
    commits about that much (a few pages per layer), not the cache."""
    before = _resident_bytes()
    cache = KVCache(num_layers=4, num_blocks=8192, block_size=16, kv_heads=2, head_dim=64,
                    dtype=torch.float32, device="cpu")
    assert cache.nbytes() == 4 * 2 * 8192 * 16 * 2 * 64 * 4  # 1 GiB
    assert _resident_bytes() - before < 64 << 20
    for layer in range(4):
        k, v = cache.flat(layer)
        k[16:32] = 1.0
        v[16:32] = 2.0
        assert k[:16].count_nonzero().item() == 0 and k[16:32].sum().item() == 16 * 2 * 64
    assert _resident_bytes() - before < 64 << 20
