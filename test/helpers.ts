import { chmodSync, lstatSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { native } from '../lib/native/index.js';

export const isRoot = process.getuid?.() === 0;

/** Host pids whose command line contains `needle` (any user's processes). */
export function hostPidsMatching(needle: string): number[] {
  const pids: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const cmd = readFileSync(`/proc/${entry}/cmdline`, 'utf8').replace(/\0/g, ' ');
      if (cmd.includes(needle)) pids.push(Number(entry));
    } catch {
      // the process exited while we looked
    }
  }
  return pids.filter((p) => p !== process.pid);
}

/**
 * The sandboxes this process started that are still alive: their PID 1s
 * (`msbx-init`, children of this process's spawner, or of Node itself on the
 * in-process path). Other test files' sandboxes, running at the same time in
 * other workers, are not counted.
 */
export function ownSandboxInits(): number[] {
  const parents = [process.pid, native.spawnerInfo().pid];
  return hostPidsMatching('msbx-init').filter((pid) => {
    try {
      return parents.includes(parentPid(pid));
    } catch {
      return false; // gone meanwhile
    }
  });
}

/** Whether `pid` runs: a zombie is dead, only its parent's wait is missing. */
export function isRunning(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2)[0] !== 'Z';
  } catch {
    return false;
  }
}

/** The parent pid of `pid` (from /proc/<pid>/stat); throws if it is gone. */
export function parentPid(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  return Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
}

/** A unique `sleep` duration that marks processes of one test in /proc. */
export function uniqueSleep(): string {
  return `1000.${process.pid}${Math.floor(Math.random() * 1e6)}`;
}

export async function waitFor(cond: () => boolean, ms = 3000): Promise<boolean> {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (cond()) return true;
    await new Promise((r) => setTimeout(r, 20));
  }
  return cond();
}

/** Overlay leaves its work/work dir with mode 000; make a tree removable. */
function makeRemovable(path: string): void {
  const st = lstatSync(path);
  if (!st.isDirectory()) return;
  chmodSync(path, 0o700);
  for (const e of readdirSync(path)) makeRemovable(join(path, e));
}

export function tempDir(prefix = 'msbx-test-'): { path: string; remove(): void } {
  const path = mkdtempSync(join(tmpdir(), prefix));
  return {
    path,
    remove: () => {
      makeRemovable(path);
      rmSync(path, { recursive: true, force: true });
    },
  };
}

export function mountinfo(): string {
  return readFileSync('/proc/self/mountinfo', 'utf8');
}
