"""Launched by test_train_distributed.py under ``accelerate launch``: records which training
windows each rank reads (through the Trainer, so through its rank/world-size plumbing), then trains;
under ZeRO-3 it then saves the engine's logits on fixed ids to ``<probe.json>.logits.pt``.

    accelerate launch ... tests/train/train_shard_probe.py <probe.json> <recipe.yaml> [key=value ...]
"""

import json
import sys

import torch
import torch.distributed as dist

import archlab
from archlab.train import Trainer
from archlab.train.dist import exit_process, groups_left, shutdown_distributed


def main() -> int:
    """Train, report, release the engine; the rank of this process."""
    out, recipe, overrides = sys.argv[1], sys.argv[2], sys.argv[3:]
    trainer = Trainer(archlab.load_recipe(recipe, overrides))
    A = trainer.cfg.train.grad_accum
    mine = [trainer.batches.starts(step, m).tolist() for step in range(3) for m in range(A)]
    everyone = [None] * trainer.info.world_size
    dist.all_gather_object(everyone, {"rank": trainer.info.rank, "starts": mine})
    if trainer.info.is_main:
        with open(out, "w") as f:
            json.dump({"world_size": trainer.info.world_size, "ranks": everyone}, f)
    trainer.run()
    if trainer.zero_stage == 3:  # logits of the trained, partitioned model through the engine (collective)
        x_BS = torch.arange(2 * trainer.cfg.train.seq_len).reshape(2, -1) % trainer.cfg.model.vocab_size
        trainer.model_t.eval()
        with torch.no_grad():
            logits = trainer.model_t(x_BS).logits
        if trainer.info.is_main:
            torch.save({"input_ids": x_BS, "logits": logits}, f"{out}.logits.pt")
    trainer.close()  # as archlab.train.train does: the engine lets go of the process groups
    return trainer.info.rank


if __name__ == "__main__":
    rank = main()
    shutdown_distributed(synchronize=True)  # every group destroyed, DeepSpeed's first
    with open(f"{sys.argv[1]}.exit-rank{rank}.json", "w") as f:  # what the tests check
        json.dump(groups_left(), f)
    exit_process(0)  # as python -m archlab.train ends: no interpreter finalization
