// The pyqueue dashboard page: renders the JSON the server inlined, then polls
// api/overview for new figures and history points. No library: tables are built with
// the DOM (text only, never innerHTML, since error texts and payloads come from
// whoever wrote the jobs), charts are SVG drawn here. Actions are POSTs of JSON with
// the CSRF token of the page's <meta>.
(function () {
  "use strict";

  const initial = JSON.parse(document.getElementById("initial").textContent);
  const config = initial.config;
  const csrfToken = document.querySelector('meta[name="csrf-token"]').content;
  const SVG = "http://www.w3.org/2000/svg";
  const COLORS = ["#2f6fdb", "#e07b00", "#1a9a5b", "#c23b73", "#7a4fc9", "#8a6d1d", "#0e8a9a", "#d4452f"];
  const MAX_LINES = 6;
  const RATE_MS = 2000;        // throughput is averaged over at least this long
  const MIN_SPAN_MS = 10000;   // the charts' narrowest window

  const state = {
    overview: null,
    history: { t: [], queues: {} },
    clockOffset: 0,        // server ms - browser ms, so ages use the server's clock
    focus: null,           // a queue name: charts show it alone
    deadQueue: null,
    deadOffset: 0,
    deadTotal: -1,
    deadSelected: new Set(),
    lookupQueues: "",      // the queue names the lookup's select was built from
    groupsShown: false,    // a queue has had groups since the page loaded: the section stays
    groupsQueue: null,
    groupsKey: "",         // the selected queue's figures when its groups were last read
    groupsAt: 0,           // and when (browser ms)
    jobsQueue: null,       // the Jobs panel: its queue, state tab and first rank shown
    jobsState: "ready",
    jobsStart: 0,
    jobsKey: "",           // the queue's figures when its page was last read
    jobsResults: 0,        // results open under their rows: no refresh at a poll meanwhile
    jobsAt: 0,             // when its page was last read (browser ms)
    eventsQueue: null,     // the Events panel: its queue, the newest event's number read, and
    eventsLast: -1,        // the rows shown (newest first); -1: read the newest anew
    eventsRows: [],
    pollTimer: null,
  };

  // -- small helpers -----------------------------------------------------------------

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (key === "class") node.className = value;
      else if (key === "text") node.textContent = value;
      else if (key.startsWith("data-")) node.setAttribute(key, value);
      else node[key] = value;
    }
    for (const child of children) node.append(child);
    return node;
  }

  function svg(tag, attrs) {
    const node = document.createElementNS(SVG, tag);
    for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
    return node;
  }

  function serverNow() { return Date.now() + state.clockOffset; }

  // One formatter for every number (toLocaleString builds a new one per call, which
  // costs more than the rest of a 100-queue table).
  const INT = new Intl.NumberFormat("en-US");
  function fmtInt(n) { return INT.format(n); }

  function fmtMs(ms) {
    if (ms < 1000) return ms + " ms";
    if (ms < 60000) return (ms / 1000).toFixed(ms < 10000 ? 1 : 0) + " s";
    if (ms < 3600000) return Math.round(ms / 60000) + " min";
    if (ms < 172800000) return (ms / 3600000).toFixed(1) + " h";
    return Math.round(ms / 86400000) + " d";
  }

  function fmtRate(r) { return r === 0 ? "0" : r < 10 ? r.toFixed(2) : r < 100 ? r.toFixed(1) : fmtInt(Math.round(r)); }

  function ago(ms) {
    if (!ms) return { text: "–", title: "" };
    const age = Math.max(0, serverNow() - ms);
    return { text: fmtMs(age) + " ago", title: new Date(ms).toISOString() };
  }

  // A time before or after ``now`` (both server ms).
  function when(ms, now) {
    const d = ms - now;
    return { text: d >= 0 ? "in " + fmtMs(d) : fmtMs(-d) + " ago", title: new Date(ms).toISOString() };
  }

  function api(path) { return "api/" + path; }

  function queuePath(name) { return "queues/" + encodeURIComponent(name); }

  function setBanner(text) {
    const banner = document.getElementById("banner");
    banner.textContent = text || "";
    banner.hidden = !text;
  }

  // -- history -----------------------------------------------------------------------

  function mergeHistory(incoming) {
    const h = state.history;
    const series = incoming.series;
    const before = h.t.length;
    if (!before) {  // the first data: take the server's columns as they are
      state.history = { t: incoming.t.slice(), queues: incoming.queues };
      return;
    }
    const fresh = [];
    incoming.t.forEach((t, i) => { if (!before || t > h.t[before - 1]) fresh.push(i); });
    if (!fresh.length) return;
    for (const i of fresh) h.t.push(incoming.t[i]);
    const names = new Set([...Object.keys(h.queues), ...Object.keys(incoming.queues)]);
    for (const name of names) {
      const mine = h.queues[name] || (h.queues[name] = Object.fromEntries(series.map((s) => [s, new Array(before).fill(null)])));
      const theirs = incoming.queues[name];
      for (const s of series) for (const i of fresh) mine[s].push(theirs ? theirs[s][i] : null);
    }
    // Keep the server's window: drop points older than the history length.
    const cutoff = h.t[h.t.length - 1] - config.history_ms;
    let drop = 0;
    while (drop < h.t.length && h.t[drop] < cutoff) drop++;
    if (drop) {
      h.t.splice(0, drop);
      for (const q of Object.values(h.queues)) for (const s of series) q[s].splice(0, drop);
    }
  }

  // Per queue, the points of one chart: [t, value] pairs (null where unknown).
  function seriesFor(metric, name) {
    const h = state.history, q = h.queues[name];
    if (!q) return [];
    if (metric === "throughput") {
      // The slope of the acked counter over at least RATE_MS (or one step, if the
      // server samples less often): acks come in bursts, and a rate over a quarter
      // second is mostly noise.
      const out = [];
      let j = 0;
      for (let i = 1; i < h.t.length; i++) {
        while (j < i - 1 && h.t[i] - h.t[j + 1] >= RATE_MS) j++;
        const a = q.acked[i], b = q.acked[j], dt = h.t[i] - h.t[j];
        out.push([h.t[i], a === null || b === null || dt <= 0 ? null : Math.max(0, a - b) * 1000 / dt]);
      }
      return out;
    }
    const key = metric === "lag" ? "lag_ms" : "ready";
    const scale = metric === "lag" ? 1 / 1000 : 1;
    return h.t.map((t, i) => [t, q[key][i] === null ? null : q[key][i] * scale]);
  }

  // -- charts ------------------------------------------------------------------------

  function niceMax(v) {
    if (v <= 0) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
    return 10 * p;
  }

  function fmtAxis(v) { return v >= 1000 ? fmtInt(Math.round(v)) : Number(v.toPrecision(3)).toString(); }

  function drawChart(figure) {
    const metric = figure.dataset.metric;
    const box = figure.querySelector("svg");
    const legend = figure.querySelector(".legend");
    const width = Math.max(240, box.clientWidth || 360), height = 150;
    const pad = { left: 44, right: 8, top: 8, bottom: 20 };
    box.setAttribute("viewBox", `0 0 ${width} ${height}`);
    box.replaceChildren();
    legend.replaceChildren();

    const names = state.focus ? [state.focus] : Object.keys(state.history.queues);
    let lines = names.map((name) => {
      const pts = seriesFor(metric, name);
      const peak = pts.reduce((m, p) => (p[1] !== null && p[1] > m ? p[1] : m), 0);
      return { name, pts, peak };
    });
    lines.sort((a, b) => b.peak - a.peak || a.name.localeCompare(b.name));
    const hidden = Math.max(0, lines.length - MAX_LINES);
    lines = lines.slice(0, MAX_LINES);

    // The window is the history there is (at least MIN_SPAN_MS, at most the server's
    // length), so a dashboard started a moment ago does not draw a spike at the edge.
    const ts = state.history.t;
    const t1 = ts.length ? ts[ts.length - 1] : serverNow();
    const span = Math.min(config.history_ms, Math.max(MIN_SPAN_MS, ts.length ? t1 - ts[0] : 0));
    const t0 = t1 - span;
    const top = niceMax(Math.max(0, ...lines.map((l) => l.peak)));
    const x = (t) => pad.left + (width - pad.left - pad.right) * (t - t0) / (t1 - t0 || 1);
    const y = (v) => height - pad.bottom - (height - pad.top - pad.bottom) * v / top;

    for (const frac of [0, 0.5, 1]) {
      const yy = y(top * frac);
      box.append(svg("line", { x1: pad.left, x2: width - pad.right, y1: yy, y2: yy, class: "grid" }));
      const label = svg("text", { x: pad.left - 4, y: yy + 3, class: "axis", "text-anchor": "end" });
      label.textContent = fmtAxis(top * frac);
      box.append(label);
    }
    for (const [t, text, anchor] of [[t0, "-" + fmtMs(span), "start"], [t1, "now", "end"]]) {
      const label = svg("text", { x: x(t), y: height - 5, class: "axis", "text-anchor": anchor });
      label.textContent = text;
      box.append(label);
    }

    lines.forEach((line) => {
      const color = colorOf(line.name);
      let d = "", pen = false;
      for (const [t, v] of line.pts) {
        if (v === null || t < t0) { pen = false; continue; }
        d += (pen ? "L" : "M") + x(t).toFixed(1) + "," + y(v).toFixed(1);
        pen = true;
      }
      if (d) box.append(svg("path", { d, stroke: color, class: "line" }));
      const swatch = el("span", { class: "swatch" });
      swatch.style.background = color;
      legend.append(el("li", { title: line.name }, swatch, line.name));
    });
    if (hidden) legend.append(el("li", { class: "more", text: `+${hidden} quieter` }));
    if (!lines.length) legend.append(el("li", { class: "more", text: "no history yet" }));
  }

  // One colour per queue on every chart: its place among all queue names.
  function colorOf(name) {
    const names = Object.keys(state.history.queues).sort();
    return COLORS[Math.max(0, names.indexOf(name)) % COLORS.length];
  }

  function drawCharts() { document.querySelectorAll("figure.chart").forEach(drawChart); }

  // -- tables ------------------------------------------------------------------------

  const QUEUE_FIELDS = ["ready", "scheduled", "leased", "dead", "done", "lag_ms", "acked_per_s", "enqueued",
    "acked", "nacked", "reclaimed", "scrubbed"];

  function renderQueues() {
    const queues = state.overview.queues;
    const body = document.querySelector("#queues tbody");
    document.getElementById("queue-count").textContent = queues.length ? String(queues.length) : "";
    document.querySelector("#queues .empty").hidden = queues.length > 0;
    const rows = queues.map((q) => {
      const nameButton = el("button", { type: "button", class: "link", text: q.name,
        title: state.focus === q.name ? "show every queue in the charts" : "show this queue alone in the charts" });
      nameButton.addEventListener("click", () => { state.focus = state.focus === q.name ? null : q.name; renderQueues(); drawCharts(); });
      const nameCell = el("td", { class: "text" }, nameButton);
      if (q.partitions > 1) nameCell.append(el("small", { text: ` ${q.partitions} partitions` }));
      const unserved = unservedBadge(q);
      if (unserved) nameCell.append(unserved);
      const tr = el("tr", { "data-queue": q.name }, nameCell, stateCell(q));
      if (state.focus === q.name) tr.classList.add("focus");
      if (unserved) tr.classList.add("unserved");
      if (q.paused_ms > 0) tr.classList.add("paused");
      for (const field of QUEUE_FIELDS) {
        let text;
        if (field === "lag_ms") text = fmtMs(q.lag_ms);
        else if (field === "acked_per_s") text = fmtRate(q.acked_per_s);
        else text = fmtInt(q[field]);
        const td = el("td", { "data-field": field });
        if (field === "dead" && q.dead > 0) {
          const link = el("a", { href: "#dead", text });
          link.addEventListener("click", () => selectDeadQueue(q.name));
          td.append(link);
          td.className = "bad";
        } else {
          td.textContent = text;
        }
        if (field !== "lag_ms" && field !== "acked_per_s") td.dataset.value = String(q[field]);
        tr.append(td);
      }
      return tr;
    });
    body.replaceChildren(...rows);
  }

  // The task names with jobs waiting in the queue that no live worker of it advertises
  // (a sample: pyqueue/tasks/census.py, read at most every ~10 s): "no worker for:
  // billing.charge (12)", the first few names, every one in the title. Null if none.
  const UNSERVED_SHOWN = 3;
  function unservedBadge(q) {
    const tasks = q.unserved_tasks || [];
    if (!tasks.length) return null;
    const named = (t) => `${t.task} (${fmtInt(t.jobs)})`;
    const more = tasks.length > UNSERVED_SHOWN ? ` +${tasks.length - UNSERVED_SHOWN} more` : "";
    const read = ago(q.census_ms);
    return el("span", { class: "badge warn", "data-field": "unserved_tasks",
      "data-value": tasks.map((t) => t.task).join(","),
      text: "no worker for: " + tasks.slice(0, UNSERVED_SHOWN).map(named).join(", ") + more,
      title: `Jobs of these tasks wait in ${q.name} and no live worker of the queue advertises them ` +
        `(a worker not deployed yet, a typo, a task removed): a worker that does not know a task ` +
        `dead-letters its jobs.\n` +
        tasks.map(named).join("\n") +
        `\n(job counts of a sample: the first 100 ready and 100 scheduled jobs, read ${read.text})` });
  }

  // "paused" or "running", and the button that changes it (the pause / resume actions).
  function stateCell(q) {
    const paused = q.paused_ms > 0;
    const since = ago(q.paused_ms);
    const td = el("td", { class: "text state-cell", "data-field": "state", "data-value": paused ? "paused" : "running" },
      el("span", { class: paused ? "state-paused" : "state-running", text: paused ? "paused" : "running",
        title: paused ? `paused ${since.text} (${since.title}): nothing is leased, enqueue goes on` : "" }));
    const groups = groupsOf(q);
    if (groups > 0) {  // fair scheduling: only a queue whose stats count groups shows this
      const link = el("a", { href: "#groups", class: "group-count", "data-field": "groups", "data-value": String(groups),
        text: `${fmtInt(groups)} group${groups === 1 ? "" : "s"}` + (q.groups_at_cap ? `, ${fmtInt(q.groups_at_cap)} at cap` : ""),
        title: `${q.groups_waiting} groups with ready jobs and a free slot, ${q.groups_at_cap} parked at their cap` });
      link.addEventListener("click", () => selectGroupsQueue(q.name));
      td.append(link);
    }
    if (q.rate_limit > 0) {  // the rate limit (pyqueue limit): leases per period, burst
      const per = q.rate_period_ms === 1000 ? "s" : `${fmtInt(q.rate_period_ms)} ms`;
      td.append(el("span", { class: "rate-limit", "data-field": "rate_limit", text: `${fmtInt(q.rate_limit)}/${per}`,
        title: `at most ${q.rate_limit} leases per ${fmtInt(q.rate_period_ms)} ms across all workers, ` +
          `${q.rate_burst} at once` }));
    }
    if (q.budget_bytes > 0) {  // the byte budget (pyqueue budget): payload bytes in use of it
      td.append(el("span", { class: "budget", "data-field": "budget", "data-value": `${q.bytes}/${q.budget_bytes}`,
        text: `${Math.round(100 * q.bytes / q.budget_bytes)}% of budget`,
        title: `${fmtInt(q.bytes)} of ${fmtInt(q.budget_bytes)} payload bytes in use; an enqueue past the budget ` +
          "is refused" }));
    }
    // Flow control (debounce, throttle, expiry, rate keys): only a queue that has used it shows this.
    const flow = [[q.sequenced, "sequenced"], [q.expired_total, "expired"], [q.debounced, "debounced"],
      [q.throttled, "throttled"], [q.deferred, "deferred"]]
      .filter(([n]) => n > 0);
    if (flow.length > 0) {
      td.append(el("span", { class: "flow-control", "data-field": "flow_control",
        "data-value": flow.map(([n, what]) => `${what}=${n}`).join(","),
        text: flow.map(([n, what]) => `${fmtInt(n)} ${what}`).join(", "),
        title: "sequenced: jobs waiting behind their sequence's head; " +
          "expired: jobs ended unrun past their expiry; debounced: sends merged into their key's pending " +
          "job; throttled: sends dropped inside their key's window; deferred: leases put off to their rate " +
          "key's next permit (since the queue was made)" }));
    }
    const action = paused ? "resume" : "pause";
    if (config.actions.includes(action)) {
      const button = el("button", { type: "button", text: paused ? "Resume" : "Pause",
        title: paused ? `let ${q.name} hand out jobs again` : `stop ${q.name} from handing out jobs (enqueue goes on)` });
      button.addEventListener("click", () => act(action, {}, { queue: q.name, where: "queue-message" }));
      td.append(button);
    }
    return td;
  }

  function renderWorkers() {
    const workers = state.overview.workers;
    const body = document.querySelector("#workers tbody");
    document.getElementById("worker-count").textContent = workers.length ? String(workers.length) : "";
    document.querySelector("#workers .empty").hidden = workers.length > 0;
    body.replaceChildren(...workers.map((w) => {
      const started = ago(w.started_ms), beat = ago(w.renewed_ms);
      return el("tr", { "data-worker": `${w.namespace}.${w.id}` },
        el("td", { text: String(w.id) }),
        el("td", { text: w.namespace }),
        el("td", { class: "state-" + w.state, text: w.state }),
        el("td", { text: w.host || "–" }),
        el("td", { text: w.pid ? String(w.pid) : "–" }),
        el("td", { text: w.queues.join(", ") }),
        tasksCell(w.tasks || []),
        el("td", { text: started.text, title: started.title }),
        el("td", { text: beat.text, title: beat.title }));
    }));
  }

  // The task names a worker advertises: a short list as it is, a long one as a count
  // with every name in the title.
  const TASKS_LISTED = 3;
  function tasksCell(tasks) {
    const td = el("td", { class: "tasks", "data-field": "tasks", "data-value": String(tasks.length) });
    if (!tasks.length) {
      td.append(el("span", { class: "muted", text: "–", title: "advertises no task names (raw jobs, or an older worker)" }));
    } else if (tasks.length <= TASKS_LISTED) {
      td.textContent = tasks.join(", ");
      td.title = tasks.join("\n");
    } else {
      td.append(el("span", { class: "count", text: `${fmtInt(tasks.length)} tasks`, title: tasks.join("\n") }));
    }
    return td;
  }

  // -- dead letters ------------------------------------------------------------------

  function renderDeadSelect() {
    const select = document.getElementById("dead-queue");
    const queues = state.overview.queues;
    if (!state.deadQueue || !queues.some((q) => q.name === state.deadQueue)) {
      const withDead = queues.find((q) => q.dead > 0);
      state.deadQueue = withDead ? withDead.name : queues.length ? queues[0].name : null;
    }
    select.replaceChildren(...queues.map((q) => el("option", { value: q.name, text: `${q.name} (${fmtInt(q.dead)})`,
      selected: q.name === state.deadQueue })));
  }

  function selectDeadQueue(name) {
    state.deadQueue = name;
    state.deadOffset = 0;
    state.deadSelected.clear();
    renderDeadSelect();
    loadDead();
  }

  async function loadDead() {
    const name = state.deadQueue;
    const body = document.querySelector("#dead-table tbody");
    if (!name) { body.replaceChildren(); updateDeadControls(0); return; }
    const url = api(`${queuePath(name)}/dead?offset=${state.deadOffset}&limit=${config.dead_page}`);
    let response, page;
    try {
      response = await fetch(url, { credentials: "same-origin" });
      page = await response.json();
    } catch (error) {
      say("Reading the dead letters failed: " + error.message, true);
      return;
    }
    if (!response.ok) { say(page.error || `HTTP ${response.status}`, true); return; }
    if (name !== state.deadQueue) return;   // another queue was chosen meanwhile
    state.deadTotal = page.total;
    if (state.deadOffset > 0 && state.deadOffset >= page.total) {
      state.deadOffset = Math.max(0, page.total - config.dead_page);
      return loadDead();
    }
    const shown = new Set(page.jobs.map((j) => j.id));
    for (const id of [...state.deadSelected]) if (!shown.has(id)) state.deadSelected.delete(id);
    body.replaceChildren(...page.jobs.map((job) => {
      const box = el("input", { type: "checkbox", checked: state.deadSelected.has(job.id) });
      box.setAttribute("aria-label", "select " + job.id);
      box.addEventListener("change", () => {
        if (box.checked) state.deadSelected.add(job.id); else state.deadSelected.delete(job.id);
        updateDeadControls(page.jobs.length);
      });
      const died = ago(job.dead_ms);
      const error = el("pre", { class: "error", text: job.error + (job.error_truncated ? " …" : "") });
      const payload = "payload" in job
        ? el("pre", { class: "payload", text: job.payload + (job.payload_truncated ? " …" : "") })
        : el("span", { class: "muted", text: `${fmtInt(job.payload_bytes)} bytes`,
          title: "payloads are hidden: start the dashboard with --show-payloads to see them" });
      const buttons = [];  // none in read-only mode (config.actions is empty)
      if (config.actions.includes("dead_replay")) {
        const replay = el("button", { type: "button", text: "replay" });
        replay.addEventListener("click", () => act("dead_replay", { ids: [job.id] }));
        buttons.push(replay);
      }
      if (config.actions.includes("dead_purge")) {
        const purge = el("button", { type: "button", class: "danger", text: "purge" });
        purge.addEventListener("click", () => act("dead_purge", { ids: [job.id] }));
        buttons.push(purge);
      }
      return el("tr", { "data-job": job.id },
        el("td", {}, box), el("td", { class: "id", text: job.id }),
        el("td", { text: died.text, title: died.title }),
        el("td", { text: `${job.attempts}/${job.max_attempts}` }),
        el("td", {}, error), el("td", {}, payload),
        el("td", { class: "row-actions" }, ...buttons));
    }));
    const last = Math.min(page.total, state.deadOffset + page.jobs.length);
    document.getElementById("dead-range").textContent =
      page.total ? `${fmtInt(state.deadOffset + 1)}–${fmtInt(last)} of ${fmtInt(page.total)}` : "";
    document.getElementById("dead-prev").disabled = state.deadOffset === 0;
    document.getElementById("dead-next").disabled = last >= page.total;
    updateDeadControls(page.jobs.length);
  }

  function updateDeadControls(rows) {
    document.querySelector("#dead .empty").hidden = rows > 0;
    const all = document.getElementById("dead-all");
    all.checked = rows > 0 && state.deadSelected.size === rows;
    for (const button of document.querySelectorAll('#dead [data-scope="selected"]')) button.disabled = state.deadSelected.size === 0;
    for (const button of document.querySelectorAll('#dead [data-scope="all"]')) button.disabled = !state.deadQueue || state.deadTotal === 0;
  }

  function say(text, bad, where) {
    const message = document.getElementById(where || "dead-message");
    message.textContent = text;
    message.className = "message" + (bad ? " bad" : "");
  }

  // One POST per action (see ACTIONS in app.py); a new action needs only a button
  // with data-action, or a call of act() with its body. ``target``: the queue and the
  // message element, when not the dead letters' (a queue's pause and resume, a job's
  // cancel, a group cap).
  async function act(action, body, target) {
    const name = target ? target.queue : state.deadQueue;
    const where = target ? target.where : "dead-message";
    if (!name) return;
    if (action === "dead_purge") {
      const what = body.all ? `every dead job of ${name}` : `${body.ids.length} dead job(s) of ${name}`;
      if (!window.confirm(`Purge ${what} for good?`)) return;
    }
    let response;
    try {
      response = await fetch(api(`${queuePath(name)}/actions/${action}`), {
        method: "POST",
        credentials: "same-origin",
        headers: { "content-type": "application/json", "x-csrf-token": csrfToken },
        body: JSON.stringify(body),
      });
    } catch (error) {
      say("The dashboard server did not answer: " + error.message, true, where);
      return;
    }
    const answer = await response.json().catch(() => ({}));
    if (!response.ok) { say(answer.error || `HTTP ${response.status}`, true, where); return; }
    say(answer.message, false, where);
    if (target) { await poll(true); return; }
    state.deadSelected.clear();
    await poll(true);
    await loadDead();
  }

  function wireDead() {
    document.getElementById("dead-queue").addEventListener("change", (e) => selectDeadQueue(e.target.value));
    document.getElementById("dead-all").addEventListener("change", (e) => {
      for (const row of document.querySelectorAll("#dead-table tbody tr")) {
        const box = row.querySelector("input[type=checkbox]");
        box.checked = e.target.checked;
        if (box.checked) state.deadSelected.add(row.dataset.job); else state.deadSelected.delete(row.dataset.job);
      }
      updateDeadControls(document.querySelectorAll("#dead-table tbody tr").length);
    });
    for (const button of document.querySelectorAll("#dead [data-action]")) {
      button.addEventListener("click", () => {
        const body = button.dataset.scope === "all" ? { all: true } : { ids: [...state.deadSelected] };
        act(button.dataset.action, body);
      });
    }
    document.getElementById("dead-prev").addEventListener("click", () => {
      state.deadOffset = Math.max(0, state.deadOffset - config.dead_page); loadDead();
    });
    document.getElementById("dead-next").addEventListener("click", () => {
      state.deadOffset += config.dead_page; loadDead();
    });
  }

  // -- groups (fair scheduling) -------------------------------------------------------

  // A queue's groups with ready jobs, from its stats (no extra call).
  function groupsOf(q) { return (q.groups_waiting || 0) + (q.groups_at_cap || 0); }

  // The figures that move when a queue's groups do: a change reads the table again.
  function groupsKey(q) { return [q.name, q.groups_waiting, q.groups_at_cap, q.ready, q.leased, q.enqueued].join("|"); }

  // A cap set elsewhere (the CLI) moves no figure: the table is read again after this long.
  const GROUPS_STALE_MS = 10000;

  // The section appears once a queue has groups, and stays: a cap can still be set while
  // a queue's groups have drained. Its select lists every queue.
  function renderGroupsSelect() {
    const queues = state.overview.queues;
    if (queues.some((q) => groupsOf(q) > 0)) state.groupsShown = true;
    document.getElementById("groups").hidden = !state.groupsShown;
    if (!state.groupsShown) return;
    if (!state.groupsQueue || !queues.some((q) => q.name === state.groupsQueue)) {
      const withGroups = queues.find((q) => groupsOf(q) > 0);
      state.groupsQueue = withGroups ? withGroups.name : queues.length ? queues[0].name : null;
    }
    document.getElementById("groups-queue").replaceChildren(...queues.map((q) => el("option", { value: q.name,
      text: `${q.name} (${fmtInt(groupsOf(q))})`, selected: q.name === state.groupsQueue })));
  }

  function selectGroupsQueue(name) {
    state.groupsQueue = name;
    renderGroupsSelect();
    say("", false, "groups-message");
    loadGroups();
  }

  // Read the selected queue's groups (one call: api/queues/<q>/groups, at most
  // config.groups_page of them), unless its stats say it has none: then nothing is asked.
  async function loadGroups() {
    const name = state.groupsQueue;
    const q = state.overview.queues.find((x) => x.name === name);
    state.groupsKey = q ? groupsKey(q) : "";
    state.groupsAt = Date.now();
    if (!q || groupsOf(q) === 0) { renderGroups(name, null); return; }
    let response, page;
    try {
      const url = api(`${queuePath(name)}/groups?limit=${config.groups_page}`);
      response = await fetch(url, { credentials: "same-origin" });
      page = await response.json();
    } catch (error) {
      say("Reading the groups failed: " + error.message, true, "groups-message");
      return;
    }
    if (!response.ok) { say(page.error || `HTTP ${response.status}`, true, "groups-message"); return; }
    if (name !== state.groupsQueue) return;   // another queue was chosen meanwhile
    renderGroups(name, page);
  }

  // At a poll: read the groups again if the selected queue's figures moved, or the
  // table is older than GROUPS_STALE_MS.
  function refreshGroups() {
    if (!state.groupsShown || !state.groupsQueue) return;
    const q = state.overview.queues.find((x) => x.name === state.groupsQueue);
    const stale = q && groupsOf(q) > 0 && Date.now() - state.groupsAt > GROUPS_STALE_MS;
    if (!q || groupsKey(q) !== state.groupsKey || stale) loadGroups();
  }

  // The table of api/queues/<q>/groups (``page``), or, with none, the queue's note.
  function renderGroups(name, page) {
    const body = document.querySelector("#groups-table tbody");
    const empty = document.querySelector("#groups .empty");
    const fallback = document.getElementById("groups-default");
    if (!page) {
      body.replaceChildren();
      empty.textContent = name ? `No group of ${name} has ready jobs.` : "No queues.";
      empty.hidden = false;
      fallback.textContent = "–";
      fallback.dataset.value = "";
      fallback.title = "read with the groups: none has ready jobs now";
      document.getElementById("groups-range").textContent = "";
      return;
    }
    const capText = (cap) => (cap > 0 ? fmtInt(cap) : "none");
    fallback.textContent = capText(page.default_cap);
    fallback.dataset.value = String(page.default_cap);
    fallback.title = "the cap of every group without its own";
    body.replaceChildren(...page.groups.map((g) => {
      const nameButton = el("button", { type: "button", class: "link", text: g.name, title: "set this group's cap" });
      nameButton.addEventListener("click", () => {
        document.getElementById("group-limit-group").value = g.name;
        document.getElementById("group-limit-cap").focus();
      });
      const nameCell = el("td", { class: "text" }, nameButton);
      if (page.partitions > 1) nameCell.append(el("small", { text: ` ${g.partition}` }));
      const cap = el("td", { "data-field": "cap", "data-value": String(g.cap) }, capText(g.cap),
        el("small", { text: g.own_cap ? " own" : " default",
          title: g.own_cap ? "its own cap" : "the queue's default cap (or its own, equal to it)" }));
      const tr = el("tr", { "data-group": g.name }, nameCell,
        el("td", { class: "text", "data-field": "state", "data-value": g.parked ? "parked" : "waiting" },
          el("span", { class: g.parked ? "state-parked" : "state-waiting", text: g.parked ? "parked at cap" : "waiting",
            title: g.parked ? "at its cap: lease skips it until one of its leases ends" : "" })),
        el("td", { "data-field": "ready", "data-value": String(g.ready), text: fmtInt(g.ready) }),
        el("td", { "data-field": "running", "data-value": String(g.running), text: fmtInt(g.running) }),
        cap);
      if (g.parked) tr.classList.add("parked");
      return tr;
    }));
    empty.textContent = `No group of ${name} has ready jobs.`;
    empty.hidden = page.groups.length > 0;
    const range = document.getElementById("groups-range");
    range.textContent = page.groups.length < page.total
      ? `${fmtInt(page.groups.length)} of ${fmtInt(page.total)} groups: ` +
        `the first ${fmtInt(page.limit)} lease sees, largest backlogs first`
      : `${fmtInt(page.total)} group${page.total === 1 ? "" : "s"} with ready jobs`;
  }

  // The group_limit action: the cap as typed (a number, off, default) for the group
  // named, or every group's default when none is; the server parses and refuses.
  async function setGroupLimit(event) {
    event.preventDefault();
    const name = state.groupsQueue;
    if (!name) return;
    const group = document.getElementById("group-limit-group").value;
    const body = { cap: document.getElementById("group-limit-cap").value };
    if (group !== "") body.group = group;
    await act("group_limit", body, { queue: name, where: "groups-message" });
    await loadGroups();
  }

  function wireGroups() {
    document.getElementById("groups-queue").addEventListener("change", (e) => selectGroupsQueue(e.target.value));
    const form = document.getElementById("group-limit-form");
    if (config.actions.includes("group_limit")) form.addEventListener("submit", setGroupLimit);
    else form.remove();  // (a toolbar is display: flex, which the hidden attribute does not beat)
  }

  // -- jobs by state -----------------------------------------------------------------

  // The Jobs panel's tabs: each state, and the stats field that counts it (the counts
  // come with every poll; the page itself is read from api/queues/<q>/jobs).
  const JOB_TABS = [["ready", "ready"], ["scheduled", "scheduled"], ["running", "leased"], ["done", "done"],
    ["dead", "dead"]];
  // Each state's columns after the id (and the partition, on a partitioned queue).
  const JOB_COLUMNS = {
    ready: ["attempts", "group", "priority"],
    scheduled: ["due", "attempts"],
    running: ["owner", "attempt", "running for", "time limit", "progress", "lease deadline", "fence"],
    done: ["a duplicate until", "result"],
    dead: ["died", "attempts", "error"],
  };

  // The figures that move when the selected state's jobs do: a change reads the page again.
  function jobsKey(q) { return [q.name, q.ready, q.scheduled, q.leased, q.done, q.dead, q.enqueued, q.acked].join("|"); }

  function renderJobsSelect() {
    const queues = state.overview.queues;
    if (!state.jobsQueue || !queues.some((q) => q.name === state.jobsQueue)) {
      state.jobsQueue = queues.length ? queues[0].name : null;
      state.jobsStart = 0;
    }
    document.getElementById("jobs-queue").replaceChildren(...queues.map((q) => el("option", { value: q.name,
      text: q.name, selected: q.name === state.jobsQueue })));
    renderJobTabs();
  }

  function renderJobTabs() {
    const q = state.overview.queues.find((x) => x.name === state.jobsQueue);
    document.getElementById("jobs-tabs").replaceChildren(...JOB_TABS.map(([name, field]) => {
      const count = q ? q[field] : 0;
      const tab = el("button", { type: "button", class: name === state.jobsState ? "active" : "", "data-state": name,
        "data-count": String(count) }, name + " ", el("small", { text: fmtInt(count) }));
      tab.setAttribute("role", "tab");
      tab.setAttribute("aria-selected", String(name === state.jobsState));
      tab.addEventListener("click", () => { state.jobsState = name; state.jobsStart = 0; renderJobTabs(); loadJobs(); });
      return tab;
    }));
  }

  // Read one page of the selected queue's jobs in the selected state (one call).
  async function loadJobs() {
    const name = state.jobsQueue, which = state.jobsState, start = state.jobsStart;
    const q = state.overview.queues.find((x) => x.name === name);
    state.jobsKey = q ? jobsKey(q) : "";
    state.jobsAt = Date.now();
    if (!name) { renderJobs(null); return; }
    let response, page;
    try {
      const url = api(`${queuePath(name)}/jobs?state=${which}&start=${start}&count=${config.jobs_page}`);
      response = await fetch(url, { credentials: "same-origin" });
      page = await response.json();
    } catch (error) {
      say("Reading the jobs failed: " + error.message, true, "jobs-message");
      return;
    }
    if (!response.ok) { say(page.error || `HTTP ${response.status}`, true, "jobs-message"); return; }
    if (name !== state.jobsQueue || which !== state.jobsState || start !== state.jobsStart) return;  // moved on
    if (start > 0 && start >= page.total) {  // the page emptied meanwhile: show the last one
      state.jobsStart = Math.max(0, Math.ceil(page.total / config.jobs_page) - 1) * config.jobs_page;
      return loadJobs();
    }
    say("", false, "jobs-message");
    renderJobs(page);
  }

  // At a poll: read the page again if the selected queue's figures moved; the running
  // tab also every RUNNING_STALE_MS, since its workers' reports and progress change
  // without them. Never while a result is open under a row: it would go.
  const RUNNING_STALE_MS = 3000;
  function refreshJobs() {
    const q = state.overview.queues.find((x) => x.name === state.jobsQueue);
    const stale = state.jobsState === "running" && Date.now() - state.jobsAt > RUNNING_STALE_MS;
    if (q && (jobsKey(q) !== state.jobsKey || stale) && state.jobsResults === 0) loadJobs();
  }

  // Show a job in the job lookup (the same view as typing its id there).
  function openJob(name, id) {
    document.getElementById("lookup-queue").value = name;
    document.getElementById("lookup-id").value = id;
    lookup({ preventDefault() {} });
    document.getElementById("lookup").scrollIntoView();
  }

  // A done job's kept result (api/queues/<q>/result), in a row under the job's.
  async function showResult(name, id, tr, button) {
    if (tr.nextSibling && tr.nextSibling.classList.contains("result-row")) {
      tr.nextSibling.remove();
      state.jobsResults = Math.max(0, state.jobsResults - 1);
      button.textContent = "show";
      return;
    }
    let response, found;
    try {
      response = await fetch(api(`${queuePath(name)}/result?id=${encodeURIComponent(id)}`), { credentials: "same-origin" });
      found = await response.json();
    } catch (error) {
      say("Reading the result failed: " + error.message, true, "jobs-message");
      return;
    }
    if (!response.ok) { say(found.error || `HTTP ${response.status}`, true, "jobs-message"); return; }
    const shown = found.value !== null
      ? el("pre", { class: "payload", text: found.value + (found.value_truncated ? " …" : "") })
      : el("span", { class: "muted", text: `no result kept now (${found.state})` });
    const columns = document.querySelectorAll("#jobs-table thead th").length;
    tr.after(el("tr", { class: "result-row", "data-result": id }, el("td", { colSpan: columns }, shown)));
    state.jobsResults += 1;
    button.textContent = "hide";
  }

  // The page of api/queues/<q>/jobs (``page``), or nothing when there is no queue.
  function renderJobs(page) {
    const body = document.querySelector("#jobs-table tbody");
    const head = document.querySelector("#jobs-table thead tr");
    const empty = document.querySelector("#jobs .empty");
    const unserved = document.getElementById("jobs-unserved");
    state.jobsResults = 0;
    if (!page) {
      head.replaceChildren(); body.replaceChildren(); unserved.replaceChildren();
      empty.textContent = "No queues."; empty.hidden = false;
      document.getElementById("jobs-range").textContent = "";
      document.getElementById("jobs-prev").disabled = document.getElementById("jobs-next").disabled = true;
      return;
    }
    const q = state.overview.queues.find((x) => x.name === page.queue);
    const partitioned = q && q.partitions > 1;
    const badge = unservedBadge({ name: page.queue, unserved_tasks: page.unserved_tasks, census_ms: page.census_ms });
    unserved.replaceChildren(...(badge ? [badge] : []));
    head.replaceChildren(el("th", { text: "id" }), ...(partitioned ? [el("th", { text: "partition" })] : []),
      ...JOB_COLUMNS[page.state].map((c) => el("th", { text: c })));
    const now = page.now_ms || serverNow();
    const time = (ms) => { const t = when(ms, now); return el("td", { text: t.text, title: t.title }); };
    body.replaceChildren(...page.jobs.map((job) => {
      const idButton = el("button", { type: "button", class: "link id", text: job.id, title: "show this job" });
      idButton.addEventListener("click", () => openJob(page.queue, job.id));
      const tr = el("tr", { "data-job": job.id }, el("td", {}, idButton));
      if (partitioned) tr.append(el("td", { class: "muted", text: job.queue || "" }));
      const tries = el("td", { text: `${job.attempts}/${job.max_attempts}` });
      if (page.state === "ready") {
        tr.append(tries, el("td", { text: job.group || "–" }), el("td", { text: String(job.priority) }));
      } else if (page.state === "scheduled") {
        tr.append(job.waiting ? el("td", { class: "muted", text: "waiting for other jobs",
          title: "a flow's next step: due when the jobs it waits for have ended" }) : time(job.due_ms), tries);
      } else if (page.state === "running") {
        const deadline = time(job.deadline_ms);
        if (job.deadline_ms <= now) {
          deadline.classList.add("expired");
          deadline.title += " (expired: the job goes back to ready at the next promote)";
        }
        // Elapsed and time limit as the worker reported them at its last renewal (a job
        // leased since has none yet); progress as the job's task wrote it.
        const elapsed = job.leased_ms === null || job.leased_ms === undefined
          ? el("td", { class: "muted", "data-field": "elapsed", text: "–",
                       title: "not reported yet: a worker reports what it runs at each heartbeat" })
          : el("td", { "data-field": "elapsed", text: fmtMs(Math.max(0, now - job.leased_ms)),
                       title: "leased " + new Date(job.leased_ms).toISOString() });
        let limit;
        if (job.limit_ms === null || job.limit_ms === undefined) {
          limit = el("td", { class: "muted", "data-field": "limit", text: job.leased_ms == null ? "–" : "none" });
        } else {
          limit = time(job.limit_ms);
          limit.dataset.field = "limit";
          if (job.limit_ms <= now) limit.classList.add("expired");
        }
        const progress = el("td", { class: job.progress ? "" : "muted", "data-field": "progress",
                                    text: job.progress || "–" });
        tr.append(el("td", { text: job.owner }), tries, elapsed, limit, progress, deadline,
          el("td", { text: String(job.fence) }));
      } else if (page.state === "done") {
        const cell = el("td", {});
        if (job.has_result) {
          const button = el("button", { type: "button", text: "show", title: "show the result it returned" });
          button.addEventListener("click", () => showResult(page.queue, job.id, tr, button));
          cell.append(button);
        } else {
          cell.append(el("span", { class: "muted", text: "none" }));
        }
        tr.append(time(job.done_until_ms), cell);
      } else {
        const died = ago(job.dead_ms);
        tr.append(el("td", { text: died.text, title: died.title }), tries,
          el("td", {}, el("pre", { class: "error", text: job.error + (job.error_truncated ? " …" : "") })));
      }
      return tr;
    }));
    empty.textContent = `No ${page.state} jobs in ${page.queue}.`;
    empty.hidden = page.jobs.length > 0;
    const last = page.start + page.jobs.length;
    document.getElementById("jobs-range").textContent =
      page.total ? `${fmtInt(page.start + 1)}–${fmtInt(last)} of ${fmtInt(page.total)}` : "";
    document.getElementById("jobs-prev").disabled = page.start === 0;
    document.getElementById("jobs-next").disabled = last >= page.total;
  }

  function wireJobs() {
    document.getElementById("jobs-queue").addEventListener("change", (e) => {
      state.jobsQueue = e.target.value; state.jobsStart = 0; renderJobTabs(); loadJobs();
    });
    document.getElementById("jobs-prev").addEventListener("click", () => {
      state.jobsStart = Math.max(0, state.jobsStart - config.jobs_page); loadJobs();
    });
    document.getElementById("jobs-next").addEventListener("click", () => {
      state.jobsStart += config.jobs_page; loadJobs();
    });
  }

  // -- events (a queue's event stream, lua/README.md section 2.5) ---------------------

  const EVENTS_KEPT = 200;   // rows the panel keeps, newest first

  function renderEventsSelect() {
    const queues = state.overview.queues;
    if (!state.eventsQueue || !queues.some((q) => q.name === state.eventsQueue)) {
      state.eventsQueue = queues.length ? queues[0].name : null;
      state.eventsLast = -1;
      state.eventsRows = [];
    }
    document.getElementById("events-queue").replaceChildren(...queues.map((q) => el("option", { value: q.name,
      text: q.name, selected: q.name === state.eventsQueue })));
  }

  // The newest events at first (since -1), then at each poll those after the last read.
  async function loadEvents() {
    const name = state.eventsQueue;
    if (!name) { renderEvents(); return; }
    let response, page;
    try {
      const url = api(`${queuePath(name)}/events?since=${state.eventsLast}&count=${config.events_page}`);
      response = await fetch(url, { credentials: "same-origin" });
      page = await response.json();
    } catch (error) {
      say("Reading the events failed: " + error.message, true, "events-message");
      return;
    }
    if (name !== state.eventsQueue) return;   // another queue was chosen meanwhile
    if (!response.ok) { say(page.error || `HTTP ${response.status}`, true, "events-message"); return; }
    const fresh = page.events.slice().reverse();
    state.eventsRows = (state.eventsLast < 0 ? fresh : fresh.concat(state.eventsRows)).slice(0, EVENTS_KEPT);
    state.eventsLast = page.last;
    say(page.missed ? `${fmtInt(page.missed)} events were trimmed before this page read them` : "",
        page.missed > 0, "events-message");
    renderEvents();
  }

  function renderEvents() {
    const now = serverNow();
    const rows = state.eventsRows;
    document.querySelector("#events .empty").hidden = rows.length > 0;
    document.querySelector("#events tbody").replaceChildren(...rows.map((e) => {
      const at = when(e.at_ms, now);
      const details = Object.entries(e).filter(([k]) => !["seq", "type", "id", "at_ms", "attempt"].includes(k))
        .map(([k, v]) => `${k}=${v}`).join("  ");
      const idButton = el("button", { type: "button", class: "link id", text: e.id, title: "look this job up" });
      idButton.addEventListener("click", () => openJob(state.eventsQueue, e.id));
      return el("tr", { "data-seq": String(e.seq), "data-type": e.type },
        el("td", { class: "num", text: String(e.seq) }),
        el("td", { text: at.text, title: at.title }),
        el("td", { class: "event-" + e.type, "data-field": "type", text: e.type }),
        el("td", {}, idButton),
        el("td", { class: "num", text: e.attempt === undefined ? "–" : String(e.attempt) }),
        el("td", { class: "details", "data-field": "details", text: details }));
    }));
  }

  function wireEvents() {
    document.getElementById("events-queue").addEventListener("change", (e) => {
      state.eventsQueue = e.target.value; state.eventsLast = -1; state.eventsRows = []; loadEvents();
    });
  }

  // -- job lookup --------------------------------------------------------------------

  // The queue selects of the job lookup, the flow panel and the search box: every
  // queue by name.
  function renderLookupSelect() {
    const names = state.overview.queues.map((q) => q.name);
    if (names.join("\n") === state.lookupQueues) return;   // rebuilt only when the queues change
    state.lookupQueues = names.join("\n");
    for (const id of ["lookup-queue", "flow-queue", "search-queue"]) {
      const select = document.getElementById(id);
      const chosen = names.includes(select.value) ? select.value : names[0];
      select.replaceChildren(...names.map((name) => el("option", { value: name, text: name, selected: name === chosen })));
    }
  }

  async function lookup(event) {
    event.preventDefault();
    const name = document.getElementById("lookup-queue").value;
    const id = document.getElementById("lookup-id").value;
    const table = document.getElementById("lookup-result");
    if (!name || !id) return;
    let response, info;
    try {
      response = await fetch(api(`${queuePath(name)}/job?id=${encodeURIComponent(id)}`), { credentials: "same-origin" });
      info = await response.json();
    } catch (error) {
      say("Looking the job up failed: " + error.message, true, "lookup-message");
      return;
    }
    if (!response.ok) { say(info.error || `HTTP ${response.status}`, true, "lookup-message"); table.hidden = true; return; }
    say("", false, "lookup-message");
    renderJob(info, name);
  }

  // Cancel the looked-up job (the cancel action), then show where it is now.
  async function cancelJob(name, id) {
    if (!window.confirm(`Cancel job ${id} of ${name}? It will not run (again).`)) return;
    await act("cancel", { ids: [id] }, { queue: name, where: "lookup-message" });
    const message = document.getElementById("lookup-message").textContent;
    await lookup({ preventDefault() {} });
    say(message, false, "lookup-message");
  }

  // The answer of api/queues/<queue>/job as label / value rows (text only; fields a
  // state has not are -1 or "", and are left out).
  function renderJob(info, name) {
    const rows = [];
    const row = (field, label, ...value) => rows.push(el("tr", { "data-field": field }, el("th", { text: label }),
      el("td", {}, ...value)));
    const time = (ms) => { const t = when(ms, info.now_ms); return el("span", { text: t.text, title: t.title }); };
    row("id", "id", el("span", { class: "id", text: info.id }));
    row("queue", "queue", info.queue);
    row("state", "state", el("span", { class: "job-state state-" + info.state, text: info.state }));
    if (info.state === "unknown") {
      row("note", "", el("span", { class: "muted",
        text: "not in this queue: never enqueued, purged, or acked long enough ago that its id is forgotten" }));
    }
    if (info.attempts >= 0) row("attempts", "attempts", `${info.attempts}/${info.max_attempts}`);
    if (info.due_ms > 0) row("due_ms", info.state === "dead" ? "died" : "due", time(info.due_ms));
    if (info.deadline_ms > 0) row("deadline_ms", "lease deadline", time(info.deadline_ms));
    if (info.owner) row("owner", "lease owner", info.owner);
    if (info.fence >= 0 && info.state === "leased") row("fence", "fence", String(info.fence));
    if (info.progress !== null && info.progress !== undefined) {
      row("progress", "progress", el("pre", { class: "payload", text: info.progress }), time(info.progress_written_ms));
    }
    for (const step of info.steps || []) {
      // Durable steps (current_job().step, .sleep, .wait_signal): values only when payloads are shown.
      const value = "value" in step ? el("pre", { class: "payload", text: step.value + (step.value_truncated ? " …" : "") })
        : el("span", { class: "muted", text: step.kind === "step" ? "committed" : step.kind === "signal" ? "kept for its wait" : "" });
      const label = { step: "step", sleep: "sleeping", wait: "waiting for", signal: "signal" }[step.kind] || step.kind;
      row("step", `${label} ${step.name}`, value, ...(step.until_ms > 0 ? [time(step.until_ms)] : []));
    }
    if (info.done_until_ms > 0) row("done_until_ms", "a duplicate until", time(info.done_until_ms));
    if (info.payload_bytes >= 0) {
      if ("payload" in info && info.payload !== null) {
        row("payload", "payload", el("pre", { class: "payload", text: info.payload + (info.payload_truncated ? " …" : "") }));
      }
      row("payload_bytes", "payload size", el("span", { text: `${fmtInt(info.payload_bytes)} bytes`,
        title: "payload" in info ? "" : "payloads are hidden: start the dashboard with --show-payloads to see them" }));
    }
    if (info.error) row("error", "last error", el("pre", { class: "error", text: info.error + (info.error_truncated ? " …" : "") }));
    if (config.actions.includes("cancel") && ["ready", "scheduled", "waiting", "leased", "dead"].includes(info.state)) {
      const button = el("button", { type: "button", id: "lookup-cancel", text: "Cancel job",
        title: info.state === "leased" ? "end its lease now; its worker tells the handler at the next extension"
          : "remove it now: it will not run" });
      button.addEventListener("click", () => cancelJob(name, info.id));
      row("cancel", "", button);
    }
    const table = document.getElementById("lookup-result");
    table.querySelector("tbody").replaceChildren(...rows);
    table.hidden = false;
  }

  // A link to a job's view (the search page's ids): ?queue=<name>&job=<id>#lookup.
  function openLinkedJob() {
    const params = new URLSearchParams(window.location.search);
    const id = params.get("job"), name = params.get("queue");
    if (id && name && state.overview.queues.some((q) => q.name === name)) openJob(name, id);
  }

  function wireLookup() {
    document.getElementById("lookup-form").addEventListener("submit", lookup);
  }

  // -- flow --------------------------------------------------------------------------

  // The states of a flow's steps in the order a flow moves through them (any other a
  // newer server sends goes last).
  const FLOW_STATES = ["waiting", "ready", "scheduled", "leased", "done", "dead", "cancelled", "unknown"];

  // Read a flow by its id from the queue of its first step (api/queues/<q>/flow: one
  // call for its record and each step's state). Only when asked: a flow is not polled.
  async function showFlow(event) {
    event.preventDefault();
    const name = document.getElementById("flow-queue").value;
    const id = document.getElementById("flow-id").value;
    const result = document.getElementById("flow-result");
    if (!name || !id) return;
    let response, flow;
    try {
      response = await fetch(api(`${queuePath(name)}/flow?id=${encodeURIComponent(id)}`), { credentials: "same-origin" });
      flow = await response.json();
    } catch (error) {
      say("Reading the flow failed: " + error.message, true, "flow-message");
      return;
    }
    if (!response.ok) { say(flow.error || `HTTP ${response.status}`, true, "flow-message"); result.hidden = true; return; }
    say("", false, "flow-message");
    renderFlow(flow);
  }

  // The answer of api/queues/<queue>/flow: a line about the flow, its steps per state,
  // and its tree as nested lists (a chain's steps in order, a group's side by side).
  function renderFlow(flow) {
    const now = serverNow();
    const sent = ago(flow.created_ms), expires = when(flow.expires_ms, now);
    document.getElementById("flow-summary").replaceChildren(
      "flow ", el("span", { class: "id", text: flow.id }),
      ` in ${flow.queue}: ${fmtInt(flow.steps.length)} step${flow.steps.length === 1 ? "" : "s"}, sent `,
      el("span", { text: sent.text, title: sent.title }),
      "; its record expires ", el("span", { text: expires.text, title: expires.title }),
      el("span", { class: "muted", text: " (press Show again to read the states anew)" }));
    const states = Object.keys(flow.counts).sort((a, b) => rank(a) - rank(b) || a.localeCompare(b));
    document.getElementById("flow-counts").replaceChildren(...states.map((s) =>
      el("span", { class: "job-state state-" + s, "data-state": s, "data-count": String(flow.counts[s]),
        text: `${fmtInt(flow.counts[s])} ${s}` })));
    document.getElementById("flow-tree").replaceChildren(flowNode(flow.tree, flow.steps));
    document.getElementById("flow-result").hidden = false;
  }

  function rank(s) { const i = FLOW_STATES.indexOf(s); return i < 0 ? FLOW_STATES.length : i; }

  // One node of a flow's tree: a step number, or {"chain": [...]} / {"group": [...]}.
  function flowNode(node, steps) {
    if (typeof node === "number") {
      const step = steps[node];
      if (!step) return el("li", { class: "muted", text: `step ${node}: not in the record` });
      return flowStep(step);
    }
    const [kind, children] = Object.entries(node || {})[0] || ["?", []];
    const list = el(kind === "chain" ? "ol" : "ul", {}, ...(Array.isArray(children) ? children : []).map((c) => flowNode(c, steps)));
    return el("li", { class: "flow-" + kind, "data-kind": kind },
      el("span", { class: "flow-kind", text: kind,
        title: kind === "chain" ? "one after another, each given the result of the one before"
          : kind === "group" ? "side by side; what follows waits for all of them" : "" }),
      list);
  }

  // A step: its number, task, job id (it fills the job lookup), queue, state and the
  // state in words (attempts, a dead step's error).
  function flowStep(step) {
    const idButton = el("button", { type: "button", class: "link id", text: step.id, title: "look this job up" });
    idButton.addEventListener("click", () => lookUpStep(step));
    const item = el("li", { class: "flow-step", "data-step": String(step.n), "data-state": step.state },
      el("span", { class: "step-n", text: String(step.n) }),
      el("strong", { class: "task", text: step.task }), " ", idButton, " ",
      el("small", { class: "muted", text: step.queue }), " ",
      el("span", { class: "job-state state-" + step.state, text: step.state }));
    if (step.describe && step.describe !== step.state) {
      item.append(" ", el("span", { class: step.state === "dead" ? "describe bad" : "describe muted", text: step.describe,
        title: step.error ? step.error + (step.error_truncated ? " …" : "") : "" }));
    }
    return item;
  }

  // Fill the job lookup with a step's job and look it up. A step names its physical
  // queue (<queue>#<p> for a partition); the lookup's select lists logical queues.
  function lookUpStep(step) {
    const select = document.getElementById("lookup-queue");
    const names = [...select.options].map((o) => o.value);
    const logical = names.includes(step.queue) ? step.queue : step.queue.replace(/#\d+$/, "");
    if (!names.includes(logical)) { say(`no queue ${logical} to look ${step.id} up in`, true, "flow-message"); return; }
    select.value = logical;
    document.getElementById("lookup-id").value = step.id;
    document.getElementById("lookup").scrollIntoView({ block: "nearest" });
    lookup({ preventDefault() {} });
  }

  function wireFlow() {
    document.getElementById("flow-form").addEventListener("submit", showFlow);
  }

  // -- the task view (workers' metrics, --worker-metrics) ----------------------------

  // A duration in seconds from a histogram quantile (null: no observation).
  function fmtSeconds(s) {
    if (s === null || s === undefined) return "–";
    return s < 1 ? fmtMs(s * 1000) : s < 60 ? s.toFixed(s < 10 ? 2 : 1) + " s" : fmtMs(s * 1000);
  }

  async function loadTasks() {
    if (!config.task_view) return;
    let response, view;
    try {
      response = await fetch(api("tasks"), { credentials: "same-origin" });
      view = await response.json();
    } catch (error) {
      say("Reading the task view failed: " + error.message, true, "tasks-message");
      return;
    }
    if (!response.ok) { say(view.error || `HTTP ${response.status}`, true, "tasks-message"); return; }
    renderTasks(view);
  }

  function renderTasks(view) {
    const section = document.getElementById("tasks");
    section.hidden = false;
    const down = view.sources.filter((s) => !s.ok);
    const message = view.error ||
      (down.length ? down.map((s) => `${s.url} did not answer: ${s.error}`).join("; ") : "");
    say(message, Boolean(message), "tasks-message");
    document.querySelector("#tasks .empty").hidden = view.tasks.length > 0 || Boolean(view.error);
    const num = (n, field) => el("td", { class: "num", "data-field": field, text: fmtInt(n) });
    const dur = (s, field) => el("td", { class: "num", "data-field": field, text: fmtSeconds(s),
                                         title: s === null ? "no run yet" : s + " s (estimated from the buckets)" });
    section.querySelector("tbody").replaceChildren(...view.tasks.map((t) =>
      el("tr", { "data-task": t.task, "data-queue": t.queue },
        el("td", { text: t.task }), el("td", { text: t.queue }),
        num(t.runs, "runs"), num(t.outcomes.ok, "ok"), num(t.failures, "failures"), num(t.outcomes.dead, "dead"),
        dur(t.run_p50_s, "run_p50"), dur(t.run_p99_s, "run_p99"),
        dur(t.wait_p50_s, "wait_p50"), dur(t.wait_p99_s, "wait_p99"))));
  }

  // -- polling -----------------------------------------------------------------------

  function apply(overview) {
    state.overview = overview;
    if (overview.now_ms) state.clockOffset = overview.now_ms - Date.now();
    mergeHistory(overview.history);
    setBanner(overview.error ? "Reading Redis failed: " + overview.error + " (showing the last figures)" : "");
    renderQueues();
    renderWorkers();
    renderDeadSelect();
    renderGroupsSelect();
    renderJobsSelect();
    renderEventsSelect();
    renderLookupSelect();
    drawCharts();
    const status = document.getElementById("status");
    status.textContent = "updated " + new Date().toLocaleTimeString();
    const selected = overview.queues.find((q) => q.name === state.deadQueue);
    return selected ? selected.dead : 0;
  }

  async function poll(now) {
    clearTimeout(state.pollTimer);
    try {
      const last = state.history.t.length ? state.history.t[state.history.t.length - 1] : -1;
      const response = await fetch(api("overview?since=" + last), { credentials: "same-origin" });
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      const dead = apply(await response.json());
      if (!now && dead !== state.deadTotal) await loadDead();
      if (!now) refreshGroups();
      if (!now) refreshJobs();
      if (!now) loadTasks();
      if (!now) loadEvents();
    } catch (error) {
      setBanner("The dashboard server did not answer: " + error.message);
    } finally {
      state.pollTimer = setTimeout(() => poll(false), document.hidden ? config.poll_ms * 5 : config.poll_ms);
    }
  }

  function start() {
    wireDead();
    wireLookup();
    wireFlow();
    wireGroups();
    wireJobs();
    wireEvents();
    apply(initial.overview);
    loadDead();
    loadJobs();
    loadTasks();
    loadEvents();
    if (state.groupsShown) loadGroups();
    openLinkedJob();
    window.addEventListener("resize", drawCharts);
    state.pollTimer = setTimeout(() => poll(false), config.poll_ms);
    document.body.dataset.ready = "1";
    // For bench/bench_dashboard.py: when the first data was on screen.
    performance.mark("pyqueue-first-render");
  }

  start();
})();
