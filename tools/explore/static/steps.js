// archlab explorer: the steps between the attention maps (tools/explore/steps.py computes them):
// embedding + position, the residual stream per block, a block's norm, output projection and
// feed-forward, the logit lens, the KV cache and the MoE routing over the whole text.
"use strict";

const BIAS_POSITIONS = ["alibi", "relative"];

function embeddingPanel(run, c) {
  const dims = run.flow.embedding.replace("token embedding ", "");
  const pos = run.position;
  const explain = pos === "rope" ? t("embed.explain.rope", dims) :
    BIAS_POSITIONS.includes(pos) ? t("embed.explain.bias", dims, pos) :
    pos === "none" ? t("embed.explain.none", dims) : t("embed.explain.add", dims, pos);
  const p = panel(t("embed.title"), "embed-panel", explain);
  p.dataset.position = pos;
  return p;
}

// ‖x‖ per position: entering block 0 and after each block, one heatmap per stack.
function residualPanel(run, c) {
  const p = panel(t("resid.title"), "resid-panel", t("resid.explain"));
  const grid = el("div", {class: "steps"});
  Object.entries(run.residual).forEach(([stack, r]) => {
    const m = decodeArray(r.norm);
    const [R, S] = m.shape;
    const max = Math.max(1e-12, ...m.data);
    const cellPx = Math.max(4, Math.min(16, Math.floor((Explore.runs.length > 1 ? 420 : 900) / S)));
    const cv = heatmap(R, S, {size: cellPx * Math.max(R, S), get: (i, j) => m.at(i, j) / max});
    cv.dataset.max = max;
    const toks = (run.kind === "encoder_decoder" && stack === "self" ? run.decoder_tokens : run.tokens).map((x) => tokenLabel(x.text));
    const rows = [t("resid.embedding"), ...Array.from({length: R - 1}, (_, i) => t("resid.after", i))];
    const fig = figure(stack === "encoder" ? stackName("encoder") : "", cv,
                       {rowsLabel: "", colsLabel: t("axis.position"), rowTicks: rows, colTicks: toks,
                        scale: t("resid.scale")});
    fig.classList.add("resid-map");
    fig.dataset.stack = stack;
    // the colour bar of this map reads 0 .. max ‖x‖
    const bar = fig.querySelector(".colorbar");
    bar.dataset.max = max;
    bar.lastChild.textContent = fmt(max);
    grid.appendChild(fig);
  });
  p.appendChild(grid);
  return p;
}

// A small line chart: one or more series over positions (SVG), with token labels under it.
function lineChart(series, labels, {title, yLabel}) {
  const n = labels.length, W = Math.max(360, Math.min(640, n * 16 + 60)), H = 150, left = 44, bottom = 30, top = 30;
  const all = series.flatMap((s) => Array.from(s.values));
  const max = Math.max(1e-12, ...all);
  const g = svg("svg", {width: W, height: H, class: "line-chart", role: "img", "aria-label": title});
  const x = (i) => left + (n > 1 ? i * (W - left - 10) / (n - 1) : 0);
  const y = (v) => H - bottom - (H - bottom - top) * v / max;
  g.appendChild(svg("line", {x1: left, y1: H - bottom, x2: W - 8, y2: H - bottom, class: "axis"}));
  g.appendChild(svg("line", {x1: left, y1: top - 4, x2: left, y2: H - bottom, class: "axis"}));
  g.appendChild(svg("text", {x: left - 4, y: y(max) + 4, "text-anchor": "end"}, fmt(max)));
  g.appendChild(svg("text", {x: left - 4, y: H - bottom, "text-anchor": "end"}, "0"));
  g.appendChild(svg("text", {x: 10, y: (H - bottom) / 2 + 16, transform: `rotate(-90 10 ${(H - bottom) / 2 + 16})`,
                             "text-anchor": "middle"}, yLabel));
  // a label every `every` positions, so that the widest label (~7 px a character) never meets the next one
  const step = n > 1 ? (W - left - 10) / (n - 1) : W;
  const every = Math.max(1, Math.ceil((Math.max(1, ...labels.map((l) => String(l).length)) * 7 + 6) / step));
  labels.forEach((s, i) => { if (i % every === 0) g.appendChild(svg("text", {x: x(i), y: H - bottom + 12, "text-anchor": "middle", class: "tick"}, s)); });
  series.forEach((s, k) => {
    const pts = Array.from(s.values).map((v, i) => `${x(i)},${y(v)}`).join(" ");
    g.appendChild(svg("polyline", {points: pts, class: `series s${k}`}));
    g.appendChild(svg("text", {x: W - 10 - 70 * (series.length - 1 - k), y: 20, "text-anchor": "end", class: `legend s${k}`},
                      `— ${s.name}`));
  });
  const fig = el("figure", {class: "chart"});
  fig.appendChild(el("figcaption", {}, title));  // HTML: the title wraps instead of being cut
  fig.appendChild(g);
  return fig;
}

