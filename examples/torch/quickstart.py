import torch
import byteps.torch as bps                      # Horovod scripts: was horovod.torch as hvd

bps.init()
torch.manual_seed(bps.rank())                   # each worker draws its own batches
model = torch.nn.Linear(20, 2)
opt = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters())
bps.broadcast_parameters(model.state_dict(), root_rank=0)
for step in range(100):
    x = torch.randn(32, 20)
    loss = torch.nn.functional.cross_entropy(model(x), (x[:, 0] > 0).long())
    opt.zero_grad(); loss.backward(); opt.step()
print(f"worker {bps.rank()} of {bps.size()}: loss {loss.item():.3f}")
