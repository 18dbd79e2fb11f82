// Loaded after require.js and before embed-amd.js on pages with widgets.
// The embed manager finds its icon fonts relative to the module name
// "@jupyter-widgets/html-manager/dist/libembed-amd", which require.js resolves against the page's
// folder by default (chapters/@jupyter-widgets/...: not found). Point that name at this folder,
// where the fonts are copied beside embed-amd.js.
(function () {
  var here = document.currentScript.src.replace(/[^/]*$/, "").replace(/\/$/, "");
  require.config({ paths: { "@jupyter-widgets/html-manager/dist": here } });
})();
