"""Bring your own Flower app, end to end: Flower's own quickstart-pytorch app (its data loading
replaced by synthetic tensors), changed only by the lines docs/flower.md shows, runs on a
SuperLink with two SuperNodes on loopback against a running ``flaudit serve``; the audits it
attaches to succeed with estimates, and the one whose app disables the noise shows it.

``flwr new`` of Flower 1.41 downloads its templates from the Flower Hub, so the app is the
unmodified copy in ``tests/integration/third_party/flower_quickstart`` (see its ORIGIN.md).
"""

from __future__ import annotations

import math
import re
import shutil
import time
from pathlib import Path

import httpx
import pytest

from tests.integration import federation
from tests.processes import ROOT, Processes, wait_for_audit

pytestmark = pytest.mark.slow

TEMPLATE = Path(__file__).parent / "third_party" / "flower_quickstart"
API_KEY = "byo-app-key-" + "k" * 12
# canaries take cohort slots (2 per round here): about 4 seen canaries in 4 rounds of 2 slots;
# 8 always fit (one period of 4 rounds x 2 slots)
NUM_CANARIES = 8
NUM_ROUNDS = 4
# noise z C / n per coordinate of the average: with C = 1 and z = 5 the CNN diverges within a few
# rounds (losses of 1e30, then non-finite models), so the clip norm is small
CLIP = 0.05
#: The service's test-only canary seeds (issue #39): the noised audit gets CANARY_SEED (4 of 8
#: canaries seen), the noise-disabled one CANARY_SEED + 1 (3 seen). A drawn seed left fewer than
#: 2 seen in about 3% of audits, and then no two-Gaussian estimate is fitted: the test failed.
CANARY_SEED = 0x5EED_2026_1206_B10F_0000_0000_0000_0001

SYNTHETIC_DATA = '''

def _synthetic(n, seed):
    """Synthetic CIFAR-shaped data (the test runs offline): 3x32x32 images, 10 classes."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (n,), generator=g)
    images = torch.randn(n, 3, 32, 32, generator=g) + labels.view(-1, 1, 1, 1) / 5
    return [{"img": images[i], "label": labels[i]} for i in range(n)]


def load_data(partition_id: int, num_partitions: int, batch_size: int):
    data = _synthetic(80, partition_id)
    return (DataLoader(data[:64], batch_size=batch_size, shuffle=True),
            DataLoader(data[64:], batch_size=batch_size))


def load_centralized_dataset():
    return DataLoader(_synthetic(64, 999), batch_size=128)
'''


def documented_blocks(marker: str = "flaudit-byo") -> dict[str, list[str]]:
    """The code blocks docs/flower.md marks with ``<!-- {marker}: NAME -->``."""
    text = (ROOT / "docs" / "flower.md").read_text()
    blocks = {}
    pattern = rf"<!-- {marker}: ([^>]+?) -->\n```\w*\n(.*?)```"
    for match in re.finditer(pattern, text, re.S):
        blocks[match.group(1)] = match.group(2).rstrip("\n").split("\n")
    return blocks


def insert_after(text: str, anchor: str, lines: list[str]) -> str:
    assert anchor in text, f"the quickstart no longer has {anchor!r}"
    return text.replace(anchor, anchor + "\n" + "\n".join(lines), 1)


def synthetic_quickstart(dest: Path) -> Path:
    """Flower's quickstart copied to ``dest``, its data synthetic; returns its package."""
    shutil.copytree(TEMPLATE, dest, ignore=shutil.ignore_patterns("ORIGIN.md", "__pycache__"))
    pkg = dest / "pytorchexample"
    task = (pkg / "task.py").read_text()
    task = re.sub(
        r"^(from datasets|from flwr_datasets|from torchvision|pytorch_transforms =).*\n",
        "",
        task,
        flags=re.M,
    )
    (pkg / "task.py").write_text(task + SYNTHETIC_DATA)  # later definitions win
    return pkg


def make_app(dest: Path, *, extra_client_metric: bool) -> int:
    """Copy Flower's quickstart, make its data synthetic, apply the documented lines; return how
    many lines the documentation adds."""
    pkg = synthetic_quickstart(dest)
    blocks = documented_blocks()
    server = (pkg / "server_app.py").read_text()
    server = insert_after(
        server, "from flwr.serverapp.strategy import FedAvg", blocks["server_app imports"]
    )
    server = insert_after(
        server,
        "    strategy = FedAvg(fraction_evaluate=fraction_evaluate)",
        blocks["server_app strategy"],
    )
    (pkg / "server_app.py").write_text(server)
    pyproject = (dest / "pyproject.toml").read_text()
    (dest / "pyproject.toml").write_text(
        insert_after(pyproject, "[tool.flwr.app.config]", blocks["pyproject config"])
    )
    if extra_client_metric:  # an app that reports more than the quickstart does
        client = (pkg / "client_app.py").read_text()
        client = insert_after(
            client,
            '        "train_loss": train_loss,',
            [
                '        "num-batches": len(trainloader),',
                '        "train_lr": float(msg.content["config"]["lr"]),',
            ],
        )
        (pkg / "client_app.py").write_text(client)
    return sum(len(lines) for lines in blocks.values())


