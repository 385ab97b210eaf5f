"""Flower's own DP + SecAgg+ example (``examples/fl-dp-sa``, copied unmodified: see
``third_party/flower_fl_dp_sa/ORIGIN.md``), its data swapped for synthetic tensors, plus the lines
docs/flower.md shows, run with the real ``SecAggPlusWorkflow`` and the example's ClientApp (with
``secaggplus_mod`` and ``fixedclipping_mod``) on an in-process grid (every node its own
``Context``; no Ray). Issue #22 item 2.

The audit's service client is replaced by an in-process one (``from_env`` is patched: the
service path is covered by ``test_byo_flower_app.py``); everything Flower does is real.
"""

from __future__ import annotations

import copy
import importlib
import random
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.server.test_wrapper import ClaimRecorder

pytestmark = pytest.mark.slow

TEMPLATE = Path(__file__).parent / "third_party" / "flower_fl_dp_sa"
ROOT = Path(__file__).resolve().parents[2]
NODES, SAMPLED, K, SEED = 50, 10, 16, 0x5EED_DA5A

SYNTHETIC_DATA = '''

def load_data(partition_id: int, num_partitions: int):
    """Synthetic MNIST-shaped data (the test runs offline); partition 0 has HEAVY x the data."""
    n = 40 * (HEAVY if partition_id == 0 else 1)
    g = torch.Generator().manual_seed(partition_id)
    labels = torch.randint(0, 10, (n,), generator=g)
    images = torch.randn(n, 1, 28, 28, generator=g) + labels.view(-1, 1, 1, 1) / 5
    data = [{"image": images[i], "label": labels[i]} for i in range(n)]
    cut = n * 4 // 5
    return (DataLoader(data[:cut], batch_size=32, shuffle=True),
            DataLoader(data[cut:], batch_size=32))
'''


def documented_lines() -> list[str]:
    text = (ROOT / "docs" / "flower.md").read_text()
    match = re.search(r"<!-- flaudit-legacy: server_app strategy -->\n```\w*\n(.*?)```", text, re.S)
    return match.group(1).rstrip("\n").split("\n")


def make_app(dest: Path, heavy: int) -> int:
    shutil.copytree(TEMPLATE, dest, ignore=shutil.ignore_patterns("ORIGIN.md", "__pycache__"))
    pkg = dest / "fl_dp_sa"
    task = (pkg / "task.py").read_text()
    task = re.sub(r"^(from flwr_datasets|from torchvision).*\n", "", task, flags=re.M)
    (pkg / "task.py").write_text(task + f"\nHEAVY = {heavy}\n" + SYNTHETIC_DATA)
    server = (pkg / "server_app.py").read_text()
    anchor = "        num_sampled_clients=num_sampled_clients,\n    )\n"
    assert anchor in server, "fl-dp-sa no longer builds its DP strategy this way"
    lines = documented_lines()
    (pkg / "server_app.py").write_text(server.replace(anchor, anchor + "\n".join(lines) + "\n", 1))
    return len(lines)


class InProcessGrid:
    """Each node runs the example's ClientApp on its own copy of every message (as a SuperNode
    receives it) with its own Context (SecAgg+ keeps its state there)."""

    class run:  # noqa: N801 - the attribute Flower's legacy compat layer reads
        run_id = 1

    def __init__(self, client_app, num_nodes: int) -> None:
        from flwr.app import Context, RecordDict

        self.client_app = client_app
        self.contexts = {
            node: Context(
                run_id=1,
                node_id=node,
                state=RecordDict(),
                run_config={},
                node_config={"partition-id": node - 1, "num-partitions": num_nodes},
            )
            for node in range(1, num_nodes + 1)
        }

    def get_node_ids(self):
        return list(self.contexts)

    def send_and_receive(self, messages, *, timeout=None):
        return [
            self.client_app(copy.deepcopy(m), self.contexts[m.metadata.dst_node_id])
            for m in messages
        ]


