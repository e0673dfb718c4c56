// archlab explorer: the views, one column per model. Tokens, next-token (or masked-token) bars,
// the data flow, one block's attention step by step, the attention maps per layer and head, MoE
// routing, T5's span filling; a strip aligning the runs' tokens by character. The views between
// (embedding, residual stream, norms, feed-forward, logit lens, KV cache) are in steps.js.
"use strict";

function stackName(s) { return t(`stack.${s}`); }

// A panel: its title and, under it, the short explanation for the reader (explain).
function panel(title, cls, explain) {
  const p = el("section", {class: `panel ${cls}`});
  p.appendChild(el("h2", {}, title));
  if (explain) p.appendChild(el("p", {class: "explain"}, explain));
  return p;
}

function colLetter(c) { return String.fromCharCode(65 + c); }

// Whether columns c and d have the same stacks and layer counts (clicks and hovers are mirrored).
function sameStructure(c, d) {
  const a = Explore.runs[c], b = Explore.runs[d];
  if (!a || !b || a.error || b.error || !a.attention || !b.attention) return false;
  const shape = (r) => Object.keys(r.attention).sort().map((s) => `${s}:${r.attention[s].map((l) => l.layer)}`).join(",") +
    "|" + r.flow.stacks.map((s) => s.blocks.map((b) => b.attention === "gated_deltanet")).join(";");
  return shape(a) === shape(b);
}

function tokenLabel(t) { return t.replace(/\n/g, "↵").replace(/ /g, "·") || "∅"; }

function renderAll() {
  renderAligned();
  const root = document.getElementById("columns");
  root.innerHTML = "";
  root.className = Explore.runs.length > 1 ? "two" : "one";
  Explore.runs.forEach((run, c) => {
    const col = el("div", {class: "column", "data-col": c});
    col.appendChild(el("h2", {class: "run-title"}, Explore.runs.length > 1 ? `${colLetter(c)}: ${run.label}` : run.label));
    if (run.error) {
      col.appendChild(el("div", {class: "run-error", role: "alert"}, run.error));
    } else {
      col.appendChild(tokensPanel(run, c));
      col.appendChild(embeddingPanel(run, c));
      col.appendChild(flowPanel(run, c));
      if (run.residual) col.appendChild(residualPanel(run, c));
      col.appendChild(el("div", {class: "inside", "data-col": c}));
      col.appendChild(el("div", {class: "maps", "data-col": c}));
      if (run.moe && run.moe.length) {
        col.appendChild(el("div", {class: "moe", "data-col": c}));
        col.appendChild(moeAllPanel(run, c));
      }
      col.appendChild(el("div", {class: "predictions", "data-col": c}));
      if (run.filled !== undefined) col.appendChild(spanPanel(run, c));
      if (run.lens) col.appendChild(el("div", {class: "lens", "data-col": c}));
      if (run.kv_cache) col.appendChild(kvPanel(run, c));
    }
    root.appendChild(col);
  });
  renderPredictions();
  Explore.runs.forEach((run, c) => { if (!run.error) { renderMaps(c); renderMoE(c); renderLens(c); } });
  // the block's inside (a server request of ~1 MB) after the bars are on screen
  requestAnimationFrame(() => setTimeout(() => Explore.runs.forEach((run, c) => { if (!run.error) renderInside(c); }), 0));
}

// ---------------------------------------------------------------- tokens
function tokensPanel(run, c) {
  const p = panel(t("tokens.title", run.tokens.length), "tokens", t("tokens.explain"));
  const row = el("div", {class: "token-row"});
  run.tokens.forEach((tok, i) => {
    const chip = el("span", {class: "tok", "data-index": i, "data-id": tok.id, title: `position ${i}, id ${tok.id}`});
    chip.appendChild(el("span", {class: "tok-text"}, tokenLabel(tok.text)));
    chip.appendChild(el("span", {class: "tok-id"}, String(tok.id)));
    chip.addEventListener("mouseenter", () => setHover(c, i));
    chip.addEventListener("click", () => { if (run.kind === "encoder") { Explore.cols[c].maskPos = i; renderPredictions(); } });
    row.appendChild(chip);
  });
  p.appendChild(row);
  return p;
}

