"""An owner names itself by a random name kept in its directory: two nodes on one owner's data give the same name
(the server then refuses the federation), two owners different ones, and the name says nothing of the path. Each
node states the delta its owner set, and its client reads the settings its own SecAgg+ runs the round with."""

from pathlib import Path

from flwr.app import ConfigRecord, Context, RecordDict
from flwr.client.mod.secure_aggregation.secaggplus_mod import SecAggPlusState
from flwr.common.config import parse_config_args
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_STATE

from dpdistill.federated.client_app import owner_client, owner_identity, secagg_settings
from dpdistill.federated.engines import supernode_command
from dpdistill.federated.protocol import SecAggSettings


def test_an_owner_keeps_one_random_name(tmp_path: Path):
    first, second = tmp_path / "a" / "owner", tmp_path / "b" / "owner"  # the same folder name on two hosts
    first.mkdir(parents=True)
    second.mkdir(parents=True)
    name = owner_identity(first)
    assert owner_identity(first) == name and owner_identity(second) != name
    assert len(name) == 32 and "owner" not in name


def test_an_owners_node_states_the_delta_its_owner_set(tmp_path: Path):
    """`federated owner --delta` reaches the owner's client through its SuperNode's config, as Flower parses it; a
    simulated owner takes the delta its caller set."""
    command = supernode_command("127.0.0.1:9092", tmp_path, None, 1e-7)
    node_config = parse_config_args([command[command.index("--node-config") + 1]])
    client = owner_client(Context(1, 1, node_config, RecordDict(), {}), None, 1e-5)
    assert client.owner_dir == tmp_path.resolve() and client.delta == 1e-7
    simulated = owner_client(Context(1, 1, {"partition-id": 0}, RecordDict(), {}), [str(tmp_path)], 1e-6)
    assert simulated.owner_dir == tmp_path and simulated.delta == 1e-6


def test_an_owners_client_reads_the_settings_its_own_secure_aggregation_took():
    """As Flower's secaggplus_mod keeps them in the node's state after a round's setup."""
    state = SecAggPlusState(sample_num=5, share_num=5, threshold=4, clipping_range=128.0, target_range=256,
                            mod_range=2**32, max_weight=1.0)
    node_state = RecordDict()
    node_state.config_records[RECORD_KEY_STATE] = ConfigRecord(state.to_dict())
    assert secagg_settings(node_state) == SecAggSettings(5, 5, 4, 128.0, 256, 1.0)
    assert secagg_settings(RecordDict()) is None  # no secure aggregation: the owner refuses (test_protocol)
