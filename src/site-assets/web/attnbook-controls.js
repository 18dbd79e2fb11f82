// The chapters' controls without a kernel (see src/site-assets/controls.py).
// Each .attnbook-control block holds labelled inputs (a range input per slider, a select per
// dropdown), a JSON description ({"states": option indices of every stored setting, "labels":
// the option labels of every control}) and one image per setting, in the same order. Moving an
// input shows the image of the chosen setting; that image's alt text describes the setting.
(function () {
  "use strict";

  function wire(block) {
    var script = block.querySelector("script.attnbook-control-states");
    if (!script) return;
    var spec = JSON.parse(script.textContent);
    var images = block.querySelectorAll(":scope > .attnbook-control-state");
    var inputs = Array.prototype.slice.call(block.querySelectorAll("[data-control]"));
    if (images.length !== spec.states.length || !inputs.length) return;

    function show() {
      var wanted = inputs.map(function (input) { return Number(input.value); }).join(",");
      for (var i = 0; i < spec.states.length; i++) {
        images[i].classList.toggle("attnbook-state-hidden", spec.states[i].join(",") !== wanted);
      }
      inputs.forEach(function (input) {
        if (input.type !== "range") return;
        var text = spec.labels[Number(input.dataset.control)][Number(input.value)];
        input.setAttribute("aria-valuetext", text);
        var shown = block.querySelector('output[for="' + input.id + '"]');
        if (shown) shown.textContent = text;
      });
    }

    inputs.forEach(function (input) {
      input.addEventListener("input", show);
      input.addEventListener("change", show);
    });
    block.classList.add("attnbook-ready");
    show();
  }

  function wireAll() {
    document.querySelectorAll(".attnbook-control").forEach(wire);
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", wireAll);
  } else {
    wireAll();
  }
})();