function renderAligned() {
  const box = document.getElementById("aligned");
  box.innerHTML = "";
  const runs = Explore.runs.filter((r) => !r.error);
  box.hidden = Explore.runs.length < 2 || runs.length < 2;
  if (box.hidden) return;
  box.appendChild(el("h2", {}, t("aligned.title")));
  const chW = 9;
  Explore.runs.forEach((run, c) => {
    if (run.error) return;
    const line = el("div", {class: "aligned-row"});
    line.appendChild(el("span", {class: "aligned-label"}, run.label));
    const track = el("div", {class: "aligned-track", style: `width:${Explore.text.length * chW + 4}px`});
    run.tokens.forEach((tok, i) => {
      if (!tok.span) return;
      const b = el("span", {class: "aligned-tok", "data-col": c, "data-index": i, title: `${tok.text} (id ${tok.id})`},
                   tokenLabel(Explore.text.slice(tok.span[0], tok.span[1])));
      b.style.left = `${tok.span[0] * chW}px`;
      b.style.width = `${Math.max(1, tok.span[1] - tok.span[0]) * chW - 2}px`;
      b.addEventListener("mouseenter", () => setHover(c, i));
      track.appendChild(b);
    });
    line.appendChild(track);
    box.appendChild(line);
  });
}

// The hovered token: its row in every map of its column, its weights over the keys, and the
// tokens of the other runs covering the same characters.
function setHover(c, i, dec = false) {
  Explore.hover = c === null ? null : {col: c, index: i, dec};
  document.querySelectorAll(".tok.hover, .aligned-tok.hover").forEach((e) => e.classList.remove("hover"));
  if (Explore.hover && dec) {
    document.querySelectorAll(`.column[data-col="${c}"] .tok.dec[data-index="${i}"]`).forEach((e) => e.classList.add("hover"));
  } else if (Explore.hover) {
    const span = Explore.runs[c].tokens[i].span;
    Explore.runs.forEach((run, d) => {
      if (run.error) return;
      run.tokens.forEach((tok, j) => {
        const same = d === c ? j === i : span && tok.span && tok.span[0] < span[1] && span[0] < tok.span[1];
        if (!same) return;
        document.querySelectorAll(`.column[data-col="${d}"] .tokens .tok[data-index="${j}"], .aligned-tok[data-col="${d}"][data-index="${j}"]`)
          .forEach((e) => e.classList.add("hover"));
      });
    });
  }
  Explore.runs.forEach((run, d) => { if (!run.error) renderMaps(d); });
}

// ---------------------------------------------------------------- predictions
function renderPredictions() {
  const {temperature, topK, topP} = Explore.controls;
  Explore.runs.forEach((run, c) => {
    const box = document.querySelector(`.predictions[data-col="${c}"]`);
    if (!box) return;
    box.innerHTML = "";
    let logits, top, title;
    if (run.kind === "encoder") {
      const pos = Explore.cols[c].maskPos;
      logits = decodeArray(run.masked.logits).row(pos);
      top = run.masked.top[pos];
      title = t("pred.title.mask", pos, tokenLabel(run.tokens[pos].text));
    } else {
      logits = decodeArray(run.next.logits).data;
      top = run.next.top;
      title = run.kind === "encoder_decoder" ? t("pred.title.dec") : t("pred.title");
    }
    const p = panel(title, "next", t("pred.explain"));
    p.appendChild(el("div", {class: "formula"},
      t("pred.formula", temperature.toFixed(2), topK || t("pred.off"), topP.toFixed(2))));
    const probs = distribution(logits, temperature, topK, topP);
    const rows = top.map((t) => ({...t, p: probs[t.id]})).filter((t) => t.p > 0).sort((a, b) => b.p - a.p);
    const list = el("div", {class: "bars"});
    rows.forEach((r) => {
      const bar = el("div", {class: "bar", "data-id": r.id, "data-prob": r.p.toPrecision(9)});
      bar.appendChild(el("span", {class: "bar-label", title: `id ${r.id}, logit ${r.logit.toFixed(3)}`}, tokenLabel(r.text)));
      const track = el("span", {class: "bar-track"});
      const fill = el("span", {class: "bar-fill"});
      fill.style.width = `${(100 * r.p).toFixed(1)}%`;  // absolute: the full track is 100%
      track.appendChild(fill);
      bar.appendChild(track);
      bar.appendChild(el("span", {class: "bar-value"}, `${(100 * r.p).toFixed(2)}%`));
      list.appendChild(bar);
    });
    p.appendChild(list);
    const kept = probs.reduce((n, x) => n + (x > 0 ? 1 : 0), 0);
    p.appendChild(el("div", {class: "note"}, t("pred.kept", kept, logits.length)));
    box.appendChild(p);
  });
}

