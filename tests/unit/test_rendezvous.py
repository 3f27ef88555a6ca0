"""The torch.distributed rendezvous stays on this machine by default: torchrun is started through
tasks/training/launch.py, whose stores listen on 127.0.0.1 only for a one-node job or a loopback endpoint
(torch's own TCPStore listens on every interface, whatever host it is given, and has no authentication).
Across machines, each node tells torchrun its own address, found from the route to the endpoint
(tests/integration/test_two_nodes.py runs two nodes over a veth pair)."""
from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tasks.core.params_spec import TrainParams
from tasks.training.distributed import torchrun_command
from tasks.training.launch import (
    address_toward,
    interface_with,
    loopback_store_class,
    node_arguments,
    rendezvous_endpoint,
    stays_on_this_machine,
)


def listening_addresses(port: int) -> set[str]:
    """Local addresses (hex, as the kernel lists them) of the sockets listening on `port`."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.rsplit(":", 1)
            if state == "0A" and int(hex_port, 16) == port:
                found.add(address)
    return found


def test_the_default_job_is_one_node_launched_with_loopback_stores():
    params = TrainParams()
    command = torchrun_command(params)
    assert command[1:3] == ["-m", "tasks.training.launch"] and "--standalone" in command
    assert stays_on_this_machine(command[3:])
    assert params.rdzv_endpoint.startswith("127.0.0.1:"), "the multi-node default must not reach other machines"
    multi = torchrun_command(params.model_copy(update={"nnodes": 2}))
    assert f"--rdzv_endpoint={params.rdzv_endpoint}" in multi and stays_on_this_machine(multi[3:])


@pytest.mark.parametrize("argv,local", [
    (["--standalone", "--nproc_per_node=2"], True),
    (["--nnodes=2", "--rdzv_endpoint=localhost:29400"], True),
    (["--nnodes=2", "--rdzv-endpoint=[::1]:29400"], True),
    (["--nnodes=2", "--rdzv_endpoint=10.0.0.5:29400"], False),
    (["--nnodes=2", "--rdzv_endpoint=trainer-0.cluster:29400"], False),
])
def test_which_jobs_stay_on_this_machine(argv, local):
    assert stays_on_this_machine(argv) is local


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads the kernel's socket table (Linux)")
def test_a_store_served_for_a_local_job_listens_on_loopback_only():
    from torch.distributed import TCPStore

    store = loopback_store_class()("localhost", 0, is_master=True)
    assert listening_addresses(store.port) == {"0100007F"}   # 127.0.0.1, and no other interface
    client = TCPStore("localhost", store.port, is_master=False)
    client.set("key", "value")
    assert store.get("key") == b"value"
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    with pytest.raises(RuntimeError, match="cannot host the store"):   # torch then joins as a client
        loopback_store_class()("localhost", taken.getsockname()[1], is_master=True)
    taken.close()


@pytest.mark.parametrize("argv,endpoint", [
    (["--rdzv_endpoint=10.0.0.1:29500"], ("10.0.0.1", 29500)),
    (["--rdzv-endpoint=trainer-0.cluster"], ("trainer-0.cluster", 29400)),
    (["--rdzv_endpoint=[fd00::1]:29501"], ("fd00::1", 29501)),
    (["--rdzv_endpoint=fd00::1"], ("fd00::1", 29400)),
    (["--standalone"], None),
])
def test_the_rendezvous_endpoint_is_read_from_torchrun_arguments(argv, endpoint):
    assert rendezvous_endpoint(argv) == endpoint


def test_a_node_tells_torchrun_its_own_address_and_the_endpoint_node_hosts_the_store():
    argv = ["--nnodes=2", "--rdzv_endpoint=10.9.9.1:29500", "-m", "tasks.train"]
    host = node_arguments(argv, "10.9.9.1", "10.9.9.1")
    other = node_arguments(argv, "10.9.9.2", "10.9.9.1")
    assert host[:2] == ["--local_addr=10.9.9.1", "--rdzv_conf=is_host=1"] and host[2:] == argv
    assert other == ["--local_addr=10.9.9.2", *argv]   # torch decides: it joins as a client
    given = ["--local-addr=10.0.0.7", "--rdzv_conf=is_host=0", *argv]
    assert node_arguments(given, "10.9.9.1", "10.9.9.1") == given   # what the user passed wins


def test_the_address_toward_a_host_comes_from_the_routing_table():
    assert address_toward("127.0.0.1", 29400) == ("127.0.0.1", "127.0.0.1")
    assert interface_with("127.0.0.1") == "lo"
    assert interface_with("192.0.2.1") is None   # TEST-NET-1: on no interface here
