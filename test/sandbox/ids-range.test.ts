/**
 * `ids: 'range'`: ids 0-65535 inside, as in a container. For a root caller
 * that is its remapped range, always; for another caller, its own ids are 0
 * and 1-65535 are its /etc/subuid and /etc/subgid range, written by the
 * setuid newuidmap/newgidmap. Run as root and as msbx-ci (100000:65536).
 */
import { statSync, writeFileSync } from 'node:fs';
import { userInfo } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { ConfigError, Sandbox, idRangeSupport, run } from '../../lib/sandbox/index.js';
import { MAP_HELPER_DIRS, SUBID_FILES, rootIdRange, subidEntry } from '../../lib/sandbox/policy.js';
import { isRoot, tempDir } from '../helpers.js';

const support = idRangeSupport();
const me = isRoot ? undefined : userInfo().username;
/** The host uid/gid of id N > 0 inside an `ids: 'range'` sandbox. */
function hostIdOf(n: number, kind: 'uid' | 'gid'): number {
  if (!support.ok) throw new Error('no range');
  // Root's range starts at inside 0; a user's subordinate range at inside 1.
  return support.caller === 'root' ? support[kind].start + n : support[kind].start + n - 1;
}
const noRange = support.ok ? undefined : `this user has no id range: ${support.reason}`;

describe("ids: 'range'", () => {
  it.skipIf(!!noRange)(`maps 0-65535: root inside, chown to 1000 works and lands on the ${isRoot ? "root range's" : 'subordinate'} id 1000 on the host`, async () => {
    await using sb = await Sandbox.create({ ids: 'range', capabilities: ['CAP_CHOWN'] });
    const r = await sb.exec('id -u; id -g; touch /tmp/f /work/f && chown 1000:1000 /tmp/f /work/f && stat -c %u:%g /tmp/f /work/f');
    expect(r.stderr).toBe('');
    expect(r.stdout).toBe('0\n0\n1000:1000\n1000:1000\n');
    const st = statSync(join(sb.privateDir, 'work', 'f'));
    expect({ uid: st.uid, gid: st.gid }).toEqual({ uid: hostIdOf(1000, 'uid'), gid: hostIdOf(1000, 'gid') });
    if (isRoot) {
      // Nothing changes for root: the range it always has.
      const range = rootIdRange();
      expect(sb.isolation.uidMap).toBe(`0 ${range.uid} ${range.count}`);
      expect(st.uid).toBe(range.uid + 1000);
    } else {
      const sub = subidEntry(SUBID_FILES.uid, [me!])!;
      expect(sb.isolation.uidMap).toBe(`0 ${process.getuid!()} 1\n1 ${sub.start} 65535`);
      expect(sb.isolation.gidMap).toBe(`0 ${process.getgid!()} 1\n1 ${subidEntry(SUBID_FILES.gid, [me!])!.start} 65535`);
      expect(st.uid).toBe(sub.start + 999);
    }
    expect(sb.isolation.hostRootInside).toBe(false);
  });

  it.skipIf(!!noRange)('a process can run as uid 1000 (user option), in run() and through enter', async () => {
    const r = await run({ argv: ['sh', '-c', 'id -u; id -g; id -G'], ids: 'range', user: { uid: 1000, gid: 1000 } });
    expect(r.stdout).toBe('1000\n1000\n1000\n');
    await using sb = await Sandbox.create({ ids: 'range' });
    const e = await sb.exec('id -u; touch /tmp/mine; stat -c %u /tmp/mine; touch /work/x 2>/dev/null || echo denied', { user: { uid: 1000, gid: 1000 } });
    // /work belongs to root inside: uid 1000 holds no capability to write there.
    expect(e.stdout).toBe('1000\n1000\ndenied\n');
  });

  it.skipIf(!!noRange)('ids past 65535 are unmapped: chown refuses them, and so does the user option', async () => {
    const r = await run({ argv: ['sh', '-c', 'touch /tmp/f; chown 70000 /tmp/f; echo rc=$?'], ids: 'range', capabilities: ['CAP_CHOWN'] });
    expect(r.stdout).toBe('rc=1\n');
    expect(r.stderr).toMatch(/invalid argument/i);
    await expect(run({ argv: ['true'], ids: 'range', user: { uid: 70000, gid: 0 } })).rejects.toThrow(/user: uid 70000\/gid 0 is not mapped .*0-65535/);
  });

  it('rejects an unknown value, and mapUser: self for a user', async () => {
    await expect(run({ argv: ['true'], ids: 'many' as never })).rejects.toThrow(ConfigError);
    await expect(run({ argv: ['true'], ids: 'many' as never })).rejects.toThrow("ids: 'many' must be 'single' or 'range'");
    if (!isRoot && !noRange) await expect(run({ argv: ['true'], ids: 'range', mapUser: 'self' })).rejects.toThrow(/mapUser: 'self' cannot go with ids: 'range'/);
  });

  it("'single' (the default) maps only the caller, as before", async () => {
    const r = await run({ argv: ['cat', '/proc/self/uid_map'] });
    const lines = r.stdout.trim().split('\n');
    expect(lines).toHaveLength(1);
    expect(lines[0]!.trim().split(/\s+/)).toEqual(['0', String(isRoot ? rootIdRange().uid : process.getuid!()), isRoot ? String(rootIdRange().count) : '1']);
  });
});

