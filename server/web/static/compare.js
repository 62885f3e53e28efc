// The compare page's plot (uPlot): each run's speedup per step and its best so far, overlaid on one axis of steps.
// A timing on a loaded host is a ring in the run's colour. Its data is the JSON block the page carries, laid out by the service (server/web/run_series.py).
"use strict";
(function () {
  const block = document.getElementById("compare-data");
  const host = document.getElementById("compare-chart");
  if (!block || !host || typeof uPlot === "undefined" || !window.kernelloopPlots) return;
  const plots = window.kernelloopPlots;
  const chart = JSON.parse(block.textContent);
  const series = [{label: "step"}];
  const data = [chart.steps];
  for (const run of chart.runs) {
    series.push({label: `${run.label}: speedup`, stroke: run.colour, width: 1, dash: [4, 4], spanGaps: true,
      points: {show: true, size: 5}});
    series.push(plots.bestSoFar(`${run.label}: best so far`, run.colour));
    series.push(plots.marker(`${run.label}: loaded host, not ranked`, run.colour, 16, "transparent"));
    data.push(run.speedup, run.best_so_far, run.loaded);
  }
  const plot = new plots.Plot(host).show("compare", () => plots.speedupOptions(host, series), data);
  window.kernelloopCompare = {plot: plot, runs: chart.runs};
})();
