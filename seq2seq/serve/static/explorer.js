// The attention explorer: translate with one run or two, or force both to one target, and
// read every attention they have. Everything comes from this server: GET /runs, POST /translate.
// The page's state is one object: what was last translated, the server's answers to it, and
// how they are shown (sentence, attention kind, layer, head, ...). Both panels, the address bar
// (so a view is a permalink) and the exports are drawn from it, never from the input boxes: a
// sentence typed but not translated shows in its box alone.
"use strict";

const $ = (selector, root = document) => root.querySelector(selector);
const runs = {};  // name -> GET /runs' description
let limits = {max_lines: Infinity, max_chars: Infinity};
const state = {
  // What was translated: {lines, a, b, compare ("", "reference", "a" or "b"), references};
  // null before the first translation. Set only when its answers are in.
  request: null,
  panels: [],  // The answers to it: [{run, answer}], one per run.
  sentence: 0, kind: "cross", layer: 1, head: "mean", rescale: false, zoom: 1,
  map: "difference",  // Differential attention: its weights, or one of the two maps they are.
};
const VIEW = ["sentence", "kind", "layer", "head", "map", "rescale", "zoom"];  // How it is shown.
// Differential attention's views (an answer's `maps`): its weights, map 1 - lambda map 2, or
// one of the two softmax maps.
const MAPS = {difference: "map 1 \u2212 \u03bb\u00b7map 2 (its weights)", map1: "map 1",
              map2: "map 2"};
const KINDS = {  // kind -> [the answer's field, what the rows are, what the columns are, name]
  cross: ["weights", "target", "source", "cross-attention (target on source)"],
  encoder: ["encoder", "source", "source", "encoder self-attention (source on source)"],
  // The decoder's columns are what it read: <s>, then the target but its last subword.
  decoder: ["decoder", "target", "target_inputs",
            "decoder self-attention (target on what the decoder read before it)"],
};
const SERVER_DOWN = "The server cannot be reached: is seq2seq-serve still running? Start it" +
  " again, then press Translate.";

function el(tag, attributes = {}, text = "") {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attributes)) e.setAttribute(k, v);
  if (text !== "") e.textContent = text;
  return e;
}

function option(value, text) {
  return el("option", {value}, text);
}

function setStatus(text, kind = "") {  // kind: "", "error" or "warning"
  const s = $("#status");
  s.textContent = text;
  s.className = kind;
}

// A subword as a reader sees it: "▁" marks a word's start and is not shown; a piece that
// continues a word begins with "·". Special pieces (</s>, <unk>) stay as they are.
function piece(p) {
  if (/^<.+>$/.test(p)) return {text: p, start: true, unk: p === "<unk>"};
  if (p.startsWith("\u2581")) return {text: p.slice(1) || "\u2423", start: true, unk: false};
  return {text: "\u00b7" + p, start: false, unk: false};
}

// A weight as the read-out and the figures write it: an exact 0 as such, a weight under
// 0.001 in 3 digits of its own (the API sends each float32 whole: 0.00004 is not 0).
function weightText(v) {
  if (v === 0) return "0 (exactly)";
  return Math.abs(v) >= 1e-3 ? v.toFixed(4) : v.toExponential(2);
}

// Whether a map's cell is drawn as exactly 0 (hatched grey, `td.zero`), apart from a small
// weight: in a run's map (not in a difference of two, `diverging` true), a value that is 0.
function exactZero(v, diverging) {
  return v === 0 && diverging !== true;
}

const ZERO_FILL = "#c3c9d0";  // A thumbnail's exact 0, where a cell is too small to hatch.

function label(p) {
  const {text, unk} = piece(p);
  return el("span", unk ? {class: "unk", title: "not in the run's vocabulary"} : {}, text);
}

// ---------------------------------------------------------------------------------------
// The state in the address bar.

// The address of what is shown: the request translated, and the view.
function writeUrl() {
  const {lines, a, b, compare, references} = state.request;
  const q = new URLSearchParams({text: lines.join("\n"), a});
  if (b) q.set("b", b);
  if (compare) {
    q.set("compare", compare);
    if (compare === "reference") q.set("ref", references.join("\n"));
  }
  for (const k of VIEW) q.set(k, String(state[k]));
  history.replaceState(null, "", "#" + q.toString());
}

function readUrl() {
  const q = new URLSearchParams(location.hash.slice(1));
  if (!q.has("text")) return false;
  $("#source").value = q.get("text");
  if (q.get("a") in runs) $("#run-a").value = q.get("a");
  $("#run-b").value = q.get("b") in runs ? q.get("b") : "";
  $("#compare").checked = q.has("compare");
  if (q.has("compare")) $("#target-from").value = q.get("compare");
  $("#reference").value = q.get("ref") || "";
  state.sentence = Math.max(0, Number(q.get("sentence")) || 0);
  state.kind = q.get("kind") in KINDS ? q.get("kind") : "cross";
  state.layer = Math.max(1, Number(q.get("layer")) || 1);
  state.head = q.get("head") === "mean" || !q.has("head") ? "mean"
    : Math.max(1, Number(q.get("head")) || 1);
  state.map = q.get("map") in MAPS ? q.get("map") : "difference";
  state.rescale = q.get("rescale") === "true";
  state.zoom = Number(q.get("zoom")) || 1;
  syncControls();
  return true;
}

