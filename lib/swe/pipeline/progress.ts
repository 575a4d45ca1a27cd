/**
 * Progress on stderr: one line redrawn in place on a terminal, plain lines
 * otherwise (logs and CI output must not fill with carriage returns).
 */
export interface ProgressLine {
  /** Updates the current state ("3/8 building venv owner/repo@1.0"). */
  update(done: number, total: number, text: string): void;
  /** A message that stays (failures); printed above the bar on a terminal. */
  log(text: string): void;
  /** Clears the bar. */
  end(): void;
}

const BAR_WIDTH = 24;

export function createProgress(stream: NodeJS.WriteStream = process.stderr, isTTY = stream.isTTY === true): ProgressLine {
  let shown = false;
  const columns = () => Math.max(40, stream.columns ?? 80);
  const clear = () => {
    if (shown) stream.write('\r\x1b[K');
    shown = false;
  };
  return {
    update(done, total, text) {
      if (!isTTY) {
        stream.write(`[${done}/${total}] ${text}\n`);
        return;
      }
      const filled = total > 0 ? Math.round((done / total) * BAR_WIDTH) : 0;
      const line = `[${'#'.repeat(filled)}${'-'.repeat(BAR_WIDTH - filled)}] ${done}/${total} ${text}`;
      clear();
      stream.write(line.slice(0, columns() - 1));
      shown = true;
    },
    log(text) {
      clear();
      stream.write(`${text}\n`);
    },
    end() {
      clear();
    },
  };
}

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

export function formatMs(ms: number): string {
  return ms >= 1000 ? `${(ms / 1000).toFixed(2)} s` : `${ms.toFixed(0)} ms`;
}

/** Plain text table, first row the header, first column left-aligned. */
export function formatTable(rows: readonly (readonly string[])[]): string {
  const widths: number[] = [];
  for (const row of rows) row.forEach((cell, i) => (widths[i] = Math.max(widths[i] ?? 0, cell.length)));
  const line = (row: readonly string[]) => row.map((c, i) => (i === 0 ? c.padEnd(widths[i]!) : c.padStart(widths[i]!))).join('  ');
  const [header, ...body] = rows;
  if (!header) return '';
  return [line(header), widths.map((w) => '-'.repeat(w)).join('  '), ...body.map(line)].join('\n');
}
