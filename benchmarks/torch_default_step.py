"""PyTorch peer of the small-CNN train step of configs/base.py, same model and loss.

Run by `benchmarks/train_step.py --peer` under an interpreter with torch.

SmallCNN: 4 x [3x3 conv (no bias, pad 1) -> BN -> ReLU], 2x2 max-pool after the first three
(28 -> 14 -> 7 -> 3), widths 32-64-128-256; head reads the global average: Linear 256->512 (no
bias) -> BN -> ReLU -> Linear 512->128. NT-Xent (tau 0.1) over 2 x B views, AdamW. This is what a
solo-learn / lightly user would run for the same job. Channels-last is tried too (oneDNN's fast path).

Usage: python torch_default_step.py [B instances] [steps] [threads]. Prints median step and images/s
(instances/s, each with 2 views, as the project's benchmark counts).
"""
import statistics, sys, time
import torch, torch.nn as nn, torch.nn.functional as F

B = int(sys.argv[1]) if len(sys.argv) > 1 else 512
STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 10
if len(sys.argv) > 3:
    torch.set_num_threads(int(sys.argv[3]))


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        layers, cin = [], 1
        for i, c in enumerate([32, 64, 128, 256]):
            layers += [nn.Conv2d(cin, c, 3, 1, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU(inplace=True)]
            if i < 3:
                layers.append(nn.MaxPool2d(2))
            cin = c
        self.body = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.Linear(256, 512, bias=False), nn.BatchNorm1d(512),
                                  nn.ReLU(inplace=True), nn.Linear(512, 128))

    def forward(self, x):
        h = self.body(x)
        return h.flatten(1), self.head(h.mean((2, 3)))


def ntxent(z, n, tau=0.1):
    z = F.normalize(z, dim=1)
    logits = z @ z.T / tau
    logits.fill_diagonal_(-1e9)
    labels = torch.cat([torch.arange(n, 2 * n), torch.arange(n)])
    return F.cross_entropy(logits, labels)


def bench(channels_last):
    torch.manual_seed(0)
    model = SmallCNN()
    x = torch.rand(2 * B, 1, 28, 28)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.to(memory_format=torch.channels_last)
    opt = torch.optim.AdamW(model.parameters(), 1e-3, weight_decay=1e-4)

    def step():
        _, z = model(x)
        loss = ntxent(z, B)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    for _ in range(2):
        step()
    times = []
    for _ in range(STEPS):
        t = time.perf_counter(); step(); times.append(time.perf_counter() - t)
    s = statistics.median(times)
    print(f"torch {torch.__version__} threads={torch.get_num_threads()} channels_last={channels_last} "
          f"B={B}x2: step {s*1000:.0f} ms, {B/s:.0f} img/s", flush=True)
    return s


if __name__ == '__main__':
    best = min(bench(False), bench(True))
    print(f"torch best: {best*1000:.0f} ms, {B/best:.0f} img/s")
