"""Building blocks. Each kind has one registry of ``type:`` names:

- ``norms.NORMS``: layernorm, rmsnorm
- ``positions.POSITIONS``: learned, sinusoidal, rope, alibi, none
- ``ffn.FFNS``: gelu, swiglu
- ``moe.router.ROUTERS``: MoE routers
"""
