/** `minisandbox store ls | du | gc`: the layer store, its sizes and its users. */
import { listEnvs } from '../../env/index.js';
import { normalizeDigest, openStore, type LayerStore } from '../../layers/index.js';
import { listRefs } from '../../swe/pipeline/index.js';
import { UsageError } from '../args.js';

export const STORE_HELP = `Usage: minisandbox store ls|du|gc [--store DIR] [--json]

  ls   every layer: digest, files, size, source, and who uses it
       (environments built with 'env build', tasks prepared with 'prepare')
  du   apparent size, real disk use, and what deduplication saves
  gc   remove the layers nothing uses (and unreferenced file objects)

Default store: $XDG_CACHE_HOME/minisandbox/store or ~/.cache/minisandbox/store.`;

const mib = (n: number) => `${(n / 1024 / 1024).toFixed(1)} MiB`;

/** digest -> who uses it ("env <id>", "prepare venv <description>"...). */
async function layerUsers(store: LayerStore): Promise<Map<string, string[]>> {
  const users = new Map<string, string[]>();
  const add = (digest: string, who: string) => {
    const d = normalizeDigest(digest);
    users.set(d, [...(users.get(d) ?? []), who]);
  };
  for (const env of await listEnvs({ store })) {
    const label = `env ${env.id}${env.name ? ` (${env.name})` : ''}`;
    add(env.venv.digest, `${label} venv`);
    if (env.repo) add(env.repo.digest, `${label} repo`);
  }
  for (const { kind, ref } of listRefs(store)) add(ref.digest, `prepare ${kind} ${ref.description}`);
  return users;
}

export async function storeCommand(args: string[]): Promise<number> {
  const [sub, ...rest] = args;
  const i = rest.indexOf('--store');
  const root = i >= 0 ? rest[i + 1] : undefined;
  if (i >= 0 && !root) throw new UsageError('--store needs a directory');
  const json = rest.includes('--json');
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
        users: users.get(normalizeDigest(l.digest)) ?? [],
      }));
      const text = layers
        .map((l) => `${l.digest.slice(0, 12)}  ${String(l.files).padStart(7)} files  ${mib(l.bytes).padStart(10)}  ${l.source}\n    used by: ${l.users.join('; ') || 'nothing'}\n`)
        .join('');
      print(layers, text || 'no layers\n');
      return 0;
    }
    case 'du': {
      const du = await store.du();
      print(du, `${du.layers} layers, ${du.objects} shared file objects\napparent ${mib(du.apparentBytes)}, on disk ${mib(du.diskBytes)} (${mib(du.undedupedDiskBytes)} without deduplication: ${mib(du.savedBytes)} saved)\nstore: ${store.root}\n`);
      return 0;
    }
    case 'gc': {
      const users = await layerUsers(store);
      const r = await store.gc({ inUse: users.keys() });
      print(r, `removed ${r.removedLayers.length} unused layer(s), ${r.removedObjects} file object(s), ${r.removedStaging} staging dir(s)\n`);
      return 0;
    }
    default:
      throw new UsageError(`store: expected ls, du or gc, not '${sub ?? ''}'`);
  }
}
