"""`python -m tasks.training.launch ARGS`: torchrun (`torch.distributed.run`) with its stores bound to 127.0.0.1.

torchrun's c10d stores (the rendezvous, and the one the workers meet at through MASTER_ADDR) listen on every
interface whatever host they are given (checked with `ss -ltn` on torch 2.13: `*:PORT` for `--standalone` and for a
127.0.0.1 endpoint), and they have no authentication: anyone who reaches the port can read and write the job's
keys. For a one-node job (`--standalone`) or one that meets on a loopback endpoint, every store served here binds
127.0.0.1 instead (TCPStore's `master_listen_fd`); a multi-node job on real addresses keeps torch's behaviour and
must run on a private network.
"""
from __future__ import annotations

import socket
import sys

LOOPBACK_HOSTS = {"localhost", "127.0.0.1", "::1"}


def stays_on_this_machine(argv: list[str]) -> bool:
    """Whether the torchrun arguments describe a job every rank of which runs here."""
    if "--standalone" in argv:
        return True
    endpoints = [arg.split("=", 1)[1] for arg in argv if arg.startswith(("--rdzv_endpoint=", "--rdzv-endpoint="))]
    return bool(endpoints) and endpoints[0].rsplit(":", 1)[0].strip("[]") in LOOPBACK_HOSTS


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


def main(argv: list[str]) -> None:
    import torch.distributed as dist

    if stays_on_this_machine(argv):
        dist.TCPStore = loopback_store_class()   # before torchrun's rendezvous modules import the name
    from torch.distributed.run import main as torchrun

    torchrun(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
