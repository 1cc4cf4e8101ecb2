"""The allocator setting: large tensors freed and allocated again reuse their pages instead of faulting in new ones."""

import os
import platform
import subprocess
import sys

import pytest

from dpdistill.allocator import SWITCH

# Allocate and free a 64 MB tensor (above the 32 MB threshold) twenty times, and count the page faults of the last
# nine: each fresh map faults in all of its 16,384 pages, a reused heap block none (the heap grows a few times first,
# until its freed blocks lie side by side and one of them holds the tensor with its alignment). "default" imports the
# command's module without running it, "command" runs the `dpdistill` command (its help) first, "keep" calls the
# setting directly.
FAULTS = """
import resource, sys, torch
from dpdistill.allocator import keep_freed_memory
from dpdistill.cli import main as command
applied = keep_freed_memory() if sys.argv[1] == "keep" else None
if sys.argv[1] == "command":
    sys.argv = ["dpdistill", "--help"]
    try:
        command.main()
    except SystemExit:
        pass
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
    applied, faults = out.split()[-2:]  # after the command's help, where it ran
    return applied, int(faults)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the setting is glibc's")
def test_the_command_and_the_setting_reuse_freed_tensors_where_importing_the_cli_maps_them_afresh():
    _, fresh = page_faults("default")  # a program (a test worker, the benchmark harness) that imports the CLI
    applied, kept = page_faults("keep")
    _, ran = page_faults("command")
    assert applied == "True"
    assert fresh > 9 * 15_000  # each new map of the tensor faulted in again (16,384 pages of 4 KB)
    assert kept < fresh / 20 and ran < fresh / 20


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the setting is glibc's")
def test_the_switch_leaves_the_defaults():
    applied, faults = page_faults("keep", switch="0")
    assert applied == "False"
    assert faults > 9 * 15_000
