/**
 * The benchmarks' command lines, parsed one way (node:util parseArgs under a
 * spec of typed flags): every benchmark gets --help (-h), the same error for a
 * bad flag (naming the flag as typed and the reason, then the usage line), and
 * its defaults written once, beside the flag.
 *
 *   const o = readArgs(USAGE, { iterations: count(200), json: flag() });
 *   o.iterations; // number
 */
import path from 'node:path';
import { parseArgs } from 'node:util';

/** A bad command line: its message is the reason, then the usage line; print it without a stack. */
export class UsageError extends Error {}

export interface Flag<T> {
  readonly type: 'string' | 'boolean';
  /** Other spellings of the same flag; when several are given the last wins. */
  readonly aliases?: readonly string[];
  /** Also accept --no-NAME, which turns a boolean flag off (the last of the two wins). */
  readonly negatable?: boolean;
  /** The option's value from the raw one (undefined: flag absent). Throws the reason for a bad value. */
  readonly convert: (raw: string | boolean | undefined) => T;
}

type Values<S> = { [K in keyof S]: S[K] extends Flag<infer T> ? T : never };

const quoted = (v: unknown) => JSON.stringify(v);

/** A boolean flag: true when given. */
export function flag(): Flag<boolean> {
  return { type: 'boolean', convert: (raw) => raw === true };
}

/** A boolean with both --NAME and --no-NAME. */
export function toggle(dflt: boolean): Flag<boolean> {
  return { type: 'boolean', negatable: true, convert: (raw) => (raw === undefined ? dflt : raw === true) };
}

function positiveInteger(v: string): number {
  const n = Number(v);
  if (v.trim() === '' || !Number.isInteger(n) || n < 1) throw new Error(`needs a positive integer, got ${quoted(v)}`);
  return n;
}

/** A positive integer. */
export function count<D extends number | undefined = undefined>(dflt?: D, aliases?: readonly string[]): Flag<number | D> {
  return { type: 'string', ...(aliases ? { aliases } : {}), convert: (raw) => (raw === undefined ? (dflt as D) : positiveInteger(String(raw))) };
}

/** A comma-separated list of positive integers, in the order given. */
export function counts<D extends number[] | undefined = undefined>(dflt?: D): Flag<number[] | D> {
  return {
    type: 'string',
    convert: (raw) => {
      if (raw === undefined) return dflt as D;
      try {
        return String(raw).split(',').map((s) => positiveInteger(s.trim()));
      } catch {
        throw new Error(`needs a comma-separated list of positive integers, got ${quoted(raw)}`);
      }
    },
  };
}

/** A number >= 0 (seconds, fractions allowed). */
export function seconds(dflt: number): Flag<number> {
  return {
    type: 'string',
    convert: (raw) => {
      if (raw === undefined) return dflt;
      const n = Number(raw);
      if (String(raw).trim() === '' || !Number.isFinite(n) || n < 0) throw new Error(`needs a number of seconds >= 0, got ${quoted(raw)}`);
      return n;
    },
  };
}

/** A string, as given. */
export function text<D extends string | undefined = undefined>(dflt?: D): Flag<string | D> {
  return { type: 'string', convert: (raw) => (raw === undefined ? (dflt as D) : String(raw)) };
}

/** A file or directory (the default too), made absolute against the working directory. */
export function file<D extends string | undefined = undefined>(dflt?: D): Flag<string | D> {
  return { type: 'string', convert: (raw) => (raw === undefined ? (dflt === undefined ? (dflt as D) : path.resolve(dflt)) : path.resolve(String(raw))) };
}

/** One of a few words. */
export function oneOf<const C extends string, D extends C | undefined = undefined>(choices: readonly C[], dflt?: D): Flag<C | D> {
  const list = choices.length > 1 ? `${choices.slice(0, -1).join(', ')} or ${choices.at(-1)}` : String(choices[0]);
  return {
    type: 'string',
    convert: (raw) => {
      if (raw === undefined) return dflt as D;
      if (!(choices as readonly string[]).includes(String(raw))) throw new Error(`must be ${list}, got ${quoted(raw)}`);
      return raw as C;
    },
  };
}

/** node:util's errors, said the same way as the flags' own. */
function describeParseError(err: unknown): string {
  const msg = err instanceof Error ? err.message : String(err);
  const name = /'(-[^' ]+)/.exec(msg)?.[1];
  switch ((err as { code?: string }).code) {
    case 'ERR_PARSE_ARGS_UNKNOWN_OPTION':
      return `unknown flag ${name}`;
    case 'ERR_PARSE_ARGS_UNEXPECTED_POSITIONAL':
      return `unexpected argument ${quoted(/'([^']*)'/.exec(msg)?.[1])}`;
    case 'ERR_PARSE_ARGS_INVALID_OPTION_VALUE':
      if (/does not take an argument/.test(msg)) return `${name} takes no value`;
      if (/ambiguous/.test(msg)) return `${name} needs a value (one starting with "-" is written ${name}=VALUE)`;
      return `${name} needs a value`;
    default:
      return msg;
  }
}

/**
 * Parse `argv` by `spec` (keys are the flags' names without the dashes).
 * --help or -h prints the usage line and exits 0; a bad flag throws a
 * UsageError.
 */
export function parseFlags<S extends Record<string, Flag<unknown>>>(argv: readonly string[], usage: string, spec: S): Values<S> {
  const options: Record<string, { type: 'string' | 'boolean'; short?: string }> = { help: { type: 'boolean', short: 'h' } };
  const owner = new Map<string, { key: string; off: boolean }>();
  for (const [key, f] of Object.entries(spec)) {
    for (const name of [key, ...(f.aliases ?? [])]) {
      options[name] = { type: f.type };
      owner.set(name, { key, off: false });
    }
    if (f.negatable) {
      options[`no-${key}`] = { type: 'boolean' };
      owner.set(`no-${key}`, { key, off: true });
    }
  }
  let tokens;
  try {
    ({ tokens } = parseArgs({ args: [...argv], options, strict: true, allowPositionals: false, tokens: true }));
  } catch (err) {
    throw new UsageError(`${describeParseError(err)}\n${usage}`);
  }
  const given = new Map<string, { raw: string | boolean; as: string }>();
  for (const t of tokens) {
    if (t.kind !== 'option') continue;
    if (t.name === 'help') {
      process.stdout.write(`${usage}\n`);
      process.exit(0);
    }
    const { key, off } = owner.get(t.name)!;
    given.set(key, { raw: off ? false : (t.value ?? true), as: t.rawName });
  }
  const values: Record<string, unknown> = {};
  for (const [key, f] of Object.entries(spec)) {
    const g = given.get(key);
    try {
      values[key] = f.convert(g?.raw);
    } catch (err) {
      throw new UsageError(`${g?.as ?? `--${key}`} ${(err as Error).message}\n${usage}`);
    }
  }
  return values as Values<S>;
}

/** parseFlags on this process's arguments; a bad command line is printed (no stack) and exits 2. */
export function readArgs<S extends Record<string, Flag<unknown>>>(usage: string, spec: S): Values<S> {
  try {
    return parseFlags(process.argv.slice(2), usage, spec);
  } catch (err) {
    if (!(err instanceof UsageError)) throw err;
    process.stderr.write(`${err.message}\n`);
    process.exit(2);
  }
}
