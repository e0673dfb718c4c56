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
function seqColor(w) {
  const x = Math.max(0, Math.min(1, w));
  return [Math.round(255 - 214 * x), Math.round(255 - 160 * x), Math.round(255 - 60 * x)];
}
function divColor(w) {
  const x = Math.max(-1, Math.min(1, w));
  return x >= 0 ? [255, Math.round(255 - 170 * x), Math.round(255 - 170 * x)]
                : [Math.round(255 + 170 * x), Math.round(255 + 170 * x), 255];
}

// A rows x cols matrix as a canvas of about `size` px. opts: {get(i, j), signed, masked(i, j),
// highlightRow, label}. Masked cells are drawn grey (the causal mask, the window).
function heatmap(rows, cols, opts) {
  const size = opts.size || 220;
  const cw = Math.max(1, Math.floor(size / Math.max(rows, cols)));
  // a wide matrix (tokens x hundreds of neurons) gets taller rows, so each token stays readable
  const cell = cols > rows ? Math.max(cw, Math.min(8, Math.floor(240 / rows))) : cw;
  const canvas = el("canvas", {width: cols * cw, height: rows * cell, class: "heat"});
  const ctx = canvas.getContext("2d");
  const img = ctx.createImageData(cols * cw, rows * cell);
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
      for (let y = 0; y < cell; y++) for (let x = 0; x < cw; x++) {
        const p = ((i * cell + y) * cols * cw + j * cw + x) * 4;
        img.data[p] = rgb[0]; img.data[p + 1] = rgb[1]; img.data[p + 2] = rgb[2]; img.data[p + 3] = 255;
      }
    }
  }
  ctx.putImageData(img, 0, 0);
  if (opts.highlightRow !== undefined && opts.highlightRow !== null && opts.highlightRow < rows) {
    ctx.strokeStyle = "#e6550d";
    ctx.lineWidth = Math.max(1, Math.min(3, cell / 2));
    ctx.strokeRect(0.5, opts.highlightRow * cell + 0.5, cols * cw - 1, cell - 1);
  }
  canvas.dataset.cell = cell;  // row height (px)
  canvas.dataset.cellw = cw;  // column width (px)
  canvas.dataset.max = scale;
  return canvas;
}

// Tick labels along one side of a heatmap: one per cell when cells are tall enough, else every n-th.
function ticks(labels, cell, vertical) {
  const box = el("div", {class: vertical ? "ticks-x" : "ticks-y"});
  const every = Math.max(1, Math.ceil(11 / cell));
  labels.forEach((text, i) => {
    if (i % every) return;
    const tk = el("span", {class: vertical ? "tick-x" : "tick-y", "data-index": i, title: text}, text);
    if (vertical) { tk.style.left = `${i * cell}px`; tk.style.width = `${Math.max(cell, 11)}px`; }
    else { tk.style.top = `${i * cell}px`; tk.style.height = `${Math.max(cell, 11)}px`; tk.style.lineHeight = `${Math.max(cell, 11)}px`; }
    box.appendChild(tk);
  });
  if (vertical) box.style.width = `${labels.length * cell}px`; else box.style.height = `${labels.length * cell}px`;
  return box;
}

function fmt(x) {
  const a = Math.abs(x);
  return a === 0 ? "0" : a >= 100 || a < 0.01 ? x.toExponential(1) : x.toPrecision(2);
}

// The colour scale with its values: signed maps -max .. 0 .. +max, weights 0 .. 1.
function colorbar(canvas, signed) {
  const max = +canvas.dataset.max;
  const bar = el("div", {class: "colorbar", "data-min": signed ? -max : 0, "data-max": signed ? max : 1});
  const strip = el("span", {class: "colorbar-strip" + (signed ? " signed" : "")});
  bar.appendChild(el("span", {class: "cb-value"}, signed ? fmt(-max) : "0"));
  bar.appendChild(strip);
  bar.appendChild(el("span", {class: "cb-value"}, signed ? fmt(max) : "1"));
  if (signed) bar.title = `0 = white`;
  return bar;
}

// A figure: title, the canvas with token labels on its axes (rowTicks, colTicks), the axis captions
// and the colour scale with values (scale: a note under it; signed: the map's colours are signed).
function figure(title, canvas, {rowsLabel, colsLabel, scale, rowTicks, colTicks, signed}) {
  const fig = el("figure", {class: "map"});
  fig.appendChild(el("figcaption", {}, title));
  const body = el("div", {class: "map-body"});
  body.appendChild(el("span", {class: "axis-y"}, rowsLabel));
  if (rowTicks) body.appendChild(ticks(rowTicks, +canvas.dataset.cell, false));
  const inner = el("div", {class: "map-inner"});
  inner.appendChild(canvas);
  if (colTicks) inner.appendChild(ticks(colTicks, +canvas.dataset.cellw, true));
  body.appendChild(inner);
  fig.appendChild(body);
  fig.appendChild(el("div", {class: "axis-x"}, colsLabel));
  fig.appendChild(colorbar(canvas, !!signed));
  if (scale) fig.appendChild(el("div", {class: "scale"}, scale));
  return fig;
}