function syncControls() {
  const comparing = $("#compare").checked;
  $("#target-from-label").hidden = !comparing;
  $("#reference-box").hidden = !comparing || $("#target-from").value !== "reference";
  $("#rescale").checked = state.rescale;
  $("#zoom").value = String(state.zoom);
}

// ---------------------------------------------------------------------------------------
// Requests.

async function loadRuns() {
  let answer;
  try {
    answer = await (await fetch("/runs")).json();
  } catch (e) {
    return setStatus(SERVER_DOWN, "error");
  }
  limits = answer.limits;
  const a = $("#run-a"), b = $("#run-b");
  b.append(option("", "(none)"));
  for (const run of answer.runs) {
    runs[run.name] = run;
    const text = `${run.name}: ${run.family}, ${run.attention_described}`;
    a.append(option(run.name, text));
    b.append(option(run.name, text));
  }
  if (answer.runs.length > 1) b.value = answer.runs[1].name;
  $("#limits").textContent = `Limits: ${limits.max_lines} sentences at once, ` +
    `${limits.max_chars} characters each; ` + answer.runs.map(
      (r) => `${r.name} translates sentences of up to ${r.max_subwords} subwords`).join(", ") +
    ".";
  const restored = readUrl();
  setStatus("Ready.");
  if (restored) translate();
}

async function post(body) {
  let response;
  try {
    response = await fetch("/translate", {
      method: "POST", headers: {"Content-Type": "application/json"},
      body: JSON.stringify(body)});
  } catch (e) {
    throw new Error(SERVER_DOWN);
  }
  let answer;
  try {
    answer = await response.json();
  } catch (e) {
    throw new Error(`The server answered ${response.status} without a reason; try again.`);
  }
  if (!response.ok) throw new Error(`${body.run}: ${answer.detail}`);
  return answer;
}

function lines(box) {
  return box.value.split("\n").map((l) => l.trim()).filter((l) => l);
}

// Why the page will not send the request (in its own terms), or "".
function refusal({lines: text, a, b, compare, references}) {
  if (!text.length) return "Type a sentence first.";
  if (text.length > limits.max_lines)
    return `There are ${text.length} lines; this server takes at most ${limits.max_lines}` +
      ` at once: remove ${text.length - limits.max_lines}.`;
  const long = text.findIndex((l) => l.length > limits.max_chars);
  if (long >= 0)
    return `Line ${long + 1} has ${text[long].length} characters; this server takes at most` +
      ` ${limits.max_chars} per line: shorten it.`;
  if (!compare) return "";
  if (!b) return "Comparing on one target needs two runs: pick a second one beside the first.";
  if (runs[a].vocabulary !== runs[b].vocabulary)
    return `${a} and ${b} have different vocabularies, so one target splits into other` +
      " subwords for each and their maps cannot be compared cell by cell: untick 'compare on" +
      " one target' to see each run's own translation.";
  if (compare === "reference" && references.length !== text.length)
    return `There are ${text.length} sentences and ${references.length} references: give one` +
      " reference per sentence, in order.";
  return "";
}

// Translates what the input boxes say; the state (and with it the maps, the address and the
// exports) changes only once every answer is in.
async function translate() {
  const request = {lines: lines($("#source")), a: $("#run-a").value, b: $("#run-b").value,
                   compare: $("#compare").checked ? $("#target-from").value : "",
                   references: lines($("#reference"))};
  const refused = refusal(request);
  if (refused) return refuse(refused);
  const button = $("#translate");
  button.disabled = true;
  setStatus("Translating…");
  try {
    const panels = await answers(request);
    Object.assign(state, {request, panels,
                          sentence: Math.min(state.sentence, request.lines.length - 1)});
    const warned = panels.flatMap((p) => (p.answer.warnings || []).filter(Boolean)
      .map((w) => `${p.run}: ${w}`));
    if (warned.length) {
      setStatus(`Done, with ${warned.length > 1 ? warned.length + " warnings" : "a warning"}` +
                ` (each panel shows its own): ${warned[0]}`, "warning");
    } else {
      setStatus("Done.");
    }
    render();
    revealFirstMap();
  } catch (e) {
    refuse(e.message);
  } finally {
    button.disabled = false;
  }
}

// Scrolls the new maps into view where the first one's top rows are below the window (a
// window 720 px high, sentences that wrap): the sentences and the pickers come to the top.
function revealFirstMap() {
  const rows = $("#panels table.heatmap tbody");
  if (rows && rows.getBoundingClientRect().top + 48 > window.innerHeight)
    $("#result").scrollIntoView({block: "start"});
}

// A refusal, the page's or the server's: says why, and leaves the state, so the maps on
// screen stay those of the last translation.
function refuse(reason) {
  setStatus(reason + (state.request ? " (The maps shown are still the last translation's.)" :
                                      ""), "error");
}

