"""One adapter per Hugging Face family (``archlab.hf.adapter``); importing this package registers them all."""

from archlab.hf.adapters import (  # noqa: F401  (register the adapters)
    bert,
    deepseek_v3,
    gpt2,
    gpt_neox,
    gptj,
    llama,
    mistral,
    mixtral,
    olmoe,
    qwen3_moe,
    qwen3_next,
    t5,
)
