/**
 * run(): start a sandboxed command, feed it input, collect its output.
 * Result fields follow execa's naming.
 */
import type { Readable } from 'node:stream';
import type { RunOptions } from './options.js';
import { spawn, type SandboxProcess } from './process.js';

export interface RunResult<T extends string | Buffer = string> {
  stdout: T;
  stderr: T;
  exitCode: number | null;
  signal: NodeJS.Signals | null;
  timedOut: boolean;
  isCanceled: boolean;
  /** Output passed maxBuffer; the tree was killed and the output cut there. */
  isMaxBuffer: boolean;
  /** True when the command did not exit 0 by itself. */
  failed: boolean;
  durationMs: number;
}

export const DEFAULT_MAX_BUFFER = 100 * 1024 * 1024;

/** How long output may still arrive after the command itself has exited. */
const AFTER_EXIT_GRACE_MS = 50;

function collect(stream: Readable | null, max: number, onOverflow: () => void): Promise<Buffer> {
  if (!stream) return Promise.resolve(Buffer.alloc(0));
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    let size = 0;
    let over = false;
    stream.on('data', (c: Buffer) => {
      if (over) return;
      if (size + c.length > max) {
        chunks.push(c.subarray(0, max - size));
        size = max;
        over = true;
        onOverflow();
        return;
      }
      chunks.push(c);
      size += c.length;
    });
    stream.on('error', () => {});
    stream.on('close', () => resolve(Buffer.concat(chunks)));
  });
}

export interface CollectOptions {
  input?: string | Buffer;
  /** Leave stdin to the caller (it pipes something in). Default false. */
  keepStdin?: boolean;
  maxBuffer?: number;
  encoding?: 'utf8' | 'buffer';
  started: number;
}

/** Feeds input to a started process and gathers its result. */
export async function collectResult(proc: SandboxProcess, opts: CollectOptions): Promise<RunResult<string | Buffer>> {
  const { input, maxBuffer = DEFAULT_MAX_BUFFER, encoding = 'utf8' } = opts;
  let isMaxBuffer = false;
  const overflow = () => {
    isMaxBuffer = true;
    proc.killTree();
  };
  const [out, err] = [collect(proc.stdout, maxBuffer, overflow), collect(proc.stderr, maxBuffer, overflow)];
  if (proc.stdin && !opts.keepStdin) {
    if (input !== undefined) proc.stdin.end(input);
    else proc.stdin.end();
  }
  const exit = await proc.exited;
  // A background process the command left running (possible in a persistent
  // sandbox) may hold the pipes open forever: once the command has exited,
  // take what is buffered and stop waiting for EOF.
  const streams = Promise.all([out, err]);
  const settled = await Promise.race([streams.then(() => true), new Promise<false>((r) => setTimeout(r, AFTER_EXIT_GRACE_MS, false))]);
  if (!settled) {
    proc.stdout?.destroy();
    proc.stderr?.destroy();
  }
  const [stdout, stderr] = await streams;
  const decode = (b: Buffer) => (encoding === 'buffer' ? b : b.toString('utf8'));
  return {
    stdout: decode(stdout),
    stderr: decode(stderr),
    exitCode: exit.exitCode,
    signal: exit.signal,
    timedOut: proc.timedOut,
    isCanceled: proc.isCanceled,
    isMaxBuffer,
    failed: exit.exitCode !== 0,
    durationMs: performance.now() - opts.started,
  };
}

export async function run(opts: RunOptions & { encoding: 'buffer' }): Promise<RunResult<Buffer>>;
export async function run(opts: RunOptions): Promise<RunResult<string>>;
export async function run(opts: RunOptions): Promise<RunResult<string | Buffer>> {
  const { input, maxBuffer, encoding, ...spawnOpts } = opts;
  const started = performance.now();
  const proc = spawn({ ...spawnOpts, stdin: input !== undefined ? 'pipe' : (spawnOpts.stdin ?? 'ignore') });
  return collectResult(proc, { input, maxBuffer, encoding, started });
}
