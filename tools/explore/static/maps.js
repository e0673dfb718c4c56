// archlab explorer: drawing. Heatmaps on canvas (attention maps, Q/K/V, scores), the data-flow
// overview and the expert-load chart in SVG.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";

function el(tag, attrs = {}, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v; else if (k.startsWith("data-") || k === "title" || k === "for") e.setAttribute(k, v);
    else e[k] = v;
  }
  if (text !== undefined) e.textContent = text;
  return e;
}

function svg(tag, attrs = {}, text) {
  const e = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

// Weight in [0, 1] -> white..blue; signed values -> blue (negative) .. white .. red (positive).
function seqColor(t) {
  const x = Math.max(0, Math.min(1, t));
  return [Math.round(255 - 214 * x), Math.round(255 - 160 * x), Math.round(255 - 60 * x)];
}
function divColor(t) {
  const x = Math.max(-1, Math.min(1, t));
  return x >= 0 ? [255, Math.round(255 - 170 * x), Math.round(255 - 170 * x)]
                : [Math.round(255 + 170 * x), Math.round(255 + 170 * x), 255];
}

// A rows x cols matrix as a canvas of about `size` px. opts: {get(i, j), signed, masked(i, j),
// highlightRow, label}. Masked cells are drawn grey (the causal mask, the window).
function heatmap(rows, cols, opts) {
  const size = opts.size || 220;
  const cell = Math.max(1, Math.floor(size / Math.max(rows, cols)));
  const canvas = el("canvas", {width: cols * cell, height: rows * cell, class: "heat"});
  const ctx = canvas.getContext("2d");
  const img = ctx.createImageData(cols * cell, rows * cell);
  let scale = 1;
  if (opts.signed) {
    let m = 1e-12;
    for (let i = 0; i < rows; i++) for (let j = 0; j < cols; j++) {
      if (!opts.masked || !opts.masked(i, j)) m = Math.max(m, Math.abs(opts.get(i, j)));
    }
    scale = m;
  }
  for (let i = 0; i < rows; i++) {
    for (let j = 0; j < cols; j++) {
      const masked = opts.masked && opts.masked(i, j);
      const rgb = masked ? [205, 205, 205] : opts.signed ? divColor(opts.get(i, j) / scale) : seqColor(opts.get(i, j));
      for (let y = 0; y < cell; y++) for (let x = 0; x < cell; x++) {
        const p = ((i * cell + y) * cols * cell + j * cell + x) * 4;
        img.data[p] = rgb[0]; img.data[p + 1] = rgb[1]; img.data[p + 2] = rgb[2]; img.data[p + 3] = 255;
      }
    }
  }
  ctx.putImageData(img, 0, 0);
  if (opts.highlightRow !== undefined && opts.highlightRow !== null && opts.highlightRow < rows) {
    ctx.strokeStyle = "#e6550d";
    ctx.lineWidth = Math.max(1, Math.min(3, cell / 2));
    ctx.strokeRect(0.5, opts.highlightRow * cell + 0.5, cols * cell - 1, cell - 1);
  }
  canvas.dataset.cell = cell;
  canvas.dataset.max = scale;
  return canvas;
}

// A figure: title, the canvas, axis captions and the colour scale.
function figure(title, canvas, {rowsLabel, colsLabel, scale}) {
  const fig = el("figure", {class: "map"});
  fig.appendChild(el("figcaption", {}, title));
  const body = el("div", {class: "map-body"});
  body.appendChild(el("span", {class: "axis-y"}, rowsLabel));
  body.appendChild(canvas);
  fig.appendChild(body);
  fig.appendChild(el("div", {class: "axis-x"}, colsLabel));
  if (scale) fig.appendChild(el("div", {class: "scale"}, scale));
  return fig;
}

// The data flow: embedding + position -> blocks (per stack) -> final norm -> head. Each block is
// a button that opens its attention.
function flowDiagram(flow, selected, onPick) {
  const W = 150, H = 58, gap = 26;
  const stacks = flow.stacks;
  const maxBlocks = Math.max(...stacks.map((s) => s.blocks.length));
  const width = (maxBlocks + 3) * (W + gap) + 20;  // embedding, blocks, final norm, head
  const height = stacks.length * (H + 40) + 30;
  const g = svg("svg", {width, height, class: "flow", role: "img", "aria-label": "data flow"});
  const box = (x, y, lines, cls, attrs = {}) => {
    const grp = svg("g", {class: cls, ...attrs});
    grp.appendChild(svg("rect", {x, y, width: W, height: H, rx: 6}));
    lines.forEach((t, n) => grp.appendChild(svg("text", {x: x + W / 2, y: y + 18 + n * 15, "text-anchor": "middle"}, t)));
    g.appendChild(grp);
    return grp;
  };
  const arrow = (x1, y1, x2, y2) => g.appendChild(svg("line", {x1, y1, x2, y2, class: "arrow", "marker-end": "url(#head)"}));
  const defs = svg("defs");
  const marker = svg("marker", {id: "head", markerWidth: 8, markerHeight: 8, refX: 7, refY: 4, orient: "auto"});
  marker.appendChild(svg("path", {d: "M0,0 L8,4 L0,8 z", fill: "#555"}));
  defs.appendChild(marker);
  g.appendChild(defs);
  stacks.forEach((stack, s) => {
    const y = 20 + s * (H + 40);
    box(10, y, [stack.name === "encoder" && stacks.length > 1 ? "embedding (shared)" : "embedding",
                `+ position: ${flow.position}`, flow.embedding.replace("token embedding ", "")], "flow-box");
    let x = 10 + W + gap;
    arrow(10 + W, y + H / 2, x - 2, y + H / 2);
    stack.blocks.forEach((b) => {
      const stackKey = stack.name === "encoder" && stacks.length > 1 ? "encoder" : "self";
      const isSel = selected && selected.stack === stackKey && selected.layer === b.layer;
      const attn = b.window ? `${b.attention} (window ${b.window})` : b.attention;
      const grp = box(x, y, [`${stack.name} block ${b.layer}`, `attn: ${attn}, ${b.heads}h/${b.kv_heads}kv`,
                              b.ffn.length > 22 ? b.ffn.slice(0, 22) + "…" : b.ffn],
                      "flow-block" + (isSel ? " selected" : ""), {"data-layer": b.layer, "data-stack": stackKey});
      grp.appendChild(svg("title", {}, `${b.ffn}${b.cross ? "; cross-attention to the encoder" : ""}`));
      grp.addEventListener("click", () => onPick(stackKey, b.layer));
      x += W + gap;
      arrow(x - gap, y + H / 2, x - 2, y + H / 2);
    });
    if (stack.name === "encoder" && stacks.length > 1) {
      g.appendChild(svg("text", {x: x + 4, y: y + H / 2 + 4, class: "flow-note"}, "→ memory (cross-attention)"));
    } else {
      box(x, y, ["final norm", flow.norm.split(" ")[0], ""], "flow-box");
      arrow(x + W, y + H / 2, x + W + gap - 2, y + H / 2);
      box(x + W + gap, y, ["head", flow.head.replace("LM head ", "").replace(", tied to the embedding", ""),
                            flow.head.includes("tied") ? "tied to embedding" : ""], "flow-box");
    }
  });
  return g;
}

// Expert load over the prompt: one bar per expert, tokens routed there (counting each of K slots).
function loadChart(load, title) {
  const n = load.length, W = Math.max(title.length * 7 + 20, n * 22 + 60), H = 170, left = 44, bottom = 36;
  const max = Math.max(1, ...load);
  const g = svg("svg", {width: W, height: H, class: "load", role: "img", "aria-label": title});
  g.appendChild(svg("text", {x: W / 2, y: 14, "text-anchor": "middle", class: "chart-title"}, title));
  const bw = (W - left - 10) / n;
  load.forEach((v, e) => {
    const h = (H - bottom - 26) * v / max;
    const x = left + e * bw;
    const r = svg("rect", {x: x + 2, y: H - bottom - h, width: bw - 4, height: h, class: "load-bar", "data-expert": e,
                           "data-count": v});
    r.appendChild(svg("title", {}, `expert ${e}: ${v} tokens`));
    g.appendChild(r);
    g.appendChild(svg("text", {x: x + bw / 2, y: H - bottom + 13, "text-anchor": "middle"}, String(e)));
  });
  g.appendChild(svg("line", {x1: left, y1: H - bottom, x2: W - 8, y2: H - bottom, class: "axis"}));
  g.appendChild(svg("line", {x1: left, y1: 22, x2: left, y2: H - bottom, class: "axis"}));
  g.appendChild(svg("text", {x: left - 6, y: 30, "text-anchor": "end"}, String(max)));
  g.appendChild(svg("text", {x: left - 6, y: H - bottom, "text-anchor": "end"}, "0"));
  g.appendChild(svg("text", {x: (W + left) / 2, y: H - 6, "text-anchor": "middle"}, "expert"));
  g.appendChild(svg("text", {x: 12, y: (H - bottom) / 2 + 10, transform: `rotate(-90 12 ${(H - bottom) / 2 + 10})`,
                             "text-anchor": "middle"}, "tokens"));
  return g;
}
