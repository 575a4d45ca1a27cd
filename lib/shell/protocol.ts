/**
 * The lines typed into the shell and the markers that come back.
 *
 * Every marker carries a per-session random nonce, and in the typed text
 * every marker is split by quotes (`'__MSE''ND…'`), so neither command
 * output nor an echoed command line (should echo come back on) can fake it.
 *
 * - Prompt: PS1 is `__MSPS1_<nonce>_${__ms_id}__`, expanded when shown, so
 *   each prompt says which command line it follows.
 * - Command line (one line whatever the command):
 *     __ms_id=N; builtin eval $'<command>'; { __ms_rc=$?; <reset PS1/PS2/PS0>;
 *       builtin printf '__MSEND_<nonce>_N_%s__' "$__ms_rc"; } 2>/dev/null
 *   The end probe runs in the same line, after the command, so it never
 *   leaks into a program's stdin; if the line is aborted (Ctrl-C) only the
 *   prompt comes back, which tells "no exit code" apart from a result.
 * - Sync line: re-asserts the prompt and prints `__MSSYNC_<nonce>_K__`; used
 *   after an interrupt to be sure everything before it has been read.
 */
import { randomBytes } from 'node:crypto';
import type { Pattern } from './expect.js';
import { ansiCQuote, escapeRegExp } from './text.js';

const MARKER_MAX = 96;
// xtrace of the command line's wrapper (PS4 is "+ " by default).
const WRAPPER_TRACE_RE = /^\++ (?:__ms_id=\d+|builtin eval (?:\$'[^\n]*'|'[\s\S]*?'))\n/gm;

export class ShellProtocol {
  readonly nonce: string;
  private readonly staleRe: RegExp;

  constructor(nonce: string = randomBytes(6).toString('hex')) {
    this.nonce = nonce;
    this.staleRe = new RegExp(`__MS(?:PS1|END|SYNC|BEGIN|READY)_${escapeRegExp(nonce)}(?:_\\d*)?(?:_\\d+)?__`, 'g');
  }

  /** Builtin-only assignments; `${__ms_id}` stays literal until the prompt is shown. */
  resetPrompt(): string {
    return `PS1='__MSPS''1_${this.nonce}_\${__ms_id}__'; PS2=''; PS0=''`;
  }

  commandLine(command: string, id: number): string {
    return (
      `__ms_id=${id}; builtin eval ${ansiCQuote(command)}; ` +
      `{ __ms_rc=$?; ${this.resetPrompt()}; builtin printf '__MSE''ND_%s_%s_%s__' ${this.nonce} ${id} "$__ms_rc"; } 2>/dev/null`
    );
  }

  syncLine(k: number, prefix = ''): string {
    return `${prefix}{ ${this.resetPrompt()}; builtin printf '__MSSY''NC_%s_%s__' ${this.nonce} ${k}; } 2>/dev/null`;
  }

  startupLine(opts: { env?: Record<string, string>; startupSource?: readonly string[] }): string {
    const parts = [
      // pexpect spawns with echo off; a pty made elsewhere may not be.
      'stty -echo 2>/dev/null',
      // Readline would wrap every prompt in \e[?2004h / \e[?2004l\r.
      `bind 'set enable-bracketed-paste off' 2>/dev/null`,
      `builtin printf '__MSBE''GIN_%s__' ${this.nonce}`,
    ];
    for (const [name, value] of Object.entries(opts.env ?? {})) {
      if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(name)) throw new TypeError(`invalid environment variable name: ${name}`);
      parts.push(`export ${name}=${ansiCQuote(value)}`);
    }
    for (const file of opts.startupSource ?? []) parts.push(`source ${ansiCQuote(file)}`);
    // A startup file's PROMPT_COMMAND would print between the end marker and the prompt.
    parts.push('unset PROMPT_COMMAND', '__ms_id=0');
    parts.push(`{ ${this.resetPrompt()}; builtin printf '__MSRE''ADY_%s__' ${this.nonce}; } 2>/dev/null`);
    return parts.join('; ');
  }

  readonly beginMarker = (): string => `__MSBEGIN_${this.nonce}__`;
  readonly readyMarker = (): string => `__MSREADY_${this.nonce}__`;
  readonly syncMarker = (k: number): string => `__MSSYNC_${this.nonce}_${k}__`;
  readonly promptFor = (id: number): string => `__MSPS1_${this.nonce}_${id}__`;

  anyPrompt(): Pattern {
    return { regex: new RegExp(`__MSPS1_${escapeRegExp(this.nonce)}_(\\d*)__`), maxLength: MARKER_MAX };
  }

  endProbe(id: number): Pattern {
    return { regex: new RegExp(`__MSEND_${escapeRegExp(this.nonce)}_${id}_(\\d+)__`), maxLength: MARKER_MAX };
  }

  /**
   * Remove markers of earlier lines (a stale prompt after a timeout, an
   * aborted probe), and the wrapper's own `set -x` trace lines, which the
   * user never typed.
   */
  scrub(text: string): string {
    return text.replace(this.staleRe, '').replace(WRAPPER_TRACE_RE, '');
  }
}
