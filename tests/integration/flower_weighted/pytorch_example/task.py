"""pytorch-example: A Flower / PyTorch app (Flower's advanced-pytorch task, offline).

Adapted from Flower's examples/advanced-pytorch (Apache-2.0, (c) Flower Labs GmbH): the same
CNN, training and test loops; Fashion-MNIST and its Dirichlet partitioner (a download) are
replaced by synthetic Fashion-MNIST-shaped data generated offline, with partitions of unequal
size as the Dirichlet split gives them (so FedAvg's weights differ).
"""

import json
from datetime import datetime
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from flwr.app import UserConfig
from torch.utils.data import DataLoader

#: Examples per partition before the 80/20 split: partition i holds 80 + 40 i (unequal, as
#: advanced-pytorch's Dirichlet partitioner makes them): 64, 96, 128 training examples for 3.
BASE_EXAMPLES, STEP_EXAMPLES = 80, 40


class Net(nn.Module):
    """Model (simple CNN adapted for Fashion-MNIST)"""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(16, 32, 5)
        self.fc1 = nn.Linear(32 * 4 * 4, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = x.view(-1, 32 * 4 * 4)
        x = F.relu(self.fc1(x))
        return self.fc2(x)


def train(net, trainloader, epochs, lr, device):
    """Train the model on the training set."""
    net.to(device)  # move model to GPU if available
    criterion = torch.nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    net.train()
    running_loss = 0.0
    for _ in range(epochs):
        for batch in trainloader:
            images = batch["image"]
            labels = batch["label"]
            optimizer.zero_grad()
            loss = criterion(net(images.to(device)), labels.to(device))
            loss.backward()
            optimizer.step()
            running_loss += loss.item()

    avg_trainloss = running_loss / len(trainloader)
    return avg_trainloss


def test(net, testloader, device):
    """Validate the model on the test set."""
    net.to(device)
    criterion = torch.nn.CrossEntropyLoss()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for batch in testloader:
            images = batch["image"].to(device)
            labels = batch["label"].to(device)
            outputs = net(images)
            loss += criterion(outputs, labels).item()
            correct += (torch.max(outputs.data, 1)[1] == labels).sum().item()
    accuracy = correct / len(testloader.dataset)
    loss = loss / len(testloader)
    return loss, accuracy


def synthetic_fashion_mnist(n: int, seed: int) -> list[dict]:
    """``n`` synthetic Fashion-MNIST-shaped examples (1x28x28 images, 10 classes, the class
    shifting the image's mean), generated offline from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (n,), generator=g)
    images = torch.randn(n, 1, 28, 28, generator=g) + (labels.view(-1, 1, 1, 1) - 4.5) / 5
    return [{"image": images[i], "label": labels[i]} for i in range(n)]


def load_data(partition_id: int, num_partitions: int):
    """Load partition ``partition_id`` (unequal sizes: see ``BASE_EXAMPLES``)."""
    partition = synthetic_fashion_mnist(BASE_EXAMPLES + STEP_EXAMPLES * partition_id,
                                        seed=1000 + partition_id)
    # Divide data on each node: 80% train, 20% test
    cut = int(0.8 * len(partition))
    trainloader = DataLoader(partition[:cut], batch_size=32, shuffle=True)
    testloader = DataLoader(partition[cut:], batch_size=32)
    return trainloader, testloader


def load_centralized_dataset():
    """The server's test set (advanced-pytorch: Fashion-MNIST's test split)."""
    return DataLoader(synthetic_fashion_mnist(64, seed=999), batch_size=32)


def create_run_dir(config: UserConfig, run_id: int = 0) -> tuple[Path, str]:
    """Create a directory where to save results from this run."""
    # Create output directory given current timestamp (and the run id: two runs may start in
    # the same second)
    current_time = datetime.now()
    run_dir = current_time.strftime("%Y-%m-%d/%H-%M-%S") + f"-{run_id}"
    # Save path is based on the current directory
    save_path = Path.cwd() / f"outputs/{run_dir}"
    save_path.mkdir(parents=True, exist_ok=False)

    # Save run config as json
    with open(f"{save_path}/run_config.json", "w", encoding="utf-8") as fp:
        json.dump(config, fp)

    return save_path, run_dir
