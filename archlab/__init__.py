"""archlab: architecture-evolution and Mixture-of-Experts experiments on decoder-only transformers.

    cfg = archlab.load_recipe("recipes/llama/tiny.yaml", ["model.n_layers=2"])
    model = archlab.build_model(cfg)
    out = model(input_ids)          # out.logits (B, S, V), out.aux_loss
"""

__version__ = "0.1.0"

from archlab.config import RecipeError, load_recipe, model_config  # noqa: E402
from archlab.model import build_model, generate, num_params  # noqa: E402

__all__ = ["RecipeError", "__version__", "build_model", "generate", "load_recipe", "model_config", "num_params"]
