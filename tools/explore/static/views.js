// archlab explorer: the views, one column per model. Tokens, next-token (or masked-token) bars,
// the data flow, one block's attention step by step, the attention maps per layer and head, MoE
// routing, T5's span filling; a strip aligning the runs' tokens by character.
"use strict";

const STACK_NAMES = {self: "self-attention", encoder: "encoder self-attention", cross: "cross-attention"};

function panel(title, cls) {
  const p = el("section", {class: `panel ${cls}`});
  p.appendChild(el("h2", {}, title));
  return p;
}

function tokenLabel(t) { return t.replace(/\n/g, "↵").replace(/ /g, "·") || "∅"; }

function renderAll() {
  renderAligned();
  const root = document.getElementById("columns");
  root.innerHTML = "";
  root.className = Explore.runs.length > 1 ? "two" : "one";
  Explore.runs.forEach((run, c) => {
    const col = el("div", {class: "column", "data-col": c});
    col.appendChild(el("h2", {class: "run-title"}, run.label));
    if (run.error) {
      col.appendChild(el("div", {class: "run-error", role: "alert"}, run.error));
    } else {
      col.appendChild(tokensPanel(run, c));
      col.appendChild(el("div", {class: "predictions", "data-col": c}));
      if (run.filled !== undefined) col.appendChild(spanPanel(run, c));
      col.appendChild(flowPanel(run, c));
      col.appendChild(el("div", {class: "inside", "data-col": c}));
      col.appendChild(el("div", {class: "maps", "data-col": c}));
      if (run.moe && run.moe.length) col.appendChild(el("div", {class: "moe", "data-col": c}));
    }
    root.appendChild(col);
  });
  renderPredictions();
  Explore.runs.forEach((run, c) => { if (!run.error) { renderMaps(c); renderInside(c); renderMoE(c); } });
}