// The data flow: embedding + position -> blocks (per stack) -> final norm -> head. Each block is
// a button that opens it. vertical: top to bottom (half-width columns), stacks side by side.
function flowDiagram(flow, selected, onPick, vertical) {
  const W = 150, H = 58, gap = vertical ? 18 : 26;
  const stacks = flow.stacks;
  const maxBlocks = Math.max(...stacks.map((s) => s.blocks.length));
  const n = maxBlocks + 3;  // embedding, blocks, final norm, head
  const width = vertical ? stacks.length * (W + 40) + 20 : n * (W + gap) + 20;
  const height = vertical ? n * (H + gap) + 20 : stacks.length * (H + 40) + 30;
  const g = svg("svg", {width, height, class: "flow", role: "img", "aria-label": "data flow"});
  const box = (x, y, lines, cls, attrs = {}) => {
    const grp = svg("g", {class: cls, ...attrs});
    grp.appendChild(svg("rect", {x, y, width: W, height: H, rx: 6}));
    lines.forEach((s, k) => grp.appendChild(svg("text", {x: x + W / 2, y: y + 18 + k * 15, "text-anchor": "middle"}, s)));
    g.appendChild(grp);
    return grp;
  };
  const arrow = (x1, y1, x2, y2) => g.appendChild(svg("line", {x1, y1, x2, y2, class: "arrow", "marker-end": "url(#head)"}));
  const defs = svg("defs");
  const marker = svg("marker", {id: "head", markerWidth: 8, markerHeight: 8, refX: 7, refY: 4, orient: "auto"});
  marker.appendChild(svg("path", {d: "M0,0 L8,4 L0,8 z", fill: "#555"}));
  defs.appendChild(marker);
  g.appendChild(defs);
  const pos = flow.position === "rope" ? t("flow.pos.rope") :
    ["alibi", "relative"].includes(flow.position) ? t("flow.pos.bias", flow.position) : t("flow.pos", flow.position);
  stacks.forEach((stack, s) => {
    // the k-th box of stack s, and an arrow from box k-1 to it
    const at = (k) => vertical ? [10 + s * (W + 40), 10 + k * (H + gap)] : [10 + k * (W + gap), 20 + s * (H + 40)];
    const link = (k) => {
      const [x0, y0] = at(k - 1), [x1, y1] = at(k);
      if (vertical) arrow(x0 + W / 2, y0 + H, x1 + W / 2, y1 - 2); else arrow(x0 + W, y0 + H / 2, x1 - 2, y1 + H / 2);
    };
    const shared = stack.name === "encoder" && stacks.length > 1;
    box(...at(0), [t(shared ? "flow.shared" : "flow.embedding"), flow.embedding.replace("token embedding ", ""),
                   pos], "flow-box flow-embed");
    let k = 1;
    stack.blocks.forEach((b) => {
      const stackKey = shared ? "encoder" : "self";
      const isSel = selected && selected.stack === stackKey && selected.layer === b.layer;
      const gdn = b.attention === "gated_deltanet";  // a fixed-size state, no attention map
      const attn = b.window ? `${b.attention} (window ${b.window})` : b.attention;
      const mixer = gdn ? `${attn}, ${b.kv_heads}k/${b.heads}v` : `attn: ${attn}, ${b.heads}h/${b.kv_heads}kv`;
      const grp = box(...at(k), [t("flow.block", t(`flow.stack.${stack.name}`), b.layer), mixer,
                                 b.ffn.length > 22 ? b.ffn.slice(0, 22) + "…" : b.ffn],
                      "flow-block" + (gdn ? " flow-gdn" : "") + (isSel ? " selected" : ""),
                      {"data-layer": b.layer, "data-stack": stackKey, "data-mixer": b.attention});
      grp.appendChild(svg("title", {}, `${gdn ? t("flow.gdn") + "; " : ""}${b.ffn}${b.cross ? "; cross-attention to the encoder" : ""}`));
      grp.addEventListener("click", () => onPick(stackKey, b.layer));
      link(k);
      k += 1;
    });
    if (shared) {
      const [x, y] = at(k);
      g.appendChild(svg("text", {x: x + 4, y: y + (vertical ? 14 : H / 2 + 4), class: "flow-note"}, t("flow.memory")));
    } else {
      box(...at(k), [t("flow.final"), flow.norm.split(" ")[0], ""], "flow-box");
      link(k);
      box(...at(k + 1), [t("flow.head"), flow.head.replace("LM head ", "").replace(", tied to the embedding", ""),
                         flow.head.includes("tied") ? t("flow.tied") : ""], "flow-box");
      link(k + 1);
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
  g.appendChild(svg("text", {x: (W + left) / 2, y: H - 6, "text-anchor": "middle"}, t("moe.expert")));
  g.appendChild(svg("text", {x: 12, y: (H - bottom) / 2 + 10, transform: `rotate(-90 12 ${(H - bottom) / 2 + 10})`,
                             "text-anchor": "middle"}, t("moe.tokens")));
  return g;
}
