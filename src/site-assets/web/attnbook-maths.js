// Inline maths wider than its line (a formula written inline on a line of its own, on a phone)
// scrolls sideways in its own box, as display maths does, instead of running off the page:
// MathJax 3 does not break lines. Only such formulas change; on a wide screen none does.
(function () {
  "use strict";
  const INLINE = 'article mjx-container[jax="CHTML"]:not([display="true"])';
  function mark() {
    document.querySelectorAll(INLINE).forEach(function (maths) {
      const line = maths.parentElement;
      const style = getComputedStyle(line);
      const room = line.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
      const math = maths.querySelector("mjx-math");
      const wide = math !== null && math.getBoundingClientRect().width > room + 1;
      maths.classList.toggle("attnbook-wide-inline", wide);
    });
  }
  function whenTypeset() {
    if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
      MathJax.startup.promise.then(mark);
    }
  }
  window.addEventListener("load", whenTypeset);
  let pending = null;
  window.addEventListener("resize", function () {
    clearTimeout(pending);
    pending = setTimeout(mark, 50);
  });
})();