// The server's answers to `request`: [{run, answer}], one per run.
async function answers({lines: text, a, b, compare, references}) {
  const names = b ? [a, b] : [a];
  let found;
  if (!compare) {
    found = await Promise.all(names.map((run) => post({text, run, attention: true})));
  } else {
    let targets = references, subwords = null, why = [];
    if (compare !== "reference") {
      // Its subwords as its search split them: its text may split otherwise (a lone "▁").
      const own = await post({text, run: compare === "a" ? a : b, attention: true});
      targets = own.translations.map((t) => t || null);
      subwords = (own.attention || []).map((found) => (found ? found.target : null));
      why = own.errors || [];  // The server's reason where a sentence failed.
    }
    found = await Promise.all(names.map((run) => forced(text, run, targets, why, subwords)));
  }
  return found.map((answer, i) => ({run: names[i], answer}));
}

// A run forced to `targets` (null where there is none to force: `why` has the server's reason
// where the run that gave them failed on it), sent as `subwords` where a run gave them: the
// sentences with a target are sent, and the answer is spread back over every line.
async function forced(text, run, targets, why, subwords) {
  const sent = text.map((_, i) => i).filter((i) => targets[i]);
  const missing = (i) => why[i] || `the target of sentence ${i + 1} is empty: the run that` +
    " gave it translated it to nothing, so there is nothing to force.";
  if (!sent.length) throw new Error(why.find(Boolean) ||
                                    "Every target is empty: type references instead.");
  const given = subwords ? {target_subwords: sent.map((i) => subwords[i])}
                         : {target: sent.map((i) => targets[i])};
  const answer = await post({text: sent.map((i) => text[i]), run, attention: true, ...given});
  const spread = (field) => text.map((_, i) => {
    const k = sent.indexOf(i);
    return k < 0 ? null : (answer[field] || [])[k] ?? null;
  });
  const errors = text.map((_, i) => {
    const k = sent.indexOf(i);
    return k < 0 ? missing(i) : (answer.errors || [])[k] ?? null;
  });
  return {...answer, translations: spread("translations"), scores: spread("scores"),
          attention: spread("attention"), warnings: spread("warnings"), errors};
}

// ---------------------------------------------------------------------------------------
// What is shown.

// The matrix a panel shows for the state: {rows, columns, values, about}, or {missing}.
function matrix(panel) {
  const attention = panel.answer.attention?.[state.sentence];
  if (!attention) return {missing: panel.answer.errors?.[state.sentence] || "no attention"};
  const [field, rows, columns, name] = KINDS[state.kind];
  if (!attention[field]) return {missing: `${panel.run} (${runs[panel.run].family}) has no` +
                                          ` ${name}; its one attention is the cross-attention.`};
  // Differential attention: the map picked, or its weights (map 1 - lambda map 2), which may
  // be negative (`signed`).
  const maps = attention.maps?.[field];
  const part = maps && state.map !== "difference" ? state.map : null;
  const all = part ? maps[part] : attention[field];
  const layer = Math.min(state.layer, all.length);
  const heads = all[layer - 1];
  const head = state.head === "mean" ? "mean" : Math.min(state.head, heads.length);
  const values = head === "mean"
    ? heads[0].map((row, r) => row.map((_, c) => heads.reduce((s, h) => s + h[r][c], 0) /
                                                 heads.length))
    : heads[head - 1];
  const lambda = maps ? maps.lambda[layer - 1] : null;
  const map = !maps ? "" : part ? `, ${MAPS[part]}`
    : `, map 1 \u2212 \u03bb\u00b7map 2 (\u03bb ${lambda.toFixed(3)})`;
  const about = `${name}${map}, layer ${layer} of ${all.length}, ` + (
    heads.length === 1 ? "its one head"
      : head === "mean" ? `mean of ${heads.length} heads` : `head ${head} of ${heads.length}`);
  // A gated output: the gate on each head's output per row ([head][row]); the mean of the
  // heads' for their mean.
  const gates = attention.gates?.[field]?.[layer - 1];
  const gate = !gates ? null : head === "mean"
    ? gates[0].map((_, r) => gates.reduce((s, g) => s + g[r], 0) / gates.length)
    : gates[head - 1];
  return {rows: attention[rows], columns: attention[columns], values, about, layer, head,
          source: attention.source, all, signed: Boolean(maps) && !part, lambda, gate, gates};
}

function rescaled(values) {
  if (!state.rescale) return values;
  return values.map((row) => {
    const most = Math.max(...row.map(Math.abs));
    return most > 0 ? row.map((v) => v / most) : row;
  });
}

// A value's colour on white: weights (0 clear, 1 full blue); `diverging` true, a difference
// of two maps (red above 0, blue below); "signed", weights that may be negative (blue above 0
// as any weight, red below).
function color(w, diverging = false) {
  const a = Math.min(1, Math.abs(w)).toFixed(3);
  if (diverging === "signed") return w >= 0 ? `rgba(25, 80, 190, ${a})`
    : `rgba(190, 40, 40, ${a})`;
  if (diverging) return w >= 0 ? `rgba(190, 40, 40, ${a})` : `rgba(25, 80, 190, ${a})`;
  return `rgba(25, 80, 190, ${Math.min(1, Math.max(0, w)).toFixed(3)})`;
}

