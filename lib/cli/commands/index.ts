/**
 * Every command of `minisandbox`, in the order --help lists them. A
 * command's module is loaded only when it runs, so --help and --version
 * work where the addon cannot load, and an addon that fails to load is an
 * error of the command that needed it, reported like any other.
 */
import type { Command } from '../args.js';

export interface CommandEntry {
  name: string;
  summary: string;
  /** `store ls`, `store du`...: the module holds one command per subcommand. */
  subcommands?: readonly string[];
  /**
   * Exit code of an error (default 1). `run` uses 125, as `docker run`
   * does: its 1 is the command's own. Known before the module loads, since
   * loading it can fail.
   */
  failureExit?: number;
  load(): Promise<{ commands: readonly Command[] }>;
}

export const COMMANDS: readonly CommandEntry[] = [
  { name: 'demo', summary: 'Prepare and evaluate the built-in SWE task set (no network needed)', load: () => import('./demo.js') },
  { name: 'prepare', summary: 'Build the environments a SWE-bench-style task set needs', load: () => import('./prepare.js') },
  { name: 'eval', summary: 'Evaluate patches (predictions) on a task set, one sandbox each', load: () => import('./eval.js') },
  { name: 'tasks', summary: 'Build task sets: FAIL_TO_PASS/PASS_TO_PASS from test runs', subcommands: ['derive'], load: () => import('./tasks.js') },
  { name: 'worker', summary: 'Take evaluation jobs from a queue (Redis, BullMQ): one worker per node', load: () => import('./worker.js') },
  { name: 'serve', summary: "Serve sandboxes over SWE-ReX's HTTP protocol", load: () => import('./serve.js') },
  { name: 'env', summary: 'Build Python environments as shared layers', subcommands: ['build', 'ls'], load: () => import('./env.js') },
  { name: 'store', summary: 'The layer store: layers, sizes, users, integrity', subcommands: ['ls', 'du', 'gc', 'verify'], load: () => import('./store.js') },
  { name: 'image', summary: 'Container images, daemonless: import, pull, list, remove, inspect, run', subcommands: ['import', 'pull', 'ls', 'rm', 'inspect', 'run'], load: () => import('./image.js') },
  { name: 'run', summary: 'Run a command in a new sandbox (bubblewrap-like options)', failureExit: 125, load: () => import('./run.js') },
  { name: 'doctor', summary: 'Check which kernel features work on this machine, and why not', load: () => import('./doctor.js') },
  { name: 'bench', summary: 'The benchmark suite against Docker (a source checkout; see benchmarks/README.md)', load: () => import('./bench.js') },
  { name: 'gc', summary: 'Remove what sandboxes of dead processes left behind', load: () => import('./gc.js') },
];

/** The command named by `name` ('store verify'), from its module. */
export async function loadCommand(entry: CommandEntry, name: string): Promise<Command> {
  const { commands } = await entry.load();
  const command = commands.find((c) => c.spec.name === name);
  if (!command) throw new Error(`lib/cli/commands: ${entry.name}'s module has no command '${name}'`);
  return command;
}
