"""The method registry: every method is one module with its paper, its needs and one interface."""

import importlib

import dpdistill
from dpdistill.methods.base import Needs
from dpdistill.registry import METHODS
from dpdistill.privacy.ledger import UncoveredRead, coverage


def test_every_method_is_listed_with_what_it_needs():
    listed = {entry["name"]: entry for entry in dpdistill.methods()}
    assert list(listed) == ["dpsd", "dpdfd", "srr", "pate", "dpsgd", "dpdfd-direct",
                            "datalens", "dp-merf", "teacher-guided", "federated", "dgd", "release"]
    assert listed["pate"]["needs"] == Needs.ENSEMBLE.value and listed["dpsgd"]["needs"] == Needs.PRIVATE_DATA.value
    assert listed["srr"]["needs"] == Needs.SINGLE_TEACHER.value
    assert listed["dgd"]["command"] == "dgd" and listed["dgd"]["needs"] == Needs.ENSEMBLE.value
    assert listed["release"]["command"] == "release" and listed["release"]["needs"] == Needs.PRIVATE_DATA.value
    assert listed["federated"]["command"] == "federated" and listed["federated"]["needs"] == Needs.ENSEMBLE.value
    for synthesiser in ("datalens", "dp-merf", "teacher-guided"):
        assert listed[synthesiser]["needs"] == Needs.PRIVATE_DATA.value
        assert listed[synthesiser]["command"] == "synthesize"
    assert all(entry["description"] and entry["paper"] and entry["command"] for entry in listed.values())


def test_each_method_module_reads_like_its_algorithm_box():
    for method in METHODS.values():
        module = importlib.import_module(type(method).__module__)
        assert "1." in module.__doc__ and "2." in module.__doc__, method.name


def test_coverage_is_derived_from_the_uncovered_reads():
    assert coverage("the student", []) == {"covered": "the student"}
    first, second = UncoveredRead("the teacher", "NO guarantee: first"), UncoveredRead("the data", "second")
    covered = coverage("the student", [first, second])
    assert covered["covered"] == "NO guarantee: first" and covered["formal_guarantee"] is False
    assert [read["event"]["type"] for read in covered["uncovered_reads"]] == ["NonPrivateDpEvent"] * 2
    conditional = coverage("the student", [UncoveredRead("the split", "NO formal guarantee: x", "where y")])
    assert conditional["covered"] == "NO formal guarantee: x; where y it would cover the student"
