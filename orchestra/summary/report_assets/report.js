/* orchestra report: sorting, per-sample drill-down, timeline.  No dependencies, no network.
   Every text that came from a model, a dataset or a log is inserted as text, never as HTML. */
(function () {
  "use strict";
  var $ = function (id) { return document.getElementById(id); };
  var esc = function (s) {
    return String(s == null ? "" : s).replace(/[&<>"']/g, function (c) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c];
    });
  };
  var fmtS = function (s) {
    if (s == null) return "?";
    if (s < 60) return s.toFixed(s < 10 ? 2 : 1) + " s";
    var m = Math.floor(s / 60), h = Math.floor(m / 60);
    return h ? h + " h " + (m % 60) + " min" : m + " min " + Math.round(s % 60) + " s";
  };

  /* ---- results table: sort by a column -------------------------------------------------- */
  function initSort() {
    var table = $("results-table");
    if (!table) return;
    var tbody = table.tBodies[0];
    table.tHead.addEventListener("click", function (ev) {
      var th = ev.target.closest("th[data-col]");
      if (!th) return;
      var col = +th.dataset.col, num = th.dataset.type === "num";
      var desc = !th.classList.contains("sorted-desc") && (num || th.classList.contains("sorted-asc"));
      Array.prototype.forEach.call(table.tHead.rows[0].cells, function (c) { c.classList.remove("sorted-asc", "sorted-desc"); });
      th.classList.add(desc ? "sorted-desc" : "sorted-asc");
      var rows = Array.prototype.slice.call(tbody.rows);
      var key = function (tr) {
        var td = tr.cells[col];
        if (!num) return td.textContent.trim().toLowerCase();
        return td.dataset.v === "" ? null : parseFloat(td.dataset.v);
      };
      rows.sort(function (a, b) {
        var x = key(a), y = key(b);
        if (x === y) return 0;
        if (x === null) return 1;  // missing values last, whichever the direction
        if (y === null) return -1;
        return (x < y ? -1 : 1) * (desc ? -1 : 1);
      });
      rows.forEach(function (tr) { tbody.appendChild(tr); });
    });
  }

  /* ---- per-sample drill-down: packs are inflated only when opened ----------------------- */
  var pairs = JSON.parse(($("pairs-data") || { textContent: "[]" }).textContent);
  var packCache = {};
  function loadPack(key) {
    if (packCache[key]) return packCache[key];
    var el = $("pack-" + key);
    if (!el) return Promise.reject(new Error("sample pack " + key + " is not in this page"));
    if (typeof DecompressionStream === "undefined") {
      return Promise.reject(new Error("this browser cannot inflate the samples (no DecompressionStream)"));
    }
    var bin = atob(el.textContent.trim()), bytes = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    var stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate-raw"));
    packCache[key] = new Response(stream).text().then(JSON.parse);
    return packCache[key];
  }

  var drill = { samples: [], shown: [], page: 0, pageSize: 50, cell: null };
  function text(v) { return v == null ? "" : typeof v === "string" ? v : JSON.stringify(v); }

  function openDrill(cell) {
    var pair = pairs[+cell.dataset.pair];
    if (!pair) return;
    if (drill.cell) drill.cell.classList.remove("open");
    drill.cell = cell;
    cell.classList.add("open");
    $("drill").hidden = false;
    $("drill-title").textContent = pair.model + " on " + pair.dataset + " — " + pair.n + " samples" +
      (pair.scored ? ", " + pair.right + "/" + pair.scored + " right by " + pair.metric : "");
    $("drill-body").innerHTML = "<tr><td colspan=5>loading…</td></tr>";
    Promise.all([loadPack(pair.prompts), loadPack(pair.key)]).then(function (packs) {
      var P = packs[0], S = packs[1], out = [];
      for (var i = 0; i < S.id.length; i++) {
        var row = S.row[i];
        out.push({ id: S.id[i], prompt: S.prompt[i] != null ? S.prompt[i] : row != null ? P.prompt[row] : "",
          gold: row != null ? P.gold[row] : "", prediction: S.prediction[i], score: S.score[i],
          error: S.error[i], other: S.other[i], hay: null });
      }
      drill.samples = out;
      drill.page = 0;
      filterDrill();
      $("drill").scrollIntoView({ block: "nearest" });
    }).catch(function (err) {
      $("drill-body").innerHTML = "";
      var tr = $("drill-body").insertRow(), td = tr.insertCell();
      td.colSpan = 5; td.className = "bad"; td.textContent = "cannot show the samples: " + err.message;
    });
  }

  function filterDrill() {
    var q = $("drill-search").value.trim().toLowerCase(), f = $("drill-filter").value;
    drill.shown = drill.samples.filter(function (s) {
      if (f === "right" && !(s.score === true || s.score > 0)) return false;
      if (f === "wrong" && !(s.score === false || s.score === 0 || s.error)) return false;
      if (f === "error" && !s.error) return false;
      if (!q) return true;
      if (s.hay === null) s.hay = [s.id, s.prompt, s.prediction, s.gold, s.error, s.other].map(text).join("\n").toLowerCase();
      return s.hay.indexOf(q) >= 0;
    });
    drill.page = 0;
    renderDrill();
  }

  // a long prompt shows its end (the question, after any few-shot examples) until its row is opened
  function promptEnd(t) { return t.length > 360 ? "… " + t.slice(-360) : t; }

  function renderDrill() {
    var body = $("drill-body"), n = drill.shown.length, pages = Math.max(1, Math.ceil(n / drill.pageSize));
    drill.page = Math.min(drill.page, pages - 1);
    var from = drill.page * drill.pageSize, to = Math.min(n, from + drill.pageSize);
    $("drill-count").textContent = n ? (from + 1) + "–" + to + " of " + n + " (page " + (drill.page + 1) + "/" + pages + ")" : "no sample matches";
    var frag = document.createDocumentFragment();
    drill.shown.slice(from, to).forEach(function (s) {
      var tr = document.createElement("tr");
      var promptDiv = null;
      [s.id, s.prompt, s.prediction, s.gold].forEach(function (v, k) {
        var td = document.createElement("td"), div = document.createElement("div");
        div.className = k ? "txt" : ""; div.textContent = k === 1 ? promptEnd(text(v)) : text(v);
        if (k === 1) promptDiv = div;
        td.appendChild(div); tr.appendChild(td);
      });
      var sc = document.createElement("td");
      if (s.error) { sc.className = "no"; sc.textContent = "failed: " + s.error; }
      else if (s.score === null || s.score === undefined) { sc.textContent = "–"; }
      else { var ok = s.score === true || s.score > 0; sc.className = ok ? "ok" : "no"; sc.textContent = typeof s.score === "number" ? String(s.score) : ok ? "✓" : "✗"; }
      tr.appendChild(sc);
      tr.addEventListener("click", function () {
        tr.classList.toggle("expanded");
        promptDiv.textContent = tr.classList.contains("expanded") ? text(s.prompt) : promptEnd(text(s.prompt));
        var next = tr.nextSibling;
        if (next && next.classList && next.classList.contains("other")) { next.remove(); return; }
        if (!s.other) return;
        var extra = document.createElement("tr"), td = document.createElement("td"), pre = document.createElement("pre");
        extra.className = "other"; td.colSpan = 5; pre.textContent = s.other;
        td.appendChild(pre); extra.appendChild(td); tr.after(extra);
      });
      frag.appendChild(tr);
    });
    body.innerHTML = "";
    body.appendChild(frag);
  }

  function initDrill() {
    var table = $("results-table");
    if (!table) return;
    table.tBodies[0].addEventListener("click", function (ev) {
      var td = ev.target.closest("td[data-pair]");
      if (td) openDrill(td);
    });
    table.tBodies[0].addEventListener("keydown", function (ev) {
      var td = ev.target.closest("td[data-pair]");
      if (td && (ev.key === "Enter" || ev.key === " ")) { ev.preventDefault(); openDrill(td); }
    });
    var timer = null;
    $("drill-search").addEventListener("input", function () { clearTimeout(timer); timer = setTimeout(filterDrill, 150); });
    $("drill-filter").addEventListener("change", filterDrill);
    $("drill-prev").addEventListener("click", function () { if (drill.page > 0) { drill.page--; renderDrill(); } });
    $("drill-next").addEventListener("click", function () {
      if ((drill.page + 1) * drill.pageSize < drill.shown.length) { drill.page++; renderDrill(); }
    });
    $("drill-close").addEventListener("click", function () {
      $("drill").hidden = true;
      if (drill.cell) drill.cell.classList.remove("open");
    });
  }

  /* ---- timeline: one row per worker slot (or GPU, host, ...), one bar per attempt ---------- */
  var TL = JSON.parse(($("timeline-data") || { textContent: "{}" }).textContent);
  var tails = null;
  function tail(i) {
    if (tails === null) {
      var el = $("tails-data");
      if (!el) return null;  // still loading
      tails = JSON.parse(el.textContent);
    }
    return tails[i];
  }
  var tl = { zoom: 1, group: "slot", inv: -1 };
  var LANE_H = 20, LABEL_W = 190, AXIS_H = 24;

  function laneKeys(a) {
    var task = TL.tasks[a[0]], host = TL.hosts[a[7]] || a[10] || "";
    switch (tl.group) {
      case "gpu": return a[8] ? a[8].split(",").map(function (g) { return (host ? host + " · " : "") + "GPU " + g; }) : ["no GPU"];
      case "host": return [host || "(this machine)"];
      case "model": return [task[3] || "?"];
      case "stage": return [task[2]];
      default: return [(host ? host + " · " : "") + "worker " + (a[6] == null ? "?" : a[6])];
    }
  }

  function natural(a, b) { return a.localeCompare(b, undefined, { numeric: true }); }

  function renderTimeline() {
    var svg = $("tl");
    if (!svg || !TL.attempts) return;
    var idx = [];
    TL.attempts.forEach(function (a, i) { if (tl.inv < 0 || a[9] === tl.inv) idx.push(i); });
    if (!idx.length) { svg.setAttribute("width", 400); svg.setAttribute("height", 30); svg.innerHTML = '<text x="8" y="20">no attempt ran in this invocation</text>'; return; }
    var t0 = Infinity, t1 = -Infinity;
    idx.forEach(function (i) { var a = TL.attempts[i]; t0 = Math.min(t0, a[2]); t1 = Math.max(t1, a[2] + a[3]); });
    var span = Math.max(t1 - t0, 0.001);
    // lanes: attempts of one key packed into sub-rows so that bars never overlap
    var groups = {};
    idx.slice().sort(function (x, y) { return TL.attempts[x][2] - TL.attempts[y][2]; }).forEach(function (i) {
      var a = TL.attempts[i];
      laneKeys(a).forEach(function (key) {
        var g = groups[key] || (groups[key] = { ends: [], bars: [] }), sub = 0;
        while (sub < g.ends.length && g.ends[sub] > a[2] + 1e-6) sub++;
        g.ends[sub] = a[2] + a[3];
        g.bars.push([i, sub]);
      });
    });
    var keys = Object.keys(groups).sort(natural), lanes = [], base = {};
    keys.forEach(function (k) {
      base[k] = lanes.length;
      groups[k].ends.forEach(function (_, s) { lanes.push(s ? k + " (" + (s + 1) + ")" : k); });
    });
    var wrap = $("tl-wrap"), plotW = Math.max(400, (wrap.clientWidth || 1000) - LABEL_W - 24) * tl.zoom;
    var nGpu = TL.gpu ? TL.gpu.gpus.length : 0;  // GPU lanes below the task lanes
    var W = LABEL_W + plotW + 44, H = AXIS_H + (lanes.length + nGpu) * LANE_H + 6, k = plotW / span;
    var out = [];
    lanes.forEach(function (name, n) {
      var y = AXIS_H + n * LANE_H;
      if (n % 2) out.push('<rect class="lane-bg" x="0" y="' + y + '" width="' + W + '" height="' + LANE_H + '"/>');
      out.push('<text x="6" y="' + (y + 14) + '">' + esc(name.length > 30 ? name.slice(0, 29) + "…" : name) + "<title>" + esc(name) + "</title></text>");
    });
    var step = niceStep(span / Math.max(2, plotW / 110));
    for (var t = 0; t <= span + 1e-9; t += step) {
      var x = LABEL_W + t * k;
      out.push('<line class="axis" x1="' + x + '" x2="' + x + '" y1="' + (AXIS_H - 4) + '" y2="' + H + '"/>');
      out.push('<text x="' + (x + 2) + '" y="14">' + esc(clock(t + t0 - (tl.inv < 0 ? 0 : invStart()))) + "</text>");
    }
    keys.forEach(function (key) {
      groups[key].bars.forEach(function (b) {
        var a = TL.attempts[b[0]], y = AXIS_H + (base[key] + b[1]) * LANE_H + 2;
        out.push('<rect class="bar o-' + TL.outcomes[a[4]] + '" data-i="' + b[0] + '" x="' + (LABEL_W + (a[2] - t0) * k).toFixed(1) +
          '" y="' + y + '" width="' + Math.max(1.5, a[3] * k).toFixed(1) + '" height="' + (LANE_H - 4) + '"/>');
      });
    });
    if (nGpu) out.push(gpuLanes(t0, t1, k, AXIS_H + lanes.length * LANE_H, W));
    svg.setAttribute("width", W);
    svg.setAttribute("height", H);
    svg.setAttribute("viewBox", "0 0 " + W + " " + H);
    svg.innerHTML = out.join("");
  }
  /* one lane per sampled GPU (gpu.jsonl): its utilisation as a filled area on the bars' time axis */
  function gpuLanes(t0, t1, k, top, W) {
    var G = TL.gpu, out = [];
    G.gpus.forEach(function (g, n) {
      var y = top + n * LANE_H, base = y + LANE_H - 2, h = LANE_H - 4, ts = G.t[n], us = G.util[n];
      var pts = [], sum = 0, cnt = 0;
      for (var i = 0; i < ts.length; i++) {
        if (ts[i] < t0 || ts[i] > t1) continue;
        pts.push([(LABEL_W + (ts[i] - t0) * k).toFixed(1), (base - us[i] / 100 * h).toFixed(1)]);
        sum += us[i]; cnt++;
      }
      var label = "GPU " + g + " busy" + (cnt ? " " + Math.round(sum / cnt) + "%" : "");
      out.push('<rect class="gpu-bg" x="0" y="' + y + '" width="' + W + '" height="' + LANE_H + '"/>');
      out.push('<text x="6" y="' + (y + 14) + '">' + esc(label) + "<title>GPU " + esc(g) +
        " utilisation sampled by nvidia-smi; the % is its mean over this view</title></text>");
      if (pts.length) {
        out.push('<polygon class="gpu-util" data-gpu="' + esc(g) + '" points="' + pts[0][0] + "," + base + " " +
          pts.map(function (p) { return p[0] + "," + p[1]; }).join(" ") + " " + pts[pts.length - 1][0] + "," + base + '"/>');
      }
    });
    return out.join("");
  }
  function invStart() {
    var inv = (TL.invocations || []).filter(function (v) { return v.index === tl.inv; })[0];
    return inv ? Math.min(inv.start, firstStart(tl.inv)) : 0;
  }
  function firstStart(inv) {
    var m = Infinity;
    TL.attempts.forEach(function (a) { if (a[9] === inv) m = Math.min(m, a[2]); });
    return m;
  }
  function niceStep(raw) {
    var p = Math.pow(10, Math.floor(Math.log10(Math.max(raw, 1e-3))));
    var f = raw / p;
    return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * p;
  }
  function clock(s) {
    s = Math.max(0, s);
    var h = Math.floor(s / 3600), m = Math.floor(s % 3600 / 60), sec = s % 60;
    var ss = (sec < 10 ? "0" : "") + (Number.isInteger(sec) ? sec : sec.toFixed(1));
    return h ? h + ":" + (m < 10 ? "0" : "") + m + ":" + ss : m + ":" + ss;
  }

  function tipHtml(i) {
    var a = TL.attempts[i], task = TL.tasks[a[0]], extra = tail(i) || ["", "", "", {}];
    var rows = [["task", task[1] + " (" + task[2] + ", model " + task[3] + ")"], ["attempt", a[1]],
      ["outcome", TL.outcomes[a[4]].replace("_", " ")], ["duration", fmtS(a[3])],
      ["exit code", a[5] == null ? "–" : a[5]], ["host", TL.hosts[a[7]] || "–"],
      ["worker slot", a[6] == null ? "–" : a[6]]];
    if (a[8]) rows.push(["GPUs", a[8]]);
    var where = extra[3] || {};
    Object.keys(where).forEach(function (key) { rows.push([key.replace("_", " "), where[key]]); });
    if (a[10]) rows.push(["runner", a[10]]);
    if (extra[0]) rows.push(["reason", extra[0]]);
    if (extra[1] && extra[1] !== extra[0]) rows.push(["why", extra[1]]);
    if (task[4]) rows.push(["log", task[4]]);
    var html = "<b>" + esc(task[0]) + "</b><br>" + rows.map(function (r) {
      return '<span class="k">' + esc(r[0]) + ":</span> " + esc(r[1]);
    }).join("<br>");
    if (tails === null) html += '<br><span class="k">(log tail still loading)</span>';
    else if (extra[2]) html += "<pre>" + esc(extra[2]) + "</pre>";
    return html;
  }

  function initTimeline() {
    if (!TL.attempts) return;
    var sel = $("tl-inv"), invs = TL.invocations || [];
    var used = {};
    TL.attempts.forEach(function (a) { used[a[9]] = true; });
    invs.forEach(function (v) {
      var o = document.createElement("option");
      o.value = v.index; o.textContent = "#" + (v.index + 1) + (v.mode ? " (" + v.mode + ")" : "") + (used[v.index] ? "" : ", nothing ran");
      sel.appendChild(o);
    });
    var all = document.createElement("option");
    all.value = -1; all.textContent = "all";
    sel.appendChild(all);
    var last = TL.attempts.length ? TL.attempts[TL.attempts.length - 1][9] : -1;
    TL.attempts.forEach(function (a) { last = Math.max(last, a[9]); });
    tl.inv = invs.length > 1 ? last : -1;
    sel.value = String(tl.inv);
    if (invs.length <= 1) $("tl-inv-label").hidden = true;
    sel.addEventListener("change", function () { tl.inv = +sel.value; renderTimeline(); });
    var anyGpu = TL.attempts.some(function (a) { return a[8]; });
    if (anyGpu) { tl.group = "gpu"; $("tl-group").value = "gpu"; }
    $("tl-group").addEventListener("change", function () { tl.group = $("tl-group").value; renderTimeline(); });
    $("tl-zoom-in").addEventListener("click", function () { tl.zoom *= 2; renderTimeline(); });
    $("tl-zoom-out").addEventListener("click", function () { tl.zoom = Math.max(1, tl.zoom / 2); renderTimeline(); });
    $("tl-fit").addEventListener("click", function () { tl.zoom = 1; renderTimeline(); });
    var tip = $("tip"), svg = $("tl");
    svg.addEventListener("mousemove", function (ev) {
      var bar = ev.target.closest ? ev.target.closest("rect.bar") : null;
      if (!bar) { tip.hidden = true; return; }
      tip.innerHTML = tipHtml(+bar.dataset.i);
      tip.hidden = false;
      var x = ev.clientX + 14, y = ev.clientY + 14, r = tip.getBoundingClientRect();
      if (x + r.width > window.innerWidth - 8) x = Math.max(8, ev.clientX - r.width - 14);
      if (y + r.height > window.innerHeight - 8) y = Math.max(8, ev.clientY - r.height - 14);
      tip.style.left = x + "px"; tip.style.top = y + "px";
    });
    svg.addEventListener("mouseleave", function () { tip.hidden = true; });
    renderTimeline();
    var resizeTimer = null;
    window.addEventListener("resize", function () { clearTimeout(resizeTimer); resizeTimer = setTimeout(renderTimeline, 200); });
  }

  initSort();
  initDrill();
  initTimeline();
})();
