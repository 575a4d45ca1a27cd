/**
 * Normalisation shared by the log parsers: real logs come from terminals and
 * CI, so they carry colour codes, CRLF line ends and carriage-return
 * progress redraws that would otherwise defeat line-anchored patterns.
 */

// CSI sequences (colours, cursor moves) plus the rarer two-byte escapes.
const ANSI_ESCAPE = /\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-Z\\-_]/g;

export function stripAnsi(text: string): string {
  return text.replace(ANSI_ESCAPE, '');
}

/**
 * Splits a log into clean lines: ANSI codes removed, CRLF handled, and for a
 * line redrawn with bare `\r` only the last non-empty redraw kept (that is
 * what a terminal would show). Trailing whitespace is dropped.
 */
export function logLines(log: string): string[] {
  return stripAnsi(log)
    .split(/\r?\n/)
    .map((line) => {
      if (line.includes('\r')) {
        const redraws = line.split('\r').filter((part) => part.trim() !== '');
        line = redraws[redraws.length - 1] ?? '';
      }
      return line.trimEnd();
    });
}
