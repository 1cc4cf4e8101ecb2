"""KEY=VALUE settings are typed by their field and refused with the field's expectation."""

from dataclasses import dataclass

import pytest

from dpdistill.errors import ConfigError
from dpdistill.methods.config import TranscriptionConfig
from dpdistill.settings import parse_assignments


def test_set_assignments_are_typed_and_checked():
    values = parse_assignments(["replay_size=100", "adversarial-weight=0.5", "class_balanced=true",
                                "generator_width=32,16,8", "student_schedule=cosine"], TranscriptionConfig)
    assert values == {"replay_size": 100, "adversarial_weight": 0.5, "class_balanced": True,
                      "generator_width": (32, 16, 8), "student_schedule": "cosine"}
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_assignments(["replay_size"], TranscriptionConfig)
    with pytest.raises(ConfigError, match="one of"):
        parse_assignments(["no_such_knob=1"], TranscriptionConfig)
    with pytest.raises(ConfigError, match="expects"):
        parse_assignments(["replay_size=many"], TranscriptionConfig)
    with pytest.raises(ConfigError, match="expects"):
        parse_assignments(["class_balanced=maybe"], TranscriptionConfig)


@dataclass
class Knobs:
    method: str = "x"
    name: str | None = None
    scale: float | None = None
    steps: int = 3


def test_optional_fields_take_their_annotated_type_and_own_options_stay_out_of_reach():
    assert parse_assignments(["name=runs/a", "scale=1e-3", "steps=7"], Knobs) == {
        "name": "runs/a", "scale": 0.001, "steps": 7}
    assert parse_assignments(["scale=4"], Knobs) == {"scale": 4}
    with pytest.raises(ConfigError, match="one of name, scale, steps"):
        parse_assignments(["method=y"], Knobs)
