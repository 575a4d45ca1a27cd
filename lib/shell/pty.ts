/**
 * A duplex byte channel to the master side of a pseudo-terminal.
 *
 * The shell session only needs this much, so it works the same on top of
 * the terminal of a sandboxed process (Sandbox.shell) and on top of any
 * other pty a caller has (the tests use script(1)'s).
 */

export interface PtyExitInfo {
  exitCode: number | null;
  signal: string | null;
}

export interface PtyChannel {
  /** Bytes typed into the terminal (control characters such as \x03 included). */
  write(data: string | Buffer): void;
  /** Terminal output; returns an unsubscribe function. */
  onData(listener: (chunk: Buffer) => void): () => void;
  /** Called once when the process on the pty is gone (immediately if it already is). */
  onExit(listener: (info: PtyExitInfo) => void): void;
  kill(signal?: NodeJS.Signals): void;
  resize?(cols: number, rows: number): void;
}