describe("ids: 'range' without a subordinate range", () => {
  const saved = { ...SUBID_FILES };
  const savedDirs = [...MAP_HELPER_DIRS];
  afterEach(() => {
    Object.assign(SUBID_FILES, saved);
    MAP_HELPER_DIRS.splice(0, MAP_HELPER_DIRS.length, ...savedDirs);
  });

  function emptySubidFiles(content: string): { remove(): void } {
    const dir = tempDir('msbx-subid-');
    writeFileSync(join(dir.path, 'subuid'), content);
    writeFileSync(join(dir.path, 'subgid'), content);
    SUBID_FILES.uid = join(dir.path, 'subuid');
    SUBID_FILES.gid = join(dir.path, 'subgid');
    return dir;
  }

  it.skipIf(isRoot)('as a user: no entry is a ConfigError naming the file and the user', async () => {
    const dir = emptySubidFiles('someoneelse:100000:65536\n');
    try {
      const s = idRangeSupport();
      expect(s.ok).toBe(false);
      const err = await run({ argv: ['true'], ids: 'range' }).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(ConfigError);
      expect((err as ConfigError).option).toBe('ids');
      expect((err as Error).message).toBe(
        `ids: 'range' needs a ${SUBID_FILES.uid} and a ${SUBID_FILES.gid} entry for ${me} (e.g. '${me}:100000:65536', as \`usermod --add-subuids 100000-165535 --add-subgids 100000-165535 ${me}\` writes)`,
      );
      // The uid form is as good as the name (shadow accepts both).
      writeFileSync(SUBID_FILES.uid, `${process.getuid!()}:100000:65536\n`);
      writeFileSync(SUBID_FILES.gid, `${process.getuid!()}:100000:65536\n`);
      expect(idRangeSupport()).toMatchObject({ ok: true, caller: 'subid', uid: { start: 100000, count: 65536 } });
      // Too small a range says so.
      writeFileSync(SUBID_FILES.uid, `${me}:100000:1000\n`);
      await expect(run({ argv: ['true'], ids: 'range' })).rejects.toThrow(/needs 65535 subordinate ids .* gives 1000/);
    } finally {
      dir.remove();
    }
  });

  it.skipIf(isRoot)('as a user: missing helpers are a ConfigError naming them', async () => {
    MAP_HELPER_DIRS.splice(0, MAP_HELPER_DIRS.length, '/nonexistent');
    await expect(run({ argv: ['true'], ids: 'range' })).rejects.toThrow(/ids: 'range' needs the setuid helpers newuidmap and newgidmap \(package uidmap\); newuidmap and newgidmap not found/);
  });

  it.skipIf(isRoot || !!noRange)('as a user: a range the helper refuses is a NamespaceError with its own words', async () => {
    // An entry for this user that is not the one /etc/subuid grants: the
    // setuid helper checks the real file and refuses.
    const dir = emptySubidFiles(`${me}:300000:65536\n`);
    try {
      await expect(run({ argv: ['true'], ids: 'range' })).rejects.toThrow(/writing the sandbox's id maps: \/usr\/bin\/newuidmap \d+ 0 \d+ 1 1 300000 65535 failed \(exit 1\): newuidmap: .*/);
    } finally {
      dir.remove();
    }
  });

  it.skipIf(!isRoot)('as root: the range needs no entry of its own (the root range is always there)', async () => {
    const dir = emptySubidFiles('');
    try {
      expect(idRangeSupport()).toMatchObject({ ok: true, caller: 'root' });
      const r = await run({ argv: ['sh', '-c', 'cat /proc/self/uid_map'], ids: 'range' });
      expect(r.stdout.trim().split(/\s+/)).toEqual(['0', String(rootIdRange().uid), String(rootIdRange().count)]);
    } finally {
      dir.remove();
    }
  });
});
