"""Routing capture: what every router of a model decided in one forward, for inspection
(``tools.explore``).

Shape legend: N tokens, E routed experts, K experts per token.

A forward hook on each :class:`~archlab.nn.moe.router.Router` keeps the :class:`Routing` it
returned: the experts the layer used (after the selection bias and group limiting), their gate
weights (renormalised and route-scaled, as applied to the expert outputs), the probabilities and
the raw logits. The hooks exist only inside ``capture_routing``; without them a router costs nothing
more.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from torch import nn

from archlab.nn.moe.router import Router, Routing


@contextmanager
def capture_routing(model: nn.Module) -> Iterator[dict[str, list[Routing]]]:
    """{router module name: its Routing per call, detached} while the block runs."""
    caps: dict[str, list[Routing]] = {}
    handles = []
    for name, m in model.named_modules():
        if isinstance(m, Router):
            caps[name] = []

            def keep(_mod, _inputs, r: Routing, out=caps[name]) -> None:
                out.append(Routing(r.experts_NK.detach(), r.weights_NK.detach(), r.probs_NE.detach(),
                                   r.logits_NE.detach()))

            handles.append(m.register_forward_hook(keep))
    try:
        yield caps
    finally:
        for h in handles:
            h.remove()
