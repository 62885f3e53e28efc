// The run page's plots (uPlot): speedup over steps with its interval band and best so far, and the host's load
// beside it, redrawn while the run is running. Their data comes from the JSON block the page carries, then from
// /runs/ID/live every few seconds; the series are laid out by the service (server/web/run_series.py).
"use strict";
(function () {
  const block = document.getElementById("run-data");
  const host = document.getElementById("chart");
  const loadHost = document.getElementById("load-chart");
  if (!block || !host || typeof uPlot === "undefined" || !window.kernelloopPlots) return;
  const plots = window.kernelloopPlots;
  const runId = block.dataset.run;
  const pollMs = Number(block.dataset.pollMs) || 2000;
  const STATUS_COLOURS = {"compile_error": "#a40e26", "wrong_result": "#cf222e", "timeout": "#953800",
    "runtime_error": "#82071e", "suspicious": "#8250df", "pending": "#8c959f"};
  const speedupPlot = new plots.Plot(host);
  const loadPlot = new plots.Plot(loadHost);

  function kindsOf(chart) {
    const failures = [...new Set(chart.steps.filter(s => s.speedup === null && !s.loaded).map(s => s.status))].sort();
    return {shapes: chart.shapes, failures: failures, colours: chart.colours};
  }

  // x, geomean, best so far, the interval's high and low ends, each shape, the loaded points, each failure.
  function dataOf(chart, kinds) {
    const steps = chart.steps;
    const data = [steps.map(s => s.x), steps.map(s => s.speedup), steps.map(s => s.best_so_far),
      steps.map(s => s.high), steps.map(s => s.low)];
    for (const shape of kinds.shapes) data.push(steps.map(s => s.speedup === null ? null : s.shapes[shape.name]));
    data.push(steps.map(s => s.loaded_speedup));
    for (const status of kinds.failures) {
      data.push(steps.map(s => s.speedup === null && !s.loaded && s.status === status ? 0 : null));
    }
    return data;
  }

  function optionsOf(kinds) {
    const colours = kinds.colours;
    const series = [
      {label: "step"},
      {label: "geomean speedup", stroke: colours.geomean, width: 3, spanGaps: true, points: {show: true, size: 7}},
      plots.bestSoFar("best so far", colours.best),
      {label: "interval high", stroke: colours.band + "55", width: 1, spanGaps: true, points: {show: false}},
      {label: "interval low", stroke: colours.band + "55", width: 1, spanGaps: true, points: {show: false}},
    ];
    kinds.shapes.forEach(shape => series.push({
      label: shape.name, stroke: shape.colour, width: 1, dash: [6, 4], spanGaps: true, points: {show: true, size: 4},
    }));
    series.push(plots.marker("loaded host, not ranked", colours.loaded, 16, "transparent"));
    for (const status of kinds.failures) {
      const colour = STATUS_COLOURS[status] || "#6e7781";
      series.push(plots.marker(status, colour, 10, colour));
    }
    return plots.speedupOptions(host, series, {bands: [{series: [3, 4], fill: colours.band + "22"}]});
  }

  function loadOptions(colours) {
    return {
      width: plots.widthOf(loadHost), height: 160, legend: {show: false},
      series: [{label: "step"}, {label: "host slowdown", stroke: colours.load, width: 1.5, spanGaps: true,
        points: {show: true, size: 5}}],
      scales: {x: {time: false}, y: {range: (u, min, max) => [1, Math.max(2, max) * 1.1]}},
      axes: [{incrs: [1, 2, 5, 10, 20, 50, 100]}, {label: "host load (x)", space: 20}],
    };
  }

  function draw(live) {
    const chart = live.chart;
    const kinds = kindsOf(chart);
    const plot = speedupPlot.show(JSON.stringify(kinds), () => optionsOf(kinds), dataOf(chart, kinds));
    loadHost.hidden = !chart.steps.some(s => s.host_slowdown !== null);  // a GPU's timings carry no host load
    const load = loadPlot.show("load", () => loadOptions(chart.colours),
      [chart.steps.map(s => s.x), chart.steps.map(s => s.host_slowdown)]);
    window.kernelloopChart = {plot: plot, load: load, steps: chart.steps};
  }

  function show(live) {
    draw(live);
    document.getElementById("chart-legend").innerHTML = live.legend_html;
    document.getElementById("attempt-rows").innerHTML = live.rows_html;
    document.getElementById("run-steps").textContent = String(live.attempts);
    document.getElementById("run-best").innerHTML = live.best_html;
    document.getElementById("run-download").innerHTML = live.download_html;
    document.getElementById("run-duration").textContent = live.duration;
    const status = document.querySelector("#run-status .status");
    status.textContent = live.status;
    status.className = "status status-" + live.status;
    const list = document.getElementById("under-way");
    list.replaceChildren(...live.under_way.map(job => {
      const item = document.createElement("li");
      const now = job.current ? `, ${job.current.step} for ${job.current.elapsed_s.toFixed(1)} s: ${job.current.message}` : "";
      item.textContent = `job ${job.job_id} (attempt ${job.attempt_id}): ${job.status}${now}`;
      return item;
    }));
    document.getElementById("under-way-section").hidden = live.under_way.length === 0;
  }

  // A poll that fails (a proxy's 502 while the service restarts, a dropped connection, a login page where the JSON
  // was) is tried again, each time twice as late up to a minute; the first answer that reads resets the pace.
  const maxBackoffMs = 60000;
  let failures = 0;

  function retry() {
    failures += 1;
    setTimeout(poll, Math.min(pollMs * 2 ** failures, maxBackoffMs));
  }

  async function poll() {
    let live;
    try {
      const answer = await fetch(`/runs/${runId}/live`, {headers: {"Accept": "application/json"}, cache: "no-store"});
      if (answer.status === 404) return;  // the run is gone: there is nothing more to show
      if (!answer.ok) {
        retry();
        return;
      }
      live = await answer.json();
    } catch (error) {
      retry();
      return;
    }
    failures = 0;
    show(live);
    if (live.status === "active") setTimeout(poll, pollMs);
  }

  const first = JSON.parse(block.textContent);
  draw(first);
  if (first.status === "active") setTimeout(poll, pollMs);
})();
