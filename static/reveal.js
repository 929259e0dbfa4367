// The show/hide toggle of the secret field. Loaded as a file with the page's
// nonce: no inline handlers, so the CSP needs no 'unsafe-inline'.
(function () {
  "use strict";
  var button = document.getElementById("toggle-secret");
  var field = document.getElementById("secret");
  if (!button || !field) { return; }
  button.hidden = false;
  button.addEventListener("click", function () {
    var showing = field.type === "text";
    field.type = showing ? "password" : "text";
    button.textContent = showing ? "Show key" : "Hide key";
    button.setAttribute("aria-pressed", showing ? "false" : "true");
    field.focus();
  });
}());
