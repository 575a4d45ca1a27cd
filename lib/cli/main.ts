#!/usr/bin/env node
/** The `minisandbox` command: a thin shell over the library. */
import { SandboxError } from '../sandbox/errors.js';
import { UsageError } from './args.js';
import { DOCTOR_HELP, doctorCommand } from './commands/doctor.js';
import { RUN_HELP, runCommand } from './commands/run.js';
import { ENV_HELP, envCommand } from './commands/env.js';
import { GC_HELP, gcCommand } from './commands/gc.js';
import { STORE_HELP, storeCommand } from './commands/store.js';
import { SERVE_HELP, serveCommand } from '../server/cli.js';
import { DEMO_HELP, EVAL_HELP, PREPARE_HELP, TASKS_HELP, demoCommand, evalCommand, prepareCommand, tasksCommand } from '../swe/cli.js';

const HELP = `Usage: minisandbox COMMAND [OPTIONS]

Container-free sandboxes for software-engineering agents.

Commands:
  demo     Prepare and evaluate the built-in SWE task set (no network needed)
  prepare  Build the environments a SWE-bench-style task set needs
  eval     Evaluate patches (predictions) on a task set, one sandbox each
  tasks    Build task sets: derive FAIL_TO_PASS/PASS_TO_PASS from test runs
  serve    Serve sandboxes over SWE-ReX's HTTP protocol
  env      Build Python environments as shared layers (env build, env ls)
  store    The layer store: ls, du, gc, verify
  run      Run a command in a new sandbox (bubblewrap-like options)
  doctor   Check which kernel features work on this machine, and why not
  gc       Remove what sandboxes of dead processes left behind

Run 'minisandbox COMMAND --help' for a command's options.
`;

const COMMANDS: Record<string, { run: (args: string[]) => Promise<number>; help: string }> = {
  run: { run: runCommand, help: RUN_HELP },
  doctor: { run: doctorCommand, help: DOCTOR_HELP },
  gc: { run: gcCommand, help: GC_HELP },
  env: { run: envCommand, help: ENV_HELP },
  store: { run: storeCommand, help: STORE_HELP },
  serve: { run: serveCommand, help: SERVE_HELP },
  prepare: { run: prepareCommand, help: PREPARE_HELP },
  eval: { run: evalCommand, help: EVAL_HELP },
  demo: { run: demoCommand, help: DEMO_HELP },
  tasks: { run: tasksCommand, help: TASKS_HELP },
};

export async function main(argv: string[]): Promise<number> {
  const [name, ...args] = argv;
  if (!name || name === '-h' || name === '--help' || name === 'help') {
    process.stdout.write(HELP);
    return name ? 0 : 2;
  }
  const cmd = COMMANDS[name];
  if (!cmd) {
    process.stderr.write(`minisandbox: unknown command '${name}'\n\n${HELP}`);
    return 2;
  }
  if (name !== 'run' && (args.includes('--help') || args.includes('-h'))) {
    process.stdout.write(cmd.help + '\n');
    return 0;
  }
  try {
    return await cmd.run(args);
  } catch (e) {
    if (e instanceof UsageError) {
      process.stderr.write(`minisandbox ${name}: ${e.message}\n`);
      return 2;
    }
    if (e instanceof SandboxError) {
      process.stderr.write(`minisandbox: ${e.name}: ${e.message}\n`);
      return 125;
    }
    throw e;
  }
}

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (e: unknown) => {
    process.stderr.write(`minisandbox: ${(e as Error).stack ?? String(e)}\n`);
    process.exitCode = 1;
  },
);
