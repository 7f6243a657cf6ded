#!/usr/bin/env python3
"""The AttnRes Transformer of train_compare.py trained with
DistributedDataParallel against one process with the same global batch.

  torchrun --nproc_per_node 2 test/Integration/GPU/train_ddp.py

Every rank builds the same model (seed 0) and takes its share of each
global batch of train_compare.BATCH sequences; DDP averages the gradients,
so each step is the single-process step on the whole batch, up to rounding.
Rank 0 then trains the model in one process on the whole batches, twice:
with the compiled op and with the plain-PyTorch AttnRes. The DDP curve must
stay within 3x the distance between those two (what rounding alone does,
the bound train_compare.py uses) or 0.02 of the single-process one.

--backend gloo lets two ranks share one GPU (NCCL refuses that): the same
code, for a machine with one GPU. --backend auto (the default) takes NCCL
where every rank has a GPU of its own, else gloo.
"""

import argparse
import json
import math
import pathlib
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[2] / "python"))

import attnres  # noqa: E402
import train_compare as t  # noqa: E402
from attnres.distributed import init_torchrun  # noqa: E402
from attnres.reference import attnres_reference  # noqa: E402

STEPS = 20


def train_ddp(data, device, rank, world):
    torch.manual_seed(0)
    model = t.Model().to(device)
    ddp = torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[device.index])
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=3e-3,
                                  weight_decay=0.0)
    share = t.BATCH // world
    losses = []
    for tokens in data:
        mine = tokens[rank * share:(rank + 1) * share]
        logits = ddp(mine[:, :-1], attnres.attnres)
        loss = F.cross_entropy(logits.reshape(-1, t.VOCAB),
                               mine[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        # The global batch's loss: the mean of the ranks' means.
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item() / world)
    return losses


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args()
    rank, world, device = init_torchrun(args.backend)
    if t.BATCH % world:
        raise SystemExit(f"the batch of {t.BATCH} does not split over "
                         f"{world} ranks")
    data = t.batches(device)[:STEPS]
    ddp = train_ddp(data, device, rank, world)
    ok = True
    if rank == 0:
        # train_compare's single-process loop (same seed, optimizer, data).
        single, _ = t.train(attnres.attnres, data, device)
        plain, _ = t.train(attnres_reference, data, device)
        difference = max(abs(a - b) for a, b in zip(ddp, single))
        noise = max(abs(a - b) for a, b in zip(single, plain))
        bound = max(3 * noise, 0.02)
        ok = difference <= bound and all(map(math.isfinite, ddp))
        print("step  ddp      single   single-plain")
        for step in range(0, STEPS, 4):
            print(f"{step:4d}  {ddp[step]:.4f}  {single[step]:.4f}  "
                  f"{plain[step]:.4f}")
        backend = dist.get_backend()
        shared = ", one GPU shared" if torch.cuda.device_count() < world \
            else ""
        print(f"\n{world} ranks ({backend}{shared}): max |ddp - single| = "
              f"{difference:.4f}; rounding noise "
              f"max |single op - single plain| = {noise:.4f}; bound "
              f"{bound:.4f}: {'PASS' if ok else 'FAIL'}")
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "train_ddp.json").write_text(json.dumps(dict(
                world=world, backend=backend, ddp=ddp, single=single,
                plain=plain, difference=difference, noise=noise, ok=ok),
                indent=1))
    flag = torch.tensor([int(ok)], device=device)
    dist.broadcast(flag, 0)
    dist.destroy_process_group()
    return 0 if flag.item() else 1


if __name__ == "__main__":
    sys.exit(main())
