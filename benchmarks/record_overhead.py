"""What record canaries add to a client's DP-SGD step (issue #37): real Opacus, with and without
:func:`flaudit.clients.record_canaries.add_record_canaries`, CPU time, interleaved.

The client: a CIFAR-10-shaped CNN (Flower's ``examples/opacus`` ``Net``, widened: conv 3->32 and
32->64 (5x5), then fully connected 1600->H->128->10; ``H = 512`` gives d = 0.94 x 10^6,
``H = 5120`` gives d = 8.9 x 10^6), Opacus 1.6 ``PrivacyEngine.make_private`` (Poisson sampling,
flat clipping, hooks), plain SGD, batch 32 of 1600 examples by default (q = 0.02), noise multiplier 1.
The audited twin adds ``SeededRecordCanaries`` (1000 canaries, half seen: 10 expected per step).
``--batch`` sets the batch (the data set is 50 batches, so q = 0.02 always).
Both train on the same batches in alternation (with, without, with, ...), one thread each
(``torch.set_num_threads(1)``, so CPU time is the work), timing ``zero_grad + forward + backward +
step`` with ``time.process_time``. Printed: the median step of each, the overhead of the
medians, and the canary sum alone.

Rerun::

    PYTHONPATH=. python -m benchmarks.record_overhead --hidden 512 --batch 32 --steps 20
    PYTHONPATH=. python -m benchmarks.record_overhead --hidden 512 --batch 128 --steps 10
    PYTHONPATH=. python -m benchmarks.record_overhead --hidden 5120 --batch 32 --steps 6
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np

__all__ = ["main"]


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


def main(argv=None) -> None:
    import torch
    from torch.utils.data import TensorDataset

    from flaudit.auditor.estimators.record_level import SeededRecordCanaries
    from flaudit.clients.record_canaries import add_record_canaries

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--canaries", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    start = time.time()
    n = 50 * args.batch  # q = 0.02 whatever the batch
    data = TensorDataset(torch.randn(n, 3, 32, 32), torch.randint(0, 10, (n,)))
    plain = _private(args.hidden, data, 0, args.batch)
    audited = _private(args.hidden, data, 0, args.batch)
    dim = sum(p.numel() for p in audited[1].params)
    source = SeededRecordCanaries(
        20260537, np.arange(args.canaries) % 2 == 0, sample_rate=audited[2].sample_rate
    )
    add_record_canaries(audited[1], source)
    loss_fn = torch.nn.CrossEntropyLoss()
    times: dict[str, list[float]] = {"without": [], "with": []}
    batches = iter(plain[2])

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
            batches = iter(plain[2])
            x, y = next(batches)
        order = (
            (("with", audited), ("without", plain))
            if i % 2
            else (("without", plain), ("with", audited))
        )
        for name, (model, opt, _) in order:
            spent = step(model, opt, x, y)
            if i >= 2:  # two warm-up rounds
                times[name].append(spent)
    sums = []
    for t in range(5):
        t0 = time.process_time()
        source.step_canary_sum(10_000 + t, dim)
        sums.append(time.process_time() - t0)
    med = {k: float(np.median(v)) for k, v in times.items()}
    print(
        f"| {dim:,} | {args.batch} | {med['without'] * 1e3:.0f} ms | {med['with'] * 1e3:.0f} ms | "
        f"{(med['with'] / med['without'] - 1):+.1%} | {np.median(sums) * 1e3:.0f} ms | "
        f"{args.steps} | {time.time() - start:.0f} s |"
    )
    print(
        f"# d={dim}, batch {args.batch}, q={audited[2].sample_rate:g}, {args.canaries} canaries "
        f"(half seen), 1 thread, CPU time; rerun: PYTHONPATH=. python -m "
        f"benchmarks.record_overhead --hidden {args.hidden} --batch {args.batch} "
        f"--steps {args.steps}"
    )


if __name__ == "__main__":
    main()
