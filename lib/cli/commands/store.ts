/** `minisandbox store ls | du | gc | verify`: the layer store, its sizes, its users and its integrity. */
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { envsDir } from '../../env/index.js';
import { describeProblem, openStore, type LayerCheck, type LayerStore } from '../../layers/index.js';
import { fileSha256 } from '../../files/hash.js';
import { formatBytes } from '../../format.js';
import { UsageError } from '../args.js';

export const STORE_HELP = `Usage: minisandbox store ls|du|gc [--store DIR] [--json]
       minisandbox store verify [LAYER...] [--store DIR] [--json]

  ls      every layer: digest, files, size, source, and who uses it: the
          store's pins (environments, tasks prepared with 'prepare', builds
          in progress)
  du      apparent size, real disk use, and what deduplication saves
  gc      remove the layers no pin names (and unreferenced file objects)
  verify  re-hash every layer (or each LAYER: a digest or a unique prefix of
          one, as 'ls' shows) and compare its tree with what was recorded
          when it was built: each file's content, size, mode and mtime, each
          symlink's target, nothing missing or added. Also re-hash each kept
          environment archive (<store>/envs/archives) against its digest. Prints every difference with the layer
          or archive it is in; exits 1 if anything differs or a layer cannot
          be checked (built before listings were recorded), 0 otherwise.

Default store: $XDG_CACHE_HOME/minisandbox/store or ~/.cache/minisandbox/store.`;


/** digest -> who uses it, as the store's pins say ("env <id> (name)", "prepared repo <repo>@<commit>"...). */
async function layerUsers(store: LayerStore): Promise<Map<string, string[]>> {
  const users = new Map<string, string[]>();
  for (const pin of await store.pins()) {
    for (const d of pin.digests) users.set(d, [...(users.get(d) ?? []), pin.label]);
  }
  return users;
}

/** The digests LAYER arguments name: full digests or unique prefixes of the store's layers. */
async function namedLayers(store: LayerStore, args: string[]): Promise<string[]> {
  const all = (await store.list()).map((l) => l.digest);
  return args.map((arg) => {
    const hex = arg.startsWith('sha256:') ? arg.slice(7) : arg;
    if (!/^[0-9a-f]{1,64}$/.test(hex)) throw new UsageError(`verify: ${JSON.stringify(arg)} is not a layer digest (hex, as 'store ls' shows)`);
    const found = all.filter((d) => d.startsWith(hex));
    if (found.length === 0) throw new UsageError(`verify: no layer ${arg} in the store ${store.root}`);
    if (found.length > 1) throw new UsageError(`verify: ${arg} matches ${found.length} layers; give more of the digest`);
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

export async function storeCommand(args: string[]): Promise<number> {
  const [sub, ...rest] = args;
  const i = rest.indexOf('--store');
  const root = i >= 0 ? rest[i + 1] : undefined;
  if (i >= 0 && !root) throw new UsageError('--store needs a directory');
  const json = rest.includes('--json');
  const positional = rest.filter((a, k) => a !== '--json' && a !== '--store' && !(i >= 0 && k === i + 1));
  const unknown = positional.find((a) => a.startsWith('-'));
  if (unknown) throw new UsageError(`unknown option '${unknown}'`);
  if (sub !== 'verify' && positional.length > 0) throw new UsageError(`${sub ?? 'store'}: unexpected argument '${positional[0]}'`);
  const store = await openStore(root ? { root } : {});
  const print = (v: unknown, text: string) => process.stdout.write(json ? `${JSON.stringify(v, null, 2)}\n` : text);
  switch (sub) {
    case 'ls': {
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
      print(layers, text || 'no layers\n');
      return 0;
    }
    case 'du': {
      const du = await store.du();
      print(du, `${du.layers} layers, ${du.objects} shared file objects\napparent ${formatBytes(du.apparentBytes)}, on disk ${formatBytes(du.diskBytes)}; deduplication saves ${formatBytes(du.savedBytes)} (files stored once for every layer that holds them)\nstore: ${store.root}\n`);
      return 0;
    }
    case 'gc': {
      const r = await store.gc();
      const busy = r.busyLayers.length > 0 ? `; ${r.busyLayers.length} unused layer(s) kept, in use at that moment` : '';
      print(r, `removed ${r.removedLayers.length} unused layer(s), ${r.removedObjects} file object(s), ${r.removedStaging} staging dir(s)${busy}\n`);
      return 0;
    }
    case 'verify': {
      const named = positional.length > 0 ? await namedLayers(store, positional) : undefined;
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
      print({ ok: bad === 0, layers, archives }, text);
      return bad === 0 ? 0 : 1;
    }
    default:
      throw new UsageError(`store: expected ls, du, gc or verify, not '${sub ?? ''}'`);
  }
}
