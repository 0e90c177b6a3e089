"""CPU tensors in their own anonymous memory mapping: zeros that cost nothing until touched.

`torch.zeros` writes every byte up front. For the engine's CPU KV cache (4 GiB at most by
default) that was most of a fresh process's start: SmolLM2-135M's 4.3 GB cache took 5.9 s
of page faults and zeroing before its first token, for a one-sentence answer that touches a
few MB of it. The operating system fills an anonymous mapping with zeros page by page as the
pages are first touched, so only the part that is used is ever committed.
"""

from __future__ import annotations

import ctypes
import math
import mmap

import torch

# transparent huge pages: the size and alignment of one
HUGE_PAGE = 2 << 20


def zeroed_cpu_tensor(shape: tuple[int, ...], dtype: torch.dtype, huge_pages: bool = False) -> torch.Tensor:
    """A contiguous zero-filled CPU tensor of `shape` and `dtype` whose memory the operating system
    commits (zeroed) a page at a time, on first touch; freed when the tensor and its views are.

    Args:
        huge_pages: ask for 2 MB pages (transparent huge pages, `madvise`) and start the tensor
            on a 2 MB boundary; where the system has none (a kernel without them, or transparent
            huge pages set to `never`) the pages are ordinary. Tensors under 2 MB take none.

    Where anonymous mappings are unavailable (not a POSIX system) this is `torch.zeros`.
    """
    nbytes = math.prod(shape) * dtype.itemsize
    anonymous = getattr(mmap, "MAP_ANONYMOUS", None)
    if anonymous is None or nbytes == 0:
        return torch.zeros(shape, dtype=dtype)
    advice = getattr(mmap, "MADV_HUGEPAGE", None) if huge_pages and nbytes >= HUGE_PAGE else None
    pad = HUGE_PAGE if advice is not None else 0
    # a private mapping: shared anonymous memory follows the shmem setting (usually no huge pages)
    area = mmap.mmap(-1, nbytes + pad, flags=mmap.MAP_PRIVATE | anonymous)
    offset = 0
    if advice is not None:
        try:
            area.madvise(advice)
        except OSError:  # a kernel built without transparent huge pages: ordinary pages
            pass
        view = ctypes.c_char.from_buffer(area)
        offset = -ctypes.addressof(view) % HUGE_PAGE
        del view  # an exported buffer would keep the mapping from closing
    flat = torch.frombuffer(area, dtype=dtype, count=math.prod(shape), offset=offset)  # its storage keeps `area` alive
    # a tensor of its own on that storage, not a view of `flat`: compiled graphs guard on a view's base
    return torch.empty(0, dtype=dtype).set_(flat.untyped_storage(), flat.storage_offset(), shape)