// 3a: the norm before the token mixer (attention, or Gated DeltaNet's state): RMS of each position in and out.
function normSection(run, block, tk, stateMixer = false) {
  const wrap = el("div", {class: "step norm-step"});
  const normType = run.flow.norm;
  wrap.appendChild(el("h3", {}, t(stateMixer ? "norm.title.state" : "norm.title", normType)));
  const pre = normType.includes("pre-norm");
  wrap.appendChild(el("p", {class: "explain"}, pre ? t("norm.explain") : t("norm.post")));
  if (pre && block.rms.attn_norm_in) {
    wrap.appendChild(lineChart([{name: "RMS in", values: decodeArray(block.rms.attn_norm_in).data},
                                {name: "RMS out", values: decodeArray(block.rms.attn_norm_out).data}],
                               tk.rows, {title: t("norm.chart"), yLabel: "RMS"}));
  }
  return wrap;
}

// After the heads: their concatenation and the output projection; then the feed-forward.
function blockSections(run, col, block, tk, size) {
  const out = [];
  const ch = t("axis.channel");
  const fig = (title, a, signed = true, cols) => {
    const m = decodeArray(a);
    const [S, D] = m.shape;
    return figure(title(S, D), heatmap(S, D, {size, get: (i, j) => m.at(i, j), signed}),
                  {rowsLabel: t("axis.query"), colsLabel: cols || ch, rowTicks: tk.rows, signed});
  };
  if (block.concat && col.stack !== "cross") {
    const proj = el("div", {class: "step proj-step"});
    proj.appendChild(el("p", {class: "explain"}, t("attn.proj.explain")));
    const grid = el("div", {class: "steps"});
    grid.appendChild(fig((S, D) => t("attn.concat", S, D), block.concat));
    grid.appendChild(fig((S, D) => t("attn.proj", S, D), block.attn_out));
    proj.appendChild(grid);
    out.push(proj);
  }
  const ffnStep = el("div", {class: "step ffn-step"});
  const ffnType = (run.flow.stacks.flatMap((s) => s.blocks).find((b) => b.layer === col.layer) || {}).ffn || "";
  if (!block.ffn) {
    ffnStep.appendChild(el("h3", {}, t("ffn.title", ffnType, "-")));
    ffnStep.appendChild(el("p", {class: "explain"}, t("ffn.moe")));
    out.push(ffnStep);
    return out;
  }
  const f = block.ffn, F = f.hidden;
  const act = (ffnType.match(/\((\w+)\)/) || [])[1] || "";
  ffnStep.appendChild(el("h3", {}, t("ffn.title", ffnType, F)));
  ffnStep.appendChild(el("p", {class: "explain"}, f.gated ? t("ffn.explain.gated", F) : t("ffn.explain", F, act)));
  if (block.rms.ffn_norm_in && run.flow.norm.includes("pre-norm")) {
    ffnStep.appendChild(lineChart([{name: "RMS in", values: decodeArray(block.rms.ffn_norm_in).data},
                                   {name: "RMS out", values: decodeArray(block.rms.ffn_norm_out).data}],
                                  tk.rows, {title: t("ffn.norm"), yLabel: "RMS"}));
  }
  const grid = el("div", {class: "steps"});
  const nr = t("axis.neuron");
  grid.appendChild(fig((S, D) => t(f.gated ? "ffn.up.gated" : "ffn.up", S, D), f.up, true, nr));
  grid.appendChild(fig((S, D) => t(f.gated ? "ffn.act.gated" : "ffn.act", S, D), f.act, true, nr));
  grid.appendChild(fig((S, D) => t("ffn.out", S, D), f.out));
  ffnStep.appendChild(grid);
  ffnStep.appendChild(magnitudeChart(decodeArray(f.magnitude).data));
  out.push(ffnStep);
  return out;
}

