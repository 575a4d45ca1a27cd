/**
 * The suite's SVG charts, drawn by Vega-Lite compiled to Vega and rendered
 * headless (renderer 'none': no canvas, no browser). Each chart's data are
 * the results' own samples or the figures the report prints.
 */
import * as vega from 'vega';
import * as vegaLite from 'vega-lite';
import { evalParts, scalingRows, setupSpread, type SuiteResults } from './results.js';

type Spec = vegaLite.TopLevelSpec;

export async function renderSvg(spec: Spec): Promise<string> {
  const view = new vega.View(vega.parse(vegaLite.compile(spec).spec), { renderer: 'none' });
  try {
    return await view.toSVG();
  } finally {
    view.finalize();
  }
}

const WIDTH = 480;

/** Median setup time per method, warm and cold, log axis (they differ by orders of magnitude). */
export function setupChart(r: SuiteResults): Spec | undefined {
  const values = r.methods.flatMap((method) =>
    (['warm', 'cold'] as const).flatMap((kind) => {
      const s = setupSpread(r, method, kind);
      return s.n ? [{ method, kind, median: s.median, p5: s.p5, p95: s.p95 }] : [];
    }),
  );
  if (values.length === 0) return undefined;
  return {
    $schema: 'https://vega.github.io/schema/vega-lite/v6.json',
    title: 'Environment preparation: nothing to first command ready (median, p5-p95)',
    width: WIDTH,
    data: { values },
    encoding: { y: { field: 'method', type: 'nominal', title: null }, yOffset: { field: 'kind' }, color: { field: 'kind', type: 'nominal', title: 'setup' } },
    layer: [
      { mark: 'bar', encoding: { x: { field: 'median', type: 'quantitative', scale: { type: 'log' }, title: 'ms (log)' } } },
      { mark: { type: 'rule', color: 'black' }, encoding: { x: { field: 'p5', type: 'quantitative' }, x2: { field: 'p95' } } },
    ],
  };
}

/** Per-environment start time against N started at once, one line per method. */
export function scalingChart(r: SuiteResults): Spec | undefined {
  const values = r.methods.flatMap((method) => scalingRows(r, method).map((row) => ({ method, n: row.n, perEnv: row.perEnv.median, latency: row.latency.median, total: row.total.median, failures: row.failures })));
  if (values.length === 0) return undefined;
  const x = { field: 'n', type: 'quantitative' as const, scale: { type: 'log' as const, base: 2 }, title: 'environments started at once (N)' };
  return {
    $schema: 'https://vega.github.io/schema/vega-lite/v6.json',
    title: 'Scaling: N environments started at once',
    data: { values },
    hconcat: [
      { width: 300, mark: { type: 'line', point: true }, encoding: { x, y: { field: 'perEnv', type: 'quantitative', scale: { type: 'log' }, title: 'per environment: all ready / N, ms (log)' }, color: { field: 'method', type: 'nominal' } } },
      { width: 300, mark: { type: 'line', point: true }, encoding: { x, y: { field: 'total', type: 'quantitative', scale: { type: 'log' }, title: 'all N ready, ms (log)' }, color: { field: 'method', type: 'nominal' } } },
    ],
  };
}

/** Every latency sample, per method and kind, on a log axis, with the median marked. */
export function latencyChart(r: SuiteResults): Spec | undefined {
  const values = r.latency.flatMap((l) => l.ms.map((ms) => ({ series: `${l.method} ${l.kind === 'exec' ? (l.method === 'docker' ? 'docker exec' : 'exec') : l.method === 'docker' ? 'docker exec (step)' : 'session.run'}`, ms })));
  if (values.length === 0) return undefined;
  return {
    $schema: 'https://vega.github.io/schema/vega-lite/v6.json',
    title: 'Per-command latency of `true` (every sample; median in black)',
    width: WIDTH,
    data: { values },
    encoding: { y: { field: 'series', type: 'nominal', title: null } },
    layer: [
      { mark: { type: 'tick', opacity: 0.5 }, encoding: { x: { field: 'ms', type: 'quantitative', scale: { type: 'log' }, title: 'ms (log)' }, color: { field: 'series', type: 'nominal', legend: null } } },
      { mark: { type: 'tick', color: 'black', thickness: 3 }, encoding: { x: { aggregate: 'median', field: 'ms', type: 'quantitative' } } },
    ],
  };
}

/** One instance's evaluation (setup, 30 agent steps, the tests, teardown) stacked, per method. */
export function evalChart(r: SuiteResults): Spec | undefined {
  const values = r.methods.flatMap((method) => Object.entries(evalParts(r, method) ?? {}).map(([part, ms], order) => ({ method, part, ms: Math.max(0, ms), order })));
  if (values.length === 0) return undefined;
  return {
    $schema: 'https://vega.github.io/schema/vega-lite/v6.json',
    title: 'Per-instance evaluation: agent rollout and reward (medians)',
    width: WIDTH,
    data: { values },
    mark: 'bar',
    encoding: {
      y: { field: 'method', type: 'nominal', title: null },
      x: { field: 'ms', type: 'quantitative', stack: 'zero', title: 'ms' },
      color: { field: 'part', type: 'nominal', sort: ['setup', 'commands', 'step overhead', 'tests', 'test overhead', 'teardown'], title: 'part' },
      order: { field: 'order', type: 'quantitative' },
    },
  };
}

export const CHARTS = { setup: setupChart, scaling: scalingChart, latency: latencyChart, eval: evalChart } as const;

/** Every chart that has data, as file name -> SVG text. */
export async function renderCharts(r: SuiteResults): Promise<Map<string, string>> {
  const out = new Map<string, string>();
  for (const [name, make] of Object.entries(CHARTS)) {
    const spec = make(r);
    if (spec) out.set(`${name}.svg`, await renderSvg(spec));
  }
  return out;
}
