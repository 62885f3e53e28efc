// What the run and compare pages' plots share (uPlot): the axis of steps, the speedup scale, the stepped path of
// a best-so-far line, and a plot that is redrawn in place while its series keep their layout.
"use strict";
window.kernelloopPlots = (function () {
  const HEIGHT = 320;

  function widthOf(host) {
    return Math.max(host.clientWidth, 280);
  }

  // A best-so-far line: flat until the step that beat it, then up (uPlot's stepped path, drawn after the point).
  function bestSoFar(label, colour) {
    return {label: label, stroke: colour, width: 2.5, spanGaps: true, paths: uPlot.paths.stepped({align: 1}),
      points: {show: false}};
  }

  // Points without a line: a ring (fill "transparent") for a loaded timing, a dot for a failure.
  function marker(label, colour, size, fill) {
    return {label: label, stroke: colour, paths: () => null,
      points: {show: true, size: size, fill: fill, stroke: colour, width: 2, space: 0}};
  }

  function speedupOptions(host, series, extra) {
    return Object.assign({
      width: widthOf(host), height: HEIGHT, series: series, legend: {show: false},
      scales: {x: {time: false}, y: {range: (u, min, max) => [0, Math.max(1, max) * 1.1]}},
      axes: [{label: "step", incrs: [1, 2, 5, 10, 20, 50, 100]}, {label: "speedup (x)"}],
    }, extra || {});
  }

  // One plot in `host`: drawn anew when its layout (the key) changes, else given the new data.
  function Plot(host) {
    this.host = host;
    this.plot = null;
    this.layout = "";
    window.addEventListener("resize", () => this.plot && this.plot.setSize({width: widthOf(host), height: this.plot.height}));
  }
  Plot.prototype.show = function (key, options, data) {
    if (this.plot && key === this.layout) {
      this.plot.setData(data);
    } else {
      if (this.plot) this.plot.destroy();
      this.plot = new uPlot(options(), data, this.host);
      this.layout = key;
    }
    return this.plot;
  };

  return {widthOf: widthOf, bestSoFar: bestSoFar, marker: marker, speedupOptions: speedupOptions, Plot: Plot};
})();
