// TinyDiT's sampler in the browser: every fixed-step sampler of tinydit (euler, heun, midpoint, heun-first,
// ancestral) on the uniform or the shifted time grid, guidance in an interval, the model (model.onnx) run by
// onnxruntime-web. It follows tinydit.export.ort_sampler step for step.
// Test mode, index.html?test=case.json: the initial noise and settings come from the file, and the
// result is posted back to /result (the test's server) instead of only being drawn.
"use strict";
const PAD = 0, BOS = 1, UNK = 2;
const PAGE_SAMPLERS = ["euler", "heun", "midpoint", "heun-first", "ancestral"];
const STAND_IN = { dopri5: "heun" };  // run in place of a recorded sampler with adaptive steps (tinydit.export)
const DEFAULT_SHIFT = 3;  // tinydit.flow.grids.DEFAULT_SHIFT, SD3's

function timeGrid(steps, grid, shift) {  // (steps + 1) times from 1 to 0 exactly, as tinydit.flow.grids
  const s = shift ?? DEFAULT_SHIFT, ts = [];
  for (let i = 0; i <= steps; i++) {
    const t = 1 - i / steps;
    ts.push(i === 0 ? 1 : i === steps ? 0 : grid === "shifted" ? s * t / (1 + (s - 1) * t) : t);
  }
  return ts;
}
const $ = (id) => document.getElementById(id);
const errors = [];
window.addEventListener("error", (e) => errors.push(String(e.message || e)));
window.addEventListener("unhandledrejection", (e) => errors.push(String(e.reason)));