// A gate's colour on white: 0 (the head's output shut) clear, 1 (passed whole) full green.
function gateColor(g) {
  return `rgba(30, 130, 70, ${Math.min(1, Math.max(0, g)).toFixed(3)})`;
}

// How cells of `shown` are drawn (`color`'s second argument).
function mode(shown) {
  return shown.signed ? "signed" : false;
}

function render() {
  $("#result").hidden = false;
  // A cell read out before is not on screen any more (another sentence, run, layer, ...).
  $("#readout").textContent = "\u00a0";
  renderSentences();
  renderPickers();
  $("#panels").style.setProperty("--columns", String(state.panels.length));
  const shown = state.panels.map((panel, i) => renderPanel(["panel-a", "panel-b"][i], panel,
                                                             "AB"[i]));
  $("#panel-b").hidden = state.panels.length < 2;
  renderDifference(shown);
  writeUrl();
}

function renderSentences() {
  const list = $("#sentences");
  list.replaceChildren();
  state.request.lines.forEach((line, i) => {
    const item = el("li", {}, line);
    const failed = state.panels.map((p) => p.answer.errors?.[i]).filter(Boolean);
    if (failed.length) {
      item.classList.add("failed");
      item.title = failed.join(" ");
    }
    if (i === state.sentence) item.classList.add("current");
    item.addEventListener("click", () => { state.sentence = i; render(); });
    list.append(item);
  });
}

function fill(select, values, current) {
  select.replaceChildren(...values.map(([v, t]) => option(String(v), t)));
  select.value = String(current);
  select.disabled = values.length < 2;
}

function renderPickers() {
  const found = state.panels.map((p) => p.answer.attention?.[state.sentence]).filter(Boolean);
  const kinds = Object.keys(KINDS).filter((k) => found.some((a) => a[KINDS[k][0]]));
  if (!kinds.includes(state.kind)) state.kind = "cross";
  fill($("#kind"), kinds.map((k) => [k, KINDS[k][3]]), state.kind);
  const field = KINDS[state.kind][0];
  const layers = Math.max(1, ...found.filter((a) => a[field]).map((a) => a[field].length));
  const heads = Math.max(1, ...found.filter((a) => a[field]).map((a) => a[field][0].length));
  state.layer = Math.min(state.layer, layers);
  if (state.head !== "mean") state.head = Math.min(state.head, heads);
  fill($("#layer"), [...Array(layers).keys()].map((i) => [i + 1, String(i + 1)]), state.layer);
  if (heads === 1) state.head = "mean";  // Its one head: nothing to pick.
  fill($("#head"), heads === 1 ? [["mean", "1"]] : [
    ["mean", "mean of the heads"], ...[...Array(heads).keys()].map((i) => [i + 1, String(i + 1)])],
  state.head);
  // Differential attention's two maps, beside its weights: a picker where a run has them.
  const differential = found.some((a) => a.maps?.[field]);
  $("#map-label").hidden = !differential;
  if (differential) fill($("#map"), Object.entries(MAPS), state.map);
}

function renderPanel(id, panel, letter) {
  const section = $("#" + id);
  section.hidden = false;
  section.replaceChildren();
  const info = runs[panel.run], answer = panel.answer, i = state.sentence;
  section.append(el("h2", {}, state.panels.length > 1 ? `${letter}: ${info.name}`
                                                         : info.name));
  // What the run is: its family and attention; its direction, size and parameters (a
  // released model's average, as its released.json says); and how it was asked.
  section.append(el("p", {class: "about"},
    `${info.family}, ${info.attention_described}; ${info.described}; ` +
    (state.request.compare ? "forced to the target" : `beam ${answer.beam}`)));
  const translation = answer.translations[i];
  const line = el("p", {class: "translation-line"});
  if (translation === null) {
    line.append(el("span", {class: "error"}, `Line ${i + 1}: ${answer.errors[i]}`));
  } else {
    // The score is what the beam ranks by: not a mean per subword, so say what it is.
    line.append(el("span", {class: "translation"}, translation), " ",
                el("span", {class: "score", title: "The sum of the log-probabilities of its" +
                            " subwords and </s>, divided by ((5 + length) / 6) ^ alpha."},
                   `(score ${answer.scores[i].toFixed(3)}: log-probability / GNMT length` +
                   ` penalty, alpha ${info.alpha})`));
  }
  section.append(line);
  const warning = answer.warnings?.[i];
  if (warning) section.append(el("p", {class: "warning"}, `Warning: ${warning}`));
  const shown = matrix(panel);
  if (shown.missing) {
    if (translation !== null) section.append(el("p", {class: "note"}, shown.missing));
    return null;
  }
  section.append(el("p", {class: "shows"}, "Shows: " + shown.about));
  section.append(sourceLine(shown.source));
  section.append(heatmap(id, shown.rows, shown.columns, rescaled(shown.values), mode(shown), 1,
                         shown.gate));
  const scale = weightScale(panel, shown);
  section.append(colourBar(scale));
  if (shown.gate) section.append(gateNote(panel, shown));
  section.append(overview(panel, shown));
  section.append(exports({...shown, values: rescaled(shown.values), runs: [panel.run],
                          title: `${panel.run}: ${shown.about}`}, scale));
  return shown;
}

