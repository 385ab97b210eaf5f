"""Issue #40: a simulation audit's Ray (GCS, raylet, workers, agents) listens on loopback only.

Ray has no authentication; a socket it opens on the machine's address lets anyone who reaches the
address run code. The test runs ``flaudit run`` on a tiny spec in a subprocess and, while it runs,
reads the listening TCP sockets of that process and all its descendants from ``/proc``.
"""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.processes import ROOT

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux /proc"),
]

SPEC = """\
name = "ray-loopback"
task = "synthetic"
task_options = { dim = 200, test_size = 100 }
num_rounds = 6
num_clients = 8
clients_per_round = 4
participation = "uniform"
num_canaries = 8
noise_multiplier = 1.0
clip_norm = 1.0
timeout_seconds = 240
"""

LISTEN = "0A"


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def _tree(root: int) -> set[int]:
    """``root`` and every live descendant of it."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            parent = _parent(int(entry.name))
            if parent is not None:
                parents[int(entry.name)] = parent
    tree = {root}
    grew = True
    while grew:
        new = {pid for pid, parent in parents.items() if parent in tree} - tree
        tree |= new
        grew = bool(new)
    return tree


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        pass
    return inodes


def _address(hex_address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An address as /proc/net/tcp{,6} prints it (32-bit words in host byte order)."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(words)


def _listening() -> dict[str, tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]]:
    """inode -> (address, port) of every listening TCP socket of this network namespace."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not Path(table).exists():
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != LISTEN:
                continue
            address, port = fields[1].split(":")
            parsed = _address(address)
            found[fields[9]] = (getattr(parsed, "ipv4_mapped", None) or parsed, int(port, 16))
    return found


def _is_loopback(address) -> bool:
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def test_address_parsing_matches_known_forms():
    assert str(_address("0100007F")) == "127.0.0.1"
    assert str(_address("00000000000000000000000001000000")) == "::1"
    assert _is_loopback(_address("0000000000000000FFFF00000100007F"))  # ::ffff:127.0.0.1
    assert not _is_loopback(_address("00000000"))  # 0.0.0.0
    assert not _is_loopback(_address("00000000000000000000000000000000"))  # ::
    assert not _is_loopback(_address("020200C0"))  # 192.0.2.2


@pytest.mark.timeout(300)
def test_simulation_audit_listens_on_loopback_only(tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("FLAUDIT_RAY_NODE_IP", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")
    }
    env["PYTHONPATH"] = str(ROOT)
    before = set(_listening())
    log = tmp_path / "run.log"
    with log.open("w") as out:
        run = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "flaudit.commands.cli",
                "run",
                str(spec),
                "--max-supernodes",
                "2",
                "--num-cpus",
                "2",
            ],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    seen: dict[str, tuple[str, object, int]] = {}  # inode -> (process, address, port)
    try:
        while run.poll() is None:
            listening = _listening()
            for pid in _tree(run.pid):
                for inode in _socket_inodes(pid) & set(listening):
                    seen.setdefault(inode, (_name(pid), *listening[inode]))
            time.sleep(0.2)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(30)
    assert run.returncode in (0, 3, 4), log.read_text()[-3000:]
    report = sorted(f"{name} {address}:{port}" for name, address, port in seen.values())
    print("listening sockets of the run's processes:", *report, sep="\n  ")
    # Ray's GCS, raylet and workers must have been seen, or the check proves nothing
    assert {"gcs_server", "raylet"} <= {name for name, _, _ in seen.values()}, report
    assert not set(seen) & before
    exposed = sorted(
        f"{name} {address}:{port}"
        for name, address, port in seen.values()
        if not _is_loopback(address)
    )
    assert exposed == [], f"listening beyond loopback: {exposed}"
