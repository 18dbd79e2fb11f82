// The search page shows a snippet of text from each result, in which maths is raw TeX, e.g. \(D\).
// On that page (only), load the site's own MathJax and typeset each snippet as it arrives.
(function () {
  "use strict";
  if (!/(^|\/)search\.html$/.test(window.location.pathname)) return;
  var root = document.documentElement.dataset.content_root || "";
  var ready = null;

  function loadMathJax() {
    if (!ready) {
      ready = new Promise(function (resolve) {
        window.MathJax = { startup: { typeset: false } };
        var script = document.createElement("script");
        script.src = root + "_static/mathjax/tex-mml-chtml.js";
        script.async = true;
        script.onload = function () { window.MathJax.startup.promise.then(resolve); };
        document.head.appendChild(script);
      });
    }
    return ready;
  }

  document.addEventListener("DOMContentLoaded", function () {
    if (typeof Search === "undefined" || typeof Search.makeSearchSummary !== "function") return;
    var makeSummary = Search.makeSearchSummary;
    Search.makeSearchSummary = function () {
      var summary = makeSummary.apply(this, arguments);
      if (/\\[(\[]/.test(summary.textContent)) {
        loadMathJax().then(function () {
          // after sphinx_highlight has marked the search terms in the snippet
          window.setTimeout(function () { window.MathJax.typesetPromise([summary]); }, 0);
        });
      }
      return summary;
    };
  });
})();
