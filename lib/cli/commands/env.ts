/** `minisandbox env build | ls`: environments (a venv layer, a repo layer). */
import { buildEnv, listEnvs, type EnvStep } from '../../env/index.js';
import { openStore } from '../../layers/index.js';
import { ArgReader, UsageError } from '../args.js';

export const ENV_HELP = `Usage: minisandbox env build --python VERSION|PATH [OPTIONS]
       minisandbox env ls [--store DIR] [--json]

Builds a Python venv from one of this machine's Pythons (e.g. 3.11 from
pyenv, or /usr/bin/python3.11), inside a sandbox with no network, installs
what the options say in the order given, and stores it (with the repo, if
any) as read-only layers that every sandbox of this env shares.

  --python V          base interpreter: a version or an absolute path (required)
  --repo PATH|URL     a git repository, checked out at /testbed during the build
  --commit REV        the commit to check out (required with --repo)
  --package DIR       pip install a local package directory
  --editable DIR      pip install -e a directory of the repo ('.' is the repo)
  --wheels DIR        install every wheel of a local directory
  --run CMD           run a shell command with the venv active (in the repo)
  --venv-path PATH    where the venv lives in every sandbox (default /opt/venv)
  --name NAME         a label kept in the env's manifest
  --store DIR         the layer store (default ~/.cache/minisandbox/store)`;

export async function envCommand(args: string[]): Promise<number> {
  const [sub, ...rest] = args;
  const r = new ArgReader(rest);
  let store: string | undefined;
  let json = false;
  let python: string | undefined;
  let repo: string | undefined;
  let commit: string | undefined;
  let venvPath: string | undefined;
  let name: string | undefined;
  const steps: EnvStep[] = [];
  while (!r.done) {
    const a = r.next();
    if (a === '--store') store = r.value(a);
    else if (a === '--json') json = true;
    else if (sub === 'build' && a === '--python') python = r.value(a);
    else if (sub === 'build' && a === '--repo') repo = r.value(a);
    else if (sub === 'build' && a === '--commit') commit = r.value(a);
    else if (sub === 'build' && a === '--venv-path') venvPath = r.value(a);
    else if (sub === 'build' && a === '--name') name = r.value(a);
    else if (sub === 'build' && a === '--package') steps.push({ package: r.value(a) });
    else if (sub === 'build' && a === '--editable') steps.push({ editable: r.value(a) });
    else if (sub === 'build' && a === '--wheels') steps.push({ wheels: r.value(a) });
    else if (sub === 'build' && a === '--run') steps.push({ run: r.value(a) });
    else throw new UsageError(`env ${sub ?? ''}: unknown option '${a}'`);
  }
  const layerStore = await openStore(store ? { root: store } : {});
  if (sub === 'ls') {
    const envs = await listEnvs({ store: layerStore });
    const rows = envs.map((e) => ({ id: e.id, name: e.name, python: e.python.version, venvPath: e.venvPath, repoPath: e.repoPath }));
    process.stdout.write(json ? `${JSON.stringify(rows, null, 2)}\n` : rows.map((e) => `${e.id}  python ${e.python}  ${e.venvPath}${e.repoPath ? ` + ${e.repoPath}` : ''}${e.name ? `  (${e.name})` : ''}\n`).join('') || 'no environments\n');
    return 0;
  }
  if (sub !== 'build') throw new UsageError(`env: expected build or ls, not '${sub ?? ''}'`);
  if (!python) throw new UsageError('env build: --python is required');
  if (repo !== undefined && commit === undefined) throw new UsageError('env build: --repo needs --commit');
  const env = await buildEnv(
    { python, steps, ...(repo ? { repo: { source: repo, commit: commit! } } : {}), ...(venvPath ? { venvPath } : {}), ...(name ? { name } : {}) },
    { store: layerStore, onOutput: json ? undefined : (step: string, text: string) => process.stderr.write(`--- ${step}\n${text}`) },
  );
  process.stdout.write(json ? `${JSON.stringify({ id: env.id, venv: env.venv.digest, repo: env.repo?.digest, python: env.python }, null, 2)}\n` : `built env ${env.id} (python ${env.python.version} at ${env.python.path}; venv ${env.venv.digest.slice(0, 12)}${env.repo ? `, repo ${env.repo.digest.slice(0, 12)}` : ''})\n`);
  return 0;
}
