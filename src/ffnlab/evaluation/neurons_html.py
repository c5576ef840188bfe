"""One self-contained HTML page to browse a layer's MLP units (no network: inline CSS, JS, data).

The data sits in a <script type="application/json"> block; the page's JS draws the unit list
(ranked by mean |activation|), and for the selected unit its statistics, an SVG histogram and
its top windows with every token shaded by the unit's activation (red > 0, blue < 0; opacity
|a| / the unit's largest |a|). The URL fragment #unit-N selects unit N, so a link or a headless
browser can open any unit directly.
"""
import html
import json

import numpy as np

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;display:flex;height:100vh;color:#222}
#side{width:230px;border-right:1px solid #ccc;display:flex;flex-direction:column}
#side input{margin:8px;padding:4px}
#list{overflow-y:auto;flex:1}
.row{padding:2px 8px;cursor:pointer;display:flex;justify-content:space-between;font-family:monospace}
.row:hover{background:#eef}.row.sel{background:#dde}
#main{flex:1;overflow-y:auto;padding:12px 20px}
h1{font-size:18px;margin:0 0 6px}h2{font-size:16px;margin:14px 0 6px}
.stats td{padding:1px 10px 1px 0;font-family:monospace}
.win{font-family:monospace;white-space:pre-wrap;margin:3px 0;padding:3px;border-bottom:1px solid #eee}
.val{display:inline-block;width:80px;color:#555}
.tok{border-radius:2px}.tok.center{outline:2px solid #000}
svg rect{fill:#6b8fd6}svg line{stroke:#999}svg text{font:10px monospace;fill:#444}
"""

JS = r"""
const D = JSON.parse(document.getElementById('data').textContent);
const list = document.getElementById('list'), detail = document.getElementById('detail');
const byUnit = new Map(D.units.map(u => [u.unit, u]));
const fmt = x => (Math.abs(x) >= 100 || (Math.abs(x) < 0.01 && x !== 0)) ? x.toExponential(2) : x.toFixed(3);
const show = s => s.replace(/\n/g, '\u21b5').replace(/\t/g, '\u21e5').replace(/\r/g, '');
function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}
function histogram(u) {
  // inline <svg> markup (the HTML parser needs no namespace); bar heights are log(1 + count)
  const W = 420, H = 110, n = u.counts.length, top = Math.log10(1 + Math.max(...u.counts));
  const bars = u.counts.map((c, i) => {
    const h = top > 0 ? H * Math.log10(1 + c) / top : 0;
    const lo = -u.R + 2 * u.R * i / n, hi = -u.R + 2 * u.R * (i + 1) / n;
    return `<rect x="${i * W / n}" y="${H - h}" width="${W / n - 1}" height="${h}"><title>[${fmt(lo)}, ${fmt(hi)}): ${c}</title></rect>`;
  }).join('');
  const labels = [[0, fmt(-u.R)], [W / 2, '0'], [W - 40, fmt(u.R)]].map(([x, s]) => `<text x="${x}" y="${H + 12}">${s}</text>`).join('');
  const box = el('div', {class: 'hist'});
  box.innerHTML = `<svg width="${W}" height="${H + 16}">${bars}${labels}</svg>`;
  return box;
}
function select(unit) {
  const u = byUnit.get(unit) || D.units[0];
  for (const r of list.children) r.classList.toggle('sel', +r.dataset.unit === u.unit);
  detail.replaceChildren();
  detail.setAttribute('data-unit', u.unit);
  detail.appendChild(el('h1', {}, `unit ${u.unit} of ${D.node} (rank ${u.rank + 1} of ${D.d_ff} by mean |a|)`));
  const st = el('table', {class: 'stats'});
  for (const k of ['mean_abs', 'mean', 'std', 'max', 'min']) {
    const tr = el('tr'); tr.appendChild(el('td', {}, k === 'mean_abs' ? 'mean |a|' : k)); tr.appendChild(el('td', {}, fmt(u[k]))); st.appendChild(tr);
  }
  detail.appendChild(st);
  detail.appendChild(el('h2', {}, `activations over ${D.n_tokens} tokens (log counts)`));
  detail.appendChild(histogram(u));
  detail.appendChild(el('h2', {}, `top ${u.windows.length} tokens by |a|, in context`));
  const peak = Math.max(1e-30, ...u.windows.map(w => Math.abs(w.value)));
  for (const w of u.windows) {
    const row = el('div', {class: 'win'});
    row.appendChild(el('span', {class: 'val'}, (w.value >= 0 ? '+' : '') + fmt(w.value)));
    w.ids.forEach((id, i) => {
      const a = w.acts[i], alpha = Math.min(1, Math.abs(a) / peak).toFixed(3);
      const s = el('span', {class: 'tok' + (i === w.center ? ' center' : ''), title: `a = ${fmt(a)}`, 'data-a': a}, show(D.vocab[id]));
      s.style.background = a >= 0 ? `rgba(220,38,38,${alpha})` : `rgba(37,99,235,${alpha})`;
      row.appendChild(s);
    });
    detail.appendChild(row);
  }
}
for (const u of D.units) {
  const r = el('div', {class: 'row', 'data-unit': u.unit});
  r.appendChild(el('span', {}, '#' + u.unit)); r.appendChild(el('span', {}, fmt(u.mean_abs)));
  r.onclick = () => { location.hash = 'unit-' + u.unit; };
  list.appendChild(r);
}
document.getElementById('filter').oninput = e => {
  const q = e.target.value.trim();
  for (const r of list.children) r.style.display = !q || r.dataset.unit.startsWith(q) ? '' : 'none';
};
document.addEventListener('keydown', e => {
  if (e.target.tagName === 'INPUT' || !['ArrowDown', 'ArrowUp'].includes(e.key)) return;
  const i = D.units.findIndex(u => u.unit === +detail.dataset.unit) + (e.key === 'ArrowDown' ? 1 : -1);
  if (i >= 0 && i < D.units.length) location.hash = 'unit-' + D.units[i].unit;
  e.preventDefault();
});
const fromHash = () => select(+((location.hash.match(/^#unit-(\d+)$/) || [])[1] ?? D.units[0].unit));
window.addEventListener('hashchange', fromHash);
fromHash();
"""


def page_data(scan, tokenizer, model_name, units=None):
    """-> the dict the page embeds: every unit (or `units`) in rank order, with a vocab of the
    tokens its windows use."""
    from .neurons import unit_report

    units = scan.ranking if units is None else units
    out, vocab = [], {}
    for u in units:
        r = unit_report(scan, tokenizer, int(u))
        r["R"] = float(scan.hist.R[u])
        r["counts"] = r.pop("hist")["counts"]
        for w in r["windows"]:
            for i, t in zip(w["ids"], w.pop("tokens")):
                vocab[i] = t
            w["acts"] = [float(np.format_float_positional(a, 4, fractional=False)) for a in w["acts"]]
        out.append(r)
    return {"model": model_name, "layer": scan.layer, "node": scan.node, "d_ff": int(len(scan.ranking)),
            "n_tokens": int(scan.n_tokens), "n_windows": scan.n_windows, "vocab": vocab, "units": out}


def render_page(data):
    """data (page_data) -> the HTML text"""
    blob = json.dumps(data, ensure_ascii=False, separators=(",", ":")).replace("<", "\\u003c")  # no "</script>" inside
    title = html.escape(f"{data['node']} units: {data['model']}")
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{title}</title>\n"
            f"<style>{CSS}</style></head>\n<body>\n"
            f"<div id=\"side\"><input id=\"filter\" placeholder=\"unit number\">"
            f"<div id=\"list\"></div></div>\n<div id=\"main\"><div id=\"detail\"></div></div>\n"
            f"<script id=\"data\" type=\"application/json\">{blob}</script>\n"
            f"<script>{JS}</script>\n</body></html>\n")


def write_page(path, scan, tokenizer, model_name, units=None):
    with open(path, "w", encoding="utf-8") as f:
        f.write(render_page(page_data(scan, tokenizer, model_name, units)))
    return path
