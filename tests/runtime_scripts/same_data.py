"""Train a few steps on 2 processes from a DataLoader that is prepared or not (argv[1]:
``prepared`` / ``unprepared``), with the script's seed; or (``sparse``) full-batch steps of a
graph layer whose forward also takes a sparse adjacency matrix (pytorch/examples' gcn). Run under
torchrun by tests/test_same_data.py, which reads the warnings on stderr."""

import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

import distify.runtime as distify

torch.manual_seed(0)
data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
loader = DataLoader(data, batch_size=8, shuffle=True)
if sys.argv[1] == "prepared":
    loader = distify.prepare(loader)


class Graph(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 1)

    def forward(self, x, adj):
        return torch.sparse.mm(adj, self.fc(x))


if sys.argv[1] == "sparse":  # the whole graph at every step, on every process
    adj = torch.eye(64).to_sparse()
    features, target = data.tensors
    model = Graph()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = distify.prepare(model, optimizer)
    for _step in range(3):
        loss = torch.nn.functional.mse_loss(model(features, adj), target)
        optimizer.zero_grad()
        distify.backward(loss)
        optimizer.step()
    loader = []
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = distify.prepare(model, optimizer)
for _epoch in range(2):
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        distify.backward(loss)
        optimizer.step()
distify.print("RESULT {}")
