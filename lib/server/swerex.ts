/**
 * The SWE-ReX runtime endpoints on one sandbox, with the behaviour of
 * SWE-ReX's own `LocalRuntime` (runtime/local.py, v1.4): same fields, same
 * defaults, same exception classes. Handlers take validated models and
 * return the response object; errors are thrown (SwerexError subclasses
 * become HTTP 511 in server.ts).
 */
import { constants as osConstants } from 'node:os';
import { posix } from 'node:path';
import { ConfigError, ExecError, SandboxError, SetupError } from '../sandbox/errors.js';
import { FILE_CAPABILITIES } from '../sandbox/policy.js';
import { CommandTimeoutError, NonZeroExitCodeError, type BashObservation } from '../shell/index.js';
import type {
  Action,
  CloseBashSessionRequest,
  Command,
  CreateBashSessionRequest,
  ReadFileRequest,
  UploadForm,
  WriteFileRequest,
} from './models.js';
import { PythonError, osErrorFrom, pyDecode, pyFloat, pyRepr } from './python.js';
import { decodeKept, execBounded } from './output.js';
import type { ManagedSandbox } from './registry.js';
import { BadZipError, ZipRefusedError, checkZipIsSafe, type ZipLimits } from './zip.js';

/**
 * SWE-ReX's prompt. Its server reports the pattern that ended the wait as
 * `expect_string`, so a plain command's observation carries this string;
 * clients that compare against it keep working.
 */
const SWEREX_PS1 = 'SHELLPS1PREFIX';

/** Printed by the exec wrapper when the program does not exist (Python: FileNotFoundError). */
const NOT_FOUND_MARKER = '__msbx_exec_not_found__';

const seconds = (s: number | null): number | undefined => (s === null ? undefined : Math.round(s * 1000));

function observation(o: BashObservation): Record<string, unknown> {
  return {
    output: o.output,
    exit_code: o.exitCode,
    failure_reason: o.failureReason,
    expect_string: o.expectString === '' ? SWEREX_PS1 : o.expectString,
    session_type: 'bash',
  };
}

/** Per request, per stream: the server's cap (ServerOptions.maxOutputBytes). */
export interface OutputLimit {
  maxOutputBytes: number;
}

export async function createSession(m: ManagedSandbox, req: CreateBashSessionRequest, limit: OutputLimit): Promise<Record<string, unknown>> {
  const session = await m.sandbox.shell({
    name: req.session,
    startupSource: req.startup_source,
    startupTimeoutMs: Math.round(req.startup_timeout * 1000),
    maxOutputBytes: limit.maxOutputBytes,
  });
  return { output: session.startupOutput, session_type: 'bash' };
}

export async function runInSession(m: ManagedSandbox, action: Action): Promise<Record<string, unknown>> {
  const session = m.session(action.session);
  if (action.action_type === 'bash_interrupt') {
    return observation(await session.interrupt({ timeoutMs: seconds(action.timeout), retries: action.n_retry, expect: action.expect }));
  }
  const timeoutMs = seconds(action.timeout);
  if (action.is_interactive_command) {
    return observation(await session.runInteractive(action.command, { expect: action.expect, timeoutMs }));
  }
  if (action.is_interactive_quit) {
    return observation(await session.quitInteractive(action.command, { timeoutMs }));
  }
  try {
    return observation(await session.run(action.command, { timeoutMs, check: action.check, expect: action.expect, errorMsg: action.error_msg }));
  } catch (e) {
    // SWE-ReX's wording, which agents' logs and prompts are used to.
    if (e instanceof CommandTimeoutError && !e.interrupted && action.timeout !== null && e.message.startsWith('timeout after')) {
      throw new CommandTimeoutError(
        `timeout after ${pyFloat(action.timeout)} seconds while running command ${pyRepr(action.command)}`,
        e.output,
      );
    }
    if (e instanceof NonZeroExitCodeError) {
      let msg = `Command ${pyRepr(action.command)} failed with exit code ${e.exitCode}. Here is the output:\n${pyRepr(e.output)}`;
      if (action.error_msg) msg = `${action.error_msg}: ${msg}`;
      throw new NonZeroExitCodeError(msg, e.output, e.exitCode);
    }
    throw e;
  }
}

export async function closeSession(m: ManagedSandbox, req: CloseBashSessionRequest): Promise<Record<string, unknown>> {
  await m.closeSession(req.session);
  return { session_type: 'bash' };
}

/** subprocess.run's argv: a string is one program name unless shell=True. */
function commandArgv(cmd: Command): string[] {
  if (cmd.shell) return ['/bin/sh', '-c', ...(typeof cmd.command === 'string' ? [cmd.command] : cmd.command)];
  return typeof cmd.command === 'string' ? [cmd.command] : cmd.command;
}

/**
 * The argv actually started. `env` replaces the whole environment (as
 * subprocess.run(env=...)) through `env -i`; merged streams need a shell
 * to redirect. Both go through a tiny sh wrapper that reports a missing
 * program with a marker, so it still becomes FileNotFoundError.
 */
function wrappedArgv(cmd: Command): { argv: string[]; wrapped: boolean } {
  const argv = commandArgv(cmd);
  if (cmd.env === null && !cmd.merge_output_streams) return { argv, wrapped: false };
  const script =
    `command -v -- "$1" >/dev/null 2>&1 || { echo ${NOT_FOUND_MARKER} >&2; exit 127; }; ` +
    (cmd.merge_output_streams ? 'exec "$@" 2>&1' : 'exec "$@"');
  const shell = ['/bin/sh', '-c', script, 'sh', ...argv];
  if (cmd.env === null) return { argv: shell, wrapped: true };
  const assignments = Object.entries(cmd.env).map(([k, v]) => `${k}=${v}`);
  return { argv: ['env', '-i', '--', ...assignments, ...shell], wrapped: true };
}

