/** Persistent bash sessions on a pty, with SWE-ReX BashSession semantics. */
export * from './errors.js';
export type { PtyChannel, PtyExitInfo } from './pty.js';
export {
  ShellSession,
  type BashObservation,
  type CheckMode,
  type InteractiveOptions,
  type InterruptOptions,
  type RunOptions,
  type ShellSessionOptions,
} from './session.js';
export { checkBashSyntax, type SyntaxCheckResult } from './syntax.js';
export { cleanTerminalText, ansiCQuote, shQuote } from './text.js';
export {
  BoundedBuffer,
  DEFAULT_MAX_OUTPUT_BYTES,
  MIN_OUTPUT_BYTES,
  truncationMarker,
  type BoundedOutputLimits,
  type KeptOutput,
} from './bounded.js';
