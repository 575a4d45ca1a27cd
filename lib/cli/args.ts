/**
 * One argument reader for every command. A command declares its options
 * and positional arguments once (a CommandSpec); the reader checks the
 * command line against it before the command runs, and its --help is
 * rendered from the same spec, so neither can drift from the other.
 *
 * node:util's parseArgs would do for most commands but not for `run`'s
 * bwrap-style options, some of which take two or more values
 * (`--ro-bind SRC DST`) and whose order matters.
 */
import { closeSync, constants, fstatSync, openSync, statSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { MinisandboxError } from '../errors.js';
import { describeErrno } from '../sandbox/errors.js';

/** The command line is wrong; nothing was done. Exit code 2. */
export class UsageError extends MinisandboxError {
  static override readonly code = 'MSBX_USAGE';
}

/**
 * The command could not do its job, for a reason it words itself in terms
 * of what the user typed (`--port 8000: address already in use`). Printed
 * without a class name.
 */
export class CommandError extends MinisandboxError {
  static override readonly code = 'MSBX_COMMAND';
}

/** Reads one typed value: what the command gets, or a UsageError naming `name` (the flag or argument). */
export type ValueCheck<T = unknown> = (value: string, name: string) => T;

export interface OptionSpec {
  /** What it takes, as --help shows it: ['SRC', 'DST']. None: a switch. */
  values?: readonly string[];
  /** Its one value may be left out (`--inherit-env [NAME]`): the next argument is taken only if it is not an option. */
  optionalValue?: boolean;
  repeatable?: boolean;
  required?: boolean;
  /** For an option of one value. */
  check?: ValueCheck;
  /** Shown by --help, and what the command gets when the option is not given. */
  default?: string;
  help: string;
  /** The --help heading it is listed under (default "Options"). */
  section?: string;
  /** The library option it sets: an error the library raises about that option names this flag instead. */
  option?: string;
}

export interface PositionalSpec {
  name: string;
  optional?: boolean;
  repeatable?: boolean;
  check?: ValueCheck;
}

export interface CommandSpec {
  /** As typed: 'store verify'. */
  name: string;
  /** Synopsis lines, when the one made from the spec would not say it (`--predictions PREDS | --gold`). */
  usage?: readonly string[];
  about: string;
  options: Readonly<Record<string, OptionSpec>>;
  positionals?: readonly PositionalSpec[];
  /**
   * The first argument that is not an option, or everything after `--`, is
   * a command line of its own (`run`'s COMMAND [ARGS...]), never read as options.
   */
  command?: string;
  exitCodes: string;
}

export interface Command {
  spec: CommandSpec;
  run(args: Args): Promise<number>;
}

/** One option as given, in command-line order. */
export interface Given {
  flag: string;
  values: string[];
  /** The value as its check read it (options of one value). */
  value: unknown;
  /** As typed, for messages: `--bind /a /b`. */
  text: string;
}

/** Where a library option came from: the flag with its values as typed, and the values. */
export interface Origin {
  text: string;
  values: readonly string[];
}

export class Args {
  /** Library option -> the flag that set it (see OptionSpec.option); commands add the ones they build (`mounts[2]`). */
  readonly origins = new Map<string, Origin>();

  constructor(
    readonly spec: CommandSpec,
    /** The arguments after the command's name, as given. */
    readonly argv: readonly string[],
    /** Every option given, in order. */
    readonly given: readonly Given[],
    readonly positionals: readonly unknown[],
    /** The command line after the options, for a spec with `command`. */
    readonly command: readonly string[],
  ) {}

  has(flag: string): boolean {
    return this.given.some((g) => g.flag === flag);
  }

  /** The value of an option of one value, read by its check, or its default. */
  get<T = string>(flag: string): T | undefined {
    const given = this.given.findLast((g) => g.flag === flag);
    if (given) return given.value as T;
    const o = this.spec.options[flag]!;
    if (o.default === undefined) return undefined;
    return (o.check ? o.check(o.default, flag) : o.default) as T;
  }

  /** The values of a repeatable option, in order. */
  all<T = string>(flag: string): T[] {
    return this.given.filter((g) => g.flag === flag).map((g) => g.value as T);
  }

  /** Says that library option `option` came from `origin` (a flag as typed), for the error boundary. */
  blame(option: string, origin: Origin): void {
    this.origins.set(option, { text: origin.text, values: origin.values });
  }
}

const isHelp = (a: string) => a === '-h' || a === '--help';
const plural = (n: number, what: string) => `${n} ${what}${n === 1 ? '' : 's'}`;

/** Shell-quoted only where needed, so a message shows the words as they could be typed again. */
export function shellWord(s: string): string {
  return /^[\w@%+=:,./-]+$/.test(s) ? s : `'${s.replace(/'/g, `'\\''`)}'`;
}

/**
 * Reads `argv` (the arguments after the command's name) against `spec`:
 * 'help' when -h or --help stands where an option could, else every option,
 * positional argument and value checked. Throws UsageError naming what is
 * wrong. Nothing here touches the disk but the checks' reads.
 */
export function parseArgs(spec: CommandSpec, argv: readonly string[]): Args | 'help' {
  const given: Omit<Given, 'value'>[] = [];
  const words: string[] = [];
  let command: string[] = [];
  const see = `see 'minisandbox ${spec.name} --help'`;
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    if (a === '--') {
      if (spec.command) command = argv.slice(i + 1);
      else words.push(...argv.slice(i + 1));
      break;
    }
    if (isHelp(a)) return 'help';
    if (a.length > 1 && a.startsWith('-')) {
      const eq = a.startsWith('--') ? a.indexOf('=') : -1;
      const flag = eq > 0 ? a.slice(0, eq) : a;
      const o = spec.options[flag];
      if (!o) throw new UsageError(`unknown option '${flag}' (${see})`);
      const metavars = o.values ?? [];
      let values: string[];
      if (eq > 0) {
        if (metavars.length !== 1) throw new UsageError(metavars.length === 0 ? `${flag} takes no value` : `${flag} takes ${metavars.length} values (${metavars.join(' ')}), not one after '='`);
        values = [a.slice(eq + 1)];
      } else if (o.optionalValue) {
        const next = argv[i + 1];
        values = next !== undefined && !next.startsWith('-') ? [argv[++i]!] : [];
      } else {
        values = argv.slice(i + 1, i + 1 + metavars.length);
        if (values.length < metavars.length) throw new UsageError(`${flag} needs ${plural(metavars.length, 'value')} (${metavars.join(' ')})`);
        // `--store --json`: a forgotten value, not a directory named --json.
        const option = values.find((v) => v.startsWith('--') || isHelp(v));
        if (option !== undefined) {
          const escape = metavars.length === 1 ? ` (if it is the value, write ${flag}=${option})` : '';
          throw new UsageError(`${flag} needs ${metavars.join(' ')}, not the option ${option}${escape}`);
        }
        i += metavars.length;
      }
      given.push({ flag, values, text: [flag, ...values].map(shellWord).join(' ') });
      continue;
    }
    if (spec.command) {
      // bwrap's way: the command may come without '--'.
      command = argv.slice(i);
      break;
    }
    words.push(a);
  }

  const counts = new Map<string, number>();
  for (const g of given) counts.set(g.flag, (counts.get(g.flag) ?? 0) + 1);
  for (const [flag, o] of Object.entries(spec.options)) {
    if ((counts.get(flag) ?? 0) > 1 && !o.repeatable) throw new UsageError(`${flag} given twice`);
    if (o.required && !counts.has(flag)) throw new UsageError(`${flag} is required (${see})`);
  }
  const checked = given.map((g): Given => {
    const check = spec.options[g.flag]!.check;
    return { ...g, value: check && g.values.length === 1 ? check(g.values[0]!, g.flag) : g.values.length === 1 ? g.values[0] : g.values };
  });
  const positionals = readPositionals(spec, words, see);
  if (spec.command && command.length === 0) throw new UsageError(`no command given (minisandbox ${spec.name} [OPTIONS] -- ${spec.command} [ARGS...])`);
  const args = new Args(spec, argv, checked, positionals, command);
  for (const g of checked) {
    const option = spec.options[g.flag]!.option;
    // A repeatable option's errors are about the list: name the flag alone.
    if (option) args.blame(option, spec.options[g.flag]!.repeatable ? { text: g.flag, values: [] } : g);
  }
  return args;
}

function readPositionals(spec: CommandSpec, words: string[], see: string): unknown[] {
  const specs = spec.positionals ?? [];
  const out: unknown[] = [];
  let k = 0;
  for (const p of specs) {
    const take = p.repeatable ? words.length - k : Math.min(1, words.length - k);
    if (take === 0 && !p.optional) throw new UsageError(`expected ${p.name} (${see})`);
    for (const w of words.slice(k, k + take)) out.push(p.check ? p.check(w, p.name) : w);
    k += take;
  }
  if (k < words.length) throw new UsageError(`unexpected argument '${words[k]}' (${see})`);
  return out;
}

// ---- value checks: each names the flag or argument and what it expected

export const positiveInt: ValueCheck<number> = (v, name) => {
  const n = Number(v);
  if (!/^\d+$/.test(v.trim()) || !Number.isSafeInteger(n) || n < 1) throw new UsageError(`${name}: expected a positive integer, got '${v}'`);
  return n;
};

export const port: ValueCheck<number> = (v, name) => {
  const n = Number(v);
  if (!/^\d+$/.test(v.trim()) || n > 65535) throw new UsageError(`${name}: expected a port number (0-65535; 0 picks a free one), got '${v}'`);
  return n;
};

function positiveNumber(what: string): ValueCheck<number> {
  return (v, name) => {
    const n = Number(v);
    if (v.trim() === '' || !Number.isFinite(n) || n <= 0) throw new UsageError(`${name}: expected a positive number of ${what}, got '${v}'`);
    return n;
  };
}

export const seconds = positiveNumber('seconds');
export const cores = positiveNumber('cores');

export function oneOf<T extends string>(...choices: T[]): ValueCheck<T> {
  const list = choices.length === 2 ? `${choices[0]} or ${choices[1]}` : `one of ${choices.join(', ')}`;
  return (v, name) => {
    if (!(choices as string[]).includes(v)) throw new UsageError(`${name}: expected ${list}, got '${v}'`);
    return v as T;
  };
}

/** NAME=VALUE, NAME not empty. */
export const assignment: ValueCheck<[string, string]> = (v, name) => {
  const eq = v.indexOf('=');
  if (eq <= 0) throw new UsageError(`${name}: expected NAME=VALUE, got '${v}'`);
  return [v.slice(0, eq), v.slice(eq + 1)];
};

/** Why a file could not be opened or read, in words. */
export function fsReason(e: unknown): string {
  const err = e as NodeJS.ErrnoException;
  if (err.code === 'ENOENT') return 'no such file';
  if (err.code === 'EACCES') return 'permission denied';
  if (err.code === 'ENOTDIR') return 'a component of the path is not a directory';
  return typeof err.errno === 'number' ? describeErrno(Math.abs(err.errno)) : String(err.message);
}

/** A regular file this process can read, checked now rather than after the work it feeds has begun. */
export const readableFile: ValueCheck<string> = (v, name) => {
  let fd: number;
  try {
    // O_NONBLOCK: opening a FIFO that nobody writes to would wait forever.
    fd = openSync(v, constants.O_RDONLY | constants.O_NONBLOCK);
  } catch (e) {
    throw new UsageError(`${name} ${v}: ${fsReason(e)}`);
  }
  try {
    if (!fstatSync(fd).isFile()) throw new UsageError(`${name} ${v}: not a regular file`);
  } finally {
    closeSync(fd);
  }
  return v;
};

/** A file to be written at the end: its directory must exist now, not after an hour of evaluation. */
export const outputFile: ValueCheck<string> = (v, name) => {
  const abs = resolve(v);
  const dir = dirname(abs);
  let st;
  try {
    st = statSync(dir);
  } catch (e) {
    throw new UsageError(`${name} ${v}: directory ${dir}: ${fsReason(e)}`);
  }
  if (!st.isDirectory()) throw new UsageError(`${name} ${v}: ${dir} is not a directory`);
  if (statSync(abs, { throwIfNoEntry: false })?.isDirectory()) throw new UsageError(`${name} ${v}: is a directory`);
  return abs;
};

/** A path for the command to use as it is later: made absolute now, so messages and children agree on it. */
export const absolutePath: ValueCheck<string> = (v, name) => {
  if (v === '') throw new UsageError(`${name}: expected a path, got ''`);
  return resolve(v);
};

// ---- help, rendered from the spec

const HELP_OPTION = '  -h, --help';

function optionLabel(flag: string, o: OptionSpec): string {
  const values = (o.values ?? []).join(' ');
  return values === '' ? flag : o.optionalValue ? `${flag} [${values}]` : `${flag} ${values}`;
}

function synopsis(spec: CommandSpec): string[] {
  if (spec.usage) return [...spec.usage];
  const positionals = (spec.positionals ?? []).map((p) => {
    const word = p.repeatable ? `${p.name}...` : p.name;
    return p.optional ? `[${word}]` : word;
  });
  const options = Object.entries(spec.options).map(([flag, o]) => (o.required ? optionLabel(flag, o) : `[${optionLabel(flag, o)}]`));
  const tail = spec.command ? ['--', spec.command, '[ARGS...]'] : [];
  const head = `minisandbox ${spec.name}`;
  const full = [head, ...positionals, ...options, ...tail].join(' ');
  if (full.length <= 72) return [full];
  const required = Object.entries(spec.options).filter(([, o]) => o.required).map(([flag, o]) => optionLabel(flag, o));
  return [[head, ...positionals, ...required, '[OPTIONS]', ...tail].join(' ')];
}

const HELP_WIDTH = 80;

/** Words filled into lines of at most `width` characters. */
function wrap(text: string, width: number): string[] {
  const lines: string[] = [];
  let line = '';
  for (const word of text.split(/\s+/).filter(Boolean)) {
    if (line && line.length + 1 + word.length > width) {
      lines.push(line);
      line = word;
    } else line = line ? `${line} ${word}` : word;
  }
  return [...lines, line];
}

/** "  --flag VALUES   help" in one column for the whole command; a label too long for it on a line of its own. */
function optionLines(rows: [string, string][], width: number): string {
  return rows
    .map(([label, help]) => {
      const [first = '', ...more] = wrap(help, HELP_WIDTH - 1 - width);
      const lead = label.length + 2 > width ? `${label}\n${' '.repeat(width)}${first}` : `${label.padEnd(width)}${first}`;
      return [lead, ...more.map((l) => `${' '.repeat(width)}${l}`)].join('\n');
    })
    .join('\n');
}

export function renderHelp(spec: CommandSpec): string {
  const [first, ...more] = synopsis(spec);
  const usage = [`Usage: ${first}`, ...more.map((l) => `       ${l}`)].join('\n');
  const sections = new Map<string, [string, string][]>();
  for (const [flag, o] of Object.entries(spec.options)) {
    const section = o.section ?? 'Options';
    const help = o.default !== undefined ? `${o.help} (default ${o.default})` : o.help;
    sections.set(section, [...(sections.get(section) ?? []), [`  ${optionLabel(flag, o)}`, help]]);
  }
  const home = sections.has('Options') ? 'Options' : ([...sections.keys()].at(-1) ?? 'Options');
  sections.set(home, [...(sections.get(home) ?? []), [HELP_OPTION, 'This help']]);
  const labels = [...sections.values()].flat().map(([label]) => label.length);
  const width = Math.min(Math.max(...labels), 26) + 2;
  const blocks = [...sections].map(([title, rows]) => `${title}:\n${optionLines(rows, width)}`);
  return `${[usage, spec.about.trim(), ...blocks, spec.exitCodes.trim()].join('\n\n')}\n`;
}
