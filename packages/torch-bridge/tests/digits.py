"""The digits CNN written as plain torch (nn, F, optim.Adam, DataLoader): the same program on any device."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812 (torch's own spelling)
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class DigitsNet(nn.Module):
    """(N, 1, 8, 8) images -> (N, 10) logits: two 3x3 convolutions and a linear layer (examples/train_digits.py's)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3)
        self.conv2 = nn.Conv2d(8, 16, 3)
        self.fc = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        return self.fc(torch.flatten(x, 1))


def digits(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x_train, y_train, x_test, y_test) of scikit-learn's digits, standardised, the last 20% of a shuffle held out."""
    from sklearn.datasets import load_digits  # type: ignore[import-untyped]

    d = load_digits()
    x = d.images.astype(np.float32).reshape(-1, 1, 8, 8)
    y = d.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = len(x) // 5
    train, test = order[:-n_test], order[-n_test:]
    x = (x - x[train].mean()) / x[train].std()
    return torch.from_numpy(x[train]), torch.from_numpy(y[train]), torch.from_numpy(x[test]), torch.from_numpy(y[test])


def train(device: str, epochs: int = 3, seed: int = 0, batch_size: int = 64) -> tuple[list[float], float]:
    """Train on `device`; return the loss of every step and the test accuracy."""
    torch.manual_seed(seed)
    model = DigitsNet().to(device)  # initialised on CPU from torch's seed, then moved
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x_train, y_train, x_test, y_test = digits(seed)
    loader = DataLoader(TensorDataset(x_train, y_train), batch_size=batch_size, shuffle=True,
                        generator=torch.Generator().manual_seed(seed))  # fmt: skip
    losses = []
    for _ in range(epochs):
        for xb, yb in loader:
            xb, yb = xb.to(device), yb.to(device)
            opt.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    with torch.no_grad():
        predicted = model(x_test.to(device)).argmax(1).cpu()
    return losses, float((predicted == y_test).float().mean())
