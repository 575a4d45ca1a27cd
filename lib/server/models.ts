/**
 * The request models of the SWE-ReX protocol (swerex.runtime.abstract,
 * v1.4) and of the sandbox management routes, validated the way pydantic v2
 * does in its default "lax" mode, with the same defaults. A bad request
 * becomes a FastAPI-shaped 422:
 * `{"detail":[{"type","loc":["body",field],"msg","input"}]}`.
 */
import { HttpError } from './http.js';

export interface ValidationIssue {
  type: string;
  loc: Array<string | number>;
  msg: string;
  input: unknown;
  ctx?: Record<string, unknown>;
}

export function validationError(issues: ValidationIssue[]): HttpError {
  return HttpError.detail(422, issues);
}

/** Parses a JSON body; an invalid one is a 422 as FastAPI reports it. */
export function parseJsonBody(raw: Buffer): unknown {
  const text = raw.toString('utf8');
  if (text.trim() === '') {
    throw validationError([{ type: 'missing', loc: ['body'], msg: 'Field required', input: null }]);
  }
  try {
    return JSON.parse(text);
  } catch (e) {
    throw validationError([
      { type: 'json_invalid', loc: ['body', 0], msg: 'JSON decode error', input: {}, ctx: { error: (e as Error).message } },
    ]);
  }
}

const TRUE_WORDS = new Set(['true', '1', 'yes', 'y', 'on', 't']);
const FALSE_WORDS = new Set(['false', '0', 'no', 'n', 'off', 'f']);

/** Pydantic's lax bool: JSON booleans, 0/1 and the usual words. */
function laxBool(v: unknown): boolean | undefined {
  if (typeof v === 'boolean') return v;
  if (v === 0 || v === 1) return v === 1;
  if (typeof v === 'string') {
    const w = v.trim().toLowerCase();
    if (TRUE_WORDS.has(w)) return true;
    if (FALSE_WORDS.has(w)) return false;
  }
  return undefined;
}

/** Reads fields of one JSON object, collecting every problem before failing. */
class FieldReader {
  readonly issues: ValidationIssue[] = [];
  readonly obj: Record<string, unknown>;

  constructor(
    input: unknown,
    private readonly prefix: Array<string | number> = ['body'],
  ) {
    if (typeof input !== 'object' || input === null || Array.isArray(input)) {
      this.issues.push({
        type: 'model_attributes_type',
        loc: prefix,
        msg: 'Input should be a valid dictionary or object to extract fields from',
        input,
      });
      this.obj = {};
    } else {
      this.obj = input as Record<string, unknown>;
    }
  }

  private fail(name: string, type: string, msg: string, input: unknown, ctx?: Record<string, unknown>): undefined {
    this.issues.push({ type, loc: [...this.prefix, name], msg, input, ...(ctx ? { ctx } : {}) });
    return undefined;
  }

  /** undefined when absent: the caller applies the default. */
  private present(name: string): unknown {
    return this.obj[name];
  }

  required<T>(name: string, read: (name: string) => T | undefined): T {
    if (this.present(name) === undefined) {
      this.fail(name, 'missing', 'Field required', this.obj);
      return undefined as T;
    }
    return read(name) as T;
  }

  str(name: string): string | undefined;
  str(name: string, dflt: string): string;
  str(name: string, dflt?: string): string | undefined {
    const v = this.present(name);
    if (v === undefined) return dflt;
    if (typeof v !== 'string') return this.fail(name, 'string_type', 'Input should be a valid string', v);
    return v;
  }

  nullableStr(name: string): string | null {
    const v = this.present(name);
    if (v === undefined || v === null) return null;
    return this.str(name) ?? null;
  }

  bool(name: string, dflt: boolean): boolean {
    const v = this.present(name);
    if (v === undefined) return dflt;
    const b = laxBool(v);
    if (b === undefined) return this.fail(name, 'bool_type', 'Input should be a valid boolean', v) ?? dflt;
    return b;
  }

  /** Seconds as a non-negative float (pydantic accepts numeric strings too). */
  seconds(name: string, dflt: number): number;
  seconds(name: string, dflt: null): number | null;
  seconds(name: string, dflt: number | null): number | null {
    const v = this.present(name);
    if (v === undefined || (v === null && dflt === null)) return dflt;
    const n = typeof v === 'number' ? v : typeof v === 'string' && v.trim() !== '' ? Number(v) : NaN;
    if (!Number.isFinite(n)) return this.fail(name, 'float_type', 'Input should be a valid number', v) ?? dflt;
    // pexpect treats a negative timeout as "already expired": refuse it instead.
    if (n < 0) return this.fail(name, 'greater_than_equal', 'Input should be greater than or equal to 0', v, { ge: 0 }) ?? dflt;
    return n;
  }

  int(name: string, dflt: number, min = 0): number {
    const v = this.present(name);
    if (v === undefined) return dflt;
    const n = typeof v === 'number' ? v : typeof v === 'string' && /^\s*-?\d+\s*$/.test(v) ? Number(v) : NaN;
    if (!Number.isInteger(n)) return this.fail(name, 'int_type', 'Input should be a valid integer', v) ?? dflt;
    if (n < min) return this.fail(name, 'greater_than_equal', `Input should be greater than or equal to ${min}`, v, { ge: min }) ?? dflt;
    return n;
  }

