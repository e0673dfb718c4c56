"""archlab: architecture-evolution and Mixture-of-Experts experiments on decoder-only transformers.

    cfg = archlab.load_recipe("recipes/llama/tiny.yaml", ["model.n_layers=2"])
    model = archlab.build_model(cfg)
    out = model(input_ids)          # out.logits (B, S, V), out.aux_loss
    archlab.from_hf("~/gpt2", "runs/gpt2")   # a local Hugging Face folder -> an archlab run folder
"""

from archlab.config import RecipeError, load_recipe, model_config
from archlab.hf import from_hf
from archlab.model import build_model, generate, num_params
from archlab.version import __version__

__all__ = ["RecipeError", "__version__", "build_model", "from_hf", "generate", "load_recipe", "model_config",
           "num_params"]
