// toolfleet console: what changes while a page is open.
//
// A running job's page, live. Its events come as server-sent events
// (/jobs/<id>/events); each is added to the page as text (never as
// markup: it came from a model, a tool or a client), a streamed answer
// grows as it is written, and the final event reloads the page, which then
// shows the finished transcript. Without JavaScript the page is whole but
// not live.
"use strict";

const live = document.getElementById("live");
if (live) {
  const list = live.querySelector("ol");
  const answer = document.getElementById("streamed");
  const state = live.querySelector("[data-state]");
  const source = new EventSource(live.dataset.events);
  source.addEventListener("open", () => { state.textContent = "live"; });
  source.addEventListener("error", () => { state.textContent = "reconnecting…"; });
  source.addEventListener("job", (message) => {
    const event = JSON.parse(message.data);
    const item = document.createElement("li");
    const when = document.createElement("span");
    when.className = "muted";
    when.textContent = event.at + " ";
    const kind = document.createElement("strong");
    kind.textContent = event.kind;
    const data = document.createElement("code");
    data.textContent = " " + event.data;
    item.append(when, kind, data);
    list.append(item);
    if (event.final) {
      source.close();
      state.textContent = "finished";
      setTimeout(() => window.location.reload(), 500);
    }
  });
  source.addEventListener("delta", (message) => {
    const event = JSON.parse(message.data);
    let delta = {};
    try { delta = JSON.parse(event.data); } catch (_) { return; }
    if (delta.restarted) { answer.textContent = ""; }
    if (typeof delta.text === "string") {
      answer.hidden = false;
      answer.textContent += delta.text;
    }
  });
}

// The jobs page's first page, live: the counts and the table, drawn anew
// by the server (every value escaped there, as on the page itself) and
// sent as a server-sent event (/jobs/live) whenever they change. No
// script runs from it: the Content-Security-Policy allows only this file.
const listing = document.getElementById("listing");
if (listing && listing.dataset.events) {
  const state = document.getElementById("listing-state");
  const source = new EventSource(listing.dataset.events);
  source.addEventListener("open", () => { state.hidden = false; });
  source.addEventListener("jobs", (message) => {
    listing.innerHTML = message.data;
  });
}
