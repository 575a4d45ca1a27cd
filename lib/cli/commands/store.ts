/** `minisandbox store ls | du | gc | verify`: the layer store, its sizes, its users and its integrity. */
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { envsDir } from '../../env/index.js';
import { openImageStore } from '../../images/index.js';
import { describeProblem, type LayerCheck, type LayerStore } from '../../layers/index.js';
import { fileSha256 } from '../../files/hash.js';
import { formatBytes } from '../../format.js';
import { UsageError, type Args, type Command, type CommandSpec, type ValueCheck } from '../args.js';
import { JSON_OPTION, STORE_OPTION } from '../options.js';


/** digest -> who uses it, as the store's pins say ("env <id> (name)", "prepared repo <repo>@<commit>"...). */
async function layerUsers(store: LayerStore): Promise<Map<string, string[]>> {
  const users = new Map<string, string[]>();
  for (const pin of await store.pins()) {
    for (const d of pin.digests) users.set(d, [...(users.get(d) ?? []), pin.label]);
  }
  return users;
}

/** A layer digest or a prefix of one, as `store ls` shows them: hex, with or without `sha256:`. */
const layerPrefix: ValueCheck<string> = (v, name) => {
  const hex = v.startsWith('sha256:') ? v.slice(7) : v;
  if (!/^[0-9a-f]{1,64}$/.test(hex)) throw new UsageError(`${name} ${JSON.stringify(v)}: not a layer digest (hex, as 'store ls' shows)`);
  return hex;
};

/** The full digests that LAYER prefixes name, each of exactly one layer of the store. */
async function namedLayers(store: LayerStore, prefixes: string[]): Promise<string[]> {
  const all = (await store.list()).map((l) => l.digest);
  return prefixes.map((hex) => {
    const found = all.filter((d) => d.startsWith(hex));
    if (found.length === 0) throw new UsageError(`LAYER ${hex}: no such layer in the store ${store.root}`);
    if (found.length > 1) throw new UsageError(`LAYER ${hex}: matches ${found.length} layers; give more of the digest`);
    return found[0]!;
  });
}

interface ArchiveCheck {
  path: string;
  /** The layer digest the archive is named for: its sha256 must be this. */
  digest: string;
  status: 'ok' | 'mismatch';
  sha256: string;
}

/** Each kept env archive (named <digest>.tar.zst) re-hashed against its name; only `only`'s, if given. */
async function verifyArchives(store: LayerStore, only: Set<string> | undefined): Promise<ArchiveCheck[]> {
  const dir = path.join(envsDir(store.root), 'archives');
  const names = await fsp.readdir(dir).catch(() => [] as string[]);
  const out: ArchiveCheck[] = [];
  for (const name of names.sort()) {
    const m = /^([0-9a-f]{64})\.tar\.zst$/.exec(name);
    if (!m || (only && !only.has(m[1]!))) continue;
    const sha = await fileSha256(path.join(dir, name));
    if (sha === undefined) continue; // removed meanwhile
    out.push({ path: path.join(dir, name), digest: m[1]!, status: sha === m[1] ? 'ok' : 'mismatch', sha256: sha });
  }
  return out;
}

function layerReport(c: LayerCheck): string {
  const head = `${c.status === 'ok' ? 'ok      ' : c.status === 'mismatch' ? 'MISMATCH' : 'UNCHECKED'} layer ${c.digest}  ${c.files} files  ${formatBytes(c.bytes)}  ${c.source}\n`;
  const lines = c.problems.map((p) => `  layer ${c.digest}: ${describeProblem(p)}\n`);
  if (c.reason) lines.push(`  layer ${c.digest}: cannot verify: ${c.reason}\n`);
  return head + lines.join('');
}

const options = { '--store': STORE_OPTION, '--json': JSON_OPTION };
const spec = (name: string, about: string, exitCodes = 'Exit code: 0, or 1 if the store cannot be read.'): CommandSpec => ({ name: `store ${name}`, about, options, exitCodes });
const print = (args: Args, v: unknown, text: string) => process.stdout.write(args.has('--json') ? `${JSON.stringify(v, null, 2)}\n` : text);
// The images room's opener: its remover can delete image layers of an id range (see lib/images/owners.ts).
const open = (args: Args) => openImageStore({ root: args.get('--store')! });

