"""What record canaries add to a client's DP-SGD step (issue #37): real Opacus, three twins
interleaved, CPU time.

The client: a CIFAR-10-shaped CNN (Flower's ``examples/opacus`` ``Net``, widened: conv 3->32 and
32->64 (5x5), then fully connected 1600->H->128->10; ``H = 512`` gives d = 0.94 x 10^6,
``H = 5120`` gives d = 8.9 x 10^6), Opacus 1.6 ``PrivacyEngine.make_private`` (Poisson sampling,
flat clipping, hooks), plain SGD, batch 32 of 1600 examples by default (q = 0.02), noise multiplier 1,
1000 canaries, half seen (10 expected per step). Three twins train on the same batches, in an
order that rotates every step, one thread each (``torch.set_num_threads(1)``, so CPU time is the
work), timing ``zero_grad + forward + backward + step`` with ``time.process_time``:

* ``without``: Opacus alone (the baseline of the same run);
* ``plan``: the Flower path's client: the step's canary sum is already there (a row of the plan the
  service sent, float32), :func:`flaudit.clients.record_audit.try_add_record_canaries` sends it
  through the optimizer's own clipping (one extra ``clip_and_accumulate`` of one row);
* ``seeded``: the built-in engine's client, which also generates the sum from the seed in the step
  (``SeededRecordCanaries.step_canary_sum``: two or three orthonormal DCTs of length ``d``).

Printed: the median step of each, the overhead of the medians and the median of the paired
per-step ratios (same batch, same moment: what the shared machine's load cancels out of), and the
generation of one sum alone (what the service pays per client step in the Flower path), with the
load average before and after.

Rerun::

    PYTHONPATH=. python -m benchmarks.record_overhead --hidden 512 --batch 32 --steps 20
    PYTHONPATH=. python -m benchmarks.record_overhead --hidden 5120 --batch 32 --steps 6
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np

__all__ = ["main"]

VARIANTS = ("without", "plan", "seeded")


def _net(hidden: int):
    import torch

    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 5),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(32, 64, 5),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(1600, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, 128),
        torch.nn.ReLU(),
        torch.nn.Linear(128, 10),
    )


def _private(hidden: int, data, seed: int, batch: int):
    import torch
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader

    torch.manual_seed(seed)
    model = _net(hidden)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, opt, loader = PrivacyEngine().make_private(
            module=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
            data_loader=DataLoader(data, batch_size=batch),
            noise_multiplier=1.0,
            max_grad_norm=1.0,
            poisson_sampling=True,
        )
    return model, opt, loader


class _Plan:
    """The Flower path's canary source: rows of a plan of per-step sums computed beforehand
    (here by the seeded source; in a Flower app by the service), cycled."""

    def __init__(self, rows: np.ndarray, sample_rate: float) -> None:
        self.rows = rows
        self.sample_rate = sample_rate

    def step_canary_sum(self, step: int, dim: int) -> np.ndarray:
        return self.rows[step % len(self.rows)]


def _load() -> str:
    with open("/proc/loadavg") as handle:
        return " ".join(handle.read().split()[:3])


def main(argv=None) -> None:
    import torch
    from torch.utils.data import TensorDataset

    from flaudit.auditor.estimators.record_level import SeededRecordCanaries
    from flaudit.clients.record_audit import try_add_record_canaries
    from flaudit.clients.record_canaries import add_record_canaries

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--canaries", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--plan-rows", type=int, default=8, help="distinct plan rows, cycled")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    start, load_before = time.time(), _load()
    n = 50 * args.batch  # q = 0.02 whatever the batch
    data = TensorDataset(torch.randn(n, 3, 32, 32), torch.randint(0, 10, (n,)))
    twins = {name: _private(args.hidden, data, 0, args.batch) for name in VARIANTS}
    dim = sum(p.numel() for p in twins["without"][1].params)
    q = twins["without"][2].sample_rate
    seen = np.arange(args.canaries) % 2 == 0
    seeded = SeededRecordCanaries(20260537, seen, sample_rate=q)
    add_record_canaries(twins["seeded"][1], seeded)
    generation = []
    rows = []
    for t in range(args.plan_rows):
        t0 = time.process_time()
        rows.append(seeded.step_canary_sum(10_000 + t, dim))
        generation.append(time.process_time() - t0)
    plan = _Plan(np.stack(rows), q)
    optimizer, refusal = try_add_record_canaries(twins["plan"][1], plan, sample_rate=q)
    assert refusal is None and optimizer is twins["plan"][1], refusal
    loss_fn = torch.nn.CrossEntropyLoss()
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    batches = iter(twins["without"][2])

    def step(model, opt, x, y) -> float:
        t0 = time.process_time()
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
        return time.process_time() - t0

    for i in range(args.steps + 2):
        try:
            x, y = next(batches)
        except StopIteration:
            batches = iter(twins["without"][2])
            x, y = next(batches)
        order = VARIANTS[i % 3 :] + VARIANTS[: i % 3]
        for name in order:
            model, opt, _ = twins[name]
            spent = step(model, opt, x, y)
            if i >= 2:  # two warm-up rounds
                times[name].append(spent)
    base = np.asarray(times["without"])
    med = {k: float(np.median(v)) for k, v in times.items()}
    paired = {k: float(np.median(np.asarray(times[k]) / base)) - 1 for k in ("plan", "seeded")}
    gen = float(np.median(generation))
    print(
        f"| {dim:,} | {args.batch} | {med['without'] * 1e3:.0f} ms | "
        f"{med['plan'] * 1e3:.0f} ms | {med['plan'] / med['without'] - 1:+.1%} "
        f"({paired['plan']:+.1%}) | {med['seeded'] * 1e3:.0f} ms | "
        f"{med['seeded'] / med['without'] - 1:+.1%} ({paired['seeded']:+.1%}) | "
        f"{gen * 1e3:.0f} ms ({gen / med['without']:.1%}) | {args.steps} | "
        f"{time.time() - start:.0f} s | {load_before} / {_load()} |"
    )
    print(
        f"# d={dim}, batch {args.batch}, q={q:g}, {args.canaries} canaries (half seen), "
        f"1 torch thread, CPU time, medians of {args.steps} interleaved steps (in brackets: median "
        f"of the paired per-step ratios); rerun: PYTHONPATH=. python -m "
        f"benchmarks.record_overhead --hidden {args.hidden} --batch {args.batch} "
        f"--steps {args.steps}"
    )


if __name__ == "__main__":
    main()
