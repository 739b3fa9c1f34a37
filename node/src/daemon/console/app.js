// gpux console: live updates of the leases table over server-sent events (the server
// renders and escapes the rows; nothing else runs here).
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  const rows = document.querySelector("[data-live]");
  if (!rows) {
    return;
  }
  const events = new EventSource(rows.dataset.live);
  events.addEventListener("leases", (event) => {
    rows.innerHTML = event.data;
    document.body.dataset.liveUpdates = String(Number(document.body.dataset.liveUpdates || 0) + 1);
  });
});
