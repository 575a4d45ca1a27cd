/** walkTree: a directory this user may not list is skipped and reported when asked, an error otherwise. */
import { chmodSync, mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { walkTree } from '../../lib/files/fsTree.js';
import { tempDir } from '../helpers.js';

const isRoot = process.getuid?.() === 0;

describe('walkTree', () => {
  const tmp = tempDir('msbx-walk-');
  afterAll(() => {
    if (!isRoot) chmodSync(path.join(tmp.path, 'a', 'closed'), 0o755);
    tmp.remove();
  });

  it.skipIf(isRoot)('skips a directory it cannot list only when onUnreadable is given, and names it (as an unprivileged user: root lists everything)', async () => {
    mkdirSync(path.join(tmp.path, 'a', 'closed'), { recursive: true });
    writeFileSync(path.join(tmp.path, 'a', 'closed', 'secret'), 'x');
    writeFileSync(path.join(tmp.path, 'a', 'open'), 'y');
    chmodSync(path.join(tmp.path, 'a', 'closed'), 0o000);
    const seen: string[] = [];
    const unreadable: string[] = [];
    for await (const e of walkTree(tmp.path, '', { onUnreadable: (rel) => unreadable.push(rel) })) seen.push(e.rel);
    expect(seen).toEqual(['a', 'a/closed', 'a/open']);
    expect(unreadable).toEqual(['a/closed']);
    await expect((async () => { for await (const _ of walkTree(tmp.path)); })()).rejects.toMatchObject({ code: 'EACCES' });
  });
});