function spanPanel(run, c) {
  const p = panel(t("span.title"), "span");
  p.appendChild(el("div", {class: "filled"}, run.filled));
  const row = el("div", {class: "token-row"});
  run.decoder_tokens.forEach((tok, i) => {
    const chip = el("span", {class: "tok dec", "data-index": i, title: `decoder position ${i}, id ${tok.id}`});
    chip.addEventListener("mouseenter", () => setHover(c, i, true));
    chip.appendChild(el("span", {class: "tok-text"}, tokenLabel(tok.text)));
    chip.appendChild(el("span", {class: "tok-id"}, String(tok.id)));
    row.appendChild(chip);
  });
  p.appendChild(el("div", {class: "note"}, t("span.dec")));
  p.appendChild(row);
  return p;
}

// ---------------------------------------------------------------- flow and one block
function flowPanel(run, c) {
  const p = panel(t("flow.title"), "flow-panel", t("flow.explain"));
  const col = Explore.cols[c];
  const scroll = el("div", {class: "scroll"});
  scroll.appendChild(flowDiagram(run.flow, col, (stack, layer) => pickBlock(c, stack, layer), Explore.runs.length > 1));
  p.appendChild(scroll);
  return p;
}

// Open block `layer` of `stack` in column c, and in every column of the same structure.
function pickBlock(c, stack, layer) {
  Explore.runs.forEach((run, d) => {
    if (d !== c && !sameStructure(c, d)) return;
    const col = Explore.cols[d];
    col.stack = (stack === "self" && !run.attention.self && Object.keys(run.attention)[0]) || stack;
    col.layer = layer;
  });
  renderAll();
}

// The token labels of a map's rows (queries) and columns (keys) for column c's selected stack.
function axisTokens(run, stack) {
  const encdec = run.kind === "encoder_decoder";
  const lab = (ts) => ts.map((tok) => tokenLabel(tok.text));
  return {rows: lab(encdec && stack !== "encoder" ? run.decoder_tokens : run.tokens),
          cols: lab(encdec && stack === "self" ? run.decoder_tokens : run.tokens)};
}