function words(text) {
  return text.toLowerCase().match(/[a-z0-9]+(?:['-][a-z0-9]+)*/g) || [];
}

function encode(meta, prompt) {  // BOS, the words' ids (UNK if unknown), PAD up to L
  const tok = meta.tokenizer, ids = new Map(tok.vocab.map((w, i) => [w, i + 3]));
  const row = [BOS, ...words(prompt).slice(0, tok.max_len - 1).map((w) => ids.get(w) ?? UNK)];
  while (row.length < tok.max_len) row.push(PAD);
  return row;
}

function gaussian(seed, n) {  // seeded normal noise (mulberry32 + Box-Muller): the page's own, not torch's
  let a = seed >>> 0;
  const rand = () => { a = (a + 0x6D2B79F5) >>> 0; let t = a; t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61); return ((t ^ (t >>> 14)) >>> 0) / 4294967296; };
  const out = new Float32Array(n);
  for (let i = 0; i < n; i += 2) {
    const r = Math.sqrt(-2 * Math.log(1 - rand())), th = 2 * Math.PI * rand();
    out[i] = r * Math.cos(th);
    if (i + 1 < n) out[i + 1] = r * Math.sin(th);
  }
  return out;
}

class Sampler {
  constructor(session, meta) { this.session = session; this.meta = meta; }

  async v(x, t, y, d) {  // x: Float32Array of B images; y: BigInt64Array (B) or (B, L)
    const { channels: c, size: s } = this.meta.image, b = x.length / (c * s * s);
    const feeds = {
      x: new ort.Tensor("float32", x, [b, c, s, s]),
      t: new ort.Tensor("float32", new Float32Array(b).fill(t), [b]),
      y: new ort.Tensor("int64", y, this.meta.cond === "class" ? [b] : [b, this.meta.tokenizer.max_len]),
    };
    if (this.meta.shortcut) feeds.d = new ort.Tensor("float32", new Float32Array(b).fill(d), [b]);
    return (await this.session.run(feeds)).v.data;
  }

  async velocity(x, t, y, null_, scale, guided, d) {
    let out;
    if (!guided || scale === 1) {
      out = await this.v(x, t, y, d);
    } else {
      const both = new Float32Array(2 * x.length); both.set(x); both.set(x, x.length);
      const ys = new BigInt64Array(2 * y.length); ys.set(y); ys.set(null_, y.length);
      const v = await this.v(both, t, ys, d), n = x.length, s = Math.fround(scale);
      out = new Float32Array(n);
      for (let i = 0; i < n; i++) out[i] = Math.fround(v[n + i] + Math.fround(s * Math.fround(v[i] - v[n + i])));
    }
    // An x-prediction model clips t at x_pred_t_min in v = (x - x0) / t; the samplers use the path's own
    // (x - x0) / t below it (tinydit.flow.guidance.unclipped_scale), so a last step lands on x0.
    const tMin = this.meta.x_pred_t_min;
    if (!tMin || !(t > 0 && t < tMin)) return out;
    const k = Math.fround(tMin / t);
    return out.map((vi) => Math.fround(vi * k));
  }

  // fresh(i): step i's normal noise for the ancestral sampler (eta 1: DDPM's posterior noise, 0: Euler).
  // onStep(i, t, x, ms): after step i, x at the time t it reached.
  async sample(noise, y, null_, { steps, cfg, sampler, interval, eta = 1, fresh, grid = "uniform", shift }, onStep) {
    if (!PAGE_SAMPLERS.includes(sampler)) throw new Error(`this page does not run the ${sampler} sampler`);
    const [lo, hi] = interval || [0, 1], ts = timeGrid(steps, grid, shift);
    const f = (x, t, d) => this.velocity(x, t, y, null_, cfg, cfg !== 1 && lo <= t && t <= hi, d);
    const axpy = (x, a, v) => x.map((xi, k) => Math.fround(xi + Math.fround(a * v[k])));  // x + a v, in float32
    let x = Float32Array.from(noise);
    for (let i = 0; i < steps; i++) {
      const t = ts[i], tNext = ts[i + 1], started = performance.now();
      const dt = tNext - t, euler = sampler === "euler" || (sampler === "heun-first" && t !== 1);
      const v = await f(x, t, euler ? -dt : 0);  // a shortcut model is told an Euler step's size
      if (sampler === "ancestral") {
        x = ancestralStep(x, v, t, tNext, eta, tNext > 0 ? fresh(i) : null);
      } else if (sampler === "midpoint") {
        x = axpy(x, Math.fround(dt), await f(axpy(x, Math.fround(0.5 * dt), v), t + 0.5 * dt, 0));
      } else if (!euler && tNext > 0) {  // heun's trapezoidal corrector; a last step to t = 0 stays Euler
        const v2 = await f(axpy(x, Math.fround(dt), v), tNext, 0), half = Math.fround(Math.fround(dt) * 0.5);
        x = x.map((xi, k) => Math.fround(xi + Math.fround(half * Math.fround(v[k] + v2[k]))));
      } else {
        x = axpy(x, Math.fround(dt), v);
      }
      if (onStep) await onStep(i, tNext, x, performance.now() - started);
    }
    return x;
  }
}

// DDIM's eta family on the straight path, as tinydit.export.ort_sampler: x0 and eps from v, put back at
// tNext with s of the noise drawn afresh (z).
function ancestralStep(x, v, t, tNext, eta, z) {
  const f = Math.fround, a = f(t), b = f(1 - t);
  const x0 = x.map((xi, k) => f(xi - f(a * v[k])));
  if (tNext <= 0) return x0;
  const r = (1 - t) * tNext / ((1 - tNext) * t), s = eta * tNext * Math.sqrt(Math.max(0, 1 - r * r));
  const c0 = f(1 - tNext), ce = f(Math.sqrt(Math.max(0, tNext * tNext - s * s))), cz = f(s);
  return x.map((xi, k) => f(f(f(c0 * x0[k]) + f(ce * f(xi + f(b * v[k])))) + f(cz * z[k])));
}

function toBytes(x) {  // [-1, 1] -> uint8, rounded half to even as torch and numpy round
  return Uint8Array.from(x, (v) => {
    const u = Math.min(1, Math.max(0, Math.fround(Math.fround(v + 1) / 2))) * 255, f = Math.floor(u), r = u - f;
    return r > 0.5 || (r === 0.5 && f % 2 === 1) ? f + 1 : f;
  });
}

function draw(meta, x) {
  const { channels: c, size: s } = meta.image, bytes = toBytes(x), img = new ImageData(s, s);
  for (let p = 0; p < s * s; p++) {
    for (let k = 0; k < 3; k++) img.data[4 * p + k] = bytes[(c === 1 ? 0 : k) * s * s + p];
    img.data[4 * p + 3] = 255;
  }
  $("canvas").getContext("2d").putImageData(img, 0, 0);
}

// The controls' first values: the sampler settings the checkpoint records (tinydit sample's defaults), with
// the stand-in for a recorded sampler with adaptive steps (its steps, guidance, interval and grid kept).
function pageDefaults(record) {
  const [lo, hi] = record.cfg_interval || [0, 1];
  const sampler = STAND_IN[record.sampler] ?? record.sampler;
  const grid = record.grid || "uniform";
  return { sampler, steps: record.steps, cfg: record.cfg_scale, lo, hi, eta: record.eta ?? 1, grid,
           shift: record.shift ?? DEFAULT_SHIFT };
}

function recordNote(record) {
  if (!(record.sampler in STAND_IN)) return "";
  return `The checkpoint records the ${record.sampler} sampler, whose adaptive steps this page does not take: ` +
    `it runs ${STAND_IN[record.sampler]} with the recorded steps, guidance and interval instead.`;
}

function controls() {
  return { sampler: $("sampler").value, steps: +$("steps").value, cfg: +$("cfg").value,
           interval: [+$("lo").value, +$("hi").value], eta: +$("eta").value, grid: $("grid").value,
           shift: +$("shift").value };
}

async function main() {
  ort.env.wasm.numThreads = 1;  // python -m http.server sends no cross-origin isolation headers
  const meta = await (await fetch("model.json")).json();
  const session = await ort.InferenceSession.create("model.onnx", { executionProviders: ["wasm"] });
  const sampler = new Sampler(session, meta), size = meta.image.size;
  $("canvas").width = $("canvas").height = size;
  $("about").textContent = `A ${meta.cond === "class" ? "class" : "text"}-conditioned model trained on ${meta.data} ` +
    `(step ${meta.step}), ${meta.image.channels}x${size}x${size} images.`;
  if (meta.cond === "class") {
    meta.classes.forEach((name, i) => $("class").add(new Option(name, i)));
  } else {
    $("class-label").hidden = true; $("prompt-label").hidden = false;
    $("prompt").value = (meta.prompts && meta.prompts[0]) || "";
  }
  const defaults = pageDefaults(meta.sampler);
  for (const [id, value] of Object.entries(defaults)) $(id).value = value;
  $("record").textContent = recordNote(meta.sampler);
  const condition = (prompt, label) => meta.cond === "class"
    ? [BigInt64Array.of(BigInt(label)), BigInt64Array.of(BigInt(meta.n_classes))]
    : [BigInt64Array.from(encode(meta, prompt), BigInt), BigInt64Array.from(encode(meta, ""), BigInt)];
  const test = new URLSearchParams(location.search).get("test");
  if (test) {  // the browser test: given noise and settings, post the image and the page's defaults back
    const c = await (await fetch(test)).json();
    const [y, null_] = condition(c.prompt, c.label);
    const fresh = (i) => Float32Array.from(c.fresh[i]);
    const x = await sampler.sample(Float32Array.from(c.noise), y, null_, { ...c, fresh }, (i, t, xi) => draw(meta, xi));
    const body = { pixels: Array.from(toBytes(x)), defaults: controls(), errors };
    await fetch("/result", { method: "POST", body: JSON.stringify(body) });
    return;
  }
  $("go").disabled = false;
  $("go").onclick = async () => {
    $("go").disabled = true;
    const settings = controls();
    const [y, null_] = condition($("prompt").value, +$("class").value);
    const seed = +$("seed").value, n = meta.image.channels * size * size, noise = gaussian(seed, n);
    settings.fresh = (i) => gaussian(seed + 1000003 * (i + 1), n);  // the ancestral steps' noise, per seed
    let total = 0;
    await sampler.sample(noise, y, null_, settings, async (i, t, x, ms) => {
      total += ms; draw(meta, x);
      $("status").textContent = `step ${i + 1}/${settings.steps}: ${ms.toFixed(0)} ms (${total.toFixed(0)} ms in all)`;
      await new Promise(requestAnimationFrame);  // let the canvas show this step
    });
    $("go").disabled = false;
  };
}

main().catch((e) => {
  errors.push(String(e)); $("about").textContent = "Could not load the model: " + e;
  if (new URLSearchParams(location.search).get("test"))
    fetch("/result", { method: "POST", body: JSON.stringify({ pixels: [], errors }) });
});
