"""Launched by test_train_expert_parallel.py under ``accelerate launch``: trains through the
Trainer and records, on every rank, the expert shapes it holds and the aux-loss-free selection
bias after every optimizer step (routing.jsonl only holds rank 0's view).

    accelerate launch ... tests/train/train_ep_probe.py <probe.json> <recipe.yaml> [key=value ...]
"""

import json
import sys

import torch.distributed as dist

import archlab
from archlab.nn.moe import moe_layers
from archlab.train import Trainer
from archlab.train.callbacks import MoEBookkeeping
from archlab.train.dist import exit_process, groups_left, shutdown_distributed


def main() -> int:
    """Train, report, release the engine; the rank of this process."""
    out, recipe, overrides = sys.argv[1], sys.argv[2], sys.argv[3:]
    trainer = Trainer(archlab.load_recipe(recipe, overrides))
    layers = moe_layers(trainer.model)
    biases: list[list] = []
    moe = trainer.callback(MoEBookkeeping)
    after_update = moe.after_update

    def record(trainer, result, read):
        after_update(trainer, result, read)
        biases.append([[] if ly.router.expert_bias is None else ly.router.expert_bias.tolist() for ly in layers])

    moe.after_update = record
    trainer.run()
    mine = {"rank": trainer.info.rank, "biases": biases,
            "local_experts": [int(ly.experts.w_up.shape[0]) for ly in layers]}
    everyone = [None] * trainer.info.world_size
    dist.all_gather_object(everyone, mine)
    if trainer.info.is_main:
        with open(out, "w") as f:
            json.dump({"world_size": trainer.info.world_size, "ranks": everyone}, f)
    trainer.close()  # as archlab.train.train does: the engine lets go of the process groups
    return trainer.info.rank


if __name__ == "__main__":
    rank = main()
    shutdown_distributed(synchronize=True)  # every group destroyed, DeepSpeed's first
    with open(f"{sys.argv[1]}.exit-rank{rank}.json", "w") as f:  # what the tests check
        json.dump(groups_left(), f)
    exit_process(0)  # as python -m archlab.train ends: no interpreter finalization
