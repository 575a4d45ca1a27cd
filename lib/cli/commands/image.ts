/** `minisandbox image import | pull | ls | rm | inspect | run`: container images, daemonless. */
import { constants as osConstants } from 'node:os';
import { formatBytes } from '../../format.js';
import {
  getImage,
  importImage,
  listImages,
  openImageStore,
  ownersMode,
  pullImage,
  removeImage,
  runImage,
  imageCommand,
  type ImageRecord,
  type ImportProgress,
} from '../../images/index.js';
import { createProgress } from '../../swe/pipeline/progress.js';
import { assignment, UsageError, type Args, type Command, type CommandSpec } from '../args.js';
import { reportError } from '../boundary.js';
import { JSON_OPTION, STORE_OPTION } from '../options.js';

const open = (args: Args) => openImageStore({ root: args.get('--store')! });
const short = (rec: ImageRecord) => rec.id.slice(0, 12);

/** Layer-by-layer progress on stderr: on a terminal a bar redrawn per MiB, in logs one line per layer. */
function importProgress(verb: string): { onProgress: (p: ImportProgress) => void; end: () => void } {
  const line = createProgress();
  const tty = process.stderr.isTTY === true;
  let last = '';
  return {
    onProgress: (p) => {
      const state = p.cached ? 'already stored' : p.done >= p.total ? 'done' : `${formatBytes(p.done)} of ${formatBytes(p.total)}`;
      const key = `${p.layer}:${p.cached ? 'c' : p.done === 0 ? 's' : p.done >= p.total ? 'd' : 'p'}`;
      if (!tty && (key === last || key.endsWith(':p'))) return;
      last = key;
      line.update(p.layer - (p.cached || p.done >= p.total ? 0 : 1), p.layers, `${verb} layer ${p.layer}/${p.layers} ${p.diffId.slice(7, 19)}: ${state}`);
    },
    end: () => line.end(),
  };
}

function summary(rec: ImageRecord): string {
  return `${short(rec)}  ${(rec.names.join(', ') || '<none>').padEnd(30)}  ${String(rec.layers.length).padStart(3)} layers  ${formatBytes(rec.size).padStart(10)}  ${rec.architecture ?? '?'}${rec.owners === 'squashed' ? '  owners squashed' : ''}\n`;
}

const importCommand: Command = {
  spec: {
    name: 'image import',
    about: `Imports a 'docker save' archive or an OCI image layout (a directory, or a
tar of one) into the layer store. Each layer is stored once, keyed by its
diffID, and every digest is checked before its bytes are used; a refused
or damaged image leaves nothing behind.`,
    options: {
      '--name': { values: ['NAME'], repeatable: true, help: "Name the image (instead of the archive's tags)" },
      '--store': STORE_OPTION,
      '--json': JSON_OPTION,
    },
    positionals: [{ name: 'FILE|DIR' }],
    exitCodes: 'Exit code: 0, or 1 if the image could not be imported.',
  },
  async run(args) {
    const store = await open(args);
    const names = args.given.filter((g) => g.flag === '--name').map((g) => g.values[0]!);
    const progress = importProgress('storing');
    let recs: ImageRecord[];
    try {
      recs = await importImage(store, args.positionals[0] as string, { ...(names.length > 0 ? { names } : {}), onProgress: progress.onProgress });
    } finally {
      progress.end();
    }
    process.stdout.write(args.has('--json') ? `${JSON.stringify(recs, null, 2)}\n` : recs.map((r) => `imported ${summary(r)}`).join(''));
    return 0;
  },
};

const pullCommand: Command = {
  spec: {
    name: 'image pull',
    about: `Pulls REF from an OCI / Docker registry (Registry API v2) into the layer
store: only the layers the store lacks are fetched, every blob's digest is
checked while it streams.`,
    options: {
      '--insecure': { help: 'Plain HTTP (allowed only for a registry on loopback)' },
      '--store': STORE_OPTION,
      '--json': JSON_OPTION,
    },
    positionals: [{ name: 'REF' }],
    exitCodes: 'Exit code: 0, or 1 if the image could not be pulled.',
  },
  async run(args) {
    const store = await open(args);
    const ref = args.positionals[0] as string;
    const fetchLine = createProgress();
    const tty = process.stderr.isTTY === true;
    let lastLayers = -1;
    const unpack = importProgress('storing');
    let rec: ImageRecord;
    try {
      rec = await pullImage(store, ref, {
        insecure: args.has('--insecure'),
        onProgress: (p) => {
          if (!tty && p.layers === lastLayers) return;
          lastLayers = p.layers;
          fetchLine.update(p.layers, p.totalLayers, `fetched ${formatBytes(p.bytes)} of ${formatBytes(p.totalBytes)}`);
        },
        onImportProgress: (p) => {
          fetchLine.end();
          unpack.onProgress(p);
        },
      });
    } finally {
      fetchLine.end();
      unpack.end();
    }
    process.stdout.write(args.has('--json') ? `${JSON.stringify(rec, null, 2)}\n` : `pulled ${summary(rec)}`);
    return 0;
  },
};

