"""The data-free transcription methods (the DPSD family: dpsd, dpdfd, srr) by name: the settings each brings to a
TranscriptionConfig (its defaults, its paper's settings, its checks)."""

from __future__ import annotations

from dpdistill.errors import ConfigError
from dpdistill.methods.dpdfd import DPDFD
from dpdistill.methods.dpsd import DPSD
from dpdistill.methods.srr import SRR
from dpdistill.methods.transcription import TranscriptionMethod

TRANSCRIPTIONS: dict[str, TranscriptionMethod] = {method.name: method for method in (DPSD(), DPDFD(), SRR())}


def family_member(name: str) -> TranscriptionMethod:
    """The transcription method called `name`, refused with the names `transcribe` runs."""
    if name not in TRANSCRIPTIONS:
        raise ConfigError(f"unknown method {name!r}: `transcribe` runs {', '.join(TRANSCRIPTIONS)} "
                          f"(`dpdistill.methods()` lists every method and the command that runs it)")
    return TRANSCRIPTIONS[name]
