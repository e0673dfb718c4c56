"""Routed mixture-of-experts feed-forward (Mixtral, DeepSeekMoE)."""
