// Swaps in the `#live` section of a freshly rendered page; on failure the
// last good one stays and the error is shown. (REFRESH_MS is set above.)
"use strict";
(() => {
  let refreshes = 0;
  const show = (id, text) => { document.getElementById(id).textContent = text; };
  async function refresh() {
    try {
      const resp = await fetch(location.pathname, { cache: "no-store" });
      if (!resp.ok) throw new Error(resp.status + " " + resp.statusText);
      const page = new DOMParser().parseFromString(await resp.text(), "text/html");
      const live = page.getElementById("live");
      if (!live) throw new Error("the answer has no #live section");
      document.getElementById("live").replaceWith(document.adoptNode(live));
      refreshes += 1;
      show("refreshes", String(refreshes));
      show("error", "");
    } catch (e) {
      show("error", "refresh failed: " + e.message);
    } finally {
      setTimeout(refresh, REFRESH_MS);
    }
  }
  setTimeout(refresh, REFRESH_MS);
})();
