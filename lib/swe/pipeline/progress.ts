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