async function renderInside(c) {
  const box = document.querySelector(`.inside[data-col="${c}"]`);
  const run = Explore.runs[c], col = Explore.cols[c];
  if (!box || !col.stack) return;
  let d;
  try { d = await loadDetail(c); } catch (e) { showError(e.message); return; }
  box.innerHTML = "";
  const tk = axisTokens(run, col.stack);
  if (d.mixer) { box.appendChild(statePanel(run, col, d, tk)); return; }
  const p = panel(t("inside.title", stackName(col.stack), col.layer, col.head, d.kv_head), "inside-panel");
  const rope = run.position === "rope" && col.stack !== "cross";
  if (d.block) p.appendChild(normSection(run, d.block, tk));
  p.appendChild(el("h3", {}, t("attn.title")));
  p.appendChild(el("p", {class: "explain"}, t("attn.explain")));
  const q = decodeArray(d.q), k = decodeArray(d.k), v = decodeArray(d.v), sc = decodeArray(d.scores);
  const allowed = decodeArray(d.allowed), probs = decodeArray(d.probs), out = decodeArray(d.out);
  const bias = d.bias ? decodeArray(d.bias) : null;
  const S = q.shape[0], T = k.shape[0];
  const qLab = col.stack === "cross" ? t("axis.decoder") : t("axis.query");
  const kLab = col.stack === "cross" ? t("axis.encoder") : t("axis.key");
  const masked = (i, j) => !allowed.at(i, j);
  p.appendChild(el("div", {class: "formula"},
    `softmax(Q Kᵀ · ${d.scale.toFixed(4)}${bias ? " + bias" : ""} + mask) V   (scale = 1/√d for standard attention)`));
  const grid = el("div", {class: "steps"});
  const size = Explore.runs.length > 1 ? 130 : 160;
  const add = (title, m, rows, cols, opts, rl, cl, rt, ct, scale) => grid.appendChild(
    figure(title, heatmap(rows, cols, {size, get: (i, j) => m.at(i, j), ...opts}),
           {rowsLabel: rl, colsLabel: cl, rowTicks: rt, colTicks: ct, signed: !!opts.signed, scale}));
  const ch = t("axis.channel");
  add(t(rope ? "attn.q.rope" : "attn.q", S, q.shape[1]), q, S, q.shape[1], {signed: true}, qLab, ch, tk.rows, null);
  add(t(rope ? "attn.k.rope" : "attn.k", T, k.shape[1]), k, T, k.shape[1], {signed: true}, kLab, ch, tk.cols, null);
  add(t("attn.v", T, v.shape[1]), v, T, v.shape[1], {signed: true}, kLab, ch, tk.cols, null);
  add(t("attn.scores", d.scale.toFixed(4)), sc, S, T, {signed: true}, qLab, kLab, tk.rows, tk.cols);
  if (bias) add(t("attn.bias", run.position), bias, S, T, {signed: true, masked}, qLab, kLab, tk.rows, tk.cols);
  grid.appendChild(figure(t("attn.mask"), heatmap(S, T, {size, get: (i, j) => allowed.at(i, j) ? 0.15 : 0, masked}),
                          {rowsLabel: qLab, colsLabel: kLab, rowTicks: tk.rows, colTicks: tk.cols,
                           scale: masked(0, T - 1) ? t("attn.mask.some") : t("attn.mask.none")}));
  add(t("attn.softmax"), probs, S, T, {masked}, qLab, kLab, tk.rows, tk.cols);
  add(t("attn.out", S, out.shape[1]), out, S, out.shape[1], {signed: true}, qLab, ch, tk.rows, null);
  p.appendChild(grid);
  if (d.block) blockSections(run, col, d.block, tk, size).forEach((e) => p.appendChild(e));
  box.appendChild(p);
}

// A Gated DeltaNet block: what it keeps instead of attending (its state, in the layer's own cache
// bytes), then its block's norms, output projection and feed-forward as for any block.
function statePanel(run, col, d, tk) {
  const p = panel(t("gdn.title", stackName(col.stack), col.layer), "inside-panel gdn-panel");
  p.dataset.layer = col.layer;
  p.dataset.stateBytes = d.state_bytes;
  p.appendChild(el("h3", {}, t("gdn.what")));
  p.appendChild(el("p", {class: "explain gdn-explain"},
    t("gdn.explain", col.layer, bytes(d.state_bytes), d.v_heads, d.d_k, d.d_v, d.k_heads, d.tokens)));
  if (d.block) p.appendChild(normSection(run, d.block, tk, true));
  if (d.block) blockSections(run, col, d.block, tk, Explore.runs.length > 1 ? 130 : 160).forEach((e) => p.appendChild(e));
  return p;
}

// ---------------------------------------------------------------- attention maps
// The map row to highlight in column c: the hovered token there, or (a column of the same structure
// beside it) the first of its tokens covering the hovered token's characters.
function hoveredRow(c, decRows, S) {
  const hv = Explore.hover;
  if (!hv || hv.dec !== decRows) return null;
  if (hv.col === c) return hv.index < S ? hv.index : null;
  if (decRows || !sameStructure(hv.col, c)) return null;
  const span = Explore.runs[hv.col].tokens[hv.index].span;
  if (!span) return null;
  const j = Explore.runs[c].tokens.findIndex((tok) => tok.span && tok.span[0] < span[1] && span[0] < tok.span[1]);
  return j >= 0 && j < S ? j : null;
}

