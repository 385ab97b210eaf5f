"""How long an external audit outlives its run (issue #40 item 5): real ``flaudit serve``
(SQLite, loopback, ``FLAUDIT_SILENCE_CHECK_SECONDS=2``) and one real ``HttpRoundReporter``
process per case, each reporting its claim, theta_0 and ``k`` rounds, then training a slow round
(``--slow`` seconds, heartbeats flowing, the "SuperLink" answering the reporter's probe):

* ``superlink-dies``: after 1 round the probe stops answering (the SuperLink died); the
  ServerApp keeps heartbeating;
* ``killed-after-k`` (k = 0, 1, 4): the ServerApp is killed (SIGKILL): no more heartbeats.

It prints whether every audit was still ``running`` at the end of the slow round, then the
seconds from the death to the audit's end, and the reason. Run (docs/flower.md, "Every audit
ends, promptly", has the numbers)::

    .venv/bin/python benchmarks/dead_runs.py --slow 70
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _service import AUTH, ROOT, running_service  # noqa: E402

CLAIM = {
    "noise_multiplier": 1.0,
    "clip_norm": 0.5,
    "num_rounds": 6,
    "num_clients": 3,
    "clients_per_round": 3,
}
RUN = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    from flaudit.server.reporting import RoundMetadata
    from flaudit.server.http_reporter import HttpRoundReporter
    url, audit_id, token, claim, flag, rounds = (sys.argv[1], sys.argv[2], sys.argv[3],
                                                 eval(sys.argv[4]), sys.argv[5], int(sys.argv[6]))
    reporter = HttpRoundReporter(url, audit_id, token, run_id="the-run")
    reporter.declare_claim(claim)
    reporter.report_initial(np.zeros(500, dtype=np.float32))

    def probe():  # the SuperLink answers until the flag file exists
        if os.path.exists(flag):
            raise ConnectionError("the SuperLink is gone")

    reporter.watch_grid(probe, round_timeout=7200)
    for t in range(1, rounds + 1):
        reporter.moved(t, "training")
        reporter.without_canaries(t, "benchmark: no canaries")  # (the rounds' data is moot)
        reporter.report_round(t, np.full(500, 0.01, dtype=np.float32),
                              RoundMetadata(0.5, 3, 0, 0, 0.0, 0.5, train_loss=1.0))
    reporter.moved(rounds + 1, "training")
    print("reported", flush=True)
    time.sleep(3600)  # a slow round: only heartbeats speak for the run
""")
CASES = {"superlink-dies": 1, "killed-after-0": 0, "killed-after-1": 1, "killed-after-4": 4}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slow", type=float, default=70.0, help="seconds of the slow round")
    parser.add_argument("--wait", type=float, default=400.0, help="give up after (seconds)")
    args = parser.parse_args()
    runs = {}
    with running_service({"FLAUDIT_SILENCE_CHECK_SECONDS": "2"}) as (url, tmp, _):
        http = httpx.Client(base_url=url, timeout=30)
        try:
            for case, rounds in CASES.items():
                body = http.post(
                    "/audits",
                    json={"engine": "external", "num_canaries": 8, "max_canary_fraction": 1.0},
                    headers=AUTH,
                ).json()
                flag = tmp / f"{case}.flag"
                run = subprocess.Popen(
                    [
                        sys.executable,
                        "-c",
                        RUN,
                        url,
                        body["id"],
                        body["environment"]["FLAUDIT_RUN_TOKEN"],
                        repr(CLAIM),
                        str(flag),
                        str(rounds),
                    ],
                    cwd=ROOT,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
                said = []
                while (line := run.stdout.readline()) and line.strip() != "reported":
                    said.append(line)
                if not line:
                    raise SystemExit(f"{case}: the run ended early:\n{''.join(said)}")
                if said:
                    print(f"{case}: the run said:\n{''.join(said)}", flush=True)
                runs[case] = (body["id"], run, flag)
            time.sleep(args.slow)
            for case, (audit_id, _, _) in runs.items():
                status = http.get(f"/audits/{audit_id}").json()["status"]
                print(f"{case}: {status} after a {args.slow:g} s slow round", flush=True)
            died = time.monotonic()
            for case, (_, run, flag) in runs.items():
                if case == "superlink-dies":
                    flag.touch()
                else:
                    os.kill(run.pid, signal.SIGKILL)
            left = set(runs)
            while left and time.monotonic() - died < args.wait:
                for case in sorted(left):
                    audit = http.get(f"/audits/{runs[case][0]}").json()
                    if audit["status"] != "running":
                        print(
                            f"{case}: {audit['status']} {time.monotonic() - died:.1f} s after "
                            f"the death: {audit['reason']}",
                            flush=True,
                        )
                        left.discard(case)
                time.sleep(1)
            for case in sorted(left):
                print(f"{case}: still running {args.wait:g} s after the death")
        finally:
            for _, run, _ in runs.values():
                if run.poll() is None:
                    os.kill(run.pid, signal.SIGKILL)


if __name__ == "__main__":
    main()