  strList(name: string): string[] {
    const v = this.present(name);
    if (v === undefined) return [];
    if (!Array.isArray(v)) return this.fail(name, 'list_type', 'Input should be a valid list', v) ?? [];
    v.forEach((item, i) => {
      if (typeof item !== 'string') {
        this.issues.push({ type: 'string_type', loc: [...this.prefix, name, i], msg: 'Input should be a valid string', input: item });
      }
    });
    return v as string[];
  }

  strDict(name: string): Record<string, string> | null {
    const v = this.present(name);
    if (v === undefined || v === null) return null;
    if (typeof v !== 'object' || Array.isArray(v)) return this.fail(name, 'dict_type', 'Input should be a valid dictionary', v) ?? null;
    for (const [k, item] of Object.entries(v)) {
      if (typeof item !== 'string') {
        this.issues.push({ type: 'string_type', loc: [...this.prefix, name, k], msg: 'Input should be a valid string', input: item });
      }
    }
    return v as Record<string, string>;
  }

  literal<T extends string>(name: string, allowed: readonly T[], dflt: T): T {
    const v = this.present(name);
    if (v === undefined) return dflt;
    if (typeof v === 'string' && (allowed as readonly string[]).includes(v)) return v as T;
    const expected = allowed.map((a) => `'${a}'`);
    const list = expected.length > 1 ? `${expected.slice(0, -1).join(', ')} or ${expected.at(-1)}` : expected[0];
    return this.fail(name, 'literal_error', `Input should be ${list}`, v, { expected: list }) ?? dflt;
  }

  /** Throws the 422 if anything was wrong, else returns `value`. */
  done<T>(value: T): T {
    if (this.issues.length > 0) throw validationError(this.issues);
    return value;
  }
}

// ------------------------------------------------------------ SWE-ReX models

export type CheckMode = 'raise' | 'silent' | 'ignore';
const CHECK_MODES = ['silent', 'raise', 'ignore'] as const;

export interface CreateBashSessionRequest {
  startup_source: string[];
  session: string;
  session_type: 'bash';
  startup_timeout: number;
}

export function parseCreateSession(body: unknown): CreateBashSessionRequest {
  const f = new FieldReader(body);
  return f.done({
    startup_source: f.strList('startup_source'),
    session: f.str('session', 'default'),
    session_type: f.literal('session_type', ['bash'], 'bash'),
    startup_timeout: f.seconds('startup_timeout', 1.0),
  });
}

export interface BashAction {
  action_type: 'bash';
  command: string;
  session: string;
  timeout: number | null;
  is_interactive_command: boolean;
  is_interactive_quit: boolean;
  check: CheckMode;
  error_msg: string;
  expect: string[];
}

export interface BashInterruptAction {
  action_type: 'bash_interrupt';
  session: string;
  timeout: number;
  n_retry: number;
  expect: string[];
}

export type Action = BashAction | BashInterruptAction;

/**
 * `Action` is discriminated on `action_type`. The Python client always
 * sends it; a hand-written request without it is read as a bash action
 * (pydantic would refuse it; accepting it costs nothing).
 */
export function parseAction(body: unknown): Action {
  const f = new FieldReader(body);
  const kind = f.literal('action_type', ['bash', 'bash_interrupt'], 'bash');
  if (f.issues.length > 0) return f.done(undefined as never);
  if (kind === 'bash_interrupt') {
    return f.done({
      action_type: 'bash_interrupt',
      session: f.str('session', 'default'),
      timeout: f.seconds('timeout', 0.2),
      n_retry: f.int('n_retry', 3),
      expect: f.strList('expect'),
    });
  }
  return f.done({
    action_type: 'bash',
    command: f.required('command', (n) => f.str(n)),
    session: f.str('session', 'default'),
    timeout: f.seconds('timeout', null),
    is_interactive_command: f.bool('is_interactive_command', false),
    is_interactive_quit: f.bool('is_interactive_quit', false),
    check: f.literal('check', CHECK_MODES, 'raise'),
    error_msg: f.str('error_msg', ''),
    expect: f.strList('expect'),
  });
}

export interface CloseBashSessionRequest {
  session: string;
  session_type: 'bash';
}

export function parseCloseSession(body: unknown): CloseBashSessionRequest {
  const f = new FieldReader(body);
  return f.done({ session: f.str('session', 'default'), session_type: f.literal('session_type', ['bash'], 'bash') });
}

export interface Command {
  command: string | string[];
  timeout: number | null;
  shell: boolean;
  check: boolean;
  error_msg: string;
  env: Record<string, string> | null;
  cwd: string | null;
  merge_output_streams: boolean;
}

