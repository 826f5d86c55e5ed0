// gpuopt report view: renders the report JSON (in #report-data) as tables and Chart.js charts.
(function () {
  'use strict';
  var report = JSON.parse(document.getElementById('report-data').textContent);
  var root = document.getElementById('report');
  root.textContent = '';

  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    if (attrs) {
      Object.keys(attrs).forEach(function (key) { node.setAttribute(key, attrs[key]); });
    }
    (children || []).forEach(function (child) {
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
  function table(columns, rows, classes) {
    var head = el('tr', null, columns.map(function (c) { return el('th', null, [c]); }));
    var body = rows.map(function (row, r) {
      return el('tr', null, row.map(function (cell, c) {
        var cls = classes && classes[r] && classes[r][c] ? classes[r][c] : (typeof cell === 'number' ? 'num' : '');
        return el('td', cls ? { 'class': cls } : null, [fmt(cell)]);
      }));
    });
    return el('table', null, [el('thead', null, [head]), el('tbody', null, body)]);
  }

  // Rows: an array of flat objects. X axis: the first of these keys present in every row.
  var X_KEYS = ['size_bytes', 'bytes', 'm', 'M', 'batch', 'streams', 'depth', 'nprobe', 'size'];
  var chartCount = 0;
  function numericKeys(rows) {
    var keys = Object.keys(rows[0]);
    return keys.filter(function (k) {
      return rows.every(function (r) { return typeof r[k] === 'number' || r[k] === null; });
    });
  }
  function maybeChart(container, name, rows) {
    if (typeof Chart === 'undefined' || rows.length < 2) return;
    var xKey = X_KEYS.filter(function (k) {
      return rows.every(function (r) { return typeof r[k] === 'number'; });
    })[0];
    if (!xKey) return;
    var yKeys = numericKeys(rows).filter(function (k) {
      return k !== xKey && /(_gbps|_us|_ms|_s|speedup|_percent|_fraction|recall|qps|_tflops)$/.test(k);
    }).slice(0, 6);
    if (!yKeys.length) return;
    var canvas = el('canvas', { id: 'chart-' + (chartCount++) });
    container.appendChild(el('div', { 'class': 'chart' }, [canvas]));
    var logX = rows.every(function (r) { return r[xKey] > 0; }) &&
      Math.max.apply(null, rows.map(function (r) { return r[xKey]; })) /
      Math.min.apply(null, rows.map(function (r) { return r[xKey]; })) > 64;
    new Chart(canvas.getContext('2d'), {
      type: 'line',
      data: {
        datasets: yKeys.map(function (k) {
          return { label: k, data: rows.map(function (r) { return { x: r[xKey], y: r[k] }; }) };
        })
      },
      options: {
        animation: false, maintainAspectRatio: false,
        plugins: { title: { display: true, text: name } },
        scales: { x: { type: logX ? 'logarithmic' : 'linear', title: { display: true, text: xKey } } }
      }
    });
  }
  // A field holding a distribution summary ({median, p10, p90, ...}, as bench testcases write
  // them) shows as its median plus a 'p10..p90' spread column, so such rows chart like flat ones.
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
      maybeChart(container, name, value);
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
  function renderFindings(container, findings) {
    container.appendChild(el('h3', null, ['Findings']));
    if (!findings.length) { container.appendChild(el('p', null, ['No findings.'])); return; }
    var rows = findings.map(function (f) {
      return [f.severity, f.id, f.device || '', fmt(f.evidence), f.fix && typeof f.fix === 'object' ? fmt(f.fix) : (f.fix || ''), f.message || f.summary || ''];
    });
    var classes = findings.map(function (f) { return ['sev-' + f.severity]; });
    container.appendChild(table(['severity', 'id', 'device', 'evidence', 'fix', 'message'], rows, classes));
  }
  function renderTestcases(container, testcases) {
    container.appendChild(table(['testcase', 'outcome', 'reason / notes'], testcases.map(function (t) {
      return [t.key, t.outcome, [t.reason || ''].concat(t.notes || []).filter(Boolean).join(' · ')];
    }), testcases.map(function (t) { return [null, 'outcome-' + t.outcome]; })));
    testcases.forEach(function (t) {
      if (t.outcome !== 'passed' || !t.data) return;
      var block = el('div');
      renderValue(block, t.key, t.data, 0);
      container.appendChild(block);
    });
  }

  root.appendChild(el('h1', null, ['gpuopt audit']));
  root.appendChild(el('p', { 'class': 'meta' }, [
    (report.host && report.host.hostname || '') + ' · ' + (report.host && report.host.kernel || '') +
    ' · ' + report.generated_at + ' · gpuopt ' + report.gpuopt_version]));
  root.appendChild(el('p', null, [report.gpu && report.gpu.present ? 'GPU: ' + report.gpu.summary :
    'No GPU used: ' + (report.gpu && report.gpu.summary || 'unknown reason') + '. GPU stages were skipped or waived.']));

  var stages = report.stages || [];
  root.appendChild(el('h2', null, ['Stages']));
  root.appendChild(table(['stage', 'status', 'seconds', 'reason'], stages.map(function (s) {
    return [s.title || s.key, s.status, s.seconds, s.reason || ''];
  }), stages.map(function (s) { return [null, 'status-' + s.status]; })));

  stages.forEach(function (s) {
    var section = el('section', { id: 'stage-' + s.key });
    section.appendChild(el('h2', null, [s.title || s.key]));
    section.appendChild(el('p', { 'class': 'meta' }, ['gpuopt ' + (s.command || []).join(' ') + ' · ' + s.status +
      (s.reason ? ' · ' + s.reason : '')]));
    var data = s.data;
    if (data && Array.isArray(data.findings)) renderFindings(section, data.findings);
    if (data && Array.isArray(data.testcases)) {
      renderTestcases(section, data.testcases);
    } else if (data) {
      var rest = {};
      Object.keys(data).forEach(function (k) { if (k !== 'findings') rest[k] = data[k]; });
      renderValue(section, '', rest, 0);
    }
    if (s.status === 'failed' && s.stderr_tail) section.appendChild(el('pre', null, [s.stderr_tail]));
    root.appendChild(section);
  });
  root.setAttribute('data-rendered', 'yes');
})();
