// The default root's copy of the host's /etc: reused between sandboxes, and
// renewed as soon as the host changes a file it mirrors.
import { execFileSync, spawnSync } from 'node:child_process';
import { lstatSync, mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { HOST_ROOT_TTL_MS } from '../../lib/sandbox/policy.js';
import { isRoot, tempDir } from '../helpers.js';

const hasUnshare = spawnSync('unshare', ['--version']).status === 0;

describe('the host root', () => {
  // A change to the real /etc would reach every program on this machine: the
  // test changes a private copy of /etc, mounted over it in a mount
  // namespace of its own, which takes root (an unprivileged user's mount
  // namespace needs a user namespace, where this Node would run as a root
  // that is not the host's and take other paths).
  it.skipIf(!isRoot || !hasUnshare)('shows a change to a copied /etc file in the next sandbox, well within HOST_ROOT_TTL_MS', () => {
    const file = ['gai.conf', 'inputrc', 'shells', 'protocols'].find((f) => {
      try {
        return lstatSync(`/etc/${f}`).isFile();
      } catch {
        return false;
      }
    });
    if (!file) throw new Error('none of the copied /etc files the test expects is on this host');
    const dir = tempDir('msbx-hostroot-');
    try {
      const etc = join(dir.path, 'etc');
      mkdirSync(etc);
      const mark = `changed-${process.pid}-${Date.now()}`;
      const script = join(dir.path, 'change.mjs');
      const entry = new URL('../../dist/lib/index.js', import.meta.url).pathname;
      writeFileSync(
        script,
        `import { appendFileSync } from 'node:fs';
         const { Sandbox } = await import(${JSON.stringify(entry)});
         const read = async () => {
           const sb = await Sandbox.create({ stateDir: ${JSON.stringify(join(dir.path, 'state'))} });
           try { return (await sb.exec(['cat', '/etc/${file}'])).stdout; } finally { await sb.close(); }
         };
         const before = await read();
         const again = await read();
         const t0 = performance.now();
         appendFileSync('/etc/${file}', '# ${mark}\\n');
         // One turn of the event loop for the watch's event, far below the TTL.
         await new Promise((r) => setTimeout(r, 20));
         const after = await read();
         process.stdout.write(JSON.stringify({ before, again, after, ms: performance.now() - t0 }));`,
      );
      const out = execFileSync(
        'unshare',
        ['--mount', '--propagation', 'private', 'sh', '-c', 'set -e; mount -t tmpfs msbx-test-etc "$1"; cp -a /etc/. "$1"/; mount --bind "$1" /etc; exec "$2" "$3"', 'sh', etc, process.execPath, script],
        { encoding: 'utf8', timeout: 60_000 },
      );
      const r = JSON.parse(out) as { before: string; again: string; after: string; ms: number };
      expect(r.before).not.toContain(mark);
      expect(r.again).toBe(r.before);
      expect(r.after).toContain(mark);
      expect(r.after.startsWith(r.before)).toBe(true);
      expect(r.ms).toBeLessThan(HOST_ROOT_TTL_MS);
    } finally {
      dir.remove();
    }
  }, 90_000);
});