export function parseCommand(body: unknown): Command {
  const f = new FieldReader(body);
  const command = f.required('command', (n) => {
    const v = f.obj[n];
    if (typeof v === 'string') return v;
    if (Array.isArray(v)) return f.strList(n);
    f.issues.push({ type: 'string_type', loc: ['body', n], msg: 'Input should be a valid string or a list of strings', input: v });
    return undefined;
  });
  if (Array.isArray(command) && command.length === 0) {
    f.issues.push({ type: 'too_short', loc: ['body', 'command'], msg: 'List should have at least 1 item', input: command });
  }
  const env = f.strDict('env');
  for (const key of Object.keys(env ?? {})) {
    // A name with '=' cannot be represented in an environment block.
    if (key === '' || key.includes('=') || key.includes('\0')) {
      f.issues.push({ type: 'value_error', loc: ['body', 'env', key], msg: 'Value error, illegal environment variable name', input: key });
    }
  }
  return f.done({
    command,
    timeout: f.seconds('timeout', null),
    shell: f.bool('shell', false),
    check: f.bool('check', false),
    error_msg: f.str('error_msg', ''),
    env,
    cwd: f.nullableStr('cwd'),
    merge_output_streams: f.bool('merge_output_streams', false),
  });
}

export interface ReadFileRequest {
  path: string;
  encoding: string | null;
  errors: string | null;
}

export function parseReadFile(body: unknown): ReadFileRequest {
  const f = new FieldReader(body);
  return f.done({
    path: f.required('path', (n) => f.str(n)),
    encoding: f.nullableStr('encoding'),
    errors: f.nullableStr('errors'),
  });
}

export interface WriteFileRequest {
  content: string;
  path: string;
}

export function parseWriteFile(body: unknown): WriteFileRequest {
  const f = new FieldReader(body);
  return f.done({ content: f.required('content', (n) => f.str(n)), path: f.required('path', (n) => f.str(n)) });
}

export interface UploadForm {
  file: Buffer;
  target_path: string;
  unzip: boolean;
}

/** The multipart fields of /upload, already split by the multipart parser. */
export function parseUploadForm(fields: Map<string, { data: Buffer; filename?: string }>): UploadForm {
  const issues: ValidationIssue[] = [];
  const file = fields.get('file');
  const target = fields.get('target_path');
  const unzipRaw = fields.get('unzip')?.data.toString('utf8');
  if (!file) issues.push({ type: 'missing', loc: ['body', 'file'], msg: 'Field required', input: null });
  if (!target) issues.push({ type: 'missing', loc: ['body', 'target_path'], msg: 'Field required', input: null });
  const unzip = unzipRaw === undefined ? false : laxBool(unzipRaw);
  if (unzip === undefined) issues.push({ type: 'bool_parsing', loc: ['body', 'unzip'], msg: 'Input should be a valid boolean, unable to interpret input', input: unzipRaw });
  if (issues.length > 0) throw validationError(issues);
  return { file: file!.data, target_path: target!.data.toString('utf8'), unzip: unzip! };
}

// ------------------------------------------------------- management models

export interface CreateSandboxRequest {
  /** An image of the server's store (name, id or id prefix): the sandbox's root is that image. */
  image?: string;
  limits?: { memory?: number | string; pids?: number; cpu?: number };
  env?: Record<string, string>;
  network?: 'none' | 'host';
  hostname?: string;
}

/** Body of POST /sandboxes; every field optional, unknown ones refused (a typo would silently give defaults). */
export function parseCreateSandbox(body: unknown): CreateSandboxRequest {
  if (body === undefined) return {};
  const f = new FieldReader(body);
  const out: CreateSandboxRequest = {};
  for (const key of Object.keys(f.obj)) {
    if (!['image', 'limits', 'env', 'network', 'hostname'].includes(key)) {
      f.issues.push({ type: 'extra_forbidden', loc: ['body', key], msg: 'Extra inputs are not permitted', input: f.obj[key] });
    }
  }
  if (f.obj.limits !== undefined && f.obj.limits !== null) {
    const l = new FieldReader(f.obj.limits, ['body', 'limits']);
    const limits: NonNullable<CreateSandboxRequest['limits']> = {};
    const mem = l.obj.memory;
    if (mem !== undefined && mem !== null) {
      if (typeof mem === 'number' || typeof mem === 'string') limits.memory = mem;
      else l.issues.push({ type: 'string_type', loc: ['body', 'limits', 'memory'], msg: "Input should be bytes or a size like '512m'", input: mem });
    }
    if (l.obj.pids !== undefined && l.obj.pids !== null) limits.pids = l.int('pids', 0, 1);
    if (l.obj.cpu !== undefined && l.obj.cpu !== null) {
      const cpu = l.seconds('cpu', 0);
      if (cpu === 0) l.issues.push({ type: 'greater_than', loc: ['body', 'limits', 'cpu'], msg: 'Input should be greater than 0', input: l.obj.cpu });
      limits.cpu = cpu;
    }
    f.issues.push(...l.issues);
    out.limits = limits;
  }
  const env = f.strDict('env');
  if (env) out.env = env;
  if (f.obj.network !== undefined && f.obj.network !== null) out.network = f.literal<'none' | 'host'>('network', ['none', 'host'], 'none');
  const hostname = f.nullableStr('hostname');
  if (hostname !== null) out.hostname = hostname;
  const image = f.nullableStr('image');
  if (image !== null) out.image = image;
  return f.done(out);
}
