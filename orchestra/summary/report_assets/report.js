/* orchestra report: sorting and the per-sample drill-down (the timeline is timeline.js).
   No dependencies, no network.
   Every text that came from a model, a dataset or a log is inserted as text, never as HTML. */
(function () {
  "use strict";
  var $ = function (id) { return document.getElementById(id); };

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

  initSort();
  initDrill();
})();
