/**
 * How numbers are shown to people, in one place for the CLI's reports and
 * the benchmarks' tables: durations, sizes, ratios and plain text tables.
 */

/** A duration in milliseconds: "0.85 ms", "63.4 ms", "239 ms", "1.23 s"; "-" for no value. */
export function formatMs(ms: number): string {
  if (!Number.isFinite(ms)) return '-';
  if (ms >= 1000) return `${(ms / 1000).toFixed(2)} s`;
  // About three significant digits: a sub-millisecond spawn and a
  // quarter-second build both read at a glance.
  return `${ms.toFixed(ms < 10 ? 2 : ms < 100 ? 1 : 0)} ms`;
}

/** Bytes in binary units: "512 B", "3.9 KiB", "201.3 MiB", "1.2 GiB". */
export function formatBytes(bytes: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let v = bytes;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return `${v.toFixed(i === 0 ? 0 : 1)} ${units[i]}`;
}

/** "12.80x"; "-" for no value. */
export function formatRatio(r: number): string {
  return Number.isFinite(r) ? `${r.toFixed(2)}x` : '-';
}

/** A plain text table: the first row is the header, the first column left-aligned, the others right-aligned. */
export function formatTable(rows: readonly (readonly string[])[]): string {
  const widths: number[] = [];
  for (const row of rows) row.forEach((cell, i) => (widths[i] = Math.max(widths[i] ?? 0, cell.length)));
  const line = (row: readonly string[]) => row.map((c, i) => (i === 0 ? c.padEnd(widths[i]!) : c.padStart(widths[i]!))).join('  ');
  const [header, ...body] = rows;
  if (!header) return '';
  return [line(header), widths.map((w) => '-'.repeat(w)).join('  '), ...body.map(line)].join('\n');
}
