"""Conformance matrix (issue #38 item 4): Flower's central-DP wrappers audited through flaudit's
wrapper, each cell with a correct run and planted bugs at x0.5 and x0.25 of the claimed noise.

Cells (``--cells``: indices into :data:`CELLS`, 0-7 Message API, 8-15 legacy): fixed and
adaptive clipping x server- and client-side x equal and weighted clients, on Flower's Message
API strategies (``flwr.serverapp.strategy``) and legacy ones (``flwr.server.strategy``).
Flower's own strategy objects do the DP
(``DifferentialPrivacy{Server,Client}Side{Fixed,Adaptive}Clipping`` around Flower's ``FedAvg``),
driven by Flower's own loop in process, no Ray (Message API: ``Strategy.start``; legacy:
``LegacyContext`` + ``DefaultWorkflow`` over a ``NumPyClient`` ``ClientApp`` on an in-process
grid), wrapped in ``CanaryAuditStrategy`` / ``LegacyCanaryAuditStrategy`` with the real
``HttpRoundReporter`` talking to the real service app in process (SQLite, ``num_canaries =
"auto"``): the audit sees what it sees in a real run, and the verdict is the one
``GET /audits/{id}`` returns. Client-side cells clip in Flower's own mods
(``fixedclipping_mod``, ``adaptiveclipping_mod``; legacy: ``flwr.client.mod``'s).

Clients send synthetic updates (random directions). Fixed clipping: norms around 2 C (all
clipped). Adaptive clipping: norms around 0.3 C_0, never clipped, so Flower grows the clip norm
every round and noises each round for the *next*, larger norm (``C_{t+1} / C_t`` about 1.1): the
case where the canaries meet more noise than z_delta C_t / n, the hardest for the design's
promise. Weighted: ``num-examples`` drawn once per node from 4..6 (weight factors up to 1.36).

The planted bug scales the noise Flower adds by 0.5 or 0.25 behind the claim's back
(``add_gaussian_noise_inplace``, legacy ``add_gaussian_noise_to_params``, replaced inside
Flower's DP modules only). A run *catches* the bug when the verdict is ``claim_refuted`` with the
noise named (cause ``noise`` or ``noise_and_weighting``); a correct run with that outcome is a
*false alarm*.

Flower's ``LocalDpMod`` is not a cell: see docs/fidelity.md (the canaries, made by the server,
never pass through a client's mod, so they cannot meet its noise; the audit refuses an app
whose strategy has no DP wrapper unless ``clip_norm=`` is given, and then claims no noise).

Seeds fix Flower's noise, the updates, the weights and the canary slots; the canary seed is the
service's own (fresh per audit, as in a real run). Rerun (about 1.6 CPU-s a run; the wall time
is printed; the table of docs/fidelity.md section 13)::

    PYTHONPATH=$PWD .venv/bin/python benchmarks/conformance.py --runs 10 --cells 0,1,2,3,4,5,6,7
    PYTHONPATH=$PWD .venv/bin/python benchmarks/conformance.py --runs 10 --seed 7 \
        --cells 8,9,10,11,12,13,14,15
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._service import in_process_reporter  # noqa: E402
from benchmarks.fidelity._common import clopper_pearson  # noqa: E402

DIM, NODES, ROUNDS, Z, CLIP, SIGMA_B = 200, 10, 10, 1.0, 1.0, 1.0
SCALES = (1.0, 0.5, 0.25)
CELLS = [
    (clipping, side, weights, api)
    for api in ("message", "legacy")
    for clipping in ("fixed", "adaptive")
    for side in ("server", "client")
    for weights in ("equal", "weighted")
]


class SynthGrid:
    """Every node answers a train message with the model plus a synthetic update, through
    Flower's clipping mod on client-side cells."""

    def __init__(self, *, side: str, clipping: str, weights: dict[int, int], rng) -> None:
        from flwr.app import Context, RecordDict
        from flwr.clientapp.mod import adaptiveclipping_mod, fixedclipping_mod

        self.nodes = list(weights)
        self.weights = weights
        self.rng = rng
        self.mod = None
        if side == "client":
            self.mod = fixedclipping_mod if clipping == "fixed" else adaptiveclipping_mod
        self.norm = 2.0 * CLIP if clipping == "fixed" else 0.3 * CLIP
        self.contexts = {
            n: Context(run_id=1, node_id=n, node_config={}, state=RecordDict(), run_config={})
            for n in self.nodes
        }

    def get_node_ids(self):
        return self.nodes

    def _answer(self, msg, context):
        from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict

        arrays = msg.content["arrays"].to_numpy_ndarrays()
        out = []
        for a in arrays:
            u = self.rng.standard_normal(a.shape)
            u *= self.norm * math.exp(0.2 * self.rng.standard_normal()) / np.linalg.norm(u)
            out.append((a + u).astype(a.dtype))
        metrics = MetricRecord({"num-examples": self.weights[msg.metadata.dst_node_id]})
        content = RecordDict({"arrays": ArrayRecord(out), "metrics": metrics})
        return Message(content=content, reply_to=msg)

    def send_and_receive(self, messages, timeout=None):
        replies = []
        for msg in messages:
            if msg.metadata.message_type != "train":
                continue
            context = self.contexts[msg.metadata.dst_node_id]
            if self.mod is None:
                replies.append(self._answer(msg, context))
            else:
                replies.append(self.mod(msg, context, self._answer))
        return replies


