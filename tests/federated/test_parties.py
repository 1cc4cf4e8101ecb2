"""A federation across machines on loopback, each party its own dpdistill command in its own process, with TLS:
the server (`federated serve`) and three owners (`federated owner`) with certificates made here. One owner's
machine dies after the first round: the second goes on with the other two, never fewer than the threshold the
noise was sized for. The server is terminated once its rounds are journaled, the owners are stopped, and
`federated finish` trains the student from the journal alone. No Flower process outlives its party."""

import contextlib
import datetime
import ipaddress
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from typer.testing import CliRunner

from dpdistill.cli.main import app
from dpdistill.federated.config import FederatedConfig
from dpdistill.federated.engines import free_port
from dpdistill.federated.owners import prepare_owners
from dpdistill.federated.server_app import RoundJournal

pytestmark = [pytest.mark.slow, pytest.mark.flower]


def make_certificates(directory: Path) -> Path:
    """A certificate authority and a server certificate for 127.0.0.1 signed by it, as Flower's SuperLink takes
    them (ca.crt, server.pem, server.key)."""
    directory.mkdir(parents=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dpdistill test federation")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now).not_valid_after(now + datetime.timedelta(1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True).sign(ca_key, hashes.SHA256()))
    server = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
              .issuer_name(ca_name).public_key(server_key.public_key()).serial_number(x509.random_serial_number())
              .not_valid_before(now).not_valid_after(now + datetime.timedelta(1))
              .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                          x509.DNSName("localhost")]), critical=False)
              .sign(ca_key, hashes.SHA256()))
    (directory / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (directory / "server.pem").write_bytes(server.public_bytes(serialization.Encoding.PEM))
    (directory / "server.key").write_bytes(server_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return directory


def dpdistill(*args: str, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "dpdistill.cli.main", *args], stdout=open(log, "wb"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def children(pid: int) -> list[int]:
    """The process groups `pid` started (an owner's SuperNode, a server's SuperLink: each leads its own); none once
    it has exited."""
    try:
        started = [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
        return [child for child in started if os.getpgid(child) == child]
    except OSError:
        return []


@pytest.fixture
def groups() -> Iterator[list[int]]:
    """The process groups a test started (each party's, and its Flower processes'): whatever the test's outcome,
    none outlives it."""
    started: list[int] = []
    yield started
    for pid in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


def gone(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_each_party_runs_its_own_command_with_tls_a_lost_owner_leaves_enough_noise_and_finish_needs_no_owner(
        tmp_path: Path, groups: list[int]):
    owner_dirs = prepare_owners(tmp_path / "owners", FederatedConfig(
        epsilon=10.0, dataset="digits", clients=3, members_per_owner=2, teacher_epochs=1))
    certificates = make_certificates(tmp_path / "certificates")
    address, out = f"127.0.0.1:{free_port()}", tmp_path / "served"
    server = dpdistill("federated", "serve", "--dataset", "digits", "--clients", "3", "--out", str(out),
                       "--certificates", str(certificates), "--address", address, "--epsilon", "10",
                       "--dropouts", "1", "--members-per-owner", "2", "--queries", "40", "--set", "round_queries=20",
                       "--set", "stage_timeout=30", "--set", "public_size=200", "--set", "epochs=1",
                       "--set", "min_steps=20", "--quiet", log=tmp_path / "server.log")
    owners = [dpdistill("federated", "owner", "--teacher", str(directory), "--superlink", address,
                        "--root-certificates", str(certificates / "ca.crt"), log=tmp_path / f"owner-{index}.log")
              for index, directory in enumerate(owner_dirs)]
    groups += [party.pid for party in [server, *owners]]
    journal = RoundJournal(out / "private" / "resume" / "rounds")

    def until_journaled(index: int) -> None:
        deadline = time.monotonic() + 240
        while journal.read(index) is None and server.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)

    until_journaled(0)
    groups += [pid for party in [server, *owners] for pid in children(party.pid)]
    for pid in (owners[1].pid, *children(owners[1].pid)):  # owner 1's machine dies: every process of it
        os.killpg(pid, signal.SIGKILL)
    until_journaled(1)
    answered = [journal.read(index) for index in range(2)]
    for party in [server, owners[0], owners[2]]:  # its ServerApp still waits on the rounds
        os.killpg(party.pid, signal.SIGTERM)
    for party in [server, *owners]:
        party.wait(timeout=60)
    assert None not in answered, (tmp_path / "server.log").read_text()[-2000:]
    assert [result[1] for result in answered] == [3, 2]  # round 2 without the lost owner, at the threshold
    for index, directory in enumerate(owner_dirs):  # each owner's own client charged its own ledger
        assert json.loads((directory / "ledger.json").read_text())["entries"][-1]["answered"] == (20 if index == 1
                                                                                                 else 40)
    for pid in groups:
        deadline = time.monotonic() + 20
        while not gone(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert gone(pid)  # each party's groups: its SuperLink or SuperNode and their ClientApps included
    assert not (out / "report.json").exists()  # the server stopped after the rounds, before the student
    finished = CliRunner().invoke(app, ["federated", "finish", "--out", str(out), "--quiet"])  # no party left
    assert finished.exit_code == 0, finished.output
    report = json.loads((out / "report.json").read_text())
    assert report["federation"]["contributors"] == [3, 2] and report["privacy"]["epsilon"] <= 10.0
    assert report["privacy"]["honest_shares"] == 1  # the threshold's two, less the one colluder tolerated