// ---------------------------------------------------------------- tokens
function tokensPanel(run, c) {
  const p = panel(`Tokens (${run.tokens.length})`, "tokens");
  const row = el("div", {class: "token-row"});
  run.tokens.forEach((t, i) => {
    const chip = el("span", {class: "tok", "data-index": i, "data-id": t.id, title: `position ${i}, id ${t.id}`});
    chip.appendChild(el("span", {class: "tok-text"}, tokenLabel(t.text)));
    chip.appendChild(el("span", {class: "tok-id"}, String(t.id)));
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
  box.appendChild(el("h2", {}, "Tokens aligned by character (each box spans the characters its token covers)"));
  const chW = 9;
  Explore.runs.forEach((run, c) => {
    if (run.error) return;
    const line = el("div", {class: "aligned-row"});
    line.appendChild(el("span", {class: "aligned-label"}, run.label));
    const track = el("div", {class: "aligned-track", style: `width:${Explore.text.length * chW + 4}px`});
    run.tokens.forEach((t, i) => {
      if (!t.span) return;
      const b = el("span", {class: "aligned-tok", "data-col": c, "data-index": i, title: `${t.text} (id ${t.id})`},
                   tokenLabel(Explore.text.slice(t.span[0], t.span[1])));
      b.style.left = `${t.span[0] * chW}px`;
      b.style.width = `${Math.max(1, t.span[1] - t.span[0]) * chW - 2}px`;
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
      run.tokens.forEach((t, j) => {
        const same = d === c ? j === i : span && t.span && t.span[0] < span[1] && span[0] < t.span[1];
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
      title = `Masked prediction at position ${pos} ("${tokenLabel(run.tokens[pos].text)}" replaced by [MASK]; click a token to move)`;
    } else {
      logits = decodeArray(run.next.logits).data;
      top = run.next.top;
      title = run.kind === "encoder_decoder" ? "Decoder's next token (after the span filling below)" : "Next token (top 20)";
    }
    const p = panel(title, "next");
    p.appendChild(el("div", {class: "formula"},
      `p = softmax(logits / T) over the tokens kept by top-k and top-p   (T = ${temperature.toFixed(2)}, top-k = ${topK || "off"}, top-p = ${topP.toFixed(2)})`));
    const probs = distribution(logits, temperature, topK, topP);
    const rows = top.map((t) => ({...t, p: probs[t.id]})).filter((t) => t.p > 0).sort((a, b) => b.p - a.p);
    const max = Math.max(1e-12, ...rows.map((r) => r.p));
    const list = el("div", {class: "bars"});
    rows.forEach((r) => {
      const bar = el("div", {class: "bar", "data-id": r.id, "data-prob": r.p.toPrecision(9)});
      bar.appendChild(el("span", {class: "bar-label", title: `id ${r.id}, logit ${r.logit.toFixed(3)}`}, tokenLabel(r.text)));
      const track = el("span", {class: "bar-track"});
      const fill = el("span", {class: "bar-fill"});
      fill.style.width = `${(100 * r.p / max).toFixed(1)}%`;
      track.appendChild(fill);
      bar.appendChild(track);
      bar.appendChild(el("span", {class: "bar-value"}, `${(100 * r.p).toFixed(2)}%`));
      list.appendChild(bar);
    });
    p.appendChild(list);
    const kept = probs.reduce((n, x) => n + (x > 0 ? 1 : 0), 0);
    p.appendChild(el("div", {class: "note"}, `${kept} of ${logits.length} tokens kept; the 20 highest logits shown`));
    box.appendChild(p);
  });
}

function spanPanel(run, c) {
  const p = panel("Span filling (greedy decoding of the decoder)", "span");
  p.appendChild(el("div", {class: "filled"}, run.filled));
  const row = el("div", {class: "token-row"});
  run.decoder_tokens.forEach((t, i) => {
    const chip = el("span", {class: "tok dec", "data-index": i, title: `decoder position ${i}, id ${t.id}`});
    chip.addEventListener("mouseenter", () => setHover(c, i, true));
    chip.appendChild(el("span", {class: "tok-text"}, tokenLabel(t.text)));
    chip.appendChild(el("span", {class: "tok-id"}, String(t.id)));
    row.appendChild(chip);
  });
  p.appendChild(el("div", {class: "note"}, "decoder tokens:"));
  p.appendChild(row);
  return p;
}

// ---------------------------------------------------------------- flow and one block
function flowPanel(run, c) {
  const p = panel("Data flow (click a block to open its attention)", "flow-panel");
  const col = Explore.cols[c];
  const scroll = el("div", {class: "scroll"});
  scroll.appendChild(flowDiagram(run.flow, col, (stack, layer) => {
    col.stack = stack === "self" && !run.attention.self ? Object.keys(run.attention)[0] : stack;
    col.layer = layer;
    renderAll();
  }));
  p.appendChild(scroll);
  return p;
}

async function renderInside(c) {
  const box = document.querySelector(`.inside[data-col="${c}"]`);
  const run = Explore.runs[c], col = Explore.cols[c];
  if (!box || !col.stack) return;
  let d;
  try { d = await loadDetail(c); } catch (e) { showError(e.message); return; }
  box.innerHTML = "";
  const p = panel(`Inside ${STACK_NAMES[col.stack]} of block ${col.layer}, head ${col.head} (K/V head ${d.kv_head})`, "inside-panel");
  const q = decodeArray(d.q), k = decodeArray(d.k), v = decodeArray(d.v), sc = decodeArray(d.scores);
  const allowed = decodeArray(d.allowed), probs = decodeArray(d.probs), out = decodeArray(d.out);
  const bias = d.bias ? decodeArray(d.bias) : null;
  const S = q.shape[0], T = k.shape[0];
  const qLab = col.stack === "cross" ? "decoder position" : "query position";
  const kLab = col.stack === "cross" ? "encoder position" : "key position";
  const masked = (i, j) => !allowed.at(i, j);
  p.appendChild(el("div", {class: "formula"},
    `softmax(Q Kᵀ · ${d.scale.toFixed(4)}${bias ? " + bias" : ""} + mask) V   (scale = 1/√d for standard attention)`));
  const grid = el("div", {class: "steps"});
  const add = (title, m, rows, cols, opts, rl, cl, scale) => grid.appendChild(
    figure(title, heatmap(rows, cols, {size: 150, get: (i, j) => m.at(i, j), ...opts}), {rowsLabel: rl, colsLabel: cl, scale}));
  add(`Q (${S} x ${q.shape[1]})`, q, S, q.shape[1], {signed: true}, qLab, "channel", "blue < 0 < red");
  add(`K (${T} x ${k.shape[1]})`, k, T, k.shape[1], {signed: true}, kLab, "channel", "blue < 0 < red");
  add(`V (${T} x ${v.shape[1]})`, v, T, v.shape[1], {signed: true}, kLab, "channel", "blue < 0 < red");
  add("scaled scores Q Kᵀ · scale", sc, S, T, {signed: true}, qLab, kLab, "blue < 0 < red");
  if (bias) add(`bias (${run.position})`, bias, S, T, {signed: true, masked}, qLab, kLab, "added to the scores");
  grid.appendChild(figure("mask (grey: not seen)", heatmap(S, T, {size: 150, get: (i, j) => allowed.at(i, j) ? 0.15 : 0, masked}),
                          {rowsLabel: qLab, colsLabel: kLab, scale: masked(0, T - 1) ? "causal / window" : "none: all seen"}));
  add("softmax (attention weights)", probs, S, T, {masked}, qLab, kLab, "0 (white) to 1 (blue)");
  add(`output (${S} x ${out.shape[1]})`, out, S, out.shape[1], {signed: true}, qLab, "channel", "weights · V");
  p.appendChild(grid);
  box.appendChild(p);
}

// ---------------------------------------------------------------- attention maps
function renderMaps(c) {
  const box = document.querySelector(`.maps[data-col="${c}"]`);
  const run = Explore.runs[c], col = Explore.cols[c];
  if (!box || !col.stack) return;
  box.innerHTML = "";
  const layers = run.attention[col.stack];
  const L = layers[col.layer];
  const p = panel(`Attention maps: ${STACK_NAMES[col.stack]}, block ${col.layer}`, "maps-panel");
  const ctl = el("div", {class: "map-controls"});
  const stackSel = el("select", {class: "stack-select"});
  Object.keys(run.attention).forEach((s) => stackSel.appendChild(el("option", {value: s, selected: s === col.stack}, STACK_NAMES[s])));
  stackSel.addEventListener("change", () => { col.stack = stackSel.value; col.layer = 0; col.head = 0; renderAll(); });
  const layerSel = el("select", {class: "layer-select"});
  layers.forEach((l, n) => layerSel.appendChild(el("option", {value: n, selected: n === col.layer}, `block ${l.layer}`)));
  layerSel.addEventListener("change", () => { col.layer = +layerSel.value; renderAll(); });
  ctl.append("stack ", stackSel, " block ", layerSel);
  p.appendChild(ctl);
  const probs = decodeArray(L.probs), allowed = decodeArray(L.allowed);
  const [H, S, T] = probs.shape;
  const decRows = run.kind === "encoder_decoder" && col.stack !== "encoder";  // queries: decoder positions
  const hv = Explore.hover;
  const row = hv && hv.col === c && hv.dec === decRows && hv.index < S ? hv.index : null;
  const groups = {};
  L.kv_head.forEach((g, h) => { (groups[g] = groups[g] || []).push(h); });
  const shared = L.kv_head.length !== Object.keys(groups).length;
  const wrap = el("div", {class: "head-groups"});
  Object.entries(groups).forEach(([g, heads]) => {
    const grp = el("div", {class: "kv-group"});
    if (shared) grp.appendChild(el("div", {class: "kv-label"}, `K/V head ${g} shared by heads ${heads.join(", ")}`));
    const inner = el("div", {class: "kv-heads"});
    heads.forEach((h) => {
      const cv = heatmap(S, T, {size: Explore.runs.length > 1 ? 150 : 190, get: (i, j) => probs.data[(h * S + i) * T + j],
                                masked: (i, j) => !allowed.at(i, j), highlightRow: row});
      const fig = figure(`head ${h}${h === col.head ? " (selected)" : ""}`, cv,
                         {rowsLabel: "query", colsLabel: col.stack === "cross" ? "encoder key" : "key", scale: null});
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
  if (window && col.stack === "self") notes.push(`sliding window of ${window.window}: grey cells lie outside it`);
  if (L.has_bias) notes.push(`${run.position} bias added to the scores before the softmax (see the block's bias map)`);
  notes.push("white = 0, blue = 1, grey = masked; hover a token or a row; click a head to open it above");
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
    `head ${h}: what "${tokenLabel(queries[i].text)}" (position ${i}) attends to`));
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
  const p = panel(`MoE routing: block ${m.layer} (${m.router}, ${m.num_experts} experts, top-${m.top_k}` +
                  `${m.shared ? `, ${m.shared} shared` : ""})`, "moe-panel");
  const sel = el("select", {class: "moe-layer"});
  run.moe.forEach((x, n) => sel.appendChild(el("option", {value: n, selected: n === col.moeLayer}, `block ${x.layer}`)));
  sel.addEventListener("change", () => { col.moeLayer = +sel.value; renderMoE(c); });
  p.append("MoE layer ", sel);
  const experts = decodeArray(m.experts), weights = decodeArray(m.weights), dropped = decodeArray(m.dropped);
  const table = el("table", {class: "routing"});
  const head = el("tr");
  ["pos", "token", "routed experts (gate weight)", m.shared ? "shared" : null].filter(Boolean)
    .forEach((t) => head.appendChild(el("th", {}, t)));
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
                               "data-weight": w.toPrecision(9), title: dropped.at(n, k) ? "dropped by capacity" : ""},
                      `E${e} ${w.toFixed(3)}`);
      chip.style.background = `hsl(${(e * 360 / m.num_experts) % 360}, 60%, 85%)`;
      td.appendChild(chip);
    });
    tr.appendChild(td);
    if (m.shared) tr.appendChild(el("td", {class: "shared"}, `${m.shared} × always`));
    table.appendChild(tr);
  }
  const scroll = el("div", {class: "scroll routing-scroll"});
  scroll.appendChild(table);
  p.appendChild(scroll);
  p.appendChild(loadChart(m.load, `load of block ${m.layer} over the prompt (${N} tokens × top-${K})`));
  box.appendChild(p);
}
