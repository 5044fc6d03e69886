// aiayn attention explorer: plain JavaScript, canvas only, nothing loaded from elsewhere.
//
// The data is one payload from aiayn.apps.explorer.attention_payload: tokens, the
// translation, and for each kind of attention (encoder, decoder, cross) the weights
// [layer][head][query][key] and per-head metrics (and, when the run has
// heads/heads.json, each head's numbers over the corpus), plus the decoder's logit
// lens of the translation (top-1 piece per layer and position). It is either embedded in the page
// (aiayn attention RUN TEXT --html FILE) or fetched from `aiayn serve`
// (POST v1/translate with "attention": true).
(() => {
  "use strict";

  const KIND_HELP = {
    encoder: "Source tokens attending to source tokens.",
    decoder: "Each target row is a decoder input (bos first) deciding the next token; it sees only earlier tokens.",
    cross: "Each target row (decoder input, bos first) attending to the source tokens.",
    lens: "What each decoder layer would predict next, read through the model's own final norm and output matrix.",
  };
  // heads.json's numbers (aiayn heads), in the order shown: [key, label, digits, unit].
  const CORPUS_METRICS = [
    ["entropy", "entropy", 3, " nats"], ["confidence", "confidence", 3, ""],
    ["offset_-1", "offset −1", 2, ""], ["offset_0", "offset 0", 2, ""], ["offset_+1", "offset +1", 2, ""],
    ["eos", "weight on eos", 3, ""], ["bos", "weight on bos", 3, ""], ["punctuation", "weight on punctuation", 3, ""],
    ["monotonicity", "monotonicity", 3, ""], ["ablation", "ablation (importance)", 4, " nats/token"],
    ["gradient", "gradient (importance)", 4, ""],
  ];
  // Viridis, sampled at 9 points and interpolated: dark purple (0) to yellow (1).
  const VIRIDIS = [
    [68, 1, 84], [71, 44, 122], [59, 81, 139], [44, 113, 142], [33, 144, 141],
    [39, 173, 129], [92, 200, 99], [170, 220, 50], [253, 231, 37],
  ];
  const HEAD_COLOURS = [
    "#4263eb", "#e8590c", "#2f9e44", "#c2255c", "#7048e8", "#0c8599", "#f08c00", "#5c940d",
    "#862e9c", "#1971c2", "#e03131", "#099268", "#a61e4d", "#364fc7", "#d9480f", "#495057",
  ];
  const ROW_PX = 20; // height of one token in the head view
  const THUMB_PX = 120; // the longer side of a thumbnail

  const state = {
    payload: null,
    kind: "encoder",
    layer: 0,
    heads: [], // shown in the head view
    focus: null, // {side: "query" | "key", index}
    images: new Map(), // "kind/layer/head" -> canvas holding one pixel per weight
    thumbs: [], // [layer][head] -> thumbnail canvas
  };
  const $ = (id) => document.getElementById(id);

  // ----- colours and pixels --------------------------------------------------------

  function viridis(w) {
    const x = Math.min(Math.max(w, 0), 1) * (VIRIDIS.length - 1);
    const i = Math.min(Math.floor(x), VIRIDIS.length - 2);
    const t = x - i;
    const a = VIRIDIS[i], b = VIRIDIS[i + 1];
    return [a[0] + t * (b[0] - a[0]), a[1] + t * (b[1] - a[1]), a[2] + t * (b[2] - a[2])];
  }

  // One head's map as an offscreen canvas, one pixel per (query, key): drawn once,
  // then scaled by drawImage wherever it is shown.
  function headImage(kind, layer, head) {
    const key = `${kind}/${layer}/${head}`;
    if (state.images.has(key)) return state.images.get(key);
    const rows = state.payload.attention[kind].weights[layer][head];
    const height = rows.length, width = rows[0].length;
    const canvas = document.createElement("canvas");
    canvas.width = width;
    canvas.height = height;
    const context = canvas.getContext("2d");
    const image = context.createImageData(width, height);
    for (let q = 0; q < height; q++) {
      for (let k = 0; k < width; k++) {
        const [r, g, b] = viridis(rows[q][k]);
        const at = 4 * (q * width + k);
        image.data[at] = r;
        image.data[at + 1] = g;
        image.data[at + 2] = b;
        image.data[at + 3] = 255;
      }
    }
    context.putImageData(image, 0, 0);
    state.images.set(key, canvas);
    return canvas;
  }

  function drawScaled(canvas, image) {
    const context = canvas.getContext("2d");
    context.imageSmoothingEnabled = false;
    context.drawImage(image, 0, 0, canvas.width, canvas.height);
  }

  // ----- tokens, metrics -------------------------------------------------------------

  function tokens(side) {
    const p = state.payload;
    return side === "source" ? p.source_tokens : p.target_tokens;
  }

  const current = () => state.payload.attention[state.kind];
  const fixed = (v, digits = 2) => (v === null || v === undefined ? "–" : Number(v).toFixed(digits));

  function offsetText(m) {
    if (!m.dominant_offset) return null;
    const share = { previous: m["offset_-1"], same: m.offset_0, next: m["offset_+1"] }[m.dominant_offset];
    return `${m.dominant_offset} ${fixed(share)}`;
  }

  function endText(m) {
    if (m.eos !== null && m.eos !== undefined) return `eos ${fixed(m.eos)}`;
    if (m.bos !== null && m.bos !== undefined) return `bos ${fixed(m.bos)}`;
    return null;
  }

  function metricLines(m) {
    const first = `<b>H</b> ${fixed(m.entropy)} <b>conf</b> ${fixed(m.confidence)}`;
    const parts = [offsetText(m), endText(m)];
    if (m.monotonicity !== null && m.monotonicity !== undefined) parts.unshift(`mono ${fixed(m.monotonicity)}`);
    return `${first}<br>${parts.filter(Boolean).join(" · ")}`;
  }

  // ----- the page --------------------------------------------------------------------

  function show(payload) {
    state.payload = payload;
    state.images.clear();
    state.focus = null;
    state.layer = Math.min(state.layer, payload.attention.encoder.weights.length - 1);
    $("translation").textContent = payload.translation;
    $("result").hidden = false;
    describeModel(payload);
    $("lens-tab").hidden = !payload.lens;
    selectKind(state.kind === "lens" && !payload.lens ? "encoder" : state.kind);
  }

  function layersText(encoder, decoder) {
    return encoder === decoder ? `${encoder} layers` : `${encoder} + ${decoder} layers`;
  }

  function describeModel(payload) {
    if ($("model-info").textContent) return; // the server's info said it already
    const m = payload.model || {};
    const parts = [payload.run, m.heads && `${layersText(m.encoder_layers, m.decoder_layers)} × ${m.heads} heads`,
      payload.decode && `beam ${payload.decode.beam}, alpha ${payload.decode.alpha}`];
    $("model-info").textContent = parts.filter(Boolean).join(" · ");
  }

  function selectKind(kind) {
    state.kind = kind;
    for (const tab of document.querySelectorAll(".tabs button")) {
      tab.setAttribute("aria-selected", String(tab.dataset.kind === kind));
    }
    $("kind-help").textContent = KIND_HELP[kind];
    const lens = kind === "lens";
    $("lens-view").hidden = !lens;
    document.querySelector(".panels").hidden = lens;
    if (lens) {
      renderLens();
      return;
    }
    const nHeads = current().weights[0].length;
    if (state.heads.length !== nHeads) state.heads = Array(nHeads).fill(true);
    state.focus = null;
    renderGrid();
    renderHeadView();
  }

  function thumbSize(nQuery, nKey) {
    const scale = THUMB_PX / Math.max(nQuery, nKey);
    return [Math.max(1, Math.round(nKey * scale)), Math.max(1, Math.round(nQuery * scale))];
  }

  function renderGrid() {
    const attention = current();
    const nLayers = attention.weights.length, nHeads = attention.weights[0].length;
    const grid = $("grid");
    grid.replaceChildren();
    grid.style.gridTemplateColumns = `1.4rem repeat(${nHeads}, minmax(110px, 190px))`;
    grid.append(document.createElement("span"));
    for (let h = 0; h < nHeads; h++) {
      const label = document.createElement("span");
      label.className = "head-label";
      label.textContent = `head ${h}`;
      grid.append(label);
    }
    state.thumbs = [];
    for (let layer = 0; layer < nLayers; layer++) {
      const label = document.createElement("span");
      label.className = "layer-label";
      label.textContent = `layer ${layer}`;
      grid.append(label);
      state.thumbs.push([]);
      for (let head = 0; head < nHeads; head++) {
        const rows = attention.weights[layer][head];
        const figure = document.createElement("figure");
        figure.className = "thumb";
        figure.dataset.layer = layer;
        figure.dataset.head = head;
        figure.title = `${attention.title}, layer ${layer}, head ${head}: click to enlarge`;
        const canvas = document.createElement("canvas");
        [canvas.width, canvas.height] = thumbSize(rows.length, rows[0].length);
        const caption = document.createElement("figcaption");
        caption.innerHTML = metricLines(attention.metrics[layer][head]);
        figure.append(canvas, caption);
        figure.tabIndex = 0;
        figure.addEventListener("click", () => openDetail(layer, head));
        figure.addEventListener("keydown", (event) => {
          if (event.key !== "Enter" && event.key !== " ") return;
          event.preventDefault(); // a space would scroll the page
          openDetail(layer, head);
        });
        grid.append(figure);
        state.thumbs[layer].push(canvas);
        drawThumb(layer, head);
      }
    }
    markCurrentLayer();
  }

  // A thumbnail, with the focused token's row (query) or column (key) outlined
  // when it belongs to the head view's layer.
  function drawThumb(layer, head) {
    const canvas = state.thumbs[layer][head];
    drawScaled(canvas, headImage(state.kind, layer, head));
    const focus = state.focus;
    if (!focus || layer !== state.layer) return;
    const rows = current().weights[layer][head];
    const cellW = canvas.width / rows[0].length, cellH = canvas.height / rows.length;
    const context = canvas.getContext("2d");
    context.fillStyle = "rgba(255, 255, 255, 0.55)"; // veil the rest, keep the focused line
    if (focus.side === "query") {
      context.fillRect(0, 0, canvas.width, focus.index * cellH);
      context.fillRect(0, (focus.index + 1) * cellH, canvas.width, canvas.height);
    } else {
      context.fillRect(0, 0, focus.index * cellW, canvas.height);
      context.fillRect((focus.index + 1) * cellW, 0, canvas.width, canvas.height);
    }
  }

  function markCurrentLayer() {
    for (const figure of document.querySelectorAll(".thumb")) {
      figure.classList.toggle("current", Number(figure.dataset.layer) === state.layer && state.focus !== null);
    }
  }

  // ----- head view: bertviz-style lines between query and key tokens ---------------

  function renderHeadView() {
    const attention = current();
    const layerButtons = $("layer-buttons");
    layerButtons.replaceChildren();
    attention.weights.forEach((_, layer) => {
      const chip = document.createElement("button");
      chip.type = "button";
      chip.className = `chip${layer === state.layer ? " on" : ""}`;
      chip.textContent = layer;
      chip.addEventListener("click", () => {
        state.layer = layer;
        state.focus = null;
        renderHeadView();
        redrawThumbs();
      });
      layerButtons.append(chip);
    });
    const toggles = $("head-toggles");
    toggles.replaceChildren();
    state.heads.forEach((on, head) => {
      const chip = document.createElement("button");
      chip.type = "button";
      chip.className = `chip head${on ? "" : " off"}`;
      chip.style.borderColor = HEAD_COLOURS[head % HEAD_COLOURS.length];
      chip.textContent = head;
      chip.title = `show or hide head ${head}`;
      chip.addEventListener("click", () => {
        state.heads[head] = !state.heads[head];
        chip.classList.toggle("off", !state.heads[head]);
        drawLines();
      });
      toggles.append(chip);
    });
    fillTokenList($("query-tokens"), tokens(attention.queries), "query");
    fillTokenList($("key-tokens"), tokens(attention.keys), "key");
    drawLines();
  }

  function fillTokenList(list, pieces, side) {
    list.replaceChildren();
    pieces.forEach((piece, index) => {
      const item = document.createElement("li");
      item.textContent = piece;
      item.addEventListener("mouseenter", () => setFocus({ side, index }));
      item.addEventListener("mouseleave", () => setFocus(null));
      list.append(item);
    });
  }

  function setFocus(focus) {
    state.focus = focus;
    for (const [id, side] of [["query-tokens", "query"], ["key-tokens", "key"]]) {
      [...$(id).children].forEach((item, index) => {
        item.classList.toggle("focus", focus !== null && focus.side === side && focus.index === index);
      });
    }
    drawLines();
    redrawThumbs();
  }

  function redrawThumbs() {
    state.thumbs.forEach((row, layer) => row.forEach((_, head) => drawThumb(layer, head)));
    markCurrentLayer();
  }

  function drawLines() {
    const attention = current();
    const layerMaps = attention.weights[state.layer];
    const nQuery = layerMaps[0].length, nKey = layerMaps[0][0].length;
    const canvas = $("lines-canvas");
    const ratio = window.devicePixelRatio || 1;
    const width = 160, height = Math.max(nQuery, nKey) * ROW_PX;
    canvas.width = width * ratio;
    canvas.height = height * ratio;
    canvas.style.width = `${width}px`;
    canvas.style.height = `${height}px`;
    const context = canvas.getContext("2d");
    context.scale(ratio, ratio);
    context.lineWidth = 2;
    const focus = state.focus;
    const shown = state.heads.map((on, head) => (on ? head : -1)).filter((h) => h >= 0);
    const scale = focus ? 1 : 1 / Math.max(1, Math.sqrt(shown.length)); // all lines at once: fainter
    for (const head of shown) {
      context.strokeStyle = HEAD_COLOURS[head % HEAD_COLOURS.length];
      const rows = layerMaps[head];
      for (let q = 0; q < nQuery; q++) {
        if (focus && focus.side === "query" && focus.index !== q) continue;
        for (let k = 0; k < nKey; k++) {
          if (focus && focus.side === "key" && focus.index !== k) continue;
          const w = rows[q][k];
          if (w < 0.02) continue;
          context.globalAlpha = Math.min(1, w * scale);
          context.beginPath();
          context.moveTo(0, (q + 0.5) * ROW_PX);
          context.lineTo(width, (k + 0.5) * ROW_PX);
          context.stroke();
        }
      }
    }
    context.globalAlpha = 1;
  }

  // ----- the logit lens: layers x positions, the last layer on top ---------------------

  function lensRow(cells, tag, label) {
    const row = document.createElement("tr");
    const head = document.createElement("th");
    head.textContent = label;
    row.append(head);
    for (const text of cells) {
      const cell = document.createElement(tag);
      cell.textContent = text;
      cell.title = text;
      row.append(cell);
    }
    return row;
  }

  function renderLens() {
    const lens = state.payload.lens;
    const table = $("lens-grid");
    table.replaceChildren();
    const head = document.createElement("thead");
    head.append(lensRow(lens.targets, "th", "next piece"));
    const body = document.createElement("tbody");
    for (let layer = lens.layers.length - 1; layer >= 0; layer--) {
      const row = lensRow([], "td", lens.layers[layer]);
      row.dataset.layer = lens.layers[layer];
      lens.top[layer].forEach((piece, t) => {
        const p = lens.prob[layer][t];
        const cell = document.createElement("td");
        const [r, g, b] = viridis(p);
        cell.style.background = `rgb(${r}, ${g}, ${b})`;
        cell.style.color = p > 0.6 ? "#000" : "#fff";
        cell.textContent = piece;
        cell.dataset.prob = p;
        cell.title = `${lens.layers[layer]}, reading ${lens.inputs[t]}: top ${piece} ${fixed(p, 3)}; ` +
          `next piece ${lens.targets[t]} ${fixed(lens.target_prob[layer][t], 3)}`;
        row.append(cell);
      });
      body.append(row);
    }
    const foot = document.createElement("tfoot");
    foot.append(lensRow(lens.inputs, "th", "input"));
    table.append(head, body, foot);
  }

  // ----- one head, enlarged ------------------------------------------------------------

  function openDetail(layer, head) {
    const attention = current();
    const rows = attention.weights[layer][head];
    const queries = tokens(attention.queries), keys = tokens(attention.keys);
    const cell = Math.max(10, Math.min(30, Math.floor(620 / Math.max(rows.length, rows[0].length))));
    $("detail-title").textContent = `${attention.title} · layer ${layer} · head ${head}`;
    const m = attention.metrics[layer][head];
    const metrics = [
      ["entropy", fixed(m.entropy, 3) + " nats"],
      ["confidence", fixed(m.confidence, 3)],
      ["offset −1 / 0 / +1", [m["offset_-1"], m.offset_0, m["offset_+1"]].map((v) => fixed(v)).join(" / ")],
      ["dominant offset", m.dominant_offset || "–"],
      [m.bos !== null && m.bos !== undefined ? "weight on bos" : "weight on eos", fixed(m.bos ?? m.eos, 3)],
    ];
    if (m.monotonicity !== null && m.monotonicity !== undefined) metrics.push(["monotonicity", fixed(m.monotonicity, 3)]);
    const applies = metrics.filter(([, value]) => /[0-9a-z]/.test(value)); // offsets: self-attention only
    fillPairs($("detail-metrics"), applies);
    fillCorpus(attention.corpus ? attention.corpus[layer][head] : null, Boolean(attention.corpus));
    const keyList = $("detail-keys"), queryList = $("detail-queries");
    keyList.replaceChildren(...keys.map((piece) => labelItem(piece, cell, "width")));
    queryList.replaceChildren(...queries.map((piece) => labelItem(piece, cell, "height")));
    const fontSize = `${Math.min(13, cell - 2)}px`;
    keyList.style.fontSize = fontSize;
    queryList.style.fontSize = fontSize;
    const canvas = $("detail-canvas");
    canvas.width = rows[0].length * cell;
    canvas.height = rows.length * cell;
    canvas.dataset.layer = layer;
    canvas.dataset.head = head;
    drawScaled(canvas, headImage(state.kind, layer, head));
    canvas.onmousemove = (event) => {
      const box = canvas.getBoundingClientRect();
      const k = Math.floor((event.clientX - box.left) / cell), q = Math.floor((event.clientY - box.top) / cell);
      if (q < 0 || q >= rows.length || k < 0 || k >= rows[0].length) return;
      $("detail-readout").textContent = `${queries[q]} → ${keys[k]}: ${rows[q][k].toFixed(3)}`;
      [...queryList.children].forEach((item, i) => item.classList.toggle("focus", i === q));
      [...keyList.children].forEach((item, i) => item.classList.toggle("focus", i === k));
      drawScaled(canvas, headImage(state.kind, layer, head));
      const context = canvas.getContext("2d");
      context.strokeStyle = "#ff6b35";
      context.lineWidth = 2;
      context.strokeRect(k * cell + 1, q * cell + 1, cell - 2, cell - 2);
    };
    $("detail-readout").textContent = "Move the cursor over the map to read a weight.";
    $("detail").hidden = false;
  }

  // The head's heads.json record beside this sentence's numbers; hidden without heads.json.
  function fillCorpus(record, haveFile) {
    $("detail-corpus-box").hidden = !haveFile;
    const rows = record
      ? CORPUS_METRICS.filter(([key]) => record[key] !== null && record[key] !== undefined)
        .map(([key, label, digits, unit]) => [label, fixed(record[key], digits) + unit])
      : [["", "not in heads.json"]];
    fillPairs($("detail-corpus"), haveFile ? rows : []);
  }

  // A <dl> of [name, value] pairs, each a <div> holding its <dt> and <dd>.
  function fillPairs(table, pairs) {
    table.replaceChildren();
    for (const [name, value] of pairs) {
      const pair = document.createElement("div");
      const dt = document.createElement("dt"), dd = document.createElement("dd");
      dt.textContent = name;
      dd.textContent = value;
      pair.append(dt, dd);
      table.append(pair);
    }
  }

  function labelItem(piece, cell, side) {
    const item = document.createElement("li");
    item.textContent = piece;
    item.style[side] = `${cell}px`;
    item.style.lineHeight = `${cell}px`;
    return item;
  }

  function closeDetail() {
    $("detail").hidden = true;
  }

  // ----- where the data comes from: the page itself, or aiayn serve -------------------

  function embeddedPayload() {
    const text = $("aiayn-data").textContent.trim();
    return text ? JSON.parse(text) : null;
  }

  function setStatus(text, error = false) {
    $("status").textContent = text;
    $("status").classList.toggle("error", error);
  }

  // GET info: {"model": path, "shape": {...}, "languages": {"source", "target"} | null, ...}
  async function loadInfo() {
    try {
      const response = await fetch("info");
      if (!response.ok) return;
      const info = await response.json();
      const shape = info.shape || {};
      const languages = info.languages ? `${info.languages.source} → ${info.languages.target}` : null;
      const layers = layersText(shape.n_encoder_layers, shape.n_decoder_layers);
      const parts = [info.model, languages, shape.n_heads && `${layers} × ${shape.n_heads} heads`,
        shape.d_model && `d_model ${shape.d_model}`,
        info.parameters && `${(info.parameters / 1e6).toFixed(1)}M parameters`];
      $("model-info").textContent = parts.filter(Boolean).join(" · ");
      const decoding = info.decoding || {};
      if (decoding.beam) $("beam").value = decoding.beam;
      if (decoding.alpha !== undefined) $("alpha").value = decoding.alpha;
    } catch (error) {
      // info is a nicety: the explorer works without it
    }
  }

  // The explorer's payload in a v1/translate answer, {"translations": [{"translation",
  // "attention"}], ...}, with the translation as the API gave it.
  function payloadOf(answer) {
    const first = (answer.translations || [])[0];
    if (!first || !first.attention) throw new Error("the server's answer holds no attention maps");
    return { ...first.attention, translation: first.translation };
  }

  async function translate(event) {
    event.preventDefault();
    const text = $("source-text").value.trim();
    if (!text) {
      setStatus("Type a sentence first.", true);
      return;
    }
    const button = $("translate-button");
    button.disabled = true;
    setStatus("Translating…");
    try {
      const response = await fetch("v1/translate", {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ text, beam: Number($("beam").value), alpha: Number($("alpha").value), attention: true }),
      });
      const answer = await response.json().catch(() => ({}));
      if (!response.ok) {
        const detail = answer.error || answer.detail || answer.message || response.statusText;
        throw new Error(`${response.status}: ${typeof detail === "string" ? detail : JSON.stringify(detail)}`);
      }
      show(payloadOf(answer));
      setStatus("");
    } catch (error) {
      setStatus(`Could not translate: ${error.message}`, true);
    } finally {
      button.disabled = false;
    }
  }

  function start() {
    for (const tab of document.querySelectorAll(".tabs button")) {
      tab.addEventListener("click", () => selectKind(tab.dataset.kind));
    }
    $("detail-close").addEventListener("click", closeDetail);
    $("detail").addEventListener("click", (event) => {
      if (event.target === $("detail")) closeDetail();
    });
    document.addEventListener("keydown", (event) => {
      if (event.key === "Escape") closeDetail();
    });
    const embedded = embeddedPayload();
    if (embedded) {
      document.body.classList.add("embedded");
      $("source-text").value = embedded.source;
      $("source-text").readOnly = true;
      $("beam").value = embedded.decode.beam;
      $("alpha").value = embedded.decode.alpha;
      for (const id of ["beam", "alpha", "translate-button"]) $(id).disabled = true;
      $("translate-button").title = "This page was exported with its data; run aiayn serve to translate new text.";
      show(embedded);
      return;
    }
    $("translate-form").addEventListener("submit", translate);
    loadInfo();
  }

  start();
})();
