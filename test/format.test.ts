/** The one formatter module, shared by the CLI's reports and the benchmarks. */
import { describe, expect, it } from 'vitest';
import { formatBytes, formatMs, formatRatio, formatTable } from '../lib/format.js';

describe('lib/format', () => {
  it('shows durations with about three significant digits, seconds from 1 s', () => {
    expect([0.854, 4.7, 63.42, 239.4, 999.4, 1234].map(formatMs)).toEqual(['0.85 ms', '4.70 ms', '63.4 ms', '239 ms', '999 ms', '1.23 s']);
    expect(formatMs(NaN)).toBe('-');
  });

  it('shows sizes in binary units and ratios with two decimals', () => {
    expect([512, 4000, 211_000_000, 1.3 * 1024 ** 3].map(formatBytes)).toEqual(['512 B', '3.9 KiB', '201.2 MiB', '1.3 GiB']);
    expect([formatRatio(12.8), formatRatio(Infinity)]).toEqual(['12.80x', '-']);
  });

  it('pads a table: header, rule, first column left, the rest right', () => {
    expect(formatTable([['what', 'median'], ['spawn', '4.70 ms'], ['exec true', '1.60 ms']])).toBe(
      ['what        median', '---------  -------', 'spawn      4.70 ms', 'exec true  1.60 ms'].join('\n'),
    );
  });
});
