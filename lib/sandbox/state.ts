/**
 * Private directories of persistent sandboxes, their ownership records, and
 * garbage collection of those left behind by a process that died.
 *
 * Removal (lib/files removeTree) never follows a symlink and never
 * crosses into another filesystem: whatever a sandbox planted in its
 * directory, only that directory is deleted.
 */
import { randomUUID } from 'node:crypto';
import { chmodSync, lstatSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { homedir, tmpdir } from 'node:os';
import { join } from 'node:path';
import { codeOf } from '../errors.js';
import { removeTree } from '../files/fsTree.js';
import { processIsAlive, selfStartTime } from '../files/proc.js';
import { ConfigError } from './errors.js';
import { removeSandboxCgroups } from './limits.js';

const OWNER_FILE = 'owner.json';

export interface OwnerRecord {
  id: string;
  pid: number;
  /** The owner's start time in clock ticks (/proc/<pid>/stat field 22): a reused pid differs. */
  startTime: string;
  created: string;
}

/** A path we may use as our own directory: missing, or a directory of ours. */
function ours(path: string): boolean {
  try {
    const st = lstatSync(path);
    return st.isDirectory() && st.uid === (process.getuid?.() ?? 0);
  } catch (e) {
    return codeOf(e) === 'ENOENT';
  }
}

/**
 * Where private directories live: $MINISANDBOX_STATE_DIR; else the user's
 * runtime directory ($XDG_RUNTIME_DIR/minisandbox); else a per-user
 * directory in tmpdir(). A shared TMPDIR lets anyone take that name first
 * (a file, a link, their own directory): then a directory under the home,
 * which nobody else can create, is used instead.
 */
export function defaultStateDir(): string {
  const explicit = process.env.MINISANDBOX_STATE_DIR;
  if (explicit) return explicit;
  const runtime = process.env.XDG_RUNTIME_DIR;
  if (runtime && ours(runtime)) return join(runtime, 'minisandbox');
  const shared = join(tmpdir(), `minisandbox-${process.getuid?.() ?? 0}`);
  if (ours(shared)) return shared;
  return join(homedir(), '.cache', 'minisandbox', 'state');
}

/**
 * Creates the state dir (mode 0700) or checks an existing one: it must be a
 * real directory owned by us, or another user could have planted it in a
 * shared /tmp to read or redirect our sandboxes' files.
 */
export function ensureStateDir(dir: string): void {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const st = lstatSync(dir);
  const uid = process.getuid?.() ?? 0;
  if (!st.isDirectory()) throw new ConfigError(`stateDir ${dir} is not a directory`, 'stateDir');
  if (st.uid !== uid) throw new ConfigError(`stateDir ${dir} belongs to uid ${st.uid}, not to us (uid ${uid})`, 'stateDir');
  if ((st.mode & 0o077) !== 0) chmodSync(dir, 0o700);
}

export function newSandboxId(): string {
  return `sbx-${randomHex12()}`;
}

/**
 * 48 random bits as 12 hex digits, for names of private directories. From
 * randomUUID(), which draws on a cached pool: randomBytes(6) asked the
 * system's generator each time (~50 us, a measurable part of a start).
 */
export function randomHex12(): string {
  const u = randomUUID(); // xxxxxxxx-xxxx-4xxx-...: the first 12 hex digits are all random
  return u.slice(0, 8) + u.slice(9, 13);
}

/** Makes <stateDir>/<id> (0700) with our ownership record in it. */
export function createPrivateDir(stateDir: string, id: string): string {
  const dir = join(stateDir, id);
  mkdirSync(dir, { mode: 0o700 });
  const rec: OwnerRecord = { id, pid: process.pid, startTime: selfStartTime(), created: new Date().toISOString() };
  writeFileSync(join(dir, OWNER_FILE), JSON.stringify(rec) + '\n', { mode: 0o600 });
  return dir;
}

function readOwner(dir: string): OwnerRecord | null {
  try {
    return JSON.parse(readFileSync(join(dir, OWNER_FILE), 'utf8')) as OwnerRecord;
  } catch {
    return null;
  }
}

export interface GcResult {
  removed: string[];
  /** Directories of live owners, left alone. */
  kept: string[];
  /** Directories that could not be removed, with the reason. */
  failed: { dir: string; reason: string }[];
}

/**
 * Removes the private directories whose owner is gone, with the cgroups of
 * their sandboxes. Directories without a readable record are left alone
 * unless they are older than `minAgeMs` (a minute by default: a sandbox
 * being created writes its record right after mkdir).
 */
export async function collectGarbage(stateDir: string, opts: { minAgeMs?: number } = {}): Promise<GcResult> {
  const minAgeMs = opts.minAgeMs ?? 60_000;
  const result: GcResult = { removed: [], kept: [], failed: [] };
  let entries: string[];
  try {
    entries = readdirSync(stateDir);
  } catch {
    return result;
  }
  for (const name of entries) {
    if (!name.startsWith('sbx-')) continue;
    const dir = join(stateDir, name);
    try {
      const rec = readOwner(dir);
      if (rec ? processIsAlive(rec.pid, rec.startTime) : Date.now() - lstatSync(dir).mtimeMs < minAgeMs) {
        result.kept.push(dir);
        continue;
      }
      await removeTree(dir);
      result.removed.push(dir);
      // Its processes died with their owner: its cgroups are empty.
      for (const failure of removeSandboxCgroups(name)) result.failed.push(failure);
    } catch (e) {
      // Gone meanwhile (its owner closed it, or another gc got there first).
      if (codeOf(e) === 'ENOENT') continue;
      result.failed.push({ dir, reason: (e as Error).message });
    }
  }
  return result;
}
