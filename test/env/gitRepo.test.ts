import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { EnvError, packRepoLayer } from '../../lib/env/index.js';
import { packDirectory } from '../../lib/files/index.js';
import { openStore } from '../../lib/layers/index.js';
import { tmpDir } from '../layers/helpers.js';

const t = tmpDir('git');
const repo = path.join(t.dir, 'origin');
const gitEnv = {
  ...process.env,
  GIT_AUTHOR_NAME: 't',
  GIT_AUTHOR_EMAIL: 't@e',
  GIT_COMMITTER_NAME: 't',
  GIT_COMMITTER_EMAIL: 't@e',
  GIT_CONFIG_GLOBAL: '/dev/null',
  GIT_CONFIG_NOSYSTEM: '1',
};
const git = (cwd: string, ...args: string[]) => execFileSync('git', ['-c', 'safe.directory=*', ...args], { cwd, env: gitEnv, encoding: 'utf8' }).trim();
let first = '';

beforeAll(() => {
  mkdirSync(repo);
  git(repo, 'init', '-q', '-b', 'main');
  for (let i = 0; i < 200; i++) {
    mkdirSync(path.join(repo, `pkg${i % 8}`), { recursive: true });
    writeFileSync(path.join(repo, `pkg${i % 8}`, `m${i}.py`), `value = ${i}\n`);
  }
  git(repo, 'add', '-A');
  git(repo, 'commit', '-q', '-m', 'first');
  first = git(repo, 'rev-parse', 'HEAD');
  writeFileSync(path.join(repo, 'pkg0', 'm0.py'), 'value = "changed"\n');
  writeFileSync(path.join(repo, 'later.txt'), 'later\n');
  git(repo, 'add', '-A');
  git(repo, 'commit', '-q', '-m', 'second');
});
afterAll(() => t.cleanup());

describe('packRepoLayer', () => {
  it('checks out the commit; after pack, store and unpack elsewhere the first git status is clean', async () => {
    const dest = path.join(t.dir, 'checkout');
    const info = await packRepoLayer(repo, first.slice(0, 10), { dest });
    expect(info.commit).toBe(first);
    expect(readFileSync(path.join(dest, 'pkg0', 'm0.py'), 'utf8')).toBe('value = 0\n');
    expect(existsSync(path.join(dest, 'later.txt'))).toBe(false);
    expect(git(dest, 'config', 'core.checkStat')).toBe('minimal');
    expect(git(dest, 'config', 'core.trustctime')).toBe('false');
    expect(existsSync(path.join(dest, '.git', 'objects', 'info', 'alternates'))).toBe(false);

    const archive = path.join(t.dir, 'repo.tar.zst');
    await packDirectory(dest, archive);
    const store = await openStore({ root: path.join(t.dir, 'store') });
    const layer = await store.addArchive(archive);
    // The read-only layer tree is a different place with new inodes and ctimes.
    const t0 = performance.now();
    const status = git(layer.path, 'status', '--porcelain');
    const ms = performance.now() - t0;
    console.log(`[git] first git status in the unpacked layer: ${ms.toFixed(0)} ms, output ${JSON.stringify(status)}`);
    expect(status).toBe('');
    expect(git(layer.path, 'rev-parse', 'HEAD')).toBe(first);
    // git status did not need to rewrite the index (it could not: read-only).
    expect(git(layer.path, 'diff', '--stat')).toBe('');
  });

  it('an unknown commit gives an error naming repo and commit', async () => {
    const bad = 'deadbeef'.repeat(5);
    const err = await packRepoLayer(repo, bad, { dest: path.join(t.dir, 'bad') }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(EnvError);
    expect((err as Error).message).toBe(`git repo ${repo}: commit ${bad} not found (not in the repository or not a commit)`);
  });

  it('a source repo using alternates yields a self-contained clone', async () => {
    const shared = path.join(t.dir, 'shared-clone');
    git(t.dir, 'clone', '-q', '--shared', repo, shared);
    expect(existsSync(path.join(shared, '.git', 'objects', 'info', 'alternates'))).toBe(true);
    const dest = path.join(t.dir, 'from-shared');
    await packRepoLayer(shared, first, { dest });
    expect(existsSync(path.join(dest, '.git', 'objects', 'info', 'alternates'))).toBe(false);
    execFileSync('mv', [repo, `${repo}.gone`]); // the alternate target disappears
    try {
      git(dest, 'fsck', '--no-progress', '--connectivity-only');
      expect(git(dest, 'status', '--porcelain')).toBe('');
    } finally {
      execFileSync('mv', [`${repo}.gone`, repo]);
    }
  });
});
