"""Keep freed memory in the process for reuse, where the C library would hand it back to the system at every free.

A DP-SGD step on a cnn allocates tensors of hundreds of megabytes (the per-example gradients of a batch of 1,024,
the unfolded inputs of its convolutions) and frees them a moment later. glibc serves any request above 32 MB (the
most its mmap threshold may be raised to) by a fresh mmap and unmaps it on free, so the kernel zeroes every page of
every such tensor again at every step: a 3-epoch Fashion-MNIST cnn run spent more time in the kernel (516 s) than
in its own computation (450 s), with 130 million page faults. Served from the heap and never trimmed, the same
run reuses its pages (docs/methods/dpsgd.md, "Speed"). The price is about twice the peak of resident memory: the
heap keeps its high-water mark, and PyTorch's aligned requests fit the holes freed tensors leave only once
neighbouring holes merge.

The command line applies it to its own process unless DPDISTILL_KEEP_FREED_MEMORY=0 (for a machine whose memory the
peak would outgrow); a Python program may call `keep_freed_memory()` itself.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

# glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
NEVER_TRIM = 2**31 - 1  # the largest value mallopt takes: free memory at the heap's top is kept up to 2 GB
SWITCH = "DPDISTILL_KEEP_FREED_MEMORY"  # "0": leave the C library's defaults


def keep_freed_memory() -> bool:
    """Serve every allocation from the heap and keep what is freed (glibc only; elsewhere nothing changes).
    Returns whether the C library took the settings."""
    if os.environ.get(SWITCH) == "0" or platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, NEVER_TRIM))
