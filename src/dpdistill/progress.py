"""How long work says how far it is: a callable taking one record per step (a dict such as {"epoch": 3, "total":
10, "test_accuracy": 0.9}). The command line draws it as a bar; an API caller may pass its own."""

from __future__ import annotations

from typing import Callable

Progress = Callable[[dict], None]
