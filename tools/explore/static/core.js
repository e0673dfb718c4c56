// archlab explorer: state, the server API (or the inlined data of an exported page), and the
// sampling math, which mirrors archlab.model.generate.filter_logits exactly.
"use strict";

const Explore = {
  offline: !!window.EXPLORE_DATA,
  text: "",
  runs: [],          // one page data object per model (see tools/explore/compute.py)
  cols: [],          // per column: {stack, layer, head, moeLayer, maskPos, detail}
  hover: null,       // {col, index}: the token under the pointer
  controls: {temperature: 1, topK: 0, topP: 1},
  lang: "en",
  lensPos: null,     // the logit lens's position (null: the last)
};

// ---------------------------------------------------------------- arrays
function decodeArray(obj) {
  if (!obj) return null;
  if (obj._cache) return obj._cache;
  const bin = atob(obj.b64);
  const bytes = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
  const Kind = {f32: Float32Array, u8: Uint8Array, i32: Int32Array}[obj.dtype];
  const data = new Kind(bytes.buffer);
  const shape = obj.shape;
  const cols = shape.length > 1 ? shape[shape.length - 1] : shape[0];
  obj._cache = {data, shape, at: (i, j) => data[i * cols + j], row: (i) => data.subarray(i * cols, (i + 1) * cols)};
  return obj._cache;
}

// ---------------------------------------------------------------- sampling
// softmax(filter(logits / T, top_k, top_p)), as archlab.model.generate.pick draws from.
function distribution(logits, T, topK, topP) {
  const V = logits.length;
  const z = new Float64Array(V);
  for (let i = 0; i < V; i++) z[i] = logits[i] / T;
  const keep = new Uint8Array(V).fill(1);
  if (topK > 0 && topK < V) {
    const kth = Array.from(z).sort((a, b) => b - a)[topK - 1];
    for (let i = 0; i < V; i++) if (z[i] < kth) keep[i] = 0;
  }
  if (topP < 1) {
    const order = Array.from(z.keys()).filter((i) => keep[i]).sort((a, b) => z[b] - z[a]);
    const p = softmaxOver(z, order);
    let before = 0;
    order.forEach((i, r) => { if (before >= topP) keep[i] = 0; before += p[r]; });
  }
  const kept = Array.from(z.keys()).filter((i) => keep[i]);
  const p = softmaxOver(z, kept);
  const probs = new Float64Array(V);
  kept.forEach((i, r) => { probs[i] = p[r]; });
  return probs;
}

function softmaxOver(z, idx) {
  let m = -Infinity;
  for (const i of idx) m = Math.max(m, z[i]);
  const e = idx.map((i) => Math.exp(z[i] - m));
  const s = e.reduce((a, b) => a + b, 0);
  return e.map((x) => x / s);
}

// ---------------------------------------------------------------- server
async function api(path, body) {
  const res = await fetch(path, {method: "POST", headers: {"Content-Type": "application/json"},
                                 body: JSON.stringify(body)});
  let out;
  try { out = await res.json(); } catch (e) { throw new Error(`the server answered ${res.status} without JSON`); }
  if (!res.ok || out.error) throw new Error(out.error || `the server answered ${res.status}`);
  return out;
}

function showError(msg) {
  const el = document.getElementById("error");
  el.textContent = msg || "";
  el.hidden = !msg;
}

function setStatus(msg) { document.getElementById("status").textContent = msg; }

async function analyze(text) {
  showError("");
  setStatus(t("status.running"));
  const t0 = performance.now();
  try {
    const out = await api("api/analyze", {text});
    loadData(out);
    setStatus(`${Math.round(performance.now() - t0)} ms`);
  } catch (e) {
    showError(e.message);
    setStatus("");
  }
}

