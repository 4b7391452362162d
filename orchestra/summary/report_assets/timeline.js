/* orchestra report: the timeline.  One row per worker slot (or GPU, host, model, stage), one bar
   per attempt, drawn on a canvas the size of the visible part only, so 100,000 attempts cost no
   more DOM than 10.  What a hover shows beyond the bar (task names, log paths, log tails) is in a
   compressed element inflated on the first visit.  Text from logs is inserted as text.  Below the
   task rows, one row per sampled GPU (gpu.jsonl) shows its utilisation on the same time axis. */
(function () {
  "use strict";
  var $ = function (id) { return document.getElementById(id); };
  var el = $("timeline-data");
  var TL = JSON.parse(el ? el.textContent : "{}");
  var LANE_H = 20, LABEL_W = 190, AXIS_H = 24, MAX_ZOOM = 8192;  // 8192 x 1000 px: within a browser's box size
  var tl = { zoom: 1, group: "slot", inv: -1, hover: -1, lanes: [], t0: 0, span: 1, k: 1, W: 0, H: 0 };
  var details = null, detailsLoading = false, detailsError = "";

  function fmtS(s) {
    if (s == null) return "?";
    if (s < 60) return s.toFixed(s < 10 ? 2 : 1) + " s";
    var m = Math.floor(s / 60), h = Math.floor(m / 60);
    return h ? h + " h " + (m % 60) + " min" : m + " min " + Math.round(s % 60) + " s";
  }
  function natural(a, b) { return a.localeCompare(b, undefined, { numeric: true }); }
  function clock(s, step) {  // as many decimals as the axis step needs
    s = Math.max(0, s);
    var h = Math.floor(s / 3600), m = Math.floor(s % 3600 / 60), sec = s % 60;
    var digits = step >= 1 ? 1 : Math.min(3, Math.ceil(-Math.log10(step) - 1e-9));
    var ss = (sec < 10 ? "0" : "") + (Number.isInteger(sec) ? sec : sec.toFixed(digits));
    return h ? h + ":" + (m < 10 ? "0" : "") + m + ":" + ss : m + ":" + ss;
  }
  function niceStep(raw) {
    var p = Math.pow(10, Math.floor(Math.log10(Math.max(raw, 1e-3))));
    var f = raw / p;
    return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * p;
  }

  /* ---- the hover details: inflated once, on the first visit to the timeline --------------- */
  function loadDetails() {
    if (details || detailsLoading) return;
    var src = $("timeline-details");
    if (!src) return;  // the page is still loading
    if (typeof DecompressionStream === "undefined") { detailsError = "this browser cannot inflate them"; return; }
    detailsLoading = true;
    var bin = atob(src.textContent.trim()), bytes = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    var stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate-raw"));
    new Response(stream).text().then(JSON.parse).then(function (d) {
      details = d;
      if (tl.hover >= 0) showTip(tl.hover, tl.tipX, tl.tipY);
    }).catch(function (err) { detailsError = err.message; }).then(function () { detailsLoading = false; });
  }

  /* ---- layout: lanes of non-overlapping bars, each lane's bars sorted by start --------------- */
  function laneKeys(a) {
    var task = TL.tasks[a[0]], host = TL.hosts[a[7]] || TL.runners[a[10]] || "";
    switch (tl.group) {
      case "gpu": return a[8] ? a[8].split(",").map(function (g) { return (host ? host + " · " : "") + "GPU " + g; }) : ["no GPU"];
      case "host": return [host || "(this machine)"];
      case "model": return [TL.models[task[1]] || "?"];
      case "stage": return [TL.stages[task[0]]];
      default: return [(host ? host + " · " : "") + "worker " + (a[6] == null ? "?" : a[6])];
    }
  }

  function layout() {
    var A = TL.attempts, idx = [];
    for (var i = 0; i < A.length; i++) if (tl.inv < 0 || A[i][9] === tl.inv) idx.push(i);
    tl.lanes = [];
    tl.count = idx.length;
    if (!idx.length) return;
    var t0 = Infinity, t1 = -Infinity;
    idx.forEach(function (i) { t0 = Math.min(t0, A[i][2]); t1 = Math.max(t1, A[i][2] + A[i][3]); });
    idx.sort(function (x, y) { return A[x][2] - A[y][2]; });
    var groups = {};
    idx.forEach(function (i) {
      var a = A[i];
      laneKeys(a).forEach(function (key) {
        var g = groups[key] || (groups[key] = { ends: [], subs: [] }), sub = 0;
        while (sub < g.ends.length && g.ends[sub] > a[2] + 1e-6) sub++;
        g.ends[sub] = a[2] + a[3];
        (g.subs[sub] || (g.subs[sub] = [])).push(i);
      });
    });
    Object.keys(groups).sort(natural).forEach(function (key) {
      groups[key].subs.forEach(function (bars, s) { tl.lanes.push({ name: s ? key + " (" + (s + 1) + ")" : key, bars: bars }); });
    });
    tl.t0 = t0;
    tl.span = Math.max(t1 - t0, 0.001);
  }

  /* ---- GPU rows: each GPU's utilisation (times sorted, <= 2,000 points) as a filled area ------ */
  var G = TL.gpu || null, gpuSum = [];  // running sums of utilisation: a window's mean in O(log n)
  if (G) G.util.forEach(function (us, n) {
    var sum = [0];
    for (var i = 0; i < us.length; i++) sum.push(sum[i] + us[i]);
    gpuSum[n] = sum;
  });
  function nGpu() { return G && tl.lanes.length ? G.gpus.length : 0; }
  function gpuTop(n) { return AXIS_H + (tl.lanes.length + n) * LANE_H; }
  function gpuWindow(n, lo, hi) {  // [i, j): GPU n's samples taken from lo to hi
    var ts = G.t[n];
    function first(t, after) {
      var a = 0, b = ts.length;
      while (a < b) { var m = (a + b) >> 1; if (ts[m] < t || (after && ts[m] === t)) a = m + 1; else b = m; }
      return a;
    }
    return [first(lo, false), first(hi, true)];
  }
  function gpuMean(n, lo, hi) {
    var w = gpuWindow(n, lo, hi);
    return w[1] > w[0] ? (gpuSum[n][w[1]] - gpuSum[n][w[0]]) / (w[1] - w[0]) : null;
  }
  function gpuLabel(n, mean) { return "GPU " + G.gpus[n] + " busy" + (mean == null ? "" : " " + Math.round(mean) + "%"); }
  function visibleTimes(sx, cw) {  // the times the plot shows, within the view's
    return [Math.max(tl.t0, tl.t0 + sx / tl.k), Math.min(tl.t0 + tl.span, tl.t0 + (sx + cw - LABEL_W) / tl.k)];
  }
  function drawGpu(ctx, n, gy, sx, vis) {  // the visible samples and one beyond each side
    var ts = G.t[n], us = G.util[n], base = gy + LANE_H - 2, h = LANE_H - 4, i;
    var all = gpuWindow(n, tl.t0, tl.t0 + tl.span), w = gpuWindow(n, vis[0], vis[1]);
    var i0 = Math.max(all[0], w[0] - 1), i1 = Math.min(all[1], w[1] + 1);
    if (i1 <= i0) return;
    var x = function (j) { return LABEL_W + (ts[j] - tl.t0) * tl.k - sx; };
    var y = function (j) { return base - Math.min(Math.max(us[j], 0), 100) / 100 * h; };
    ctx.beginPath();
    ctx.moveTo(x(i0), base);
    for (i = i0; i < i1; i++) ctx.lineTo(x(i), y(i));
    ctx.lineTo(x(i1 - 1), base);
    ctx.closePath();
    ctx.fillStyle = color("gpu-util");
    ctx.fill();
    ctx.beginPath();
    ctx.moveTo(x(i0), y(i0));
    for (i = i0 + 1; i < i1; i++) ctx.lineTo(x(i), y(i));
    ctx.strokeStyle = color("gpu-edge"); ctx.lineWidth = 0.8; ctx.stroke(); ctx.lineWidth = 1;
  }

  /* ---- drawing: only what the scroll box shows ---------------------------------------------- */
  var colors = {};
  function color(name) {
    if (!colors[name]) colors[name] = getComputedStyle(document.documentElement).getPropertyValue("--" + name).trim() || "#888";
    return colors[name];
  }
  function barX(a) { return LABEL_W + (a[2] - tl.t0) * tl.k; }
  function barW(a) { return Math.max(1.5, a[3] * tl.k); }

  function render() {
    var wrap = $("tl-wrap"), space = $("tl-space"), canvas = $("tl");
    if (!canvas || !TL.attempts) return;
    layout();
    var plotW = Math.max(400, (wrap.clientWidth || 1000) - LABEL_W - 46) * tl.zoom;
    tl.k = plotW / tl.span;
    tl.W = LABEL_W + plotW + 44;
    tl.H = tl.lanes.length ? AXIS_H + (tl.lanes.length + nGpu()) * LANE_H + 6 : 30;
    canvas.style.width = canvas.style.height = "0px";
    space.style.width = tl.W + "px";
    space.style.height = tl.H + "px";
    canvas.dataset.bars = String(tl.count);
    canvas.setAttribute("aria-label", "timeline: " + tl.count + " attempts in " + tl.lanes.length + " rows" +
      (nGpu() ? ", and the utilisation of " + nGpu() + " GPUs" : ""));
    draw();
  }

  function draw() {
    var wrap = $("tl-wrap"), canvas = $("tl");
    var cw = Math.min(wrap.clientWidth, tl.W), ch = Math.min(wrap.clientHeight, tl.H);
    var dpr = window.devicePixelRatio || 1;
    if (canvas.width !== Math.round(cw * dpr) || canvas.height !== Math.round(ch * dpr)) {
      canvas.width = Math.round(cw * dpr); canvas.height = Math.round(ch * dpr);
    }
    canvas.style.width = cw + "px"; canvas.style.height = ch + "px";
    var ctx = canvas.getContext("2d"), sx = wrap.scrollLeft, sy = wrap.scrollTop;
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, cw, ch);
    ctx.font = "11px system-ui, sans-serif";
    ctx.textBaseline = "middle";
    if (!tl.lanes.length) { ctx.fillStyle = color("fg"); ctx.fillText("no attempt ran in this invocation", 8, 15); return; }
    var first = Math.max(0, Math.floor((sy - AXIS_H) / LANE_H)), last = Math.min(tl.lanes.length - 1, Math.floor((sy + ch - AXIS_H) / LANE_H));
    var laneY = function (n) { return AXIS_H + n * LANE_H - sy; }, n;
    for (n = first; n <= last; n++) {  // lane stripes
      if (n % 2) { ctx.fillStyle = color("soft"); ctx.fillRect(0, laneY(n), cw, LANE_H); }
    }
    var gpuRows = [];  // the GPU rows in sight: [n, y]
    for (n = 0; n < nGpu(); n++) if (gpuTop(n) - sy + LANE_H > AXIS_H - 4 && gpuTop(n) - sy < ch) gpuRows.push([n, gpuTop(n) - sy]);
    ctx.fillStyle = color("gpu-bg");
    gpuRows.forEach(function (r) { ctx.fillRect(0, r[1], cw, LANE_H); });
    var step = niceStep(tl.span / Math.max(2, (tl.W - LABEL_W - 44) / 110)), ticks = [];
    for (var t = Math.max(0, Math.floor((sx - LABEL_W) / tl.k / step) * step); t <= Math.min(tl.span + 1e-9, (sx + cw) / tl.k); t += step) {
      ticks.push([t, Math.round(LABEL_W + t * tl.k - sx) + 0.5]);
    }
    ctx.strokeStyle = color("line");
    ticks.forEach(function (tk) { ctx.beginPath(); ctx.moveTo(tk[1], AXIS_H - 4); ctx.lineTo(tk[1], ch); ctx.stroke(); });
    var lo = tl.t0 + (sx - LABEL_W) / tl.k, hi = tl.t0 + (sx + cw - LABEL_W) / tl.k;
    for (n = first; n <= last; n++) {  // bars of the visible lanes and times
      var bars = tl.lanes[n].bars, y = laneY(n) + 2;
      for (var j = firstEnding(bars, lo); j < bars.length && TL.attempts[bars[j]][2] <= hi; j++) {
        var a = TL.attempts[bars[j]], w = barW(a);
        ctx.fillStyle = color(TL.outcomes[a[4]]);
        ctx.fillRect(barX(a) - sx, y, w > 3 ? w - 0.5 : w, LANE_H - 4);
        if (bars[j] === tl.hover) {
          ctx.strokeStyle = color("fg"); ctx.lineWidth = 1.5; ctx.strokeRect(barX(a) - sx, y, w, LANE_H - 4); ctx.lineWidth = 1;
        }
      }
    }
    var vis = visibleTimes(sx, cw);
    gpuRows.forEach(function (r) { drawGpu(ctx, r[0], r[1], sx, vis); });
    // the clock stays at the top and the row names at the left while the plot scrolls
    var offset = tl.inv < 0 ? 0 : invStart();
    ctx.fillStyle = color("bg");
    ctx.fillRect(0, 0, cw, AXIS_H - 4);
    ctx.fillRect(0, AXIS_H - 4, Math.min(LABEL_W, cw), ch);
    ctx.fillStyle = color("fg");
    ticks.forEach(function (tk) { if (tk[1] >= LABEL_W) ctx.fillText(clock(tk[0] + tl.t0 - offset, step), tk[1] + 2, 12); });
    for (n = first; n <= last; n++) {
      var name = tl.lanes[n].name, ly = laneY(n);
      if (ly + LANE_H / 2 < AXIS_H) continue;
      if (n % 2) { ctx.fillStyle = color("soft"); ctx.fillRect(0, Math.max(ly, AXIS_H - 4), LABEL_W, LANE_H); }
      ctx.fillStyle = color("fg");
      ctx.fillText(name.length > 30 ? name.slice(0, 29) + "…" : name, 6, ly + LANE_H / 2);
    }
    gpuRows.forEach(function (r) {  // the label: the mean over the times in sight
      if (r[1] + LANE_H / 2 < AXIS_H) return;
      ctx.fillStyle = color("gpu-bg"); ctx.fillRect(0, Math.max(r[1], AXIS_H - 4), LABEL_W, LANE_H);
      ctx.fillStyle = color("fg"); ctx.fillText(gpuLabel(r[0], gpuMean(r[0], vis[0], vis[1])), 6, r[1] + LANE_H / 2);
    });
  }

  // first bar of a lane (bars sorted by start, never overlapping) that ends at or after time t
  function firstEnding(bars, t) {
    var lo = 0, hi = bars.length;
    while (lo < hi) {
      var mid = (lo + hi) >> 1, a = TL.attempts[bars[mid]];
      if (a[2] + Math.max(a[3], 1.5 / tl.k) < t) lo = mid + 1; else hi = mid;
    }
    return lo;
  }
  function invStart() {
    var inv = (TL.invocations || []).filter(function (v) { return v.index === tl.inv; })[0], m = Infinity;
    TL.attempts.forEach(function (a) { if (a[9] === tl.inv) m = Math.min(m, a[2]); });
    return inv ? Math.min(inv.start, m) : 0;
  }

  /* ---- hover: which bar is under the pointer, and its card ---------------------------------- */
  function hit(cx, cy) {  // content coordinates -> attempt index, or -1; a lane label -> -2 - lane
    var n = Math.floor((cy - AXIS_H) / LANE_H);
    if (cy < AXIS_H || n < 0 || n >= tl.lanes.length + nGpu()) return -1;
    if (cx - $("tl-wrap").scrollLeft < LABEL_W) return -2 - n;
    if (n >= tl.lanes.length) return -1;
    var bars = tl.lanes[n].bars, found = -1;
    // bars narrower than a pixel overlap; the one drawn last (on top) is the one shown
    for (var j = firstEnding(bars, tl.t0 + (cx - LABEL_W - 1) / tl.k); j < bars.length; j++) {
      var a = TL.attempts[bars[j]], x = barX(a);
      if (x > cx + 1) break;
      if (cx <= x + barW(a) + 1) found = bars[j];
    }
    return found;
  }

  function line(tip, key, value) {
    var k = document.createElement("span");
    k.className = "k"; k.textContent = key + ": ";
    tip.appendChild(document.createElement("br"));
    tip.appendChild(k);
    tip.appendChild(document.createTextNode(String(value)));
  }

  function showTip(i, x, y) {
    var tip = $("tip"), a = TL.attempts[i], task = TL.tasks[a[0]];
    var d = details ? details.tasks[a[0]] : null, extra = details ? details.tails[i] : null;
    tip.textContent = "";
    var b = document.createElement("b");
    b.textContent = d ? d[0] : TL.stages[task[0]] + " task";
    tip.appendChild(b);
    line(tip, "task", (d ? d[1] + " " : "") + "(" + TL.stages[task[0]] + ", model " + TL.models[task[1]] + ")");
    line(tip, "attempt", a[1]);
    line(tip, "outcome", TL.outcomes[a[4]].replace("_", " "));
    line(tip, "duration", fmtS(a[3]));
    line(tip, "exit code", a[5] == null ? "–" : a[5]);
    line(tip, "host", TL.hosts[a[7]] || "–");
    line(tip, "worker slot", a[6] == null ? "–" : a[6]);
    if (a[8]) line(tip, "GPUs", a[8]);
    if (TL.runners[a[10]]) line(tip, "runner", TL.runners[a[10]]);
    if (extra) {
      var where = extra[3] || {};
      Object.keys(where).forEach(function (key) { line(tip, key.replace("_", " "), where[key]); });
      if (extra[0]) line(tip, "reason", extra[0]);
      if (extra[1] && extra[1] !== extra[0]) line(tip, "why", extra[1]);
      if (d && d[2]) line(tip, "log", d[2]);
      if (extra[2]) { var pre = document.createElement("pre"); pre.textContent = extra[2]; tip.appendChild(pre); }
    } else {
      line(tip, "details", detailsError ? "cannot show them: " + detailsError : "loading…");
    }
    place(tip, x, y);
  }

  function place(tip, x, y) {
    tl.tipX = x; tl.tipY = y;
    tip.hidden = false;
    var r = tip.getBoundingClientRect(), left = x + 14, top = y + 14;
    if (left + r.width > window.innerWidth - 8) left = Math.max(8, x - r.width - 14);
    if (top + r.height > window.innerHeight - 8) top = Math.max(8, y - r.height - 14);
    tip.style.left = left + "px"; tip.style.top = top + "px";
  }

  function onMove(ev) {
    var wrap = $("tl-wrap"), box = wrap.getBoundingClientRect(), tip = $("tip");
    loadDetails();
    var i = hit(ev.clientX - box.left - wrap.clientLeft + wrap.scrollLeft, ev.clientY - box.top - wrap.clientTop + wrap.scrollTop);
    if (i !== tl.hover) { tl.hover = i; draw(); }
    if (i >= 0) showTip(i, ev.clientX, ev.clientY);
    else if (i <= -2) {
      var n = -2 - i;
      tip.textContent = n < tl.lanes.length ? tl.lanes[n].name : "GPU " + G.gpus[n - tl.lanes.length] +
        " utilisation sampled by nvidia-smi; the % is its mean over the times in sight";
      place(tip, ev.clientX, ev.clientY);
    }
    else tip.hidden = true;
  }

  /* ---- a small API: where each bar is drawn (for tests and for linking to an attempt) ------- */
  window.orchestraTimeline = {
    // every bar of the current view: attempt index, outcome and its box in content pixels
    bars: function () {
      var out = [];
      tl.lanes.forEach(function (lane, n) {
        lane.bars.forEach(function (i) {
          var a = TL.attempts[i];
          out.push({ i: i, outcome: TL.outcomes[a[4]], x: barX(a), y: AXIS_H + n * LANE_H + 2, w: barW(a), h: LANE_H - 4 });
        });
      });
      return out;
    },
    // every GPU row: its box, the x extent of its area (content pixels) and its mean over the times in sight
    gpuLanes: function () {
      var wrap = $("tl-wrap"), vis = visibleTimes(wrap.scrollLeft, Math.min(wrap.clientWidth, tl.W)), out = [];
      for (var n = 0; n < nGpu(); n++) {
        var all = gpuWindow(n, tl.t0, tl.t0 + tl.span), ts = G.t[n], mean = gpuMean(n, vis[0], vis[1]);
        out.push({ gpu: G.gpus[n], y: gpuTop(n), h: LANE_H, base: gpuTop(n) + LANE_H - 2, points: all[1] - all[0],
                   x0: all[1] > all[0] ? LABEL_W + (ts[all[0]] - tl.t0) * tl.k : null,
                   x1: all[1] > all[0] ? LABEL_W + (ts[all[1] - 1] - tl.t0) * tl.k : null, mean: mean, label: gpuLabel(n, mean) });
      }
      return out;
    },
    // scroll attempt i's bar into view; the viewport coordinates of its centre
    show: function (i) {
      var b = this.bars().filter(function (x) { return x.i === i; })[0], wrap = $("tl-wrap");
      if (!b) return null;
      wrap.scrollIntoView({ block: "center" });
      wrap.scrollLeft = Math.max(0, b.x - LABEL_W - 40);
      wrap.scrollTop = Math.max(0, b.y - AXIS_H - 40);
      draw();
      var box = wrap.getBoundingClientRect();
      return [box.left + wrap.clientLeft + b.x + b.w / 2 - wrap.scrollLeft, box.top + wrap.clientTop + b.y + b.h / 2 - wrap.scrollTop];
    },
  };

  function init() {
    if (!TL.attempts || !$("tl")) return;
    var sel = $("tl-inv"), invs = TL.invocations || [], used = {}, last = -1;
    TL.attempts.forEach(function (a) { used[a[9]] = true; last = Math.max(last, a[9]); });
    invs.forEach(function (v) {
      var o = document.createElement("option");
      o.value = v.index; o.textContent = "#" + (v.index + 1) + (v.mode ? " (" + v.mode + ")" : "") + (used[v.index] ? "" : ", nothing ran");
      sel.appendChild(o);
    });
    var all = document.createElement("option");
    all.value = -1; all.textContent = "all";
    sel.appendChild(all);
    tl.inv = invs.length > 1 ? last : -1;
    sel.value = String(tl.inv);
    if (invs.length <= 1) $("tl-inv-label").hidden = true;
    sel.addEventListener("change", function () { tl.inv = +sel.value; render(); });
    if (TL.attempts.some(function (a) { return a[8]; })) { tl.group = "gpu"; $("tl-group").value = "gpu"; }
    $("tl-group").addEventListener("change", function () { tl.group = $("tl-group").value; render(); });
    $("tl-zoom-in").addEventListener("click", function () { tl.zoom = Math.min(tl.zoom * 2, MAX_ZOOM); render(); });
    $("tl-zoom-out").addEventListener("click", function () { tl.zoom = Math.max(1, tl.zoom / 2); render(); });
    $("tl-fit").addEventListener("click", function () { tl.zoom = 1; render(); });
    var wrap = $("tl-wrap"), frame = 0;
    wrap.addEventListener("scroll", function () {
      if (!frame) frame = requestAnimationFrame(function () { frame = 0; draw(); });
    });
    wrap.addEventListener("mousemove", onMove);
    wrap.addEventListener("mouseleave", function () { $("tip").hidden = true; tl.hover = -1; draw(); });
    render();
    var resizeTimer = null;
    window.addEventListener("resize", function () { clearTimeout(resizeTimer); resizeTimer = setTimeout(render, 200); });
  }

  init();
})();
