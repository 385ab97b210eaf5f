"""pytorch-example: A Flower / PyTorch app.

Flower's advanced-pytorch ``CustomFedAvg``, offline: its learning-rate schedule
(``configure_train``) and its results directory are kept; its ``start()`` override (W&B logging,
per-round JSON, best-model checkpoints) is left out: inside one of Flower's DP wrappers a
custom ``start()`` of the inner FedAvg never runs (the wrapper's own ``start()`` does), with or
without the audit.
"""

from logging import INFO
from pathlib import Path
from typing import Iterable

from flwr.app import ArrayRecord, ConfigRecord, Message
from flwr.common import logger
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg


class CustomFedAvg(FedAvg):
    """FedAvg (weighted by each client's ``num-examples``) with a simple learning-rate
    schedule."""

    def set_save_path_and_run_dir(self, path: Path, run_dir: str):
        """Set the path where results and model checkpoints will be saved."""
        self.save_path = path
        self.run_dir = run_dir

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Configure the next round of federated training."""
        # Perform basic learning rate scheduling
        if server_round == 5:  # half LR at round 5
            config["lr"] = config["lr"] * 0.5
            logger.log(INFO, "⚙️ Adjusted learning rate to %f", config["lr"])
        # Continue with standard FedAvg configure_train
        return super().configure_train(server_round, arrays, config, grid)
