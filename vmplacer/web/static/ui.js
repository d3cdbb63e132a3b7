// vmplacer web view: refreshes the page's data every few seconds without reloading.
// Every value from the server goes into the page as text (textContent, attributes), never as HTML.
"use strict";

(function () {
  const body = document.body;
  const refreshUrl = body.dataset.refresh;
  const everyS = Math.max(2, parseInt(body.dataset.refreshS || "10", 10) || 10);
  const prefix = "/ui";
  const hostName = body.dataset.host || "";

  function el(tag, attrs, text) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value !== undefined && value !== null && value !== "") node.setAttribute(name, String(value));
    }
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function gib(mib) { return (mib / 1024).toFixed(1); }

  function fleetRow(row) {
    const tr = el("tr", { "data-host": row.name });
    const hostUrl = prefix + "/hosts/" + encodeURIComponent(row.name);
    const name = el("td");
    name.appendChild(el("a", { href: hostUrl }, row.name));
    tr.appendChild(name);
    const state = el("td");
    const warn = row.state === "ok" && row.violations;
    state.appendChild(el("span", { class: "state s-" + (warn ? "warning" : row.state), title: row.error || row.maintenance },
      warn ? "violations" : row.state));
    tr.appendChild(state);
    tr.appendChild(el("td", { class: "num" }, row.guests === null ? "—" : row.guests));
    const cores = el("td", { class: "num" }, row.free_cores === null ? "—" : row.free_cores);
    const memory = el("td", { class: "num" }, row.free_memory === null ? "—" : gib(row.free_memory) + " GiB");
    if (row.free_cores !== null) {
      const perNode = (texts) => {
        const span = el("span", { class: "per-node" });
        for (const text of texts) {
          span.appendChild(document.createTextNode(" "));
          span.appendChild(el("span", { class: "nd" }, text));
        }
        return span;
      };
      cores.appendChild(perNode(row.nodes.filter((n) => n.cores).map((n) => "n" + n.node + ": " + n.whole_cores + "/" +
        n.cores + " cores")));
      memory.appendChild(perNode(row.nodes.map((n) => "n" + n.node + ": " + gib(n.free_mib) + " GiB")));
    }
    tr.appendChild(cores);
    tr.appendChild(memory);
    const isolation = el("td", { class: "num" });
    if (row.violations !== null) {
      isolation.appendChild(el("a", { class: row.violations ? "bad" : "good", href: hostUrl + "#violation-list" },
        row.violations));
    } else {
      isolation.textContent = row.checked ? "unreadable" : "not checked";
    }
    tr.appendChild(isolation);
    const plan = el("td", { class: "last-plan" });
    if (row.last_plan) {
      const planUrl = prefix + "/plans/" + row.last_plan.id;
      plan.appendChild(el("a", { href: planUrl }, "#" + row.last_plan.id));
      plan.appendChild(document.createTextNode(" " + row.last_plan.state + " "));
      const gain = row.last_plan.gain;
      const table = document.getElementById("fleet");
      plan.appendChild(el("a", { class: "gain", href: planUrl, title: table ? table.dataset.gainTitle : "" },
        (gain >= 0 ? "+" : "") + gain.toFixed(3) + " " + (table ? table.dataset.gainUnit : "")));
    } else {
      plan.textContent = "—";
    }
    tr.appendChild(plan);
    return tr;
  }

  function showFleet(data) {
    const rows = document.getElementById("fleet-rows");
    if (!rows) return;
    rows.replaceChildren(...data.rows.map(fleetRow));
    const count = document.getElementById("count");
    if (count) count.textContent = data.total + " of " + data.fleet + " hosts · page " + data.page + " of " + data.pages;
  }

  function showCpu(box, cell) {
    box.className = "cpu k-" + cell.kind + (cell.colour ? " " + cell.colour : "") +
      (cell.violated.length ? " violated" : "") + (box.classList.contains("is-picked") ? " is-picked" : "") +
      (box.classList.contains("lit") ? " lit" : "");
    box.dataset.kind = cell.kind;
    box.dataset.guests = cell.guests.join(",");
    box.dataset.ix = cell.ix.join(" ");
    box.dataset.marks = cell.marks;
    box.title = cell.title;
    const who = box.querySelector(".who");
    if (who) who.textContent = cell.label;
    const mark = box.querySelector(".mark");
    if (mark) mark.textContent = cell.marks;
  }

  function guestRow(g) {
    const tr = el("tr", { "data-guest": g.name, "data-ix": g.ix });
    const name = el("td");
    name.appendChild(el("span", { class: "swatch " + g.colour }));
    if (g.placed) {
      name.appendChild(el("a", { href: prefix + "/hosts/" + encodeURIComponent(hostName) + "/guests/" +
        encodeURIComponent(g.name) }, g.name));
    } else {
      name.appendChild(el("span", { tabindex: "0" }, g.name));
    }
    if (g.short && g.short !== g.name) {
      name.appendChild(document.createTextNode(" "));
      name.appendChild(el("span", { class: "short" }, "(" + g.short + ")"));
    }
    tr.appendChild(name);
    for (const value of [g.state, g.kind, g["class"]]) tr.appendChild(el("td", {}, value));
    const labels = el("td");
    for (const label of g.labels) labels.appendChild(el("span", { class: "label" }, label));
    tr.appendChild(labels);
    for (const value of [g.vcpupin, g.emulatorpin, g.iothreadpin, g.memory_nodes]) {
      tr.appendChild(el("td", { class: "mono" }, value));
    }
    tr.appendChild(el("td", {}, g.throttle));
    return tr;
  }

  function showViolations(data) {
    const count = document.getElementById("violations");
    if (count) {
      count.textContent = data.violations !== null ? data.violations + " violation(s)"
        : (data.checked ? "unreadable" : "not checked yet");
      count.className = data.violations ? "bad" : "";
    }
    const badge = document.getElementById("host-state");
    if (badge) {
      const warn = data.state === "ok" && data.violations;
      badge.className = "state s-" + (warn ? "warning" : data.state);
      badge.textContent = warn ? data.violations + " violation(s)" : data.state;
    }
    const section = document.getElementById("violation-list");
    const items = document.getElementById("violation-items");
    if (section && items) {
      items.replaceChildren(...data.violation_list.map((v) => {
        const li = el("li", { "data-guest": v.guest });
        li.appendChild(document.createTextNode(v.thread + " of "));
        li.appendChild(el("b", {}, v.guest));
        li.appendChild(document.createTextNode(" may run on pCPUs "));
        li.appendChild(el("span", { class: "mono" }, v.cpus));
        if (v.owner !== null) {
          li.appendChild(document.createTextNode(", exclusive to "));
          li.appendChild(el("b", {}, v.owner));
        } else {
          li.appendChild(document.createTextNode(", reserved for the host"));
        }
        return li;
      }));
      section.hidden = data.violation_list.length === 0;
    }
  }

  function showHost(data) {
    const keep = lit; // replacing a focused row ends its focus: light again what was lit
    for (const box of document.querySelectorAll(".cpu-map .cpu[data-cpu]")) {
      const cell = data.cpus[box.dataset.cpu];
      if (cell) showCpu(box, cell);
    }
    const rows = document.getElementById("guest-rows");
    if (rows) {
      if (data.guests.length) {
        rows.replaceChildren(...data.guests.map(guestRow));
      } else {
        const tr = el("tr", { class: "none" });
        tr.appendChild(el("td", { colspan: "10" }, "no guests on this host"));
        rows.replaceChildren(tr);
      }
    }
    showViolations(data);
    showMemory(data.memory);
    if (keep !== null) light(keep);
  }

  // ----- each node's memory and hugepage pools, as the page's table spells them ----------------
  function memoryRow(n) {
    const tr = el("tr", { "data-node": n.node });
    tr.appendChild(el("td", {}, "node " + n.node));
    tr.appendChild(el("td", { class: "num" }, gib(n.memory_mib) + " GiB"));
    tr.appendChild(el("td", { class: "num free" }, gib(n.free_mib) + " GiB"));
    const pools = el("td");
    n.pools.forEach((p, i) => {
      if (i) pools.appendChild(document.createTextNode("; "));
      pools.appendChild(el("span", { class: "pool", "data-size-kib": p.size_kib, "data-total": p.total,
        "data-free": p.free, "data-placeable": p.placeable },
        p.size + ": " + p.total + " pages (" + gib(p.total_mib) + " GiB), " + p.free + " free, " + p.placeable +
        " free for placing"));
    });
    if (!n.pools.length) pools.textContent = "none";
    tr.appendChild(pools);
    return tr;
  }

  function showMemory(memory) {
    const rows = document.getElementById("memory-rows");
    if (!rows || !memory || !memory.length) return;
    rows.replaceChildren(...memory.map(memoryRow));
  }

  // ----- lighting one guest: its row and its pCPUs, while either is pointed at or focused -----
  const map = document.getElementById("cpu-map");
  let lit = null; // the guest places ("ix") lit now, or null

  function light(places) {
    lit = places;
    if (!map) return;
    const wanted = new Set(places);
    map.classList.toggle("lighting", places !== null && places.length > 0);
    for (const box of map.querySelectorAll(".cpu[data-cpu]")) {
      const mine = places !== null && (box.dataset.ix || "").split(" ").some((i) => i !== "" && wanted.has(i));
      box.classList.toggle("lit", mine);
    }
    for (const tr of document.querySelectorAll("#guest-rows tr[data-ix]")) {
      tr.classList.toggle("lit", places !== null && wanted.has(tr.dataset.ix));
    }
  }

  function unlight() {
    lit = null;
    if (map) map.classList.remove("lighting");
    for (const node of document.querySelectorAll(".lit")) node.classList.remove("lit");
  }

  const guestRows = document.getElementById("guest-rows");
  if (guestRows && map) {
    const fromRow = (event) => {
      const tr = event.target.closest("tr[data-ix]");
      if (tr) light([tr.dataset.ix]);
    };
    guestRows.addEventListener("mouseover", fromRow);
    guestRows.addEventListener("focusin", fromRow);
    guestRows.addEventListener("mouseleave", unlight);
    guestRows.addEventListener("focusout", unlight);
  }

  function pick(box) {
    const shown = document.getElementById("picked");
    if (!shown) return;
    for (const old of document.querySelectorAll(".cpu.is-picked")) old.classList.remove("is-picked");
    box.classList.add("is-picked");
    shown.textContent = box.title;
  }

  function boxes() { return Array.from(map.querySelectorAll(".cpu[data-cpu]")); }

  function moveTo(box) {
    // the map is one Tab stop: only the box last reached keeps tabindex 0
    for (const other of map.querySelectorAll('.cpu[tabindex="0"]')) other.setAttribute("tabindex", "-1");
    box.setAttribute("tabindex", "0");
    box.focus();
  }

  if (map) {
    map.addEventListener("click", (event) => {
      const box = event.target.closest(".cpu[data-cpu]");
      if (box) { pick(box); moveTo(box); }
    });
    const fromBox = (event) => {
      const box = event.target.closest(".cpu[data-cpu]");
      if (!box) return;
      const places = (box.dataset.ix || "").split(" ").filter((i) => i !== "");
      if (places.length) light(places); else unlight();
      if (event.type === "focusin") pick(box);
    };
    map.addEventListener("mouseover", fromBox);
    map.addEventListener("focusin", fromBox);
    map.addEventListener("mouseleave", unlight);
    map.addEventListener("focusout", unlight);
    map.addEventListener("keydown", (event) => {
      const box = event.target.closest(".cpu[data-cpu]");
      if (!box) return;
      if (event.key === "Enter" || event.key === " ") { pick(box); event.preventDefault(); return; }
      const all = boxes();
      const at = all.indexOf(box);
      const step = { ArrowRight: 1, ArrowDown: 1, ArrowLeft: -1, ArrowUp: -1 }[event.key];
      let next = null;
      if (step !== undefined) next = all[Math.min(all.length - 1, Math.max(0, at + step))];
      if (event.key === "Home") next = all[0];
      if (event.key === "End") next = all[all.length - 1];
      if (next) { moveTo(next); event.preventDefault(); }
    });
  }

  // ----- live refresh, and saying so when it fails ------------------------------------------
  function utc(seconds) { return new Date(seconds * 1000).toISOString().slice(11, 19) + " UTC"; }

  const stamp = document.getElementById("refreshed");
  let lastGood = stamp && stamp.dataset.at ? parseFloat(stamp.dataset.at) : null;

  function stale(why) {
    const banner = document.getElementById("stale");
    body.dataset.stale = "1";
    if (!banner) return;
    banner.textContent = "Live refresh failed at " + utc(Date.now() / 1000) + " (" + why + "): " +
      (lastGood ? "the figures below are from " + utc(lastGood) + " and may be out of date." :
        "the figures below may be out of date.");
    banner.hidden = false;
  }

  function fresh(at) {
    const banner = document.getElementById("stale");
    if (banner) banner.hidden = true;
    delete body.dataset.stale;
    lastGood = at;
    if (stamp) stamp.textContent = "refreshed " + utc(at);
  }

  async function refresh() {
    if (!refreshUrl) return; // a page with nothing live on it
    let response;
    let data;
    const abort = new AbortController();
    const timer = window.setTimeout(() => abort.abort(), everyS * 1000);
    try {
      response = await fetch(refreshUrl, { credentials: "same-origin", headers: { Accept: "application/json" },
        signal: abort.signal });
      if (response.status === 401) { // signed out meanwhile: back to this page once signed in again
        const here = window.location.pathname + window.location.search;
        window.location.assign(prefix + "/login" + (here === prefix + "/" ? "" : "?next=" + encodeURIComponent(here)));
        return;
      }
      if (!response.ok) {
        stale("the server answered " + response.status);
        return;
      }
      data = await response.json();
    } catch (error) {
      stale(abort.signal.aborted ? "no answer within " + everyS + " s" : "the server cannot be reached");
      return; // the next round tries again
    } finally {
      window.clearTimeout(timer);
    }
    if (body.dataset.page === "fleet") showFleet(data);
    if (body.dataset.page === "host") showHost(data);
    fresh(data.at);
    body.dataset.refreshes = String((parseInt(body.dataset.refreshes || "0", 10) || 0) + 1);
  }

  if (refreshUrl) window.setInterval(refresh, everyS * 1000);
  window.vmplacerRefresh = refresh; // lets a test run a round now instead of waiting
})();