@contextlib.contextmanager
def noise_scaled(scale: float):
    """Flower's DP modules add ``scale`` x the noise they compute (the planted bug)."""
    import flwr.server.strategy.dp_adaptive_clipping as legacy_adaptive
    import flwr.server.strategy.dp_fixed_clipping as legacy_fixed
    import flwr.serverapp.strategy.dp_adaptive_clipping as adaptive
    import flwr.serverapp.strategy.dp_fixed_clipping as fixed

    real = fixed.add_gaussian_noise_inplace
    real_legacy = legacy_fixed.add_gaussian_noise_to_params

    def scaled(arrays, std):
        return real(arrays, std * scale)

    def scaled_legacy(params, noise_multiplier, clipping_norm, num_sampled_clients):
        return real_legacy(params, noise_multiplier * scale, clipping_norm, num_sampled_clients)

    for module in (fixed, adaptive):
        module.add_gaussian_noise_inplace = scaled
    for module in (legacy_fixed, legacy_adaptive):
        module.add_gaussian_noise_to_params = scaled_legacy
    try:
        yield
    finally:
        for module in (fixed, adaptive):
            module.add_gaussian_noise_inplace = real
        for module in (legacy_fixed, legacy_adaptive):
            module.add_gaussian_noise_to_params = real_legacy


def dp_strategy(clipping: str, side: str, api: str = "message"):
    if api == "message":
        from flwr.serverapp import strategy as s

        fedavg = s.FedAvg(
            fraction_train=1.0,
            fraction_evaluate=0.0,
            min_train_nodes=NODES,
            min_available_nodes=NODES,
        )
    else:
        from flwr.server import strategy as s

        fedavg = s.FedAvg(
            fraction_fit=1.0,
            fraction_evaluate=0.0,
            min_fit_clients=NODES,
            min_available_clients=NODES,
        )
    if clipping == "fixed":
        cls = (
            s.DifferentialPrivacyServerSideFixedClipping
            if side == "server"
            else s.DifferentialPrivacyClientSideFixedClipping
        )
        return cls(fedavg, Z, CLIP, num_sampled_clients=NODES)
    cls = (
        s.DifferentialPrivacyServerSideAdaptiveClipping
        if side == "server"
        else s.DifferentialPrivacyClientSideAdaptiveClipping
    )
    return cls(
        fedavg,
        Z,
        num_sampled_clients=NODES,
        initial_clipping_norm=CLIP,
        clipped_count_stddev=SIGMA_B,
    )


def legacy_client_app(*, side: str, clipping: str, weights: dict[int, int], rng):
    """A legacy ``ClientApp`` (a ``NumPyClient``) sending synthetic updates, with Flower's
    legacy clipping mod on client-side cells; node ``i`` is partition ``i - 1``."""
    from flwr.client import ClientApp, NumPyClient
    from flwr.client.mod import adaptiveclipping_mod, fixedclipping_mod

    norm = 2.0 * CLIP if clipping == "fixed" else 0.3 * CLIP

    class Synthetic(NumPyClient):
        def __init__(self, weight: int) -> None:
            self.weight = weight

        def get_parameters(self, config):
            return [np.zeros(DIM, np.float32)]

        def fit(self, parameters, config):
            out = []
            for a in parameters:
                u = rng.standard_normal(a.shape)
                u *= norm * math.exp(0.2 * rng.standard_normal()) / np.linalg.norm(u)
                out.append((a + u).astype(a.dtype))
            return out, self.weight, {}

    def client_fn(context):
        node = int(context.node_config["partition-id"]) + 1
        return Synthetic(weights[node]).to_client()

    mods = []
    if side == "client":
        mods = [fixedclipping_mod if clipping == "fixed" else adaptiveclipping_mod]
    return ClientApp(client_fn=client_fn, mods=mods)


