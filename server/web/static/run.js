// The run page's plot of speedup over steps (uPlot), redrawn while the run is running.
// Its data comes from the JSON block the page carries, then from /runs/ID/live every few seconds.
"use strict";
(function () {
  const block = document.getElementById("run-data");
  const host = document.getElementById("chart");
  if (!block || !host || typeof uPlot === "undefined") return;
  const runId = block.dataset.run;
  const pollMs = Number(block.dataset.pollMs) || 2000;
  const SHAPE_COLOURS = ["#2da44e", "#bf8700", "#8250df", "#1b7c83", "#cf222e", "#57606a", "#e16f24", "#0969da"];
  const STATUS_COLOURS = {"compile_error": "#a40e26", "wrong_result": "#cf222e", "timeout": "#953800",
    "runtime_error": "#82071e", "suspicious": "#8250df", "pending": "#8c959f"};
  let plot = null;
  let layout = "";

  function seriesOf(live) {
    const failures = [...new Set(live.chart.steps.filter(s => s.speedup === null).map(s => s.status))].sort();
    return {shapes: live.chart.shapes, failures: failures};
  }

  function dataOf(live, kinds) {
    const steps = live.chart.steps;
    const data = [steps.map(s => s.x), steps.map(s => s.speedup)];
    for (const shape of kinds.shapes) data.push(steps.map(s => s.speedup === null ? null : s.shapes[shape]));
    for (const status of kinds.failures) data.push(steps.map(s => s.speedup === null && s.status === status ? 0 : null));
    return data;
  }

  function optionsOf(kinds) {
    const series = [
      {label: "step"},
      {label: "geomean speedup", stroke: "#0a58ca", width: 3, spanGaps: true, points: {show: true, size: 7}},
    ];
    kinds.shapes.forEach((shape, i) => series.push({
      label: shape, stroke: SHAPE_COLOURS[i % SHAPE_COLOURS.length], width: 1, dash: [6, 4], spanGaps: true,
      points: {show: true, size: 4},
    }));
    for (const status of kinds.failures) {
      const colour = STATUS_COLOURS[status] || "#6e7781";
      series.push({label: status, stroke: colour, paths: () => null,
        points: {show: true, size: 10, fill: colour, stroke: colour, space: 0}});
    }
    return {
      width: Math.max(host.clientWidth, 280), height: 320, series: series,
      scales: {x: {time: false}, y: {range: (u, min, max) => [0, Math.max(1, max) * 1.1]}},
      axes: [{label: "step", incrs: [1, 2, 5, 10, 20, 50, 100]}, {label: "speedup (x)"}],
    };
  }

  function draw(live) {
    const kinds = seriesOf(live);
    const key = JSON.stringify(kinds);
    const data = dataOf(live, kinds);
    if (plot && key === layout) {
      plot.setData(data);
    } else {
      if (plot) plot.destroy();
      plot = new uPlot(optionsOf(kinds), data, host);
      layout = key;
    }
    window.kernelloopChart = {plot: plot, steps: live.chart.steps};
  }

  function show(live) {
    draw(live);
    document.getElementById("attempt-rows").innerHTML = live.rows_html;
    document.getElementById("run-steps").textContent = String(live.attempts);
    document.getElementById("run-best").innerHTML = live.best_html;
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

  async function poll() {
    try {
      const answer = await fetch(`/runs/${runId}/live`, {headers: {"Accept": "application/json"}, cache: "no-store"});
      if (!answer.ok) return;
      const live = await answer.json();
      show(live);
      if (live.status === "active") setTimeout(poll, pollMs);
    } catch (error) {
      setTimeout(poll, pollMs * 2);  // the service restarting: try again, less often
    }
  }

  const first = JSON.parse(block.textContent);
  draw(first);
  window.addEventListener("resize", () => plot && plot.setSize({width: Math.max(host.clientWidth, 280), height: 320}));
  if (first.status === "active") setTimeout(poll, pollMs);
})();