function renderMaps(c) {
  const box = document.querySelector(`.maps[data-col="${c}"]`);
  const run = Explore.runs[c], col = Explore.cols[c];
  if (!box || !col.stack) return;
  box.innerHTML = "";
  // only the attention layers have maps (a Gated DeltaNet block keeps a state instead)
  const layers = run.attention[col.stack] || [];
  const L = layers.find((l) => l.layer === col.layer);
  const p = panel(t("maps.title", stackName(col.stack), col.layer), "maps-panel", t("maps.explain"));
  const ctl = el("div", {class: "map-controls"});
  const stackSel = el("select", {class: "stack-select"});
  Object.keys(run.attention).forEach((s) => stackSel.appendChild(el("option", {value: s, selected: s === col.stack}, stackName(s))));
  stackSel.addEventListener("change", () => {
    col.stack = stackSel.value; col.layer = run.attention[col.stack][0].layer; col.head = 0; renderAll();
  });
  const layerSel = el("select", {class: "layer-select"});
  if (!L) layerSel.appendChild(el("option", {value: "", selected: true}, "—"));
  layers.forEach((l) => layerSel.appendChild(el("option", {value: l.layer, selected: l.layer === col.layer}, `block ${l.layer}`)));
  layerSel.addEventListener("change", () => { if (layerSel.value !== "") pickBlock(c, col.stack, +layerSel.value); });
  if (layers.length) ctl.append(`${t("maps.stack")} `, stackSel, ` ${t("maps.block")} `, layerSel);
  p.appendChild(ctl);
  if (!L) {
    const names = layers.map((l) => l.layer).join(", ");
    p.appendChild(el("p", {class: "note maps-none"}, names ? t("maps.nomap", col.layer, names) : t("maps.nomap.all")));
    box.appendChild(p);
    return;
  }
  const probs = decodeArray(L.probs), allowed = decodeArray(L.allowed);
  const [H, S, T] = probs.shape;
  const decRows = run.kind === "encoder_decoder" && col.stack !== "encoder";  // queries: decoder positions
  const hv = Explore.hover;
  const row = hoveredRow(c, decRows, S);
  const tk = axisTokens(run, col.stack);
  const groups = {};
  L.kv_head.forEach((g, h) => { (groups[g] = groups[g] || []).push(h); });
  const shared = L.kv_head.length !== Object.keys(groups).length;
  const wrap = el("div", {class: "head-groups"});
  Object.entries(groups).forEach(([g, heads]) => {
    const grp = el("div", {class: "kv-group"});
    if (shared) grp.appendChild(el("div", {class: "kv-label"}, t("maps.shared", g, heads.join(", "))));
    const inner = el("div", {class: "kv-heads"});
    heads.forEach((h) => {
      const cv = heatmap(S, T, {size: Explore.runs.length > 1 ? 150 : 190, get: (i, j) => probs.data[(h * S + i) * T + j],
                                masked: (i, j) => !allowed.at(i, j), highlightRow: row});
      const fig = figure(t("maps.head", h) + (h === col.head ? t("maps.selected") : ""), cv,
                         {rowsLabel: t("axis.query"), colsLabel: col.stack === "cross" ? t("axis.encoder") : t("axis.key"),
                          rowTicks: tk.rows, colTicks: tk.cols});
      fig.classList.add("head-map");
      if (h === col.head) fig.classList.add("selected");
      fig.dataset.head = h;
      cv.addEventListener("mousemove", (e) => {
        const i = Math.floor(e.offsetY / (+cv.dataset.cell));
        if (i >= 0 && i < S && (!hv || hv.index !== i || hv.col !== c || hv.dec !== decRows)) setHover(c, i, decRows);
      });
      cv.addEventListener("click", () => { col.head = h; renderAll(); });
      inner.appendChild(fig);
    });
    grp.appendChild(inner);
    wrap.appendChild(grp);
  });
  p.appendChild(wrap);
  const notes = [];
  const window = run.flow.stacks.flatMap((s) => s.blocks).find((b) => b.layer === L.layer && b.window);
  if (window && col.stack === "self") notes.push(t("maps.window", window.window));
  if (L.has_bias) notes.push(t("maps.biasnote", run.position));
  notes.push(t("maps.note"));
  p.appendChild(el("div", {class: "note"}, notes.join(" · ")));
  if (row !== null) p.appendChild(rowReadout(run, col, probs, allowed, row, S, T));
  box.appendChild(p);
}