const lsCommand: Command = {
  spec: {
    name: 'image ls',
    about: 'Lists the images in the store: id, names, layers, size.',
    options: { '--store': STORE_OPTION, '--json': JSON_OPTION },
    exitCodes: 'Exit code: 0, or 1 if the store cannot be read.',
  },
  async run(args) {
    const recs = await listImages(await open(args));
    process.stdout.write(args.has('--json') ? `${JSON.stringify(recs, null, 2)}\n` : recs.map(summary).join('') || 'no images\n');
    return 0;
  },
};

const rmCommand: Command = {
  spec: {
    name: 'image rm',
    about: `Removes an image (or, for one of several names, that name). Its layers go
at the next 'store gc' unless another image, env or task uses them.`,
    options: { '--store': STORE_OPTION },
    positionals: [{ name: 'IMAGE', repeatable: true }],
    exitCodes: 'Exit code: 0, or 1 if an image is not there or cannot be removed.',
  },
  async run(args) {
    const store = await open(args);
    for (const ref of args.positionals as string[]) {
      const r = await removeImage(store, ref);
      process.stdout.write(r.removed === 'name' ? `untagged ${ref} (image ${r.id.slice(0, 12)} keeps its other names)\n` : `removed image ${r.id.slice(0, 12)}\n`);
    }
    return 0;
  },
};

const inspectCommand: Command = {
  spec: {
    name: 'image inspect',
    about: "Prints an image's record as JSON: names, config digest, layers, Env, WorkingDir, User, Entrypoint, Cmd.",
    options: { '--store': STORE_OPTION },
    positionals: [{ name: 'IMAGE' }],
    exitCodes: 'Exit code: 0, or 1 if the image is not there.',
  },
  async run(args) {
    const store = await open(args);
    const rec = await getImage(store, args.positionals[0] as string);
    const warnings = rec.owners === 'squashed' ? [`owners squashed: no subordinate id range when it was imported (${ownersMode().reason ?? 'see minisandbox doctor'}); its sandboxes run as root whatever USER says`] : [];
    process.stdout.write(`${JSON.stringify({ ...rec, ...(warnings.length > 0 ? { warnings } : {}) }, null, 2)}\n`);
    return 0;
  },
};

const runCommand: Command = {
  spec: {
    name: 'image run',
    about: `Runs a command in a throwaway sandbox of IMAGE, as 'docker run --rm IMAGE
[COMMAND...]' does: the image's Entrypoint, then COMMAND (default: its Cmd),
as its User, in its WorkingDir, with its Env; stdio is this terminal's.`,
    options: {
      '--env': { values: ['K=V'], repeatable: true, check: assignment, help: 'Set a variable (over the image Env)' },
      '--workdir': { values: ['DIR'], help: "Start here instead of the image's WorkingDir" },
      '--user': { values: ['USER'], help: "Run as USER (name, uid, uid:gid) instead of the image's" },
      '--entrypoint': { values: ['CMD'], help: "Instead of the image's Entrypoint ('' clears it)" },
      '--network': { values: ['MODE'], default: 'none', help: "'none' (loopback only) or 'host'" },
      '--store': STORE_OPTION,
    },
    usage: ['minisandbox image run [OPTIONS] IMAGE [-- COMMAND [ARGS...]]'],
    command: 'IMAGE [-- COMMAND...]',
    exitCodes: `Exit code: COMMAND's own, or 128+N when signal N killed it; 125 when the
image or its sandbox could not be set up; 2 on usage errors.`,
  },
  async run(args) {
    const store = await open(args);
    // IMAGE starts the command line (the reader takes options only before it); a `--` after it is optional.
    const [ref, ...rest] = args.command;
    if (ref === undefined) throw new UsageError("expected IMAGE (see 'minisandbox image run --help')");
    const env = Object.fromEntries(args.given.filter((g) => g.flag === '--env').map((g) => g.value as [string, string]));
    const ep = args.get('--entrypoint');
    const network = args.get('--network');
    const abort = new AbortController();
    for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) process.on(sig, () => abort.abort());
    const argv = rest[0] === '--' ? rest.slice(1) : rest;
    const command = argv.length > 0 ? argv : undefined;
    let r;
    try {
      // Checked before the sandbox starts, so "no command" is the image's fault, not the command's.
      imageCommand(await getImage(store, ref), command, ep === undefined ? undefined : ep === '' ? [] : [ep]);
      r = await runImage(store, ref, command, {
      env,
      ...(args.get('--workdir') ? { workdir: args.get('--workdir')! } : {}),
      ...(args.get('--user') ? { user: args.get('--user')! } : {}),
      ...(ep !== undefined ? { entrypoint: ep === '' ? [] : [ep] } : {}),
      network: network === 'host' ? 'host' : 'none',
      stdin: 'inherit',
      stdout: 'inherit',
      stderr: 'inherit',
      signal: abort.signal,
    });
    } catch (e) {
      // As `docker run`: 125 when the container could not be run, so that 1 stays the command's own.
      return reportError('image run', e, args.origins, 125);
    }
    return r.exitCode ?? 128 + (osConstants.signals[r.signal ?? 'SIGKILL'] ?? 9);
  },
};

export const commands = [importCommand, pullCommand, lsCommand, rmCommand, inspectCommand, runCommand];
