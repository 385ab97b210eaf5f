"""The bring-your-own worked example on a real federation (issue #28, "Done when"): which cause
the verdict names, and how soon each audit ends after its run's last report.

Flower's advanced-pytorch, offline (``tests/integration/flower_weighted``): weighted FedAvg over
partitions of 64, 96 and 128 examples (heaviest reply 1.33x C/n) behind Flower's
``DifferentialPrivacyServerSideFixedClipping`` (z = 1, C = 0.05), docs/flower.md's lines,
canaries ``auto``; one SuperLink, 3 SuperNodes on loopback, 2 sampled per round, 20 rounds; a
real ``flaudit serve`` (SQLite). ``--pairs N`` runs N pairs one after the other, each pair a
planted-bug run (``planted-bug = "short-noise"``: noise x 0.5 behind the claim's back) and a
correct run training side by side.

Rerun: ``PYTHONPATH=$PWD .venv/bin/python benchmarks/byo_weighted.py --pairs 5`` (a pair
took 12.5-16.6 minutes on the 2 shared cores at load 14-20, 2026-11-27; ``--pairs 2
--together``: 15.0 minutes; results in docs/flower.md, "Weighted FedAvg gets two answers").
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument(
        "--together",
        action="store_true",
        help="start every pair at once (default: one pair after the other)",
    )
    args = parser.parse_args()

    from tests.integration.byo_weighted import NUM_ROUNDS, Federation, blamed_on_noise

    rounds = args.rounds or NUM_ROUNDS
    load_before = os.getloadavg()
    started = time.monotonic()
    out: dict[str, list[dict]] = {"x 0.5 (bug)": [], "as claimed": []}
    with tempfile.TemporaryDirectory(prefix="flaudit-byo-bench-") as tmp:
        with Federation(Path(tmp)) as fed:

            def start(i):
                return [
                    (
                        "x 0.5 (bug)",
                        fed.start_run(f"bug {i}", planted_bug="short-noise", rounds=rounds),
                    ),
                    ("as claimed", fed.start_run(f"correct {i}", rounds=rounds)),
                ]

            batches = (
                [[run for i in range(args.pairs) for run in start(i)]]
                if args.together
                else (start(i) for i in range(args.pairs))
            )
            for pair in batches:
                audits = fed.wait([run for _, run in pair], timeout=1800, start_timeout=900)
                for noise, run in pair:
                    audit = audits[run["audit"]]
                    out[noise].append(audit)
                    v = audit.get("verdict") or {}
                    print(
                        f"{run['name']} {noise}: {audit['status']} {v.get('status')} / "
                        f"{v.get('cause')}, W = {audit.get('max_weight_factor')}, ended "
                        f"{audit['end_latency_s']} s after the last round "
                        f"({time.monotonic() - started:.0f} s)",
                        flush=True,
                    )
            design = ((audits[pair[0][1]["audit"]].get("verdict") or {}).get("design") or {}).get(
                "summary"
            )
    elapsed = time.monotonic() - started
    print(f"\ndesign: {design}\n")
    print(
        "| noise | runs | verdicts (status / cause) | blamed on the noise | max weight factor "
        "| audit ended after the last round (s, median / max) |"
    )
    print("|---|---|---|---|---|---|")
    for noise, audits in out.items():
        verdicts = Counter(
            f"{(a.get('verdict') or {}).get('status')} / "
            f"{(a.get('verdict') or {}).get('cause') or '-'}"
            for a in audits
        )
        shown = ", ".join(f"{n}× {v}" for v, n in verdicts.most_common())
        lat = [a["end_latency_s"] for a in audits if a["end_latency_s"] is not None]
        weights = [a["max_weight_factor"] or 1.0 for a in audits]
        print(
            f"| {noise} | {len(audits)} | {shown} | {sum(map(blamed_on_noise, audits))} of "
            f"{len(audits)} | {min(weights):.2f}-{max(weights):.2f} | "
            f"{statistics.median(lat):.1f} / {max(lat):.1f} |"
        )
    print(
        f"\n{elapsed / 60:.1f} minutes; load average {load_before[0]:.1f} before, "
        f"{os.getloadavg()[0]:.1f} after, on {os.cpu_count()} cores"
    )


if __name__ == "__main__":
    main()
