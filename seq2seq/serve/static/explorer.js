// The attention explorer: translate with one run or two, and read their attention.
// Everything comes from this server: GET /runs, POST /translate.
"use strict";

const $ = (selector, root = document) => root.querySelector(selector);
const runs = {};  // name -> GET /runs' description
const shown = {};  // panel id -> {info, answer, sentence}

function option(value, text) {
  const o = document.createElement("option");
  o.value = value;
  o.textContent = text;
  return o;
}

function el(tag, attributes = {}, text = "") {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attributes)) e.setAttribute(k, v);
  if (text) e.textContent = text;
  return e;
}

async function loadRuns() {
  const answer = await (await fetch("/runs")).json();
  const a = $("#run-a"), b = $("#run-b");
  b.append(option("", "(none)"));
  for (const run of answer.runs) {
    runs[run.name] = run;
    const label = `${run.name}: ${run.family}, ${run.attention}`;
    a.append(option(run.name, label));
    b.append(option(run.name, label));
  }
  if (answer.runs.length > 1) b.value = answer.runs[1].name;
}

function setStatus(text, error = false) {
  const s = $("#status");
  s.textContent = text;
  s.className = error ? "error" : "";
}

async function translate() {
  const lines = $("#source").value.split("\n").map((l) => l.trim()).filter((l) => l);
  if (!lines.length) return setStatus("Type a sentence first.", true);
  setStatus("Translating…");
  const panels = [["panel-a", $("#run-a").value], ["panel-b", $("#run-b").value]];
  const answers = await Promise.all(panels.map(async ([id, run]) => {
    if (!run) return [id, null, null];
    const response = await fetch("/translate", {
      method: "POST", headers: {"Content-Type": "application/json"},
      body: JSON.stringify({text: lines, run, attention: true}),
    });
    return [id, run, {ok: response.ok, body: await response.json()}];
  }));
  let failed = "";
  for (const [id, run, answer] of answers) {
    const panel = $("#" + id);
    panel.hidden = !run;
    if (!run) continue;
    if (!answer.ok) {
      failed = answer.body.detail;
      panel.replaceChildren(el("p", {class: "error"}, `${run}: ${answer.body.detail}`));
      continue;
    }
    shown[id] = {info: runs[run], answer: answer.body, sentence: 0};
    render(id);
  }
  setStatus(failed ? "Refused: " + failed : "Done.", Boolean(failed));
}

function render(id) {
  const {info, answer} = shown[id];
  const panel = $("#" + id);
  panel.replaceChildren();
  panel.append(el("h2", {}, info.name));
  panel.append(el("p", {class: "about"},
    `${info.family}, ${info.attention} attention; checkpoint ${info.checkpoint}` +
    ` (steps ${info.steps.join(", ")}); beam ${answer.beam}`));
  const list = el("ol", {class: "translations"});
  answer.translations.forEach((text, i) => {
    const item = el("li");
    item.append(el("span", {class: "translation"}, text), " ",
                el("span", {class: "score"}, `(${answer.scores[i].toFixed(3)})`));
    item.addEventListener("click", () => { shown[id].sentence = i; render(id); });
    if (i === shown[id].sentence) item.classList.add("current");
    list.append(item);
  });
  panel.append(list);
  const weights = answer.attention[shown[id].sentence].weights;
  const pickers = el("div", {class: "pickers"});
  for (const [name, count] of [["layer", weights.length], ["head", weights[0].length]]) {
    const label = el("label", {}, name + " ");
    const select = el("select", {class: name});
    for (let i = 1; i <= count; i++) select.append(option(String(i), String(i)));
    if (count === 1) select.disabled = true;
    select.addEventListener("change", () => heatmap(id));
    label.append(select);
    pickers.append(label);
  }
  panel.append(pickers, el("div", {class: "source-line"}), el("div", {class: "map"}));
  heatmap(id);
}

function color(w) {
  return `rgba(25, 80, 190, ${Math.min(1, Math.max(0, w)).toFixed(3)})`;
}

function heatmap(id) {
  const panel = $("#" + id);
  const {answer, sentence} = shown[id];
  const attention = answer.attention[sentence];
  const layer = Number($("select.layer", panel).value) - 1;  // Shown from 1.
  const head = Number($("select.head", panel).value) - 1;
  const w = attention.weights[layer][head];
  const sourceLine = $(".source-line", panel);
  sourceLine.replaceChildren(...attention.source.map((s) => el("span", {}, s)));
  const table = el("table", {class: "heatmap"});
  const top = el("tr");
  top.append(el("th"));
  attention.source.forEach((s) => top.append(el("th", {}, s)));
  table.append(el("thead"));
  table.tHead.append(top);
  const body = el("tbody");
  attention.target.forEach((t, row) => {
    const tr = el("tr");
    tr.append(el("th", {}, t));
    w[row].forEach((value) => {
      const td = el("td", {"data-w": value.toFixed(4), title: value.toFixed(3)});
      td.style.background = color(value);
      tr.append(td);
    });
    tr.addEventListener("mouseenter", () => highlight(panel, w[row]));
    tr.addEventListener("mouseleave", () => highlight(panel, null));
    body.append(tr);
  });
  table.append(body);
  $(".map", panel).replaceChildren(table);
}

// The source subwords that one target subword attends to: shaded by weight, the
// strongest in bold.
function highlight(panel, row) {
  const spans = panel.querySelectorAll(".source-line span");
  const heads = panel.querySelectorAll("table.heatmap thead th:not(:first-child)");
  const most = row ? Math.max(...row) : 0;
  spans.forEach((span, i) => {
    span.style.background = row ? color(row[i]) : "";
    span.style.color = row && row[i] > 0.5 ? "#fff" : "";
  });
  heads.forEach((th, i) => th.classList.toggle("attended", Boolean(row) && row[i] === most));
}

$("#translate").addEventListener("click", translate);
$("#source").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) translate();
});
loadRuns().then(() => setStatus("Ready."));
