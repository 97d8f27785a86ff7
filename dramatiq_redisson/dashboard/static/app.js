// Optional niceties; every page works without them.
// "Select all" checkboxes: a checkbox with data-select-all="NAME" toggles every
// checkbox named NAME in the same form.
document.addEventListener("change", function (event) {
  var box = event.target;
  if (!box.matches || !box.matches("input[data-select-all]")) return;
  var boxes = box.form.querySelectorAll('input[type="checkbox"][name="' + box.dataset.selectAll + '"]');
  boxes.forEach(function (other) { other.checked = box.checked; });
});
// Auto-refresh without losing the scroll position is left to the <meta refresh> of the
// overview; nothing else runs on a timer.
