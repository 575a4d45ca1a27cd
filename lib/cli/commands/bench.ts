/**
 * `minisandbox bench`: the benchmark suite (benchmarks/suite, issue 13).
 * The suite is not part of lib/ (no room may import benchmarks/, and the
 * npm package ships dist/lib only), so this command runs the compiled
 * suite in a node process of its own, with the options as given; it is
 * there in a source checkout after `npm run build`.
 */
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { packageRoot } from '../../native/packageRoot.js';
import { CommandError, positiveInt, type Command } from '../args.js';

/** Options passed through to the suite as they were given. */
const PASSED = ['--quick', '--workload', '--methods', '--scale', '--repeat', '--tasks', '--cold-tasks', '--out', '--cache', '--no-docker', '--json'] as const;

const benchCommand: Command = {
  spec: {
    name: 'bench',
    about: `Runs the benchmark suite: one SWE-style workload run with Docker's images,
MiniSandbox's extract mode, its shared layers and its runner of Docker
images, side by side (environment preparation, disk, scaling to N at once,
an agent-like rollout, per-command latency). Writes results.json,
report.md and SVG charts to --out and prints the bars with their verdicts.
Installs nothing: says what is missing (Docker) and runs without it.
Needs a source checkout of MiniSandbox (benchmarks/ is not in the npm
package); see benchmarks/README.md.`,
    options: {
      '--quick': { help: 'A first look in under 3 minutes: quick workload, N = 1, 8, fewer repeats' },
      '--workload': { values: ['full|quick|demo'], help: 'The task set (default full; quick with --quick; demo: the built-in demo tasks, offline)' },
      '--methods': { values: ['LIST'], help: 'Comma-separated: docker, extract, layers, image (default all)' },
      '--scale': { values: ['LIST'], help: 'Environments started at once (default 1,8,32,128,256)' },
      '--repeat': { values: ['N'], check: positiveInt, help: 'Repeats of every measurement (default 3; 2 with --quick)' },
      '--tasks': { values: ['N'], check: positiveInt, help: 'Tasks used for setup, rollout and latency (default 8; 2 with --quick)' },
      '--cold-tasks': { values: ['N'], check: positiveInt, help: 'Tasks whose cold preparation is measured (default 2; 1 with --quick)' },
      '--out': { values: ['DIR'], help: 'Results folder (default bench-results/)' },
      '--cache': { values: ['DIR'], help: 'Where the workload and its stores are cached' },
      '--no-docker': { help: 'Leave Docker out (the docker and image methods)' },
      '--json': { help: 'Print the results as JSON on stdout' },
    },
    exitCodes: "Exit code: the suite's: 0 when it ran (a missed bar is reported, not an error), 1 when it failed, 130 when interrupted.",
  },
  async run(args) {
    const suite = join(packageRoot(), 'dist', 'benchmarks', 'suite', 'main.js');
    if (!existsSync(suite)) {
      throw new CommandError(`the benchmark suite is not here (${suite}): it is part of MiniSandbox's source checkout, not of the npm package; in a checkout run \`npm ci && npm run build\`, then \`minisandbox bench\` or \`npm run bench\``);
    }
    const argv = args.given.filter((g) => (PASSED as readonly string[]).includes(g.flag)).flatMap((g) => [g.flag, ...g.values]);
    const child = spawn(process.execPath, [suite, ...argv], { stdio: 'inherit' });
    // Ctrl-C reaches the suite through the terminal's process group; a
    // SIGTERM sent to this process alone is passed on, so the suite still
    // removes its containers and sandboxes.
    const forward = (sig: NodeJS.Signals) => child.kill(sig);
    process.on('SIGINT', () => undefined);
    process.on('SIGTERM', forward);
    return new Promise<number>((resolve, reject) => {
      child.on('error', (e) => reject(new CommandError(`cannot run the benchmark suite ${suite}: ${e.message}`)));
      child.on('close', (code, signal) => resolve(code ?? (signal === 'SIGINT' ? 130 : 128 + 15)));
    });
  },
};

export const commands = [benchCommand];
