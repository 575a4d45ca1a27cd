/**
 * Whose ids an image's files get in the store, and how they get there.
 *
 *  - root: the image's own (`tar --same-owner`); a root caller's sandboxes
 *    idmap the layers, so image uid N shows as N inside.
 *  - an unprivileged caller with a subordinate id range: `tar` runs as root
 *    in an `ids: 'range'` sandbox (CAP_CHOWN, CAP_FOWNER, CAP_DAC_OVERRIDE
 *    kept) with the staging directory bound read-write, so image uid 0 is
 *    the caller and uid N is the range's N: exactly what that caller's
 *    `ids: 'range'` sandboxes show as N. Those files are the caller's
 *    subordinate ids' on the host, so the caller cannot always delete them
 *    (a 0700 directory of uid 100000): removal runs `rm -rf` in the same
 *    kind of sandbox (removeForeign).
 *  - no range: every file is the caller's ('squashed'); a sandbox of such an
 *    image runs as root inside whatever the image's USER says.
 */
import { EventEmitter } from 'node:events';
import type { ChildProcess } from 'node:child_process';
import path from 'node:path';
import type { TarSpawner } from '../files/extract.js';
import { idRangeSupport, spawn } from '../sandbox/index.js';
import { ImageError } from './errors.js';

export type Owners = 'kept' | 'range' | 'squashed';

export interface OwnersMode {
  owners: Owners;
  /** Why not 'kept' or 'range', for inspect and doctor. */
  reason?: string;
  spawnTar?: TarSpawner;
}

const RANGE_CAPS = ['CAP_CHOWN', 'CAP_FOWNER', 'CAP_DAC_OVERRIDE'];

/** What this caller can keep of an image's owners. */
export function ownersMode(): OwnersMode {
  if ((process.getuid?.() ?? 0) === 0) return { owners: 'kept' };
  const range = idRangeSupport();
  if (!range.ok) return { owners: 'squashed', reason: range.reason };
  return { owners: 'range', spawnTar: rangeTar };
}

/** A command run as root in an `ids: 'range'` sandbox with `dir` bound read-write at the same path, as a ChildProcess look-alike. */
function inRange(argv: string[], dir: string): ChildProcess {
  const child = new EventEmitter() as EventEmitter & { stdin: unknown; stdout: unknown; stderr: unknown; exitCode: number | null; kill: (s?: string) => boolean };
  const proc = spawn({
    root: 'host',
    ids: 'range',
    mounts: [{ type: 'bind', source: dir, target: dir }],
    argv,
    cwd: '/',
    capabilities: RANGE_CAPS,
    stdin: 'pipe',
    stdout: 'ignore',
    stderr: 'pipe',
  });
  child.stdin = proc.stdin;
  child.stdout = null;
  child.stderr = proc.stderr;
  child.exitCode = null;
  child.kill = () => {
    proc.killTree();
    return true;
  };
  proc.exited.then(
    (info) => {
      child.exitCode = info.exitCode ?? 128;
      // Let stderr drain before 'close', as a child process's would.
      setImmediate(() => child.emit('close', info.exitCode, info.signal));
    },
    (err: unknown) => {
      child.exitCode = 127;
      child.emit('error', err);
    },
  );
  return child as unknown as ChildProcess;
}

const rangeTar: TarSpawner = (args) => {
  const i = args.indexOf('-C');
  const dest = i >= 0 ? args[i + 1] : undefined;
  if (!dest) throw new ImageError('internal: tar in a sandbox needs -C DEST');
  return inRange(['tar', ...args], dest);
};

/** Deletes `dir` (a path under the store) from inside an `ids: 'range'` sandbox, where the range's files are root's. */
export async function removeInRange(dir: string): Promise<void> {
  const parent = path.dirname(dir);
  const child = inRange(['rm', '-rf', '--one-file-system', '--', dir], parent);
  let stderr = '';
  (child.stderr as NodeJS.ReadableStream | null)?.on('data', (b: Buffer) => (stderr += b.toString()));
  (child.stdin as NodeJS.WritableStream | null)?.end();
  await new Promise<void>((resolve, reject) => {
    child.on('error', reject);
    child.on('close', (code: number | null) => (code === 0 ? resolve() : reject(new ImageError(`remove ${dir} in an ids: 'range' sandbox: rm failed (exit ${code}): ${stderr.trim()}`))));
  });
}
