"""Entry point of the SuperNode image: work out this replica's node config, then exec flower-supernode.

``docker compose up --scale supernode=4`` starts identical containers, so the partition id
cannot be written in compose.yaml. It comes from, in this order:

1. ``FLAUDIT_PARTITION_ID`` (set it when a SuperNode runs on its own host);
2. the compose replica number ``n``, giving ``partition-id = n - 1``: compose names the replicas
   ``<project>-supernode-<n>`` and Docker's DNS resolves those names on the compose network, so
   the entry point looks them up by name (n = 1, 2, ...) and takes the one that resolves to this
   container's own address. (A reverse lookup of the own address does not work: it answers from
   ``/etc/hosts`` with the container id.) ``FLAUDIT_COMPOSE_SERVICE`` is the name prefix
   (compose.yaml sets ``<project>-supernode``);
3. otherwise no ``partition-id`` is set (the flaudit ServerApp assigns partitions to nodes
   itself; the node config is a label for logs and custom ClientApps).

``num-partitions`` is ``FLAUDIT_NUM_PARTITIONS`` (compose sets it from ``SUPERNODES``).
The SuperLink address is ``FLAUDIT_SUPERLINK`` (default ``superlink:9093``). With
``FLAUDIT_SUPERLINK_ROOT_CERTIFICATES`` (a CA bundle path) the connection uses TLS; without it,
``--insecure``. Extra arguments are passed through to ``flower-supernode``.
"""

import os
import socket
import sys
import time


def own_addresses() -> set[str]:
    """This container's IPv4 addresses (/etc/hosts maps its hostname to them)."""
    try:
        return set(socket.gethostbyname_ex(socket.gethostname())[2]) - {"127.0.0.1"}
    except OSError:
        return set()


def resolve(name: str) -> set[str]:
    try:
        return set(socket.gethostbyname_ex(name)[2])
    except OSError:
        return set()


def replica_number(
    service: str | None = None,
    *,
    attempts: int = 10,
    wait: float = 1.0,
    max_misses: int = 3,
    lookup=resolve,
    addresses=own_addresses,
) -> int | None:
    """The n of the ``<service>-<n>`` name (also ``<service>_<n>``, compose v1) that resolves to
    this container's own address, or None. Names are tried n = 1, 2, ... until ``max_misses``
    in a row resolve to nothing (a replica being created at the same moment may not be in DNS
    yet); the whole scan is retried ``attempts`` times, ``wait`` seconds apart, since this
    container's own name can appear in DNS a moment after it starts."""
    service = (
        service or os.environ.get("FLAUDIT_COMPOSE_SERVICE", "").strip() or "flaudit-supernode"
    )
    for attempt in range(attempts):
        mine = addresses()
        if mine:
            n, misses = 1, 0
            while misses < max_misses:
                found = lookup(f"{service}-{n}") or lookup(f"{service.replace('-', '_')}_{n}")
                if found & mine:
                    return n
                misses = 0 if found else misses + 1
                n += 1
        if attempt + 1 < attempts:
            time.sleep(wait)
    return None


def node_config() -> str:
    parts = []
    explicit = os.environ.get("FLAUDIT_PARTITION_ID", "").strip()
    if explicit:
        partition_id = int(explicit)
    else:
        number = replica_number()
        partition_id = None if number is None else number - 1
    if partition_id is not None:
        parts.append(f"partition-id={partition_id}")
    num_partitions = os.environ.get("FLAUDIT_NUM_PARTITIONS", "").strip()
    if num_partitions:
        if partition_id is not None and partition_id >= int(num_partitions):
            print(
                f"supernode: partition-id {partition_id} >= num-partitions {num_partitions}; "
                "set SUPERNODES to the number of SuperNodes you scale to",
                file=sys.stderr,
            )
            sys.exit(2)
        parts.append(f"num-partitions={int(num_partitions)}")
    return " ".join(parts)


def main() -> None:
    args = [
        "flower-supernode",
        "--superlink",
        os.environ.get("FLAUDIT_SUPERLINK", "superlink:9093"),
    ]
    ca = os.environ.get("FLAUDIT_SUPERLINK_ROOT_CERTIFICATES", "").strip()
    args += ["--root-certificates", ca] if ca else ["--insecure"]
    config = node_config()
    if config:
        args += ["--node-config", config]
    args += sys.argv[1:]
    print("supernode: " + " ".join(args), flush=True)
    os.execvp(args[0], args)


if __name__ == "__main__":
    main()
