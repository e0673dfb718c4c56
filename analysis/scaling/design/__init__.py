"""The scaling-study designer: before any run trains, how precisely will a planned grid determine the
exponents? ``spec`` reads a design, ``simulate`` fits many simulated studies of it, ``result`` reports the
spread, ``propose`` plans a grid, ``check`` names a grid's problems, ``cli`` is ``python -m analysis.scaling
design``. The method: docs/methods/scaling-design.md."""