// What the gate strip (the column right of a gated run's map) shows, and each head's gate in
// the layer shown, the head shown in bold.
function gateNote(panel, shown) {
  const note = el("p", {class: "gates about"});
  const mean = (values) => values.reduce((s, g) => s + g, 0) / values.length;
  const elementwise = runs[panel.run].attention_gate === "elementwise";
  const whose = shown.head === "mean" ? "the mean of the heads' gates on their outputs"
    : `head ${shown.head}'s gate on its output`;
  note.append(`Gate column: ${whose}, per row, from 0 (shut) to 1 (passed` +
              " whole)" + (elementwise ? ", each the mean over the head's features (an" +
                                         " element-wise gate)" : "") +
              `; mean ${mean(shown.gate).toFixed(3)}. Mean gate by head in layer ${shown.layer}:`);
  shown.gates.forEach((values, h) => {
    note.append(" ");
    const value = el("span", {class: "gate-value", "data-head": h + 1},
                     `${h + 1}: ${mean(values).toFixed(3)}`);
    if (h + 1 === shown.head) value.classList.add("current");
    note.append(value);
  });
  return note;
}

function sourceLine(source) {
  const line = el("p", {class: "source-line"});
  source.forEach((p, i) => {
    const {text, start, unk} = piece(p);
    if (start && i > 0) line.append(" ");
    // A lone word-start mark is the space itself (its span stays: spans are the columns).
    const shown = p === "\u2581" ? "" : start ? text : text.slice(1);
    const span = el("span", unk ? {class: "unk", title: "not in the run's vocabulary"} : {},
                    shown);
    line.append(span);
  });
  return line;
}

// A heatmap that fits its panel: cells sized to the width left by the row labels (times the
// zoom), column labels written upwards, row labels sticky when a zoom makes it scroll. With
// `gate` (a value per row), a last column shows it (`td.gate`, green: `gateColor`).
function heatmap(id, rows, columns, values, diverging = false, most = 1, gate = null) {
  const wrap = el("div", {class: "map"});
  const width = $("#panels").clientWidth / (state.panels.length > 1 && id !== "panel-diff"
                                             ? 2 : 1) - 60;
  const labelWidth = Math.min(140, 12 + 7 * Math.max(...rows.map((r) => piece(r).text.length)));
  const fit = Math.floor((width - labelWidth) / (columns.length + (gate ? 1 : 0)));
  const cell = Math.max(4, Math.min(26, fit) * state.zoom);
  const font = Math.max(6, Math.min(12, cell - 2));
  const table = el("table", {class: "heatmap"});
  table.style.setProperty("--cell", `${cell}px`);
  table.style.setProperty("--font", `${font}px`);
  // Column labels as tall as the longest one, not a fixed height: the map starts higher.
  const tallest = cell >= 7 ? Math.max(...columns.map((c) => measure(
    piece(c).text, `${font}px ${getComputedStyle(document.body).fontFamily}`))) : 0;
  table.style.setProperty("--labels", `${Math.min(88, tallest + 6)}px`);
  const top = el("tr");
  top.append(el("th", {class: "corner"}));
  columns.forEach((c) => {
    const th = el("th", {title: c});
    if (cell >= 7) th.append(label(c));
    top.append(th);
  });
  if (gate) top.append(el("th", {class: "gate", title: "the gate on the head's output"},
                          cell >= 7 ? "gate" : ""));
  table.append(el("thead"));
  table.tHead.append(top);
  const body = el("tbody");
  rows.forEach((r, row) => {
    const tr = el("tr");
    const th = el("th", {title: r});
    th.style.maxWidth = `${labelWidth}px`;
    th.append(label(r));
    tr.append(th);
    values[row].forEach((value, column) => {
      const td = el("td", {"data-w": String(value)});
      // The colour alone (not the shorthand): an exact 0 adds its hatching (`td.zero`).
      td.style.backgroundColor = color(value / most, diverging);
      if (exactZero(value, diverging)) td.classList.add("zero");
      td.addEventListener("mouseenter", () => {
        $("#readout").textContent = `${$("#" + id + " h2").textContent}: row ` +
          `${row + 1} "${piece(r).text}", column ${column + 1} "${piece(columns[column]).text}"` +
          `: ${weightText(value)}` + (state.rescale && diverging !== true && value !== 0
                                      ? " (rescaled)" : "");
      });
      tr.append(td);
    });
    if (gate) {
      const td = el("td", {class: "gate", "data-gate": gate[row].toFixed(4)});
      td.style.background = gateColor(gate[row]);
      td.addEventListener("mouseenter", () => {
        $("#readout").textContent = `${$("#" + id + " h2").textContent}: row ${row + 1} ` +
          `"${piece(r).text}", gate ${gate[row].toFixed(4)}`;
      });
      tr.append(td);
    }
    tr.addEventListener("mouseenter", () => hover(row));
    tr.addEventListener("mouseleave", () => hover(null));
    body.append(tr);
  });
  table.append(body);
  wrap.append(table);
  return wrap;
}