function returnCode(exitCode: number | null, signal: NodeJS.Signals | null): number | null {
  if (exitCode !== null) return exitCode;
  // Python reports death by signal N as returncode -N.
  const n = signal ? osConstants.signals[signal] : undefined;
  return n !== undefined ? -n : null;
}

export async function execute(m: ManagedSandbox, cmd: Command, limit: OutputLimit): Promise<Record<string, unknown>> {
  const { argv, wrapped } = wrappedArgv(cmd);
  const cwd = cmd.cwd === null ? undefined : posix.resolve(m.sandbox.cwd, cmd.cwd);
  let result;
  try {
    result = await execBounded(m.sandbox, argv, { cwd, timeout: seconds(cmd.timeout), maxOutputBytes: limit.maxOutputBytes });
  } catch (e) {
    if (e instanceof ExecError || (e instanceof SetupError && e.step === 'chdir')) {
      const what = e instanceof ExecError ? argv[0]! : cwd!;
      throw osErrorFrom(e.code === 'ENOENT' ? 'No such file or directory' : e.code === 'EACCES' ? 'Permission denied' : e.message, what);
    }
    throw e;
  }
  if (result.timedOut) throw new CommandTimeoutError(`Timeout (${pyFloat(cmd.timeout)}s) exceeded while running command`, '');
  if (wrapped && result.exitCode === 127 && result.stderr.kept().head.toString('latin1').trim() === NOT_FOUND_MARKER) {
    throw osErrorFrom('No such file or directory', commandArgv(cmd)[0]!);
  }
  const stdout = decodeKept(result.stdout);
  const stderr = cmd.merge_output_streams ? '' : decodeKept(result.stderr);
  const exitCode = returnCode(result.exitCode, result.signal);
  if (cmd.check && exitCode !== 0) {
    let msg = `Command ${pyRepr(cmd.command)} failed with exit code ${exitCode}. Stdout:\n${pyRepr(stdout)}\nStderr:\n${pyRepr(stderr)}`;
    if (cmd.error_msg) msg = `${cmd.error_msg}: ${msg}`;
    throw new NonZeroExitCodeError(msg, stdout, exitCode ?? -1);
  }
  return { stdout, stderr, exit_code: exitCode };
}

/** A sandbox file-operation failure as the OSError Python's pathlib would raise. */
function fileError(e: unknown, path: string): unknown {
  if (e instanceof ConfigError) return new PythonError('builtins.ValueError', e.message);
  if (e instanceof SandboxError && !(e instanceof SetupError)) return osErrorFrom(e.message, path);
  return e;
}

export async function readFile(m: ManagedSandbox, req: ReadFileRequest): Promise<Record<string, unknown>> {
  let data: Buffer;
  try {
    data = await m.sandbox.readFile(req.path);
  } catch (e) {
    throw fileError(e, req.path);
  }
  return { content: pyDecode(data, req.encoding, req.errors) };
}

export async function writeFile(m: ManagedSandbox, req: WriteFileRequest): Promise<Record<string, unknown>> {
  try {
    await m.sandbox.writeFile(req.path, req.content);
  } catch (e) {
    throw fileError(e, req.path);
  }
  return {};
}

/**
 * A single file is written at target_path; a zip (unzip=true) is checked
 * (every entry inside target_path, no links, bounded size) and unpacked by
 * `unzip` running inside the sandbox, from a temporary copy in its /tmp.
 */
export async function upload(m: ManagedSandbox, form: UploadForm, zipLimits: ZipLimits): Promise<Record<string, unknown>> {
  if (!form.unzip) {
    try {
      await m.sandbox.writeFile(form.target_path, form.file);
    } catch (e) {
      throw fileError(e, form.target_path);
    }
    return {};
  }
  try {
    checkZipIsSafe(form.file, zipLimits);
  } catch (e) {
    if (e instanceof BadZipError) throw new PythonError('zipfile.BadZipFile', e.message);
    if (e instanceof ZipRefusedError) throw new PythonError('builtins.ValueError', e.message);
    throw e;
  }
  const target = posix.resolve(m.sandbox.cwd, form.target_path);
  const script =
    't=$(mktemp /tmp/.msbx-upload-XXXXXX) || exit 120; trap \'rm -f "$t"\' EXIT; ' +
    'cat > "$t" && mkdir -p -- "$1" && unzip -qq -o "$t" -d "$1"';
  const r = await m.sandbox.exec(['/bin/sh', '-c', script, 'sh', target], { input: form.file, capabilities: FILE_CAPABILITIES });
  // unzip: 1 is "completed with warnings".
  if (r.exitCode === 0 || r.exitCode === 1) return {};
  if (r.exitCode === 127) throw new PythonError('builtins.RuntimeError', 'unzip is not installed in the sandbox: cannot unpack the upload');
  if (/no such file|is a directory|not a directory|permission denied|read-only/i.test(r.stderr) && r.exitCode !== 9) {
    throw osErrorFrom(r.stderr, form.target_path);
  }
  throw new PythonError('zipfile.BadZipFile', `unzip failed (exit ${r.exitCode}): ${r.stderr.trim()}`);
}

export function isAlive(m: ManagedSandbox | null): Record<string, unknown> {
  if (m && m.sandbox.closed) return { is_alive: false, message: `sandbox ${m.id} has exited` };
  return { is_alive: true, message: '' };
}

export async function close(m: ManagedSandbox | null): Promise<Record<string, unknown>> {
  await m?.closeAllSessions();
  return {};
}