def load_apps(monkeypatch, app: Path, package: str):
    """The ServerApp and ClientApp of the app copied at ``app`` (its package ``package``),
    imported afresh, with Flower's task identity of a ServerApp inside a run (restored after
    the test)."""
    from flwr.supercore.task_identity import TaskIdentity

    monkeypatch.syspath_prepend(str(app))
    for name in [m for m in sys.modules if m == package or m.startswith(f"{package}.")]:
        monkeypatch.delitem(sys.modules, name)
    server_app = importlib.import_module(f"{package}.server_app").app
    client_app = importlib.import_module(f"{package}.client_app").app
    for private in ("_task_id", "_run_id", "_node_id"):
        monkeypatch.setattr(TaskIdentity, private, getattr(TaskIdentity, private), raising=False)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    return server_app, client_app


def run_app(tmp_path: Path, monkeypatch, *, heavy: int, noise: float):
    """Run the app once; return (reporter, strategy)."""
    from flwr.app import Context, RecordDict

    import flaudit.server.wrapper as wrapper

    app = tmp_path / f"fl-dp-sa-{heavy}"
    assert make_app(app, heavy) <= 15
    reporter = ClaimRecorder.for_audit(canary_seed=SEED, num_canaries=K)
    made = []

    def local_from_env(cls, strategy, *, num_rounds, run_config=None, **options):
        canaries = wrapper.LocalCanaries(
            SEED, num_canaries=K, num_rounds=num_rounds, clients_per_round=SAMPLED
        )
        made.append(cls(strategy, num_rounds=num_rounds, reporter=reporter, canaries=canaries))
        made[-1].audit._slot_rng = np.random.default_rng(
            0
        )  # which sampled clients canaries displace
        return made[-1]

    monkeypatch.setattr(wrapper.LegacyCanaryAuditStrategy, "from_env", classmethod(local_from_env))
    server_app, client_app = load_apps(monkeypatch, app, "fl_dp_sa")
    random.seed(31)  # Flower's client sampling: node 1 (partition 0) first in round 1's sample
    np.random.seed(3)  # Flower's DP noise
    # the models' start and the clients' batches (torch's global generator): a fresh worker and
    # one that ran other torch tests before must see the same run (issue #39)
    torch.manual_seed(22)
    run_config = {
        "noise-multiplier": noise,
        "clipping-norm": 10.0,
        "num-sampled-clients": SAMPLED,
        "num-shares": 3,
        "reconstruction-threshold": 2,
    }
    server_app(
        InProcessGrid(client_app, NODES),
        Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config),
    )
    return reporter, made[0]


def alarm_status(reporter) -> str:
    """The service's own alarm decision on this run's statistics (final look)."""
    return reporter.final_alarm("fl-dp-sa", SEED, K).status


@pytest.mark.timeout(300)
def test_fl_dp_sa_with_secagg_is_audited_and_a_10x_weighted_client_raises_the_alarm(
    tmp_path, monkeypatch
):
    reporter, strategy = run_app(tmp_path, monkeypatch, heavy=1, noise=0.2)
    claim = reporter.claims[0]
    assert (
        claim["noise_multiplier"],
        claim["clip_norm"],
        claim["clients_per_round"],
        claim["num_rounds"],
    ) == (0.2, 10.0, SAMPLED, 3)  # read from the app's strategy
    assert "DifferentialPrivacyClientSideFixedClipping" in claim["strategy"]
    assert [m.cohort_size for _, m in reporter.rounds] == [SAMPLED] * 3  # exactly n results
    assert (
        sum(m.num_canaries_inserted for _, m in reporter.rounds)
        == sum(strategy.displaced.values())
        > 0
    )
    assert reporter.final_model is not None
    assert all(f == pytest.approx(1.0) for f in strategy.weight_factors.values())
    correct = alarm_status(reporter)
    assert correct != "error"  # consistent with the claim

    heavy, weighted = run_app(tmp_path, monkeypatch, heavy=10, noise=0.2)
    assert [m.cohort_size for _, m in heavy.rounds] == [SAMPLED] * 3
    factors = [m.weight_factor for _, m in heavy.rounds]
    # partition 0 (10x the data) is sampled by Flower in some round (seeded): from then on the
    # canaries weigh what it weighs and the round records the weighting above C/n
    assert max(factors) > 1.5, factors
    # the canaries weigh what the 10x client weighs: the claim (mu = 1 / 0.2 per round) is
    # refuted, and the round metadata says the weighting did it (factors 2.7-3.6 when measured)
    assert alarm_status(heavy) == "error", factors