function loadData(out) {
  const sameText = out.text === Explore.text;
  Explore.text = out.text;
  if (!sameText) Explore.lensPos = null;
  Explore.runs = out.runs;
  Explore.cols = out.runs.map((run, c) => {
    const old = Explore.cols[c] || {};
    const stacks = run.attention ? Object.keys(run.attention) : [];
    if (run.flow && !stacks.length) stacks.push("self");  // no attention layer (pure Gated DeltaNet): the blocks
    const stack = stacks.includes(old.stack) ? old.stack : stacks[0];
    // col.layer is the block's number; a new model opens its first block with an attention map
    const blocks = stack ? stackBlocks(run, stack).map((b) => b.layer) : [];
    const maps = stack && run.attention[stack] ? run.attention[stack].map((l) => l.layer) : [];
    const layer = blocks.includes(old.layer) ? old.layer : maps.length ? maps[0] : 0;
    const moe = run.moe || [];
    return {stack, layer, head: old.head || 0,
            moeLayer: Math.min(old.moeLayer || 0, Math.max(0, moe.length - 1)),
            maskPos: defaultMaskPos(run, sameText ? old.maskPos : undefined), detail: null};
  });
  Explore.hover = null;
  document.getElementById("prompt").value = Explore.text;
  fillTargets();
  renderAll();
}

// BERT's prediction position: the one chosen on this same text, else the first [MASK], else the last.
function defaultMaskPos(run, old) {
  if (!run.tokens) return 0;
  if (old !== undefined && old < run.tokens.length) return old;
  const marked = run.tokens.findIndex((tok) => tok.text === "[MASK]");
  return marked >= 0 ? marked : run.tokens.length - 1;
}

// The flow's blocks of a view stack: "encoder" (T5's) or the stack the decoder (or BERT) reads.
function stackBlocks(run, stack) {
  const stacks = run.flow.stacks;
  const found = stack === "encoder" ? stacks.find((s) => s.name === "encoder" && stacks.length > 1) : stacks[stacks.length - 1];
  return found ? found.blocks : [];
}

// Whether block `layer` of `stack` has attention maps (a Gated DeltaNet block has none).
function hasMap(run, stack, layer) {
  return !!(run.attention && run.attention[stack] && run.attention[stack].some((l) => l.layer === layer));
}

// The selected head's Q, K, V, scores, bias, mask, softmax, output: inlined or from the server.
async function loadDetail(c) {
  const col = Explore.cols[c];
  const run = Explore.runs[c];
  if (!col.stack) return null;
  const head = hasMap(run, col.stack, col.layer) ? col.head : 0;  // a Gated DeltaNet block: one detail
  const key = `${col.stack}/${col.layer}/${head}`;
  if (col.detail && col.detail.key === key) return col.detail.data;
  let data;
  if (Explore.offline) {
    data = run.details[col.stack][col.layer][head];
  } else {
    data = await api("api/detail", {run: c, text: Explore.text, stack: col.stack, layer: col.layer, head});
  }
  col.detail = {key, data};
  return data;
}

// The decoders the "with" selector names: one column, or every decoder ("both").
function generationTargets() {
  const sel = document.getElementById("gen-target");
  const decoders = Explore.runs.map((r, c) => c).filter((c) => Explore.runs[c].kind === "decoder" && !Explore.runs[c].error);
  if (!sel.value || sel.value === "both") return decoders;
  return decoders.filter((c) => c === +sel.value);
}

// Sample / generate with the chosen model(s). One model: its continuation becomes the prompt (and
// is analysed); both: each continuation is shown, labelled, with a button to continue from it.
async function generateN(n) {
  showError("");
  const targets = generationTargets();
  if (!targets.length) { showError(t("err.nodecoder")); return; }
  const {temperature, topK, topP} = Explore.controls;
  try {
    setStatus(t("status.generating"));
    const outs = [];
    for (const c of targets) {
      const out = await api("api/generate", {run: c, text: Explore.text, n, temperature, top_k: topK, top_p: topP,
                                             seed: Math.floor(Math.random() * 1e9)});
      outs.push({col: c, label: Explore.runs[c].label, text: out.text});
    }
    const base = Explore.text;
    showGenerated(outs, base, n);
    if (outs.length === 1) await analyze(outs[0].text); else setStatus("");
  } catch (e) { showError(e.message); setStatus(""); }
}

