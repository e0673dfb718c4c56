"""MoE routers, by ``moe.router.type``."""

from archlab.registry import Registry

ROUTERS: Registry = Registry("router")