// Mean |activation| of each neuron over the text: one bar per neuron, the strongest marked.
function magnitudeChart(mag) {
  const n = mag.length, W = Math.min(640, Math.max(300, n + 70)), H = 140, left = 50, bottom = 30;
  const max = Math.max(1e-12, ...mag);
  const g = svg("svg", {width: W, height: H, class: "mag-chart", role: "img", "aria-label": t("ffn.mag")});
  g.appendChild(svg("text", {x: W / 2, y: 12, "text-anchor": "middle", class: "chart-title"}, t("ffn.mag")));
  const bw = (W - left - 10) / n;
  let best = 0;
  mag.forEach((v, i) => {
    if (v > mag[best]) best = i;
    const h = (H - bottom - 22) * v / max;
    g.appendChild(svg("rect", {x: left + i * bw, y: H - bottom - h, width: Math.max(0.6, bw - 0.2), height: h,
                               class: "mag-bar", "data-neuron": i, "data-value": v.toPrecision(9)}));
  });
  g.appendChild(svg("line", {x1: left, y1: H - bottom, x2: W - 8, y2: H - bottom, class: "axis"}));
  g.appendChild(svg("line", {x1: left, y1: 20, x2: left, y2: H - bottom, class: "axis"}));
  g.appendChild(svg("text", {x: left - 4, y: 26, "text-anchor": "end"}, fmt(max)));
  g.appendChild(svg("text", {x: left - 4, y: H - bottom, "text-anchor": "end"}, "0"));
  g.appendChild(svg("text", {x: left, y: H - bottom + 13, "text-anchor": "start"}, "0"));
  g.appendChild(svg("text", {x: W - 10, y: H - bottom + 13, "text-anchor": "end"}, String(n - 1)));
  g.appendChild(svg("text", {x: (W + left) / 2, y: H - 4, "text-anchor": "middle"}, `${t("axis.neuron")} (max: ${best})`));
  g.appendChild(svg("text", {x: 12, y: (H - bottom) / 2 + 12, transform: `rotate(-90 12 ${(H - bottom) / 2 + 12})`,
                             "text-anchor": "middle"}, "|a|"));
  return g;
}

// The logit lens at one position: per block, the top tokens and their probabilities. The page data
// holds the last position's; another position is asked of the server (offline: the last only).
async function lensAt(c, pos) {
  const run = Explore.runs[c], col = Explore.cols[c];
  if (run.lens.pos === pos) return run.lens;
  if (col.lens && col.lens.pos === pos) return col.lens;
  col.lens = await api("api/lens", {run: c, text: Explore.text, pos});
  return col.lens;
}

async function renderLens(c) {
  const box = document.querySelector(`.lens[data-col="${c}"]`);
  const run = Explore.runs[c];
  if (!box || !run.lens) return;
  const toks = run.kind === "encoder_decoder" ? run.decoder_tokens : run.tokens;
  const S = toks.length;
  const pos = !Explore.offline && Explore.lensPos !== null && Explore.lensPos < S ? Explore.lensPos : run.lens.pos;
  let lens;
  try { lens = await lensAt(c, pos); } catch (e) { showError(e.message); return; }
  box.innerHTML = "";
  const ids = decodeArray(lens.ids), probs = decodeArray(lens.probs);
  const [L, K] = ids.shape;
  const p = panel(t("lens.title"), "lens-panel", t("lens.explain"));
  const sel = el("select", {class: "lens-pos", disabled: Explore.offline});
  for (let i = 0; i < S; i++) sel.appendChild(el("option", {value: i, selected: i === pos}, `${i}: ${tokenLabel(toks[i].text)}`));
  sel.addEventListener("change", () => { Explore.lensPos = +sel.value; Explore.runs.forEach((r, d) => { if (!r.error) renderLens(d); }); });
  p.append(`${t("lens.position")} `, sel);
  const table = el("table", {class: "lens-table", "data-pos": pos});
  const head = el("tr");
  [t("lens.block"), t("lens.top", K)].forEach((h) => head.appendChild(el("th", {}, h)));
  table.appendChild(head);
  for (let l = 0; l < L; l++) {
    const tr = el("tr", {class: "lens-row", "data-layer": l});
    tr.appendChild(el("td", {}, String(l)));
    const td = el("td");
    for (let k = 0; k < K; k++) {
      const id = ids.at(l, k), pr = probs.at(l, k);
      const cell = el("span", {class: "lens-tok", "data-id": id, "data-prob": pr.toPrecision(9)});
      cell.appendChild(el("span", {class: "tok-text"}, tokenLabel(lensText(lens, id))));
      const barw = el("span", {class: "lens-bar"});
      barw.style.width = `${(60 * pr).toFixed(1)}px`;
      cell.appendChild(barw);
      cell.appendChild(el("span", {class: "lens-p"}, `${(100 * pr).toFixed(1)}%`));
      td.appendChild(cell);
    }
    tr.appendChild(td);
    table.appendChild(tr);
  }
  p.appendChild(table);
  box.appendChild(p);
}

