// The reader's own time beside the UTC time the server wrote, on every
// <time data-local-time>: the server cannot know the reader's time zone, and
// without scripts its UTC text stands alone. Loaded as a file with the page's
// nonce: the CSP allows no inline script.
(function () {
  "use strict";
  var today = new Date().toDateString();
  var times = document.querySelectorAll("time[data-local-time]:not([data-local-time=shown])");
  Array.prototype.forEach.call(times, function (time) {
    var when = new Date(time.getAttribute("datetime"));
    // Unreadable, or the reader's clock is on UTC: the server's text says it all.
    if (isNaN(when.getTime()) || when.getTimezoneOffset() === 0) { return; }
    var options = {hour: "numeric", minute: "2-digit", timeZoneName: "short"};
    if (when.toDateString() !== today) {
      options.weekday = "short";
      options.day = "numeric";
      options.month = "short";
    }
    var local = document.createElement("span");
    local.className = "local-time";
    local.textContent = new Intl.DateTimeFormat(undefined, options).format(when) + " your time, ";
    time.parentNode.insertBefore(local, time);
    time.setAttribute("data-local-time", "shown");
  });
}());