def one_run(client, cell, scale: float, seed: int) -> dict:
    from flwr.app import ArrayRecord

    from flaudit.server.wrapper import CanaryAuditStrategy
    from tests.service.conftest import AUTH

    clipping, side, weighting, api = cell
    body = client.post(
        "/audits",
        json={"name": "conformance", "engine": "external", "num_canaries": "auto"},
        headers=AUTH,
    ).json()
    env = body["environment"]
    reporter = in_process_reporter(client, env)
    rng = np.random.default_rng(seed)
    nodes = list(range(1, NODES + 1))
    weights = {n: (int(rng.integers(4, 7)) if weighting == "weighted" else 5) for n in nodes}
    random.seed(seed)
    np.random.seed(seed)  # Flower's DP noise (and noisy clipped count)
    dp = dp_strategy(clipping, side, api)
    if api == "message":
        strategy = CanaryAuditStrategy(dp, reporter=reporter)
        strategy.audit._slot_rng = np.random.default_rng(seed)
        with noise_scaled(scale):
            strategy.start(
                SynthGrid(side=side, clipping=clipping, weights=weights, rng=rng),
                ArrayRecord([np.zeros(DIM, np.float32)]),
                num_rounds=ROUNDS,
            )
    else:
        from flwr.app import Context, RecordDict
        from flwr.server import LegacyContext, ServerConfig
        from flwr.server.workflow import DefaultWorkflow

        from flaudit.server.wrapper import LegacyCanaryAuditStrategy
        from tests.integration.test_fl_dp_sa import InProcessGrid

        strategy = LegacyCanaryAuditStrategy(dp, num_rounds=ROUNDS, reporter=reporter)
        strategy.audit._slot_rng = np.random.default_rng(seed)
        app = legacy_client_app(side=side, clipping=clipping, weights=weights, rng=rng)
        context = LegacyContext(
            context=Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={}),
            config=ServerConfig(num_rounds=ROUNDS),
            strategy=strategy,
        )
        with noise_scaled(scale):
            DefaultWorkflow()(InProcessGrid(app, NODES), context)
    reporter.close()
    audit = client.get(f"/audits/{env['FLAUDIT_AUDIT_ID']}", headers=AUTH).json()
    verdict = audit["verdict"]
    design = (reporter.claim_ack or {}).get("design") or {}
    return {
        "status": verdict["status"],
        "cause": verdict.get("cause"),
        "caught": verdict["status"] == "claim_refuted"
        and verdict.get("cause") in ("noise", "noise_and_weighting"),
        "num_canaries": audit["spec"]["num_canaries"],
        "design_factor": design.get("detectable_noise_scale"),
        "design_summary": design.get("summary"),
        "min_noise_clip_factor": audit.get("min_noise_clip_factor"),
        "max_weight_factor": audit.get("max_weight_factor"),
    }


def _rate(hits: int, runs: int) -> str:
    lo, hi = clopper_pearson(hits, runs)
    return f"{hits}/{runs} = {hits / runs:.0%} [{lo:.0%}, {hi:.0%}]"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="runs per cell and noise scale")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cells", default="", help="comma-separated cell indices (default all)")
    parser.add_argument("--json", default="", help="write every run's outcome here")
    args = parser.parse_args(argv)

    from flwr.common.logger import FLOWER_LOGGER
    from flwr.supercore.task_identity import TaskIdentity

    from flaudit.service.store import Store
    from tests.service.conftest import CIPHER, make_client

    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    FLOWER_LOGGER.setLevel(logging.ERROR)
    logging.getLogger("flaudit").setLevel(logging.ERROR)
    chosen = [CELLS[int(i)] for i in args.cells.split(",")] if args.cells else CELLS
    started = time.monotonic()
    print(
        f"d = {DIM}, {NODES} of {NODES} nodes, T = {ROUNDS}, z = {Z}, "
        f"C = {CLIP}, sigma_b = {SIGMA_B} (adaptive), canaries auto, {args.runs} runs per row"
    )
    print(
        "| API | clipping | side | clients | canaries | promised factor | caught at x0.5 | "
        "caught at x0.25 | false alarms (correct) | min C_noise/C_clip | max W |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    everything = []
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(f"sqlite:///{tmp}/conformance.db", cipher=CIPHER)
        with make_client(store) as client:
            for cell in chosen:
                outs = {
                    scale: [
                        one_run(client, cell, scale, args.seed * 100_000 + 1000 * i + j)
                        for j in range(args.runs)
                    ]
                    for i, scale in enumerate(SCALES)
                }
                everything.append({"cell": cell, "runs": {str(s): o for s, o in outs.items()}})
                first = outs[1.0][0]
                ks = Counter(o["num_canaries"] for o in outs[1.0])
                factors = {o["design_factor"] for o in outs[1.0]}
                min_f = min(
                    (
                        o["min_noise_clip_factor"]
                        for os_ in outs.values()
                        for o in os_
                        if o["min_noise_clip_factor"] is not None
                    ),
                    default=None,
                )
                max_w = max((o["max_weight_factor"] or 1.0) for os_ in outs.values() for o in os_)
                print(
                    f"| {cell[3]} | {cell[0]} | {cell[1]} | {cell[2]} | "
                    f"{', '.join(str(k) for k in sorted(ks))} | "
                    f"{', '.join(f'{f:.3f}' for f in sorted(factors) if f is not None)} | "
                    f"{_rate(sum(o['caught'] for o in outs[0.5]), args.runs)} | "
                    f"{_rate(sum(o['caught'] for o in outs[0.25]), args.runs)} | "
                    f"{_rate(sum(o['caught'] for o in outs[1.0]), args.runs)} | "
                    f"{'-' if min_f is None else f'{min_f:.3f}'} | {max_w:.2f} |",
                    flush=True,
                )
                if first["design_summary"]:
                    print(f"<!-- design: {first['design_summary']} -->", flush=True)
        store.dispose()
    print(f"wall time: {time.monotonic() - started:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(everything, indent=1, default=str))


if __name__ == "__main__":
    main()
