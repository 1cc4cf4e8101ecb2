"""An owner names itself by a random name kept in its directory: two nodes on one owner's data give the same name
(the server then refuses the federation), two owners different ones, and the name says nothing of the path."""

from pathlib import Path

from dpdistill.federated.client_app import owner_identity


def test_an_owner_keeps_one_random_name(tmp_path: Path):
    first, second = tmp_path / "a" / "owner", tmp_path / "b" / "owner"  # the same folder name on two hosts
    first.mkdir(parents=True)
    second.mkdir(parents=True)
    name = owner_identity(first)
    assert owner_identity(first) == name and owner_identity(second) != name
    assert len(name) == 32 and "owner" not in name
