"""pytorch-example: A Flower / PyTorch app (Flower's advanced-pytorch ServerApp, offline),
behind Flower's server-side DP wrapper and audited by flaudit: the lines docs/flower.md
("Bring your own Flower app") tells a user to add are marked ``# flaudit``."""

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp

# flaudit: the documented imports (docs/flower.md, step 3)
from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping
from flaudit.server.wrapper import CanaryAuditStrategy

from pytorch_example.planted_bug import dp_wrapper_class, seed_run, seeded_grid
from pytorch_example.strategy import CustomFedAvg
from pytorch_example.task import Net, create_run_dir, load_centralized_dataset, test

# Create ServerApp
app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Main entry point for the ServerApp."""
    # Read run config
    num_rounds = context.run_config["num-server-rounds"]
    fraction_train = context.run_config["fraction-train"]
    fraction_eval = context.run_config["fraction-evaluate"]
    device = context.run_config["server-device"]

    # Tests only (delete in your app): run-config test-seed > 0 seeds the run and lists the
    # nodes in the order of their partitions (planted_bug.py)
    seed_run(context.run_config)
    grid = seeded_grid(grid, context.run_config)

    # Load global model
    global_model = Net()
    arrays = ArrayRecord(global_model.state_dict())

    # Initialize FedAvg strategy (weighted by each client's num-examples)
    strategy = CustomFedAvg(
        fraction_train=fraction_train, fraction_evaluate=fraction_eval,
        min_available_nodes=context.run_config["min-available-nodes"],
    )

    # Define directory for results and save config
    save_path, run_dir = create_run_dir(config=context.run_config, run_id=context.run_id)
    strategy.set_save_path_and_run_dir(save_path, run_dir)

    # Tests only (delete in your app): run-config planted-bug = "short-noise" swaps in a DP
    # wrapper that adds half the noise it claims (pytorch_example/planted_bug.py)
    DifferentialPrivacyServerSideFixedClipping = dp_wrapper_class(context.run_config)

    # flaudit: the documented strategy lines (docs/flower.md, step 3)
    strategy = DifferentialPrivacyServerSideFixedClipping(
        strategy, context.run_config["noise-multiplier"], context.run_config["clipping-norm"],
        num_sampled_clients=context.run_config["num-sampled-clients"])
    strategy = CanaryAuditStrategy.from_env(strategy, run_config=context.run_config)
    seed_run(context.run_config, strategy)  # tests only (delete in your app)

    # Start strategy, run FedAvg for `num_rounds`
    result = strategy.start(
        grid=grid,
        initial_arrays=arrays,
        train_config=ConfigRecord({"lr": 0.1}),
        num_rounds=num_rounds,
        evaluate_fn=get_global_evaluate_fn(device=device),
    )

    # Save final model to disk
    print("\nSaving final model to disk...")
    state_dict = result.arrays.to_torch_state_dict()
    torch.save(state_dict, save_path / "final_model.pt")


def get_global_evaluate_fn(device: str):
    """Return an evaluation function for server-side evaluation."""

    def global_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        """Evaluate model on central data."""
        net = Net()
        net.load_state_dict(arrays.to_torch_state_dict())
        net.to(device)
        loss, accuracy = test(net, load_centralized_dataset(), device=device)
        return MetricRecord({"accuracy": accuracy, "loss": loss})

    return global_evaluate
