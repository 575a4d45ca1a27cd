/**
 * The CLI's one error boundary. Whatever a command throws becomes one
 * message, `minisandbox <command>: <ErrorName>: <message>`, and an exit
 * code: 2 for a usage error, the command's failure code (1; 125 for `run`)
 * for anything else. The stack is shown only with MINISANDBOX_DEBUG=1: a
 * user needs the reason, a bug report the place.
 */
import { CommandError, UsageError, type Origin } from './args.js';

export const DEBUG_ENV = 'MINISANDBOX_DEBUG';

/** JavaScript's own error classes: thrown by a bug, not by a check of ours. */
const BUILTIN_ERRORS = new Set(['TypeError', 'RangeError', 'ReferenceError', 'SyntaxError', 'EvalError', 'URIError']);

const debugging = () => (process.env[DEBUG_ENV] ?? '') !== '' && process.env[DEBUG_ENV] !== '0';

/** `mounts[2].source` for a message that begins with it. */
const LEADING_OPTION = /^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*|\[\d+\])*/;

/**
 * The message with the library option it is about replaced by the flag the
 * user typed: `limits.memory: ...` raised because of `--memory 2x` reads
 * `--memory 2x: ...`. The option is the error's own (ConfigError's
 * `option`), else the path the message begins with, which is how the
 * library's messages name what they are about.
 */
export function inTermsOfFlags(e: Error, origins: ReadonlyMap<string, Origin>): string {
  // What the library says to its API users ("minisandbox: cannot load the
  // native addon: ...") already follows the command's own prefix here.
  const message = e.message.replace(/^minisandbox: /, '');
  const declared = (e as { option?: unknown }).option;
  const option = typeof declared === 'string' ? declared : LEADING_OPTION.exec(message)?.[0];
  if (!option) return message;
  let found: [string, Origin] | undefined;
  for (const [known, origin] of origins) {
    const within = option === known || option.startsWith(`${known}.`) || option.startsWith(`${known}[`);
    if (within && (!found || known.length > found[0].length)) found = [known, origin];
  }
  if (!found) return message;
  const [, origin] = found;
  for (const lead of [option, ...(origin.values.length ? [`${option} ${origin.values.join(' ')}`] : [])]) {
    if (message.startsWith(`${lead}:`)) return `${origin.text}${message.slice(lead.length)}`;
  }
  return typeof declared === 'string' ? `${origin.text}: ${message}` : message;
}

function stackOf(e: unknown): string {
  let text = '';
  for (let cause = e, depth = 0; cause !== undefined && depth < 5; cause = (cause as { cause?: unknown }).cause, depth++) {
    text += `${depth ? 'caused by: ' : ''}${cause instanceof Error ? (cause.stack ?? String(cause)) : String(cause)}\n`;
  }
  return text;
}

/** Writes what `e` means for `command` to stderr; returns the exit code. */
export function reportError(command: string | undefined, e: unknown, origins: ReadonlyMap<string, Origin>, failureExit: number): number {
  const prefix = command ? `minisandbox ${command}: ` : 'minisandbox: ';
  let line: string;
  if (!(e instanceof Error)) line = String(e);
  else if (e instanceof UsageError || e instanceof CommandError) line = inTermsOfFlags(e, origins);
  else {
    line = `${e.name}: ${inTermsOfFlags(e, origins)}`;
    if (BUILTIN_ERRORS.has(e.name) && !debugging()) line += ` (an internal error: ${DEBUG_ENV}=1 shows where)`;
  }
  process.stderr.write(`${prefix}${line}\n`);
  if (debugging()) process.stderr.write(stackOf(e));
  return e instanceof UsageError ? 2 : failureExit;
}