const ls: Command = {
  spec: spec('ls', `Lists every layer: digest, files, size, source, and who uses it: the
store's pins (environments, tasks prepared with 'prepare', builds in
progress).`),
  async run(args) {
    const store = await open(args);
    const users = await layerUsers(store);
    const layers = (await store.list()).map((l) => ({
      digest: l.digest,
      files: l.manifest.fileCount,
      bytes: l.manifest.size,
      source: l.manifest.source,
      users: users.get(l.digest) ?? [],
    }));
    const text = layers
      .map((l) => `${l.digest.slice(0, 12)}  ${String(l.files).padStart(7)} files  ${formatBytes(l.bytes).padStart(10)}  ${l.source}\n    used by: ${l.users.join('; ') || 'nothing'}\n`)
      .join('');
    print(args, layers, text || 'no layers\n');
    return 0;
  },
};

const du: Command = {
  spec: spec('du', 'Shows the apparent size, the real disk use, and what deduplication saves.'),
  async run(args) {
    const store = await open(args);
    const du = await store.du();
    print(args, du, `${du.layers} layers, ${du.objects} shared file objects\napparent ${formatBytes(du.apparentBytes)}, on disk ${formatBytes(du.diskBytes)}; deduplication saves ${formatBytes(du.savedBytes)} (files stored once for every layer that holds them)\n${du.unreadableDirs ? `not counted: ${du.unreadableDirs} directories of image layers that only their image's users may read\n` : ''}store: ${store.root}\n`);
    return 0;
  },
};

const gc: Command = {
  spec: spec('gc', 'Removes the layers no pin names (and unreferenced file objects).', 'Exit code: 0, or 1 if the store cannot be read or changed.'),
  async run(args) {
    const store = await open(args);
    const r = await store.gc();
    const busy = r.busyLayers.length > 0 ? `; ${r.busyLayers.length} unused layer(s) kept, in use at that moment` : '';
    print(args, r, `removed ${r.removedLayers.length} unused layer(s), ${r.removedObjects} file object(s), ${r.removedStaging} staging dir(s)${busy}\n`);
    return 0;
  },
};

const verify: Command = {
  spec: {
    ...spec(
      'verify',
      `Re-hashes every layer (or each LAYER: a digest or a unique prefix of one,
as 'ls' shows) and compares its tree with what was recorded when it was
built: each file's content, size, mode and mtime, each symlink's target,
nothing missing or added. Also re-hashes each kept environment archive
(<store>/envs/archives, what extract mode unpacks) against its digest.
Prints every difference with the layer or archive it is in.`,
      `Exit code: 0 if everything is as built; 1 if anything differs or a layer
cannot be checked (built before listings were recorded); 2 on usage errors.`,
    ),
    positionals: [{ name: 'LAYER', optional: true, repeatable: true, check: layerPrefix }],
  },
  async run(args) {
    const store = await open(args);
    const named = args.positionals.length > 0 ? await namedLayers(store, args.positionals as string[]) : undefined;
    const layers = await store.verify(named);
    const archives = await verifyArchives(store, named ? new Set(named) : undefined);
    const bad = layers.filter((l) => l.status !== 'ok').length + archives.filter((a) => a.status !== 'ok').length;
    const text =
      layers.map(layerReport).join('') +
      archives
        .map((a) =>
          a.status === 'ok'
            ? `ok       archive ${a.path}\n`
            : `MISMATCH archive ${a.path}\n  archive ${a.path}: sha256 ${a.sha256}, expected ${a.digest} (its layer's digest)\n`,
        )
        .join('') +
      `${layers.length} layer(s) and ${archives.length} archive(s) checked: ${bad === 0 ? 'all as built' : `${bad} differ or cannot be checked`}\nstore: ${store.root}\n`;
    print(args, { ok: bad === 0, layers, archives }, text);
    return bad === 0 ? 0 : 1;
  },
};

export const commands = [ls, du, gc, verify];
