"""An interactive explorer of a model archlab trains: tokens, the next-token distribution with
temperature / top-k / top-p, the data flow, every layer's attention (Q, K, V, scores, mask, bias,
softmax), MoE routing per token, BERT's masked prediction and T5's three attentions, side by side
for two runs, in a local web page or one offline HTML file.

    python -m tools.explore runs/<run>                  # http://127.0.0.1:8765
    python -m tools.explore recipes/mixtral/tiny.yaml   # a recipe at random init
    python -m tools.explore RUN_A RUN_B                 # side by side on the same text
    python -m tools.explore runs/<run> --export page.html --prompt "def f(x):"

One job per file: ``load`` (a run folder, checkpoint or recipe -> model and codec), ``compute``
(the numbers each view shows, read from the real modules through ``archlab.nn.attention.capture``
and ``archlab.nn.moe.capture``), ``encode`` (tensors -> compact JSON), ``server`` (the ASGI app),
``page`` (the vendored front end, and the offline export), ``cli``.
"""
