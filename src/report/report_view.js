// gpuopt report view: renders the report JSON (in #report-data). First screen: the machine, the
// verdict and the top actions; then a table of contents, one section per stage with its verdicts
// and one chart, and the raw data in an appendix.
(function () {
  'use strict';
  var report = JSON.parse(document.getElementById('report-data').textContent);
  var root = document.getElementById('report');
  root.textContent = '';

  // Okabe-Ito: distinct for colour-blind readers too.
  var PALETTE = ['#0072B2', '#E69F00', '#009E73', '#D55E00', '#CC79A7', '#56B4E9', '#000000',
    '#F0E442'];
  var LIMIT_COLOUR = '#cf222e';
  var ANCHOR_COLOUR = '#6e7781';

  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    if (attrs) {
      Object.keys(attrs).forEach(function (key) { node.setAttribute(key, attrs[key]); });
    }
    (children || []).forEach(function (child) {
      if (child === null || child === undefined) return;
      node.appendChild(typeof child === 'string' ? document.createTextNode(child) : child);
    });
    return node;
  }
  function isScalar(v) { return v === null || ['string', 'number', 'boolean'].indexOf(typeof v) >= 0; }
  function fmt(v) {
    if (v === null || v === undefined) return '—';
    if (typeof v === 'number') {
      if (Number.isInteger(v)) return String(v);
      var a = Math.abs(v);
      return a >= 100 ? v.toFixed(1) : a >= 1 ? v.toFixed(2) : v.toPrecision(3);
    }
    if (Array.isArray(v)) return v.map(fmt).join(', ');
    if (typeof v === 'object') return JSON.stringify(v);
    return String(v);
  }
  function median(v) { return v && typeof v === 'object' && typeof v.median === 'number' ? v.median : v; }
  function badge(verdict) {
    return el('span', { 'class': 'badge v-' + (verdict || 'unknown') }, [verdict || 'unknown']);
  }
  function table(columns, rows, classes) {
    var head = el('tr', null, columns.map(function (c) { return el('th', null, [c]); }));
    var body = rows.map(function (row, r) {
      return el('tr', null, row.map(function (cell, c) {
        var cls = classes && classes[r] && classes[r][c] ? classes[r][c] : (typeof cell === 'number' ? 'num' : '');
        var content = cell instanceof Node ? cell : fmt(cell);
        return el('td', cls ? { 'class': cls } : null, [content]);
      }));
    });
    return el('table', null, [el('thead', null, [head]), el('tbody', null, body)]);
  }
  function stageTitle(s) { return s.title || s.key; }
  function stageAnchor(s) { return 'stage-' + String(s.key).replace(/[^A-Za-z0-9_-]/g, '-'); }
  function findTestcase(data, key) {
    var list = data && Array.isArray(data.testcases) ? data.testcases : [];
    for (var i = 0; i < list.length; ++i) if (list[i].key === key) return list[i];
    return null;
  }

  // ---- charts -----------------------------------------------------------------------------------
  var chartCount = 0;
  // A horizontal reference line over [xMin, xMax] (linear/log x) or over every label (bars).
  function referenceLine(label, value, colour, xs) {
    return {
      type: 'line', label: label, borderColor: colour, backgroundColor: colour,
      borderDash: [6, 4], borderWidth: 2, pointRadius: 0, fill: false,
      data: xs.map(function (x) { return { x: x, y: value }; })
    };
  }
  function addChart(container, title, config) {
    if (typeof Chart === 'undefined') return;
    var canvas = el('canvas', { id: 'chart-' + (chartCount++), 'aria-label': title, role: 'img' });
    container.appendChild(el('div', { 'class': 'chart' }, [canvas]));
    config.options = config.options || {};
    config.options.animation = false;
    config.options.maintainAspectRatio = false;
    config.options.plugins = config.options.plugins || {};
    config.options.plugins.title = { display: true, text: title };
    new Chart(canvas.getContext('2d'), config);
  }
  function lineDataset(label, points, i) {
    return { type: 'line', label: label, data: points, borderColor: PALETTE[i % PALETTE.length],
      backgroundColor: PALETTE[i % PALETTE.length], borderWidth: 2, pointRadius: 3, fill: false };
  }
  function barDataset(label, values, i) {
    return { type: 'bar', label: label, data: values, backgroundColor: PALETTE[i % PALETTE.length] };
  }
  function axis(title, log) { return { type: log ? 'logarithmic' : 'linear', title: { display: true, text: title } }; }
  function bytesText(b) {
    var units = ['B', 'KiB', 'MiB', 'GiB'];
    for (var i = units.length - 1; i > 0; --i) {
      if (b >= Math.pow(1024, i)) return fmt(b / Math.pow(1024, i)) + ' ' + units[i];
    }
    return b + ' B';
  }
  // A log axis of byte sizes, ticked at the sizes measured.
  function bytesAxis(title, sizes) {
    var a = axis(title, true);
    a.afterBuildTicks = function (scale) { scale.ticks = sizes.map(function (v) { return { value: v }; }); };
    a.ticks = { callback: function (value) { return bytesText(value); } };
    return a;
  }

  var CHARTS = {
    'bench.pcie': function (container, data) {
      var verdict = findTestcase(data, 'pcie_link_verdict');
      var link = verdict && verdict.data && verdict.data.link;
      var datasets = [], xs = [];
      (data.testcases || []).forEach(function (t) {
        if (t.outcome !== 'passed' || !/^(host_to_device|device_to_host)_memcpy_/.test(t.key)) return;
        var rows = t.data && t.data.sizes;
        if (!Array.isArray(rows) || !rows.length) return;
        var points = rows.map(function (r) { xs.push(r.bytes); return { x: r.bytes, y: median(r.bandwidth_gbps) }; });
        datasets.push(lineDataset(t.key.replace('_memcpy', ''), points, datasets.length));
      });
      if (!datasets.length) return;
      xs.sort(function (a, b) { return a - b; });
      var range = [xs[0], xs[xs.length - 1]];
      if (link && typeof link.theoretical_gbps === 'number') {
        datasets.push(referenceLine('link rate, Gen' + link.generation + ' x' + link.width + ' (' +
          fmt(link.theoretical_gbps) + ' GB/s)', link.theoretical_gbps, LIMIT_COLOUR, range));
      }
      addChart(container, 'Host ↔ device copy bandwidth by size', {
        type: 'line', data: { datasets: datasets },
        options: { scales: { x: bytesAxis('bytes per copy', xs.filter(function (v, i) { return xs.indexOf(v) === i; })),
          y: { min: 0, title: { display: true, text: 'GB/s (median)' } } } }
      });
    },
    'bench.streams': function (container, data) {
      var t = findTestcase(data, 'contention');
      if (!t || t.outcome !== 'passed' || !t.data || !Array.isArray(t.data.modes)) return;
      var modes = t.data.modes.filter(function (m) { return typeof m.critical_p99_us === 'number'; });
      if (!modes.length) return;
      var labels = modes.map(function (m) { return m.mode; });
      var datasets = [barDataset('critical task p99 latency', modes.map(function (m) { return m.critical_p99_us; }), 0)];
      var solo = modes.filter(function (m) { return m.mode === 'critical_alone'; })[0];
      if (solo) {
        datasets.push(referenceLine('anchor: the task alone on the GPU (' + fmt(solo.critical_p99_us) + ' µs)',
          solo.critical_p99_us, ANCHOR_COLOUR, labels));
      }
      addChart(container, 'Critical task latency under background load, by scheduling mode', {
        type: 'bar', data: { labels: labels, datasets: datasets },
        options: { scales: { x: { title: { display: true, text: 'mode' } }, y: axis('µs, p99 (log scale)', true) } }
      });
    },
    'bench.loader': function (container, data) {
      var labels = [], series = [];
      (data.testcases || []).forEach(function (t) {
        if (t.outcome !== 'passed' || !t.data || !Array.isArray(t.data.runs)) return;
        var values = {};
        t.data.runs.forEach(function (r) {
          if (labels.indexOf(r.config) < 0) labels.push(r.config);
          values[r.config] = 100 * r.wait_fraction;
        });
        series.push({ name: t.key, values: values });
      });
      if (!series.length) return;
      addChart(container, 'Share of wall time the consumer waited for data, by prefetch depth', {
        type: 'bar',
        data: { labels: labels, datasets: series.map(function (s, i) {
          return barDataset(s.name, labels.map(function (l) { return s.values[l] === undefined ? null : s.values[l]; }), i);
        }) },
        options: { scales: { x: { title: { display: true, text: 'prefetch depth' } }, y: { min: 0, title: { display: true, text: '% of wall time waiting' } } } }
      });
    },
    'bench.scaler': function (container, data) {
      var t = (data.testcases || []).filter(function (t) { return t.outcome === 'passed' && t.data && typeof t.data.copy_bandwidth_gbps === 'number'; })[0];
      if (!t) return;
      var labels = ['fused unscale + inf/NaN check'];
      addChart(container, 'Loss-scaler kernel against a device copy of the same bytes', {
        type: 'bar', data: { labels: labels, datasets: [
          barDataset('fused unscale', [t.data.unscale_bandwidth_gbps], 0),
          referenceLine('anchor: device copy (' + fmt(t.data.copy_bandwidth_gbps) + ' GB/s)', t.data.copy_bandwidth_gbps, ANCHOR_COLOUR, labels)] },
        options: { indexAxis: 'x', scales: { y: { min: 0, title: { display: true, text: 'GB/s (bytes read + written)' } } } }
      });
    },
    'bench.gemm': function (container, data) {
      var datasets = [], xs = [];
      (data.testcases || []).forEach(function (t) {
        if (t.outcome !== 'passed' || !t.data || !Array.isArray(t.data.rows)) return;
        var points = t.data.rows.filter(function (r) { return typeof r.speedup_vs_cublas_fp16 === 'number'; })
          .map(function (r) { xs.push(r.m); return { x: r.m, y: r.speedup_vs_cublas_fp16 }; });
        if (points.length) datasets.push(lineDataset('K=' + t.data.k + ' N=' + t.data.n, points, datasets.length));
      });
      if (!datasets.length) return;
      xs.sort(function (a, b) { return a - b; });
      datasets.push(referenceLine('anchor: cuBLAS fp16 (1x)', 1, ANCHOR_COLOUR, [xs[0], xs[xs.length - 1]]));
      addChart(container, 'W4A16 GEMM time against cuBLAS fp16, by rows M', {
        type: 'line', data: { datasets: datasets },
        options: { scales: { x: axis('M (rows of activations)', xs[xs.length - 1] / xs[0] > 16), y: { min: 0, title: { display: true, text: 'speedup over cuBLAS fp16 (x)' } } } }
      });
    },
    'pipeline': function (container, data) {
      var runs = Array.isArray(data.runs) ? data.runs : [];
      if (!runs.length) return;
      var labels = runs.map(function (r) { return r.mode + ' (' + r.cameras + ' cameras)'; });
      var datasets = [barDataset('frames served per second', runs.map(function (r) { return r.throughput_fps; }), 0)];
      if (typeof runs[0].offered_fps === 'number') {
        datasets.push(referenceLine('offered (' + fmt(runs[0].offered_fps) + ' frames/s)', runs[0].offered_fps, LIMIT_COLOUR, labels));
      }
      addChart(container, 'Pipeline throughput against the frames offered', {
        type: 'bar', data: { labels: labels, datasets: datasets },
        options: { scales: { y: { min: 0, title: { display: true, text: 'frames per second' } } } }
      });
    }
  };

  // ---- raw data (appendix) ----------------------------------------------------------------------
  function isSummary(v) {
    return v && typeof v === 'object' && !Array.isArray(v) && typeof v.median === 'number';
  }
  function flattenSummaries(value) {
    if (!Array.isArray(value)) return value;
    return value.map(function (r) {
      if (!r || typeof r !== 'object' || Array.isArray(r)) return r;
      var out = {};
      Object.keys(r).forEach(function (k) {
        if (isSummary(r[k])) {
          out[k] = r[k].median;
          if (typeof r[k].p10 === 'number' && typeof r[k].p90 === 'number') {
            out[k + ' p10..p90'] = fmt(r[k].p10) + '..' + fmt(r[k].p90);
          }
        } else {
          out[k] = r[k];
        }
      });
      return out;
    });
  }
  function renderValue(container, name, value, depth) {
    value = flattenSummaries(value);
    if (Array.isArray(value) && value.length && value.every(function (r) {
      return r && typeof r === 'object' && !Array.isArray(r) &&
        Object.keys(r).every(function (k) { return isScalar(r[k]); });
    })) {
      var columns = [];
      value.forEach(function (r) { Object.keys(r).forEach(function (k) { if (columns.indexOf(k) < 0) columns.push(k); }); });
      container.appendChild(el('h4', null, [name]));
      container.appendChild(table(columns, value.map(function (r) { return columns.map(function (c) { return r[c]; }); })));
      return;
    }
    if (value && typeof value === 'object' && !Array.isArray(value) && depth < 3) {
      var scalars = Object.keys(value).filter(function (k) { return isScalar(value[k]) || (Array.isArray(value[k]) && value[k].every(isScalar)); });
      if (scalars.length) {
        if (name) container.appendChild(el('h4', null, [name]));
        container.appendChild(table(['field', 'value'], scalars.map(function (k) { return [k, value[k]]; })));
      }
      Object.keys(value).filter(function (k) { return scalars.indexOf(k) < 0; }).forEach(function (k) {
        renderValue(container, name ? name + '.' + k : k, value[k], depth + 1);
      });
      return;
    }
    if (value !== null && value !== undefined) {
      container.appendChild(el('details', null, [el('summary', null, [name || 'data']),
        el('pre', null, [JSON.stringify(value, null, 2)])]));
    }
  }

  // ---- first screen -----------------------------------------------------------------------------
  var verdict = report.verdict || { verdict: 'unknown', headline: 'this report carries no verdict' };
  var stages = report.stages || [];
  var actions = report.actions || [];
  var machine = (report.gpu && report.gpu.present ? report.gpu.summary :
    'no GPU used (' + (report.gpu && report.gpu.summary || 'unknown reason') + ')') +
    ' · ' + (report.host && report.host.hostname || '?') + ' · ' + (report.host && report.host.kernel || '') +
    ' · ' + (report.generated_at || '') + ' · gpuopt ' + (report.gpuopt_version || '');
  var header = el('header', { id: 'summary' }, [
    el('h1', null, ['gpuopt audit']),
    el('p', { 'class': 'machine', id: 'machine' }, [machine]),
    el('div', { id: 'verdict', 'class': 'verdict v-' + verdict.verdict }, [
      el('span', { 'class': 'verdict-word' }, [String(verdict.verdict).toUpperCase()]),
      el('span', { 'class': 'verdict-headline' }, [verdict.headline || ''])])
  ]);
  if (Array.isArray(verdict.skipped) && verdict.skipped.length) {
    header.appendChild(el('p', { 'class': 'skipped' }, ['Skipped: ' + verdict.skipped.map(function (s) {
      return s.stage + ' (' + s.reason + ')';
    }).join('; ')]));
  }
  root.appendChild(header);

  var top = el('section', { id: 'actions' }, [el('h2', null, ['What to do, by expected gain'])]);
  if (!actions.length) {
    top.appendChild(el('p', null, ['Nothing to change: no measured figure points to a fix.']));
  } else {
    var list = el('ol', { 'class': 'actions' });
    actions.slice(0, 5).forEach(function (a) {
      list.appendChild(el('li', { 'class': 'action v-' + a.verdict }, [
        el('div', { 'class': 'action-head' }, [el('strong', null, [a.headline]),
          a.gain_text ? el('span', { 'class': 'gain' }, [a.gain_text]) : null]),
        el('div', { 'class': 'evidence' }, ['Evidence: ' + a.evidence + ' ',
          el('a', { href: '#' + stageAnchor({ key: a.stage }) }, ['(' + a.stage + ')'])]),
        el('div', { 'class': 'fix' }, ['Fix: ' + a.fix])]));
    });
    top.appendChild(list);
    if (actions.length > 5) {
      top.appendChild(el('p', { 'class': 'meta' }, [(actions.length - 5) + ' more in the stage sections below.']));
    }
  }
  root.appendChild(top);

  // ---- contents and overview ----------------------------------------------------------------------
  var toc = el('nav', { id: 'contents' }, [el('h2', null, ['Contents'])]);
  var tocList = el('ol');
  stages.forEach(function (s) {
    tocList.appendChild(el('li', null, [el('a', { href: '#' + stageAnchor(s) }, [stageTitle(s)]), ' ', badge(s.verdict)]));
  });
  tocList.appendChild(el('li', null, [el('a', { href: '#appendix' }, ['Appendix: raw data'])]));
  toc.appendChild(tocList);
  root.appendChild(toc);

  root.appendChild(el('h2', null, ['Stages']));
  root.appendChild(table(['stage', 'verdict', 'status', 'seconds', 'summary'], stages.map(function (s) {
    return [stageTitle(s), badge(s.verdict), s.status, s.seconds, s.verdict_summary || s.reason || ''];
  })));

  // ---- one section per stage ----------------------------------------------------------------------
  function renderChecks(checks) {
    if (!Array.isArray(checks) || !checks.length) return null;
    return el('ul', { 'class': 'checks' }, checks.map(function (c) {
      return el('li', null, [badge(c.verdict), ' ', c.summary + (c.development_target ? ' (a goal of gpuopt\'s own code, not a property of this machine)' : '')]);
    }));
  }
  stages.forEach(function (s) {
    var section = el('section', { id: stageAnchor(s), 'class': 'stage' });
    section.appendChild(el('h2', null, [stageTitle(s), ' ', badge(s.verdict)]));
    section.appendChild(el('p', { 'class': 'meta' }, ['gpuopt ' + (s.command || []).join(' ') + ' · ' + s.status +
      ' · ' + fmt(s.seconds) + ' s' + (s.verdict_summary ? ' · ' + s.verdict_summary : '')]));
    var data = s.data;
    if (s.status !== 'ran' && s.reason) section.appendChild(el('p', null, [s.reason]));
    if (data && Array.isArray(data.findings)) {
      if (!data.findings.length) {
        section.appendChild(el('p', null, ['No findings.']));
      } else {
        section.appendChild(table(['verdict', 'finding', 'device', 'evidence', 'fix'], data.findings.map(function (f) {
          var evidence = f.evidence && typeof f.evidence === 'object' ? Object.keys(f.evidence).map(function (k) { return k + ' ' + f.evidence[k]; }).join('; ') : fmt(f.evidence);
          return [badge(f.verdict || f.severity), f.summary || f.id, f.device || '', evidence, f.fix || ''];
        })));
      }
    }
    var stageChecks = renderChecks(s.checks);
    if (stageChecks) section.appendChild(stageChecks);
    if (data && Array.isArray(data.testcases)) {
      section.appendChild(table(['testcase', 'verdict', 'outcome', 'checks, reason'], data.testcases.map(function (t) {
        var cell = el('div');
        var checks = renderChecks(t.checks);
        if (checks) cell.appendChild(checks);
        if (t.reason) cell.appendChild(el('div', null, [t.reason]));
        return [t.key, badge(t.verdict), t.outcome, cell];
      })));
      // A failed testcase shows what it measured before it failed.
      data.testcases.forEach(function (t) {
        if (t.outcome !== 'failed') return;
        var block = el('div', { 'class': 'failed-data' }, [el('h3', null, ['Failed: ' + t.key])]);
        if (t.reason) block.appendChild(el('pre', null, [t.reason]));
        (t.notes || []).forEach(function (n) { block.appendChild(el('p', null, [n])); });
        if (t.data && Object.keys(t.data).length) renderValue(block, t.key, t.data, 0);
        section.appendChild(block);
      });
    }
    var more = actions.filter(function (a) { return a.stage === s.key; });
    if (more.length) {
      section.appendChild(el('ul', { 'class': 'stage-actions' }, more.map(function (a) {
        return el('li', null, [el('strong', null, [a.headline]), ' — ' + a.evidence + '. Fix: ' + a.fix]);
      })));
    }
    if (data && CHARTS[s.key]) {
      try {
        CHARTS[s.key](section, data);
      } catch (error) {
        section.appendChild(el('p', { 'class': 'meta' }, ['chart not drawn: ' + error.message]));
      }
    }
    if (s.status === 'failed' && s.stderr_tail) section.appendChild(el('pre', null, [s.stderr_tail]));
    root.appendChild(section);
  });

  // ---- appendix -----------------------------------------------------------------------------------
  var appendix = el('section', { id: 'appendix' }, [el('h2', null, ['Appendix: raw data']),
    el('p', { 'class': 'meta' }, ['Every stage\'s own JSON as it reported it; report.json beside this file has the same.'])]);
  stages.forEach(function (s) {
    var block = el('details', { id: 'raw-' + stageAnchor(s) }, [el('summary', null, [stageTitle(s)])]);
    if (s.data && Array.isArray(s.data.testcases)) {
      s.data.testcases.forEach(function (t) {
        block.appendChild(el('h3', null, [t.key + ' — ' + (t.description || '')]));
        (t.notes || []).forEach(function (n) { block.appendChild(el('p', { 'class': 'note' }, [n])); });
        if (t.data && Object.keys(t.data).length) renderValue(block, '', t.data, 0);
      });
    } else if (s.data) {
      renderValue(block, '', s.data, 0);
    } else {
      block.appendChild(el('p', null, ['no data']));
    }
    appendix.appendChild(block);
  });
  root.appendChild(appendix);

  // For the browser test: is the verdict and the first action inside the first screen?
  function bottomOf(id, selector) {
    var node = document.getElementById(id);
    if (node && selector) node = node.querySelector(selector);
    return node ? node.getBoundingClientRect().bottom : Infinity;
  }
  var fold = window.innerHeight;
  var html = document.documentElement;
  html.setAttribute('data-viewport', window.innerWidth + 'x' + fold);
  html.setAttribute('data-verdict-visible', bottomOf('verdict') <= fold ? 'yes' : 'no');
  html.setAttribute('data-actions-visible', actions.length ?
    (bottomOf('actions', 'li:nth-child(' + Math.min(3, actions.length) + ')') <= fold ? 'yes' : 'no') :
    (bottomOf('actions', 'p') <= fold ? 'yes' : 'no'));
  html.setAttribute('data-charts', String(chartCount));
  root.setAttribute('data-rendered', 'yes');
})();