function showGenerated(outs, base, n) {
  const box = document.getElementById("generated");
  box.innerHTML = "";
  box.hidden = false;
  box.appendChild(el("h2", {}, t("gen.title")));
  outs.forEach((o) => {
    const row = el("div", {class: "gen-row", "data-col": o.col});
    row.appendChild(el("div", {class: "note"}, t("gen.by", o.label, n)));
    const txt = el("div", {class: "filled"});
    txt.appendChild(document.createTextNode(base));
    txt.appendChild(el("b", {class: "gen-new"}, o.text.slice(base.length)));
    row.appendChild(txt);
    if (outs.length > 1) {
      const b = el("button", {class: "gen-use"}, t("gen.use"));
      b.addEventListener("click", () => analyze(o.text));
      row.appendChild(b);
    }
    box.appendChild(row);
  });
}

function fillTargets() {
  const sel = document.getElementById("gen-target");
  const old = sel.value;
  sel.innerHTML = "";
  const decoders = Explore.runs.map((r, c) => c).filter((c) => Explore.runs[c].kind === "decoder" && !Explore.runs[c].error);
  document.getElementById("gen-target-label").hidden = Explore.runs.length < 2;
  decoders.forEach((c) => sel.appendChild(el("option", {value: String(c)}, `${String.fromCharCode(65 + c)}: ${Explore.runs[c].label}`)));
  if (decoders.length > 1) sel.appendChild(el("option", {value: "both"}, t("ctl.both")));
  if ([...sel.options].some((o) => o.value === old)) sel.value = old;
}

function setLanguage(lang) {
  Explore.lang = lang;
  document.getElementById("lang").value = lang;
  translateStatic();
  if (Explore.runs.length) { fillTargets(); renderAll(); }
}

function readControls() {
  const T = parseFloat(document.getElementById("temperature").value);
  const k = parseInt(document.getElementById("top-k").value || "0", 10);
  const p = parseFloat(document.getElementById("top-p").value);
  Explore.controls = {temperature: T, topK: Number.isFinite(k) && k > 0 ? k : 0, topP: p};
  document.getElementById("temperature-value").textContent = T.toFixed(2);
  document.getElementById("top-p-value").textContent = p.toFixed(2);
}

function setup() {
  const prompt = document.getElementById("prompt");
  document.getElementById("lang").addEventListener("change", (e) => setLanguage(e.target.value));
  translateStatic();
  for (const id of ["temperature", "top-k", "top-p"]) {
    document.getElementById(id).addEventListener("input", () => { readControls(); renderPredictions(); });
  }
  if (Explore.offline) {
    document.getElementById("offline-note").hidden = false;
    for (const id of ["analyze", "sample", "generate"]) {
      const b = document.getElementById(id);
      b.disabled = true;
      b.title = "needs the model: open this run with python -m tools.explore";
    }
    prompt.readOnly = true;
    loadData(window.EXPLORE_DATA);
    return;
  }
  document.getElementById("analyze").addEventListener("click", () => analyze(prompt.value));
  prompt.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); analyze(prompt.value); }
  });
  document.getElementById("sample").addEventListener("click", () => generateN(1));
  document.getElementById("generate").addEventListener("click", () => {
    generateN(parseInt(document.getElementById("gen-n").value || "1", 10));
  });
  fetch("api/info").then((r) => r.json()).then((info) => {
    document.getElementById("runs-label").textContent = info.runs.map((r, c) => `${String.fromCharCode(65 + c)}: ${r.label}`).join("  |  ");
    prompt.value = info.prompt;  // the start of the first run's validation split (tools/explore/prompt.py)
    analyze(prompt.value);
  }).catch((e) => showError(`cannot reach the explorer's server: ${e.message}`));
}

window.addEventListener("DOMContentLoaded", () => { readControls(); setup(); });
