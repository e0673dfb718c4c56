"""Building blocks. Each kind of component is one registry of ``type:`` names, each variant one
class that states its own facts (``archlab.nn.component``):

- ``norms.NORMS``: layernorm, rmsnorm
- ``positions.POSITIONS``: learned, sinusoidal, rope, alibi, none; ``positions.ROPE_SCALINGS``:
  none, linear, ntk, yarn
- ``attention.ATTENTIONS``: mha, sliding_window, mla (one module each under ``attention/``)
- ``ffn.FFNS``: gelu, relu, swiglu (also the routed experts' math)
- ``moe.router.ROUTERS``: MoE routers; ``moe.balance``: the balancing terms
"""