// The hovered query's weights over the keys for the selected head, as tokens shaded by weight.
function rowReadout(run, col, probs, allowed, i, S, T) {
  const h = col.head;
  const encdec = run.kind === "encoder_decoder";
  const keys = encdec && col.stack === "self" ? run.decoder_tokens : run.tokens;
  const queries = encdec && col.stack !== "encoder" ? run.decoder_tokens : run.tokens;
  const box = el("div", {class: "row-readout", "data-query": i, "data-head": h, "data-layer": col.layer,
                         "data-stack": col.stack});
  box.appendChild(el("div", {class: "note"},
    t("maps.readout", h, tokenLabel(queries[i].text), i)));
  const line = el("div", {class: "token-row"});
  for (let j = 0; j < T; j++) {
    const w = probs.data[(h * S + i) * T + j];
    const cell = el("span", {class: "tok weight" + (allowed.at(i, j) ? "" : " masked"), "data-key": j,
                             "data-weight": w.toPrecision(9), title: `weight ${w.toFixed(4)}`});
    const rgb = seqColor(w);
    cell.style.background = allowed.at(i, j) ? `rgb(${rgb.join(",")})` : "#ddd";
    cell.style.color = w > 0.55 ? "white" : "black";
    cell.appendChild(el("span", {class: "tok-text"}, tokenLabel(keys[j] ? keys[j].text : "?")));
    cell.appendChild(el("span", {class: "tok-id"}, w.toFixed(3)));
    line.appendChild(cell);
  }
  box.appendChild(line);
  return box;
}

// ---------------------------------------------------------------- MoE
function renderMoE(c) {
  const box = document.querySelector(`.moe[data-col="${c}"]`);
  const run = Explore.runs[c], col = Explore.cols[c];
  if (!box) return;
  box.innerHTML = "";
  const m = run.moe[col.moeLayer];
  const p = panel(t("moe.title", m.layer, m.router, m.num_experts, m.top_k, m.shared ? t("moe.shared", m.shared) : ""),
                  "moe-panel", t("moe.explain"));
  const sel = el("select", {class: "moe-layer"});
  run.moe.forEach((x, n) => sel.appendChild(el("option", {value: n, selected: n === col.moeLayer}, `block ${x.layer}`)));
  sel.addEventListener("change", () => { col.moeLayer = +sel.value; renderMoE(c); });
  p.append(`${t("moe.layer")} `, sel);
  const experts = decodeArray(m.experts), weights = decodeArray(m.weights), dropped = decodeArray(m.dropped);
  const table = el("table", {class: "routing"});
  const head = el("tr");
  [t("moe.pos"), t("moe.token"), t("moe.routed"), m.shared ? t("moe.sharedcol") : null].filter(Boolean)
    .forEach((h) => head.appendChild(el("th", {}, h)));
  table.appendChild(head);
  const N = experts.shape[0], K = experts.shape[1];
  for (let n = 0; n < N; n++) {
    const tr = el("tr", {class: "route", "data-index": n});
    tr.appendChild(el("td", {}, String(n)));
    tr.appendChild(el("td", {class: "tok-text"}, tokenLabel(run.tokens[n].text)));
    const td = el("td");
    const order = [...Array(K).keys()].sort((a, b) => weights.at(n, b) - weights.at(n, a));
    order.forEach((k) => {
      const e = experts.at(n, k), w = weights.at(n, k);
      const chip = el("span", {class: "expert" + (dropped.at(n, k) ? " dropped" : ""), "data-expert": e,
                               "data-weight": w.toPrecision(9), title: dropped.at(n, k) ? t("moe.dropped") : ""},
                      `E${e} ${w.toFixed(3)}`);
      chip.style.background = `hsl(${(e * 360 / m.num_experts) % 360}, 60%, 85%)`;
      td.appendChild(chip);
    });
    tr.appendChild(td);
    if (m.shared) tr.appendChild(el("td", {class: "shared"}, t("moe.always", m.shared)));
    table.appendChild(tr);
  }
  const scroll = el("div", {class: "scroll routing-scroll"});
  scroll.appendChild(table);
  p.appendChild(scroll);
  p.appendChild(loadChart(m.load, t("moe.load", m.layer, N, K)));
  box.appendChild(p);
}