// Hovering row `row` in one panel highlights it in every panel, and shades each panel's
// source line by that row's weights (cross-attention only: its columns are the source).
function hover(row) {
  for (const [i, id] of ["panel-a", "panel-b", "panel-diff"].entries()) {
    const section = $("#" + id);
    if (section.hidden) continue;
    section.querySelectorAll("table.heatmap tbody tr").forEach((tr, r) =>
      tr.classList.toggle("hover", r === row));
    const spans = section.querySelectorAll(".source-line span");
    const panel = state.panels[i];
    const shown = panel && state.kind === "cross" ? matrix(panel) : null;
    spans.forEach((span, c) => {
      const w = row !== null && shown && !shown.missing ? shown.values[row]?.[c] : undefined;
      span.style.background = w === undefined ? "" : color(w, mode(shown));
      span.style.color = Math.abs(w) > 0.5 ? "#fff" : "";
    });
  }
}

// The scales cells are drawn on, {low, high, diverging, legend}: a cell of value v has the
// colour the bar has at v's place between `low` and `high`. Weights are drawn as they are,
// 0 clear and 1 full colour, whatever the map's largest: a colour is one weight in every
// panel, layer, head and thumbnail, so A and B can be read against each other. (Scaled to
// each map's largest, A's full colour could be 0.3 and B's 0.9.) Weights that may be negative
// (differential attention's) run from -1, red, through 0, clear, to 1, blue. The legend says
// where a run's weights do not sum to one over a row (its normalizer's, GET /runs).
function weightScale(panel, shown) {
  const info = runs[panel.run];
  let legend = state.rescale ? "each row's weights over the row's largest" : "attention weight";
  if (shown.signed) {
    legend = (state.rescale ? "each row over its largest size; " : "") + "weight = map 1" +
      " \u2212 \u03bb\u00b7map 2: blue, positive; red, negative (a row sums to" +
      ` 1 \u2212 \u03bb, \u03bb ${shown.lambda.toFixed(3)})`;
  }
  if (info.weights_sum_to_one === false)
    legend += `; ${info.attention_normalizer} weights need not sum to one: each is between 0` +
      " and 1 on its own";
  // A map with weights that are exactly 0 (a sparse normalizer's, a causal mask's) draws them
  // hatched, apart from small weights; its legend says so.
  const zeros = shown.values.some((row) => row.some((v) => v === 0));
  return shown.signed ? {low: -1, high: 1, diverging: false, signed: true, legend, zeros}
    : {low: 0, high: 1, diverging: false, legend, zeros};
}

function differenceScale(most) {
  const [a, b] = state.panels.map((p) => p.run);
  return {low: -most, high: most, diverging: true,
          legend: `A minus B: red, A (${a}) attends more; blue, B (${b}) does`};
}

function number(v) {  // A scale's end, as short as its precision allows.
  return String(Number(v.toPrecision(3)));
}

function colourBar(scale) {
  const bar = el("div", {class: "colour-bar"});
  bar.append(el("span", {class: "low"}, number(scale.low)),
             el("span", {class: scale.diverging ? "scale diverging"
                                  : scale.signed ? "scale signed" : "scale"}),
             el("span", {class: "high"}, number(scale.high)),
             el("span", {class: "about"}, scale.legend));
  if (scale.zeros) {
    bar.append(el("span", {class: "zero-key", title: "A weight that is exactly 0, not a small" +
                                                     " one (0.0002 is drawn as a weight)"},
                  ""));
    bar.lastChild.append(el("span", {class: "swatch zero"}), "exactly 0");
  }
  return bar;
}

// Every layer and head of the kind shown, as small maps (bertviz's model view); a click
// opens one.
function overview(panel, shown) {
  const box = el("div", {class: "overview"});
  const layers = shown.all, heads = layers[0].length;
  if (layers.length * heads === 1) return box;
  box.append(el("p", {class: "about"}, "Every layer (rows) and head (columns); click one:"));
  const grid = el("div", {class: "grid"});
  grid.style.gridTemplateColumns = `repeat(${heads}, auto)`;
  const gates = panel.answer.attention[state.sentence].gates?.[KINDS[state.kind][0]];
  layers.forEach((layer, l) => layer.forEach((values, h) => {
    const gate = gates ? gates[l][h].reduce((s, g) => s + g, 0) / gates[l][h].length : null;
    const canvas = el("canvas", {class: "thumb", "data-layer": l + 1, "data-head": h + 1,
                                 title: `layer ${l + 1}, head ${h + 1}` +
                                   (gate === null ? "" : `, mean gate ${gate.toFixed(3)}`)});
    draw(canvas, rescaled(values), Math.max(1, Math.floor(64 / Math.max(values.length,
                                                                         values[0].length))),
         mode(shown));
    if (l + 1 === shown.layer && h + 1 === shown.head) canvas.classList.add("current");
    canvas.addEventListener("click", () => {
      state.layer = l + 1;
      state.head = h + 1;
      render();
    });
    grid.append(canvas);
  }));
  box.append(grid);
  return box;
}

