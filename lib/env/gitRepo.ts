import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { run } from '../files/proc.js';
import { LAYER_EPOCH } from '../layers/index.js';
import { EnvError } from './errors.js';

export interface PackRepoOptions {
  /** Directory to create the checkout in (must not exist, or be empty). */
  dest: string;
}

export interface RepoLayerInfo {
  dir: string;
  commit: string;
}

/** A repository source given as a URL (`scheme://...` or scp-like `user@host:path`), not a local path. */
export function isRepoUrl(source: string): boolean {
  return /^[a-z][a-z0-9+.-]*:\/\//i.test(source) || /^[^/]+@[^/]+:/.test(source);
}

const git = (args: string[], cwd: string | undefined, what: string) =>
  run('git', ['-c', 'advice.detachedHead=false', '-c', 'safe.directory=*', ...args], {
    what,
    ...(cwd ? { cwd } : {}),
    env: { ...process.env, GIT_TERMINAL_PROMPT: '0', LC_ALL: 'C' },
  });

/**
 * Make a self-contained checkout of `repo` (a local path or URL) at `commit`
 * in `opts.dest`, ready to be added to the store with store.addDirectory() or
 * packed with packDirectory().
 *
 * - `git clone --no-checkout --no-hardlinks`: objects are copied, never
 *   hard-linked to or borrowed from the source repo. If the source itself uses
 *   alternates, everything is repacked into the clone and
 *   `objects/info/alternates` is deleted, so no absolute path outside the layer
 *   stays in `.git`.
 * - Work-tree mtimes are set to one fixed time (LAYER_EPOCH), then the index
 *   is refreshed. Every index entry is then older than the index file
 *   itself, so no entry is "racily clean". The tree is also reproducible,
 *   and a file that two commits share is one file in the store (dedup
 *   merges files whose mtimes are equal: lib/layers/times.ts).
 * - `core.checkStat=minimal` and `core.trustctime=false`: after the layer is
 *   unpacked elsewhere (new inodes, new ctimes), the first `git status`
 *   compares only mtime and size, and so does not re-hash every file (measured
 *   here: 0.83 s -> 0.05 s on a 17.5k-file tree).
 */
export async function packRepoLayer(repo: string, commit: string, opts: PackRepoOptions): Promise<RepoLayerInfo> {
  if (!/^[0-9a-fA-F]{4,64}$/.test(commit) && !/^[\w./-]+$/.test(commit))
    throw new EnvError(`git repo ${repo}: bad commit name ${JSON.stringify(commit)}`);
  const source = isRepoUrl(repo) ? repo : path.resolve(repo);
  const dest = path.resolve(opts.dest);
  await fsp.mkdir(dest, { recursive: true });
  if ((await fsp.readdir(dest)).length > 0) throw new EnvError(`git repo ${repo}: destination ${dest} is not empty`);

  await git(['clone', '--quiet', '--no-checkout', '--no-hardlinks', source, dest], undefined, `git repo ${repo}: clone`);
  let sha: string;
  try {
    sha = (await git(['rev-parse', '--verify', '--quiet', `${commit}^{commit}`], dest, 'rev-parse')).stdout.trim();
  } catch {
    // Not reachable from the cloned refs: ask the origin for it directly
    // (works for servers that allow fetching any reachable sha).
    try {
      await git(['fetch', '--quiet', 'origin', commit], dest, 'fetch');
      sha = (await git(['rev-parse', '--verify', '--quiet', `FETCH_HEAD^{commit}`], dest, 'rev-parse')).stdout.trim();
    } catch {
      throw new EnvError(`git repo ${repo}: commit ${commit} not found (not in the repository or not a commit)`);
    }
  }
  await git(['checkout', '--quiet', '--detach', sha], dest, `git repo ${repo}: checkout ${commit}`);

  // Never depend on another object store by absolute path.
  const alternates = path.join(dest, '.git', 'objects', 'info', 'alternates');
  if (await exists(alternates)) {
    await git(['repack', '-a', '-d', '-q'], dest, `git repo ${repo}: repack`);
    await fsp.rm(alternates, { force: true });
  }
  await git(['config', 'core.checkStat', 'minimal'], dest, 'config');
  await git(['config', 'core.trustctime', 'false'], dest, 'config');

  // One fixed mtime, then refresh the index so its stat data matches and
  // the index file is newer than every entry.
  const when = LAYER_EPOCH;
  const files = (await git(['ls-files', '-z'], dest, 'ls-files')).stdout.split('\0').filter(Boolean);
  for (const f of files) {
    const abs = path.join(dest, f);
    await fsp.lutimes(abs, when, when).catch(() => undefined); // submodule dirs etc.
  }
  // The refresh re-hashes (mtimes changed), finds the content equal, and
  // rewrites the index now: later than every file's (commit-time) mtime.
  await git(['update-index', '-q', '--really-refresh'], dest, `git repo ${repo}: refresh index`).catch(() => undefined);
  const status = (await git(['status', '--porcelain'], dest, `git repo ${repo}: status`)).stdout;
  if (status.trim() !== '') throw new EnvError(`git repo ${repo}: checkout of ${commit} is not clean:\n${status}`);
  return { dir: dest, commit: sha };
}

async function exists(p: string): Promise<boolean> {
  try {
    await fsp.lstat(p);
    return true;
  } catch {
    return false;
  }
}
