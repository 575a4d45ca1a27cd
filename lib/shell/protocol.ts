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
 * - A command whose line would pass MAX_TYPED_LINE is typed as a chain:
 *     __ms_c=$'<part 1>'; __ms_k=N.1
 *     [[ $__ms_k == N.1 ]] && __ms_c+=$'<part 2>' && __ms_k=N.2
 *     __ms_id=N; [[ $__ms_k == N.2 ]] || __ms_c=<report the loss>;
 *       builtin eval "$__ms_c"; { <as above, and unset __ms_c __ms_k> }
 *   Each link checks the one before it, so a chain that lost a line (read
 *   by a program still running when it was typed) runs nothing of it.
 * - Sync line: re-asserts the prompt and prints `__MSSYNC_<nonce>_K__`; used
 *   after an interrupt to be sure everything before it has been read.
 */
import { randomBytes } from 'node:crypto';
import type { Pattern } from './expect.js';
import { ansiCQuote, ansiCQuoteChunks, escapeRegExp } from './text.js';

const MARKER_MAX = 96;
// xtrace of the command line's wrapper (PS4 is "+ " by default).
const WRAPPER_TRACE_RE =
  /^\++ (?:__ms_id=\d+|__ms_[ck]\+?=[^\n]*|\[\[ \d+\.\d+ == \d+\.\d+ \]\]|builtin eval (?:\$'[^\n]*'|'[\s\S]*?'))\n/gm;

/**
 * The longest line typed into the shell. The shell reads without readline
 * (Sandbox.shell: readline reads a line a byte at a time, with work per
 * byte, ~1 ms for a short command and ~230 ms for a 25 KB one), so the
 * terminal is in canonical mode while it reads, and the line discipline
 * keeps at most 4095 bytes of a line (N_TTY_BUF_SIZE), dropping the rest.
 */
export const MAX_TYPED_LINE = 3800;
const LOST_COMMAND =
  "builtin printf 'minisandbox: part of this command was read by a program still running on the terminal; nothing of it was run\\n' >&2; builtin false";

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

  /** The lines that type `command` as run number `id` (see the chain above). */
  commandLines(command: string, id: number): string[] {
    const end = (extra: string) =>
      `{ __ms_rc=$?; ${extra}${this.resetPrompt()}; builtin printf '__MSE''ND_%s_%s_%s__' ${this.nonce} ${id} "$__ms_rc"; } 2>/dev/null`;
    const line = `__ms_id=${id}; builtin eval ${ansiCQuote(command)}; ${end('')}`;
    if (line.length <= MAX_TYPED_LINE) return [line];
    // A link's own words around its part, with room for any part number.
    const linkWords = `[[ $__ms_k == ${id}.9999999999 ]] && __ms_c+= && __ms_k=${id}.9999999999`.length;
    const parts = ansiCQuoteChunks(command, MAX_TYPED_LINE - linkWords);
    const lines = parts.map((q, i) =>
      i === 0 ? `__ms_c=${q}; __ms_k=${id}.1` : `[[ $__ms_k == ${id}.${i} ]] && __ms_c+=${q} && __ms_k=${id}.${i + 1}`,
    );
    lines.push(
      `__ms_id=${id}; [[ $__ms_k == ${id}.${parts.length} ]] || __ms_c=${ansiCQuote(LOST_COMMAND)}; ` +
        `builtin eval "$__ms_c"; ${end('builtin unset __ms_c __ms_k; ')}`,
    );
    return lines;
  }

  syncLine(k: number, prefix = ''): string {
    return `${prefix}{ ${this.resetPrompt()}; builtin printf '__MSSY''NC_%s_%s__' ${this.nonce} ${k}; } 2>/dev/null`;
  }

  /** The lines typed once, before any command: quiet terminal, markers, environment, startup files. */
  startupLines(opts: { env?: Record<string, string>; startupSource?: readonly string[] }): string[] {
    const statements = [
      // pexpect spawns with echo off; a pty made elsewhere may not be.
      'stty -echo 2>/dev/null',
      // Readline (on a pty made elsewhere) would wrap every prompt in \e[?2004h / \e[?2004l\r.
      `bind 'set enable-bracketed-paste off' 2>/dev/null`,
      // No prompt text between the startup lines.
      "PS1=''; PS2=''",
      `builtin printf '__MSBE''GIN_%s__' ${this.nonce}`,
    ];
    for (const [name, value] of Object.entries(opts.env ?? {})) {
      if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(name)) throw new TypeError(`invalid environment variable name: ${name}`);
      const [first, ...rest] = ansiCQuoteChunks(value, MAX_TYPED_LINE - name.length - 40);
      if (!rest.length) statements.push(`export ${name}=${first}`);
      else statements.push(`__ms_v=${first}`, ...rest.map((q) => `__ms_v+=${q}`), `export ${name}="$__ms_v"; builtin unset __ms_v`);
    }
    for (const file of opts.startupSource ?? []) statements.push(`source ${ansiCQuote(file)}`);
    // A startup file's PROMPT_COMMAND would print between the end marker and the prompt.
    statements.push('unset PROMPT_COMMAND', '__ms_id=0');
    statements.push(`{ ${this.resetPrompt()}; builtin printf '__MSRE''ADY_%s__' ${this.nonce}; } 2>/dev/null`);
    const lines: string[] = [];
    for (const st of statements) {
      const last = lines.length - 1;
      if (last >= 0 && lines[last]!.length + 2 + st.length <= MAX_TYPED_LINE) lines[last] += `; ${st}`;
      else lines.push(st);
    }
    return lines;
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
