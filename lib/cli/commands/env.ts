/** `minisandbox env build | ls`: environments (a venv layer, a repo layer). */
import { DEFAULT_VENV_PATH, buildEnv, checkRecipe, listEnvs, resolvePython, type EnvRecipe, type EnvStep } from '../../env/index.js';
import { openStore } from '../../layers/index.js';
import { UsageError, absolutePath, type Args, type Command } from '../args.js';
import { JSON_OPTION, STORE_OPTION } from '../options.js';

/** The recipe steps, in the order given, each with the flag it came from. */
const STEP_FLAGS = {
  '--package': (dir: string): EnvStep => ({ package: dir }),
  '--editable': (dir: string): EnvStep => ({ editable: dir }),
  '--wheels': (dir: string): EnvStep => ({ wheels: dir }),
  '--run': (cmd: string): EnvStep => ({ run: cmd }),
} as const;

const build: Command = {
  spec: {
    name: 'env build',
    about: `Builds a Python venv from one of this machine's Pythons (e.g. 3.11 from
pyenv, or /usr/bin/python3.11), inside a sandbox with no network, installs
what the options say in the order given, and stores it (with the repo, if
any) as read-only layers that every sandbox of this env shares. The
interpreter and the options are checked before anything is written. A
recipe built before (the same interpreter, options and inputs) is not
built again: its env is printed at once, unless --rebuild says otherwise.`,
    options: {
      '--python': { values: ['V'], required: true, option: 'python', help: 'Base interpreter: a version or an absolute path' },
      '--repo': { values: ['PATH|URL'], option: 'recipe.repo', help: 'A git repository, checked out at /testbed during the build' },
      '--commit': { values: ['REV'], option: 'recipe.repo.commit', help: 'The commit to check out (required with --repo)' },
      '--package': { values: ['DIR'], repeatable: true, check: absolutePath, help: 'pip install a local package directory' },
      '--editable': { values: ['DIR'], repeatable: true, help: "pip install -e a directory of the repo ('.' is the repo)" },
      '--wheels': { values: ['DIR'], repeatable: true, check: absolutePath, help: 'Install every wheel of a local directory' },
      '--run': { values: ['CMD'], repeatable: true, help: 'Run a shell command with the venv active (in the repo)' },
      '--venv-path': { values: ['PATH'], default: DEFAULT_VENV_PATH, option: 'recipe.venvPath', help: 'Where the venv lives in every sandbox' },
      '--name': { values: ['NAME'], help: "A label kept in the env's manifest" },
      '--rebuild': { help: 'Build even if this recipe was built before' },
      '--store': STORE_OPTION,
      '--json': { help: 'Print the env as JSON, and no build output' },
    },
    exitCodes: 'Exit code: 0 when the env is built, 1 when it could not be, 2 on usage errors.',
  },
  async run(args: Args) {
    const steps: EnvStep[] = [];
    for (const g of args.given) {
      if (!(g.flag in STEP_FLAGS)) continue;
      args.blame(`recipe.steps[${steps.length}]`, g);
      steps.push(STEP_FLAGS[g.flag as keyof typeof STEP_FLAGS](g.value as string));
    }
    const repo = args.get('--repo');
    const commit = args.get('--commit');
    if ((repo === undefined) !== (commit === undefined)) throw new UsageError(repo ? '--repo needs --commit' : '--commit needs --repo');
    const name = args.get('--name');
    const recipe: EnvRecipe = { python: args.get('--python')!, venvPath: args.get('--venv-path')!, steps, ...(repo ? { repo: { source: repo, commit: commit! } } : {}), ...(name ? { name } : {}) };
    // Everything that can be checked is, before the store is made.
    checkRecipe(recipe);
    resolvePython(recipe.python);
    const json = args.has('--json');
    const env = await buildEnv(recipe, {
      store: await openStore({ root: args.get('--store')! }),
      onOutput: json ? undefined : (step: string, text: string) => process.stderr.write(`--- ${step}\n${text}`),
      rebuild: args.has('--rebuild'),
    });
    process.stdout.write(
      json
        ? `${JSON.stringify({ id: env.id, reused: env.reused === true, venv: env.venv.digest, repo: env.repo?.digest, python: env.python }, null, 2)}\n`
        : `${env.reused ? `reused env ${env.id}, built ${env.manifest.created} from the same recipe` : `built env ${env.id}`} (python ${env.python.version} at ${env.python.path}; venv ${env.venv.digest.slice(0, 12)}${env.repo ? `, repo ${env.repo.digest.slice(0, 12)}` : ''})\n`,
    );
    return 0;
  },
};

const ls: Command = {
  spec: {
    name: 'env ls',
    about: "Lists the environments built into the store with 'env build'.",
    options: { '--store': STORE_OPTION, '--json': JSON_OPTION },
    exitCodes: 'Exit code: 0, or 1 if the store cannot be read.',
  },
  async run(args: Args) {
    const envs = await listEnvs({ store: await openStore({ root: args.get('--store')! }) });
    const rows = envs.map((e) => ({ id: e.id, name: e.name, python: e.python.version, venvPath: e.venvPath, repoPath: e.repoPath }));
    process.stdout.write(
      args.has('--json')
        ? `${JSON.stringify(rows, null, 2)}\n`
        : rows.map((e) => `${e.id}  python ${e.python}  ${e.venvPath}${e.repoPath ? ` + ${e.repoPath}` : ''}${e.name ? `  (${e.name})` : ''}\n`).join('') || 'no environments\n',
    );
    return 0;
  },
};

export const commands = [build, ls];