function lensText(lens, id) {
  const s = lens.names && lens.names[id];
  return s !== undefined ? s : `#${id}`;
}

function bytes(b) {
  return b >= 1 << 20 ? `${(b / (1 << 20)).toFixed(2)} MiB` : b >= 1024 ? `${(b / 1024).toFixed(1)} KiB` : `${b} B`;
}

// What generation keeps: per layer (prefill, each new token) and the variants at the same width.
function kvPanel(run, c) {
  const kv = run.kv_cache;
  const p = panel(t("kv.title"), "kv-panel", t("kv.explain", kv.tokens, kv.dtype_bytes));
  const table = el("table", {class: "kv-layers"});
  const head = el("tr");
  [t("kv.layer"), t("kv.prefill", kv.tokens), t("kv.step")].forEach((h) => head.appendChild(el("th", {}, h)));
  table.appendChild(head);
  kv.prefill.forEach((b, l) => {
    const mixer = kv.mixers ? kv.mixers[l] : kv.attention;
    const tr = el("tr", {class: "kv-layer", "data-layer": l, "data-prefill": b, "data-step": kv.per_token[l], "data-mixer": mixer});
    [mixer === "gated_deltanet" ? `${l} (${t("kv.state")})` : String(l), bytes(b), bytes(kv.per_token[l])].forEach((x) => tr.appendChild(el("td", {}, x)));
    table.appendChild(tr);
  });
  const tot = el("tr");
  [t("kv.total"), bytes(kv.prefill.reduce((a, b) => a + b, 0)), bytes(kv.per_token.reduce((a, b) => a + b, 0))]
    .forEach((x) => tot.appendChild(el("th", {}, x)));
  table.appendChild(tot);
  p.appendChild(table);
  p.appendChild(el("p", {class: "explain"}, t("kv.variants", kv.heads, kv.d_head, kv.prefill.length)));
  const vt = el("table", {class: "kv-variants"});
  const vh = el("tr");
  [t("kv.variant"), t("kv.keeps"), t("kv.prefill", kv.tokens), t("kv.step"), t("kv.full", kv.context)]
    .forEach((h) => vh.appendChild(el("th", {}, h)));
  vt.appendChild(vh);
  const mine = {mha: kv.kv_heads === kv.heads ? "MHA" : kv.kv_heads === 1 ? "MQA" : "GQA", mla: "MLA",
                sliding_window: "sliding window"}[kv.attention];
  kv.variants.forEach((v) => {
    const tr = el("tr", {class: "kv-variant" + (v.name === mine ? " this" : ""), "data-name": v.name, "data-prefill": v.prefill});
    [v.name + (v.name === mine ? t("kv.this") : ""), v.keeps, bytes(v.prefill), bytes(v.per_token), bytes(v.full)]
      .forEach((x) => tr.appendChild(el("td", {}, x)));
    vt.appendChild(tr);
  });
  p.appendChild(vt);
  return p;
}

// Every MoE block's experts for every token of the text: rows = blocks, columns = tokens.
function moeAllPanel(run, c) {
  const p = panel(t("moe.all.title"), "moe-all-panel", t("moe.all.explain"));
  const table = el("table", {class: "moe-all"});
  const head = el("tr");
  head.appendChild(el("th", {}, t("maps.block")));
  run.tokens.forEach((tok, n) => head.appendChild(el("th", {class: "tok-text", title: `position ${n}`}, tokenLabel(tok.text))));
  table.appendChild(head);
  run.moe.forEach((m) => {
    const experts = decodeArray(m.experts), weights = decodeArray(m.weights);
    const [N, K] = experts.shape;
    const tr = el("tr", {class: "moe-all-row", "data-layer": m.layer});
    tr.appendChild(el("th", {}, String(m.layer)));
    for (let n = 0; n < N; n++) {
      const order = [...Array(K).keys()].sort((a, b) => weights.at(n, b) - weights.at(n, a));
      const es = order.map((k) => experts.at(n, k));
      const td = el("td", {class: "moe-cell", "data-index": n, "data-experts": es.join(","),
                           title: order.map((k) => `E${experts.at(n, k)} ${weights.at(n, k).toFixed(3)}`).join(", ")},
                    es.join(" "));
      td.style.background = `hsl(${(es[0] * 360 / m.num_experts) % 360}, 60%, 85%)`;
      tr.appendChild(td);
    }
    table.appendChild(tr);
  });
  const scroll = el("div", {class: "scroll"});
  scroll.appendChild(table);
  p.appendChild(scroll);
  return p;
}
