/**
 * run(): start a sandboxed command, feed it input, collect its output.
 * Result fields follow execa's naming.
 */
import type { Readable } from 'node:stream';
import type { RunOptions } from './options.js';
import { spawn } from './process.js';

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

export async function run(opts: RunOptions & { encoding: 'buffer' }): Promise<RunResult<Buffer>>;
export async function run(opts: RunOptions): Promise<RunResult<string>>;
export async function run(opts: RunOptions): Promise<RunResult<string | Buffer>> {
  const { input, maxBuffer = DEFAULT_MAX_BUFFER, encoding = 'utf8', ...spawnOpts } = opts;
  const started = performance.now();
  const proc = spawn({ ...spawnOpts, stdin: input !== undefined ? 'pipe' : (spawnOpts.stdin ?? 'ignore') });
  let isMaxBuffer = false;
  const overflow = () => {
    isMaxBuffer = true;
    proc.killTree();
  };
  const [out, err] = [collect(proc.stdout, maxBuffer, overflow), collect(proc.stderr, maxBuffer, overflow)];
  if (proc.stdin) {
    if (input !== undefined) proc.stdin.end(input);
    else proc.stdin.end();
  }
  const exit = await proc.exited;
  const [stdout, stderr] = await Promise.all([out, err]);
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
    durationMs: performance.now() - started,
  };
}