function draw(canvas, values, cell, diverging = false) {
  canvas.width = values[0].length * cell;
  canvas.height = values.length * cell;
  const g = canvas.getContext("2d");
  g.fillStyle = "#fff";
  g.fillRect(0, 0, canvas.width, canvas.height);
  values.forEach((row, r) => row.forEach((v, c) => {
    g.fillStyle = exactZero(v, diverging) ? ZERO_FILL : color(v, diverging);
    g.fillRect(c * cell, r * cell, cell, cell);
  }));
}

function renderDifference(shown) {
  const section = $("#panel-diff");
  section.replaceChildren();
  section.hidden = !state.request.compare || shown.length < 2;
  if (section.hidden) return;
  const [a, b] = shown, [runA, runB] = state.panels.map((p) => p.run);
  section.append(el("h2", {}, `Difference: ${runA} minus ${runB}`));
  if (!a || !b || a.values.length !== b.values.length ||
      a.values[0].length !== b.values[0].length) {
    section.append(el("p", {class: "note"}, "Both runs need this attention for this sentence" +
                                            " to be compared."));
    return;
  }
  const diff = rescaled(a.values).map((row, r) => row.map((v, c) => v -
                                                          rescaled(b.values)[r][c]));
  const most = Math.max(1e-9, ...diff.flat().map(Math.abs));
  const scale = differenceScale(most);
  section.append(el("p", {class: "shows"}, `Shows: A: ${a.about}; B: ${b.about}. Cells are` +
                                           " A - B."));
  section.append(heatmap("panel-diff", a.rows, a.columns, diff, true, most), colourBar(scale));
  section.append(exports({...a, values: diff, runs: [runA, runB],
                          title: `${runA} minus ${runB}: A: ${a.about}; B: ${b.about}`}, scale));
}

// ---------------------------------------------------------------------------------------
// Export: the map shown as SVG or PNG (the SVG drawn), each a figure that stands alone (the
// runs, the sentence, what is shown, the colour scale with its range and, for a difference,
// its sign), and its weights as JSON, with the same.

function exports(shown, scale) {
  const box = el("div", {class: "exports"});
  const map = shown.lambda === null || shown.lambda === undefined ? "" : `-${state.map}`;
  const base = (`${shown.runs.join("-minus-")}-${state.kind}${map}-layer${shown.layer}` +
                `-head${shown.head}-sentence${state.sentence + 1}`).replace(/[^\w.-]+/g, "_");
  const sentence = `Sentence ${state.sentence + 1}: ${state.request.lines[state.sentence]}`;
  const picture = () => svg(shown, scale, sentence);
  const buttons = {
    PNG: () => png(picture()).then((blob) => save(blob, base + ".png")),
    SVG: () => save(new Blob([picture().text], {type: "image/svg+xml"}), base + ".svg"),
    JSON: () => save(new Blob([JSON.stringify({
      runs: shown.runs, sentence: state.sentence + 1, text: state.request.lines[state.sentence],
      kind: state.kind, shows: shown.title, rows: shown.rows, columns: shown.columns,
      weights: shown.values, ...(shown.gate ? {gate: shown.gate} : {}), scale}, null, 1)],
                              {type: "application/json"}), base + ".json"),
  };
  box.append(el("span", {class: "about"}, "Export: "));
  for (const [format, action] of Object.entries(buttons)) {
    const button = el("button", {type: "button", class: "export", "data-format": format},
                      format);
    button.addEventListener("click", action);
    box.append(button);
  }
  return box;
}

function save(blob, filename) {
  const a = el("a", {href: URL.createObjectURL(blob), download: filename});
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 10_000);
}

const CELL = 16, PAD = 8, FONT = "11px sans-serif", BOLD = "bold 12px sans-serif";

function escapeXml(s) {
  return s.replace(/[<>&"]/g, (c) => ({"<": "&lt;", ">": "&gt;", "&": "&amp;",
                                       "\"": "&quot;"})[c]);
}

// Text widths as the browser draws them, so that the picture is as wide as its longest line.
const measure = (() => {
  const g = document.createElement("canvas").getContext("2d");
  return (text, font = FONT) => { g.font = font; return Math.ceil(g.measureText(text).width); };
})();

// An exact 0 in a figure: grey hatching on white, as on the page (`td.zero`), and its key.
const HATCH = '<pattern id="zero" width="4" height="4" patternUnits="userSpaceOnUse"' +
  ' patternTransform="rotate(45)"><rect width="4" height="4" fill="#fff"/>' +
  '<rect width="1.5" height="4" fill="#8a949e"/></pattern>';
const ZERO_KEY = "exactly 0";

