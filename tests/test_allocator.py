"""The allocator setting: large tensors freed and allocated again reuse their pages instead of faulting in new ones."""

import os
import platform
import subprocess
import sys

import pytest

from dpdistill.allocator import SWITCH

# Allocate and free a 64 MB tensor (above the 32 MB threshold) twenty times, and count the page faults of the last
# nine: each fresh map faults in all of its 16,384 pages, a reused heap block none (the heap grows a few times first,
# until its freed blocks lie side by side and one of them holds the tensor with its alignment)
FAULTS = """
import resource, sys, torch
from dpdistill.allocator import keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "keep" else None
for _ in range(11):
    torch.ones(16 * 2**20)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(9):
    torch.ones(16 * 2**20)
print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def page_faults(mode: str, switch: str = "") -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", FAULTS, mode], capture_output=True, text=True, check=True,
                         env={**os.environ, SWITCH: switch}).stdout
    applied, faults = out.split()
    return applied, int(faults)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the setting is glibc's")
def test_freed_tensors_are_reused_not_mapped_afresh():
    _, fresh = page_faults("default")
    applied, kept = page_faults("keep")
    assert applied == "True"
    assert fresh > 9 * 15_000  # each new map of the tensor faulted in again (16,384 pages of 4 KB)
    assert kept < fresh / 20


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the setting is glibc's")
def test_the_switch_leaves_the_defaults():
    applied, faults = page_faults("keep", switch="0")
    assert applied == "False"
    assert faults > 9 * 15_000
