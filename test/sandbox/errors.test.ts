/** Every way of asking for a bad sandbox gets its own clear error. */
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ConfigError, ExecError, MountError, SetupError, run, spawn } from '../../lib/index.js';
import type { RunOptions } from '../../lib/index.js';
import { hostPidsMatching, mountinfo, tempDir } from '../helpers.js';

let dir: ReturnType<typeof tempDir>;
const mountsBefore = mountinfo();
beforeAll(() => {
  dir = tempDir('msbx-err-');
  writeFileSync(join(dir.path, 'file'), 'x');
  for (const d of ['lower', 'upper', 'work', 'work2']) mkdirSync(join(dir.path, d));
});
afterAll(() => {
  dir.remove();
  expect(mountinfo()).toBe(mountsBefore);
});

describe('options are validated before anything starts', () => {
  const cases: [string, Partial<RunOptions>, RegExp][] = [
    ['missing bind source', { mounts: [{ type: 'bind', source: '/nonexistent/x', target: '/x' }] }, /^mounts\[0\]\.source: bind source \/nonexistent\/x does not exist$/],
    ['relative target', { mounts: [{ type: 'tmpfs', target: 'tmp' }] }, /^mounts\[0\]\.target: 'tmp' must be an absolute path$/],
    ['dot-dot target', { mounts: [{ type: 'tmpfs', target: '/a/../b' }] }, /must not contain '\.\.'/],
    ['conflicting mounts', { mounts: [{ type: 'tmpfs', target: '/x' }, { type: 'tmpfs', target: '/x/' }] }, /^mounts\[1\]: conflicts with mounts\[0\]: both mount on \/x$/],
    ['unknown namespace', { namespaces: { time: true } as never }, /^namespaces\.time: unknown namespace 'time'/],
    ['unknown option', { tiemout: 5 } as never, /^tiemout: unknown option$/],
    ['unknown mount type', { mounts: [{ type: 'nfs', target: '/x' } as never] }, /unknown mount type 'nfs'/],
    ['bad tmpfs size', { mounts: [{ type: 'tmpfs', target: '/x', size: 'huge' }] }, /size 'huge' must be bytes/],
    ['overlay without lower', { mounts: [{ type: 'overlay', target: '/x', lower: [] }] }, /needs at least one lower directory/],
    ['overlay upper without work', { mounts: [{ type: 'overlay', target: '/x', lower: ['/usr'], upper: '/tmp' }] }, /upper and work must be given together/],
    // Unmapped both for a user (only itself is mapped) and for root (ids 0-65535).
    ['unmapped user', { user: { uid: 424242, gid: 424242 } }, /uid 424242\/gid 424242 is not mapped/],
    ['unknown capability', { capabilities: ['CAP_FLY'] }, /unknown capability 'CAP_FLY'/],
    ['unknown rlimit', { rlimits: { bogus: 1 } as never }, /^rlimits\.bogus: unknown resource/],
    ['bad env name', { env: { 'A=B': 'x' } }, /^env\.A=B: is not a valid variable name$/],
    ['relative cwd', { cwd: 'work' }, /^cwd: 'work' must be an absolute path$/],
    ['empty argv', { argv: [] }, /^argv: must be a non-empty array of strings$/],
    ['bad hostname', { hostname: 'no spaces allowed' }, /is not a valid host name/],
    ['bad network', { network: 'bridge' as never }, /^network: 'bridge' must be 'none' or 'host'$/],
  ];
  for (const [name, opts, message] of cases) {
    it(name, () => {
      let err: unknown;
      try {
        spawn({ argv: ['true'], ...opts } as RunOptions);
      } catch (e) {
        err = e;
      }
      expect(err).toBeInstanceOf(ConfigError);
      expect((err as Error).message).toMatch(message);
    });
  }
});

describe('setup failures name the step, the path and errno', () => {
  it('command not found', async () => {
    const err = await run({ argv: ['no-such-command-xyz'] }).catch((e) => e);
    expect(err).toBeInstanceOf(ExecError);
    expect(err.message).toMatch(/^exec no-such-command-xyz: ENOENT/);
    expect(err.code).toBe('ENOENT');
  });

  it('command not executable', async () => {
    const err = await run({ argv: ['/etc/passwd'] }).catch((e) => e);
    expect(err).toBeInstanceOf(ExecError);
    expect(err.message).toMatch(/^exec \/etc\/passwd: EACCES/);
  });

  it('cwd that does not exist', async () => {
    const err = await run({ argv: ['true'], cwd: '/nowhere' }).catch((e) => e);
    expect(err).toBeInstanceOf(SetupError);
    expect(err.message).toMatch(/^chdir \/nowhere: ENOENT/);
  });

  it('a directory bound onto a file', async () => {
    const err = await run({
      argv: ['true'],
      mounts: [
        { type: 'file', target: '/f', content: 'x' },
        { type: 'bind', source: dir.path, target: '/f' },
      ],
    }).catch((e) => e);
    expect(err).toBeInstanceOf(MountError);
    expect(err.message).toMatch(/^bind .* -> \/f: target: ENOTDIR/);
  });

  it('overlay the kernel refuses, with its own reason', async () => {
    const ok = await run({
      argv: ['true'],
      mounts: [{ type: 'overlay', target: '/o', lower: [join(dir.path, 'lower')], upper: join(dir.path, 'upper'), work: join(dir.path, 'work') }],
    });
    expect(ok.exitCode).toBe(0);
    // The upper layer also a lower one: the kernel refuses, and says why.
    const bad = await run({
      argv: ['true'],
      mounts: [{ type: 'overlay', target: '/o', lower: [join(dir.path, 'upper')], upper: join(dir.path, 'upper'), work: join(dir.path, 'work') }],
    }).catch((e) => e);
    expect(bad).toBeInstanceOf(MountError);
    expect(bad.message).toMatch(/^overlay \/o \(lower .*, upper .*\/upper, work .*\/work\): ELOOP .*kernel log/);
  });

  it('writing a file into a read-only bind', async () => {
    const err = await run({
      argv: ['true'],
      mounts: [
        { type: 'bind', source: dir.path, target: '/ro', readOnly: true },
        { type: 'file', target: '/ro/new', content: 'x' },
      ],
    }).catch((e) => e);
    expect(err).toBeInstanceOf(MountError);
    expect(err.message).toMatch(/^file \/ro\/new: EROFS/);
  });

  it('leaves nothing running after a failed setup', async () => {
    const mark = `nothing-left-${process.pid}`;
    await run({ argv: ['sh', '-c', `sleep 1 # ${mark}`], cwd: '/nowhere' }).catch(() => {});
    expect(hostPidsMatching(mark)).toEqual([]);
  });
});
