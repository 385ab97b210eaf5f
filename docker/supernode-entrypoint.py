"""Entry point of the SuperNode image: work out this replica's node config, then exec flower-supernode.

``docker compose up --scale supernode=4`` starts identical containers, so the partition id
cannot be written in compose.yaml. It comes from, in this order:

1. ``FLAUDIT_PARTITION_ID`` (set it when a SuperNode runs on its own host);
2. the compose replica number: Docker's DNS names this container ``<project>-supernode-<n>``
   (reverse lookup of its own address), giving ``partition-id = n - 1``;
3. otherwise no ``partition-id`` is set (the flaudit ServerApp assigns partitions to nodes
   itself; the node config is a label for logs and custom ClientApps).

``num-partitions`` is ``FLAUDIT_NUM_PARTITIONS`` (compose sets it from ``SUPERNODES``).
The SuperLink address is ``FLAUDIT_SUPERLINK`` (default ``superlink:9093``). With
``FLAUDIT_SUPERLINK_ROOT_CERTIFICATES`` (a CA bundle path) the connection uses TLS; without it,
``--insecure``. Extra arguments are passed through to ``flower-supernode``.
"""

import os
import re
import socket
import sys


def replica_number() -> int | None:
    try:
        address = socket.gethostbyname(socket.gethostname())
        name = socket.gethostbyaddr(address)[0]
    except OSError:
        return None
    match = re.search(r"[-_]supernode[-_](\d+)(?:\.|$)", name)
    return int(match.group(1)) if match else None


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
    args = ["flower-supernode", "--superlink", os.environ.get("FLAUDIT_SUPERLINK", "superlink:9093")]
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