// The map as an SVG figure: {text, width, height}.
function svg(shown, scale, sentence) {
  const rows = shown.rows.map((r) => piece(r).text);
  const columns = shown.columns.map((c) => piece(c).text);
  const left = PAD + Math.max(...rows.map((r) => measure(r))) + 6;
  const head = 2 * 18 + 4, top = head + Math.max(...columns.map((c) => measure(c))) + 6;
  const [low, high] = [number(scale.low), number(scale.high)];
  const bar = top + CELL * rows.length + 14, barX = PAD + measure(low) + 4;
  const legendX = barX + 164 + measure(high) + 8;
  const zeroX = legendX + measure(scale.legend) + 16;  // The key of exact zeros, where any.
  const width = PAD + Math.max(left + CELL * columns.length, measure(shown.title, BOLD) + PAD,
                               measure(sentence) + PAD, legendX + measure(scale.legend),
                               scale.zeros ? zeroX + 16 + measure(ZERO_KEY) : 0);
  const height = bar + 24;
  const stops = scale.diverging || scale.signed
    ? (scale.signed ? ["rgb(190, 40, 40)", "#fff", "rgb(25, 80, 190)"]
      : ["rgb(25, 80, 190)", "#fff", "rgb(190, 40, 40)"]).map((c, i) =>
      `<stop offset="${i / 2}" stop-color="${c}"/>`)
    : ['<stop offset="0" stop-color="rgb(25, 80, 190)" stop-opacity="0"/>',
       '<stop offset="1" stop-color="rgb(25, 80, 190)"/>'];
  const parts = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}"` +
    ` font-family="sans-serif" font-size="11">`,
    `<rect width="${width}" height="${height}" fill="#fff"/>`,
    `<text x="${PAD}" y="18" font-weight="bold" font-size="12">${escapeXml(shown.title)}</text>`,
    `<text x="${PAD}" y="36">${escapeXml(sentence)}</text>`,
    `<defs><linearGradient id="scale">${stops.join("")}</linearGradient>${HATCH}</defs>`,
    `<text x="${PAD}" y="${bar + 10}">${low}</text>`,
    `<rect x="${barX}" y="${bar}" width="160" height="12" fill="url(#scale)"/>`,
    `<text x="${barX + 164}" y="${bar + 10}">${high}</text>`,
    `<text x="${legendX}" y="${bar + 10}">${escapeXml(scale.legend)}</text>`];
  if (scale.zeros) {
    parts.push(`<rect x="${zeroX}" y="${bar}" width="12" height="12" fill="url(#zero)"` +
               ' stroke="#ccd3da"/>',
               `<text x="${zeroX + 16}" y="${bar + 10}">${ZERO_KEY}</text>`);
  }
  columns.forEach((c, i) => parts.push(
    `<text transform="translate(${left + i * CELL + 12},${top - 4}) rotate(-90)">` +
    `${escapeXml(c)}</text>`));
  rows.forEach((r, j) => {
    parts.push(`<text x="${left - 4}" y="${top + j * CELL + 12}" text-anchor="end">` +
               `${escapeXml(r)}</text>`);
    shown.values[j].forEach((v, i) => parts.push(
      `<rect x="${left + i * CELL}" y="${top + j * CELL}" width="${CELL}" height="${CELL}"` +
      ` fill="${exactZero(v, scale.diverging) ? "url(#zero)"
        : color(scale.diverging ? v / scale.high : v, scale.signed ? "signed" : scale.diverging)}">` +
      `<title>${weightText(v)}</title></rect>`));
  });
  parts.push("</svg>");
  return {text: parts.join("\n"), width, height};
}

// The SVG figure drawn at twice its size, as a PNG blob.
function png(figure) {
  return new Promise((resolve, reject) => {
    const image = new Image();
    image.onload = () => {
      const canvas = el("canvas", {width: 2 * figure.width, height: 2 * figure.height});
      canvas.getContext("2d").drawImage(image, 0, 0, canvas.width, canvas.height);
      canvas.toBlob(resolve, "image/png");
    };
    image.onerror = () => reject(new Error("The browser could not draw the figure as PNG."));
    image.src = "data:image/svg+xml;charset=utf-8," + encodeURIComponent(figure.text);
  });
}

// ---------------------------------------------------------------------------------------
$("#translate").addEventListener("click", translate);
$("#source").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && (e.ctrlKey || e.metaKey) && !$("#translate").disabled) translate();
});
for (const id of ["compare", "target-from"]) {
  $("#" + id).addEventListener("change", syncControls);  // The next Translate's, not the maps'.
}
const picked = {kind: (v) => v, layer: Number, head: (v) => (v === "mean" ? v : Number(v)),
                map: (v) => v};
for (const [id, read] of Object.entries(picked)) {
  $("#" + id).addEventListener("change", (e) => { state[id] = read(e.target.value); render(); });
}
$("#rescale").addEventListener("change", (e) => { state.rescale = e.target.checked; render(); });
$("#zoom").addEventListener("input", (e) => { state.zoom = Number(e.target.value); render(); });
window.addEventListener("resize", () => { if (state.request) render(); });
loadRuns();
