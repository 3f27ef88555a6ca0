"""`python -m tasks.training.launch ARGS`: torchrun (`torch.distributed.run`) with its stores bound to 127.0.0.1
for a job on this machine, and, for a job across machines, told this node's own address.

torchrun's c10d stores (the rendezvous, and the one the workers meet at through MASTER_ADDR) listen on every
interface whatever host they are given (checked with `ss -ltn` on torch 2.13: `*:PORT` for `--standalone` and for a
127.0.0.1 endpoint), and they have no authentication: anyone who reaches the port can read and write the job's
keys. For a one-node job (`--standalone`) or one that meets on a loopback endpoint, every store served here binds
127.0.0.1 instead (TCPStore's `master_listen_fd`); a multi-node job on real addresses keeps torch's behaviour and
must run on a private network.

Across machines, torch finds this node's address from its hostname, which on many hosts (Debian's default
`127.0.1.1`, a container's `/etc/hosts`) names a loopback address: the node at the rendezvous endpoint then does
not host the store (every node waits as a client), rank 0 publishes a MASTER_ADDR the others cannot reach, and
gloo offers the others a loopback address (checked on torch 2.13 across two network namespaces). So the address
is taken from the route instead: the one this node reaches the endpoint through (`--local_addr`, and its interface
for gloo and nccl); the node whose address is the endpoint hosts the rendezvous store (`is_host`).
"""
from __future__ import annotations

import fcntl
import socket
import struct
import sys

from tasks.core.env import NODE_INTERFACE_ENVS, UNSHARED_STORE, set_defaults

LOOPBACK_HOSTS = {"localhost", "127.0.0.1", "::1"}
SIOCGIFADDR = 0x8915   # Linux ioctl: an interface's (first) IPv4 address


def rendezvous_endpoint(argv: list[str]) -> tuple[str, int] | None:
    """(host, port) of `--rdzv_endpoint` (torch's default port 29400 when none is given), or None."""
    endpoints = [arg.split("=", 1)[1] for arg in argv if arg.startswith(("--rdzv_endpoint=", "--rdzv-endpoint="))]
    if not endpoints:
        return None
    value = endpoints[0]
    if value.startswith("["):                 # [IPv6]:port
        host, _, port = value[1:].partition("]")
        port = port.lstrip(":")
    elif value.count(":") == 1:               # host:port
        host, port = value.split(":")
    else:                                     # a bare host or IPv6 address
        host, port = value, ""
    return host, int(port or 29400)


def stays_on_this_machine(argv: list[str]) -> bool:
    """Whether the torchrun arguments describe a job every rank of which runs here."""
    if "--standalone" in argv:
        return True
    endpoint = rendezvous_endpoint(argv)
    return endpoint is not None and endpoint[0] in LOOPBACK_HOSTS


def loopback_store_class():
    """A TCPStore whose server side listens on 127.0.0.1 only (the clients are unchanged)."""
    from torch.distributed import TCPStore

    class LoopbackTCPStore(TCPStore):
        def __init__(self, host_name, port, *args, **kwargs):
            if kwargs.get("is_master") and kwargs.get("master_listen_fd") is None:
                listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    listener.bind(("127.0.0.1", int(port)))
                except OSError as exc:   # another process hosts it: torch then joins as a client, on RuntimeError
                    listener.close()
                    raise RuntimeError(f"cannot host the store on 127.0.0.1:{port}: {exc}") from exc
                listener.listen(4096)
                port = listener.getsockname()[1]
                kwargs["master_listen_fd"] = listener.detach()   # the store owns the socket from here on
            super().__init__(host_name, port, *args, **kwargs)

    return LoopbackTCPStore


def address_toward(host: str, port: int) -> tuple[str, str]:
    """(this machine's source address toward `host`, `host`'s address), from the routing table: connecting a
    UDP socket sends nothing. For an address of this machine itself, the two are equal."""
    family, _, _, _, target = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect(target)
        return probe.getsockname()[0], target[0]


def interface_with(address: str) -> str | None:
    """The name of the interface that holds the IPv4 `address` (None for IPv6 or when none does)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            try:
                answer = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:   # no IPv4 address on it
                continue
            if socket.inet_ntoa(answer[20:24]) == address:
                return name
    return None


def node_arguments(argv: list[str], address: str, endpoint_address: str) -> list[str]:
    """torchrun's arguments with this node's address (unless given) and, on the endpoint's node, `is_host`."""
    extra = []
    if not any(arg.startswith(("--local_addr", "--local-addr")) for arg in argv):
        extra.append(f"--local_addr={address}")
    if address == endpoint_address and not any(arg.startswith(("--rdzv_conf", "--rdzv-conf")) for arg in argv):
        extra.append("--rdzv_conf=is_host=1")
    return extra + argv   # before the training module and its own arguments


def main(argv: list[str]) -> None:
    import torch.distributed as dist

    if stays_on_this_machine(argv):
        dist.TCPStore = loopback_store_class()   # before torchrun's rendezvous modules import the name
    elif (endpoint := rendezvous_endpoint(argv)) is not None:
        address, endpoint_address = address_toward(*endpoint)
        interface = interface_with(address)
        # torchrun and the workers inherit these; a user's own setting wins
        set_defaults({**UNSHARED_STORE, **({name: interface for name in NODE_INTERFACE_ENVS} if interface else {})})
        argv = node_arguments(argv, address, endpoint_address)
    from torch.distributed.run import main as torchrun

    torchrun(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