@pytest.mark.timeout(600)
def test_flower_quickstart_audited_with_the_documented_lines(tmp_path):
    env, marker = federation.flower_home(tmp_path)
    # deferred: that module imports this one
    from tests.integration.test_byo_auto_sizing import _seed_app

    service = federation.start_service(tmp_path, API_KEY, seed=CANARY_SEED)
    procs = Processes(tmp_path, cwd=tmp_path)
    bodies: list[str] = []
    cases = {  # name: (noise multiplier, extra client metric)
        "noised": (5.0, True),
        "noise disabled": (0.0, False),
    }
    audits, secrets = {}, []
    started = time.monotonic()
    try:
        federation.start_federation(procs, env, marker, 2)
        http = httpx.Client(base_url=service.url, timeout=30)
        for name, (noise, extra) in cases.items():
            app = tmp_path / f"app-{name.replace(' ', '-')}"
            added = make_app(app, extra_client_metric=extra)
            assert added <= 15  # the documented change stays small
            _seed_app(app)  # Flower's DP noise and cohorts, the canary slots: one outcome each
            lines = federation.attach(
                service.url,
                env,
                API_KEY,
                name,
                tmp_path / f"{app.name}.token",
                "--canaries",
                str(NUM_CANARIES),
                "--max-canary-fraction",
                "1.0",
            )
            # the token is in a file: the run config (which apps write to disk) holds its path
            assert set(lines) == {
                "flaudit-audit-id",
                "flaudit-ingest-url",
                "flaudit-run-token-file",
            }
            secrets.append(Path(lines["flaudit-run-token-file"]).read_text().strip())
            assert len(secrets[-1]) >= 16  # and not in attach's output (attach checks)
            run_config = federation.write_run_config(
                tmp_path / f"{app.name}.toml",
                {
                    "noise-multiplier": noise,
                    "clipping-norm": CLIP,
                    "num-sampled-clients": 2,
                    "num-server-rounds": NUM_ROUNDS,
                    "fraction-evaluate": 0.0,  # evaluate_fn only
                    **lines,
                },
            )

            federation.submit(app, run_config, env, tmp_path, timeout=90)
            audits[name] = lines["flaudit-audit-id"]
        for name, audit_id in audits.items():  # the two runs train side by side
            audits[name] = wait_for_audit(
                http, audit_id, timeout=420, bodies=bodies, what=f"the {name} audit"
            )
    finally:
        procs.stop_all()
        service.stop()
    print(f"two audited quickstart runs took {time.monotonic() - started:.1f} s")
    logs = {p.name: p.read_text(errors="replace")[-3000:] for p in tmp_path.glob("*.log")}

    headline = {}
    for name, audit in audits.items():
        assert audit["status"] == "succeeded", (audit["reason"], logs)
        noise = cases[name][0]
        assert audit["spec"]["noise_multiplier"] == noise  # the claim came from the app
        assert audit["spec"]["clip_norm"] == CLIP and audit["spec"]["num_rounds"] == NUM_ROUNDS
        assert audit["spec"]["num_clients"] == 2 and audit["spec"]["clients_per_round"] == 2
        assert audit["dim"] == 62006  # the quickstart's CNN, unchanged
        assert 0 <= audit["metrics"]["accuracy"] <= 1 and math.isfinite(audit["metrics"]["loss"])
        estimates = audit["estimates"]
        assert any(
            e["estimator"] == "two_gaussian" and e["threat_model"] == "final_model"
            for e in estimates
        )
        analytic = [e for e in estimates if e["estimator"] == "analytic"]
        assert analytic
        if noise == 0:
            assert all(e["epsilon"] == "inf" for e in analytic)
            assert audit["alarm_guarantee"].startswith("No DP claim")  # the claim says so
            # the one-run bound is reported (valid at any value); with k = 8 canaries (all that
            # 4 rounds x 2 cohort slots hold) it is at most about 0.2, 0 with an unbalanced
            # split (it was > 1 with 48 extra-reply canaries before they took cohort slots,
            # issue #22); the separation itself is checked by the headline below
            one_run = [
                e
                for e in estimates
                if e["estimator"] == "one_run" and e["threat_model"] == "final_model"
            ]
            assert one_run and 0 <= one_run[0]["epsilon"] < 1
        else:
            assert all(isinstance(e["epsilon"], float) for e in analytic)
        headline[name] = (
            audit["headline_epsilon"]
            if "headline_epsilon" in audit
            else next(
                e["epsilon"]
                for e in estimates
                if e["estimator"] == "two_gaussian"
                and e["threat_model"] == "final_model"
                and e["variance"] == "null"
            )
        )
    # noise disabled in the app: the canaries stand out; z = 5 hides them
    assert headline["noise disabled"] > 10 * max(headline["noised"], 0.2), headline
    for text in [*bodies, *(p.read_text(errors="replace") for p in tmp_path.glob("*.log"))]:
        for secret in secrets:  # the run tokens reach no log and no response after creation
            assert secret not in text
