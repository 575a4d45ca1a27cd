/**
 * Running git for the demo generator with a fixed identity, fixed dates and
 * no user/system configuration: the generated commits (and so base_commit
 * SHAs) are identical on every machine and run, and a user's hooks, signing
 * or autocrlf settings cannot alter the repositories.
 */
import { execFileSync } from 'node:child_process';
import { SweError } from '../errors.js';

const FIXED_DATE = '2024-03-01T12:00:00+00:00';

export const DETERMINISTIC_GIT_ENV: NodeJS.ProcessEnv = {
  GIT_AUTHOR_NAME: 'MiniSandbox Demo',
  GIT_AUTHOR_EMAIL: 'demo@minisandbox.invalid',
  GIT_COMMITTER_NAME: 'MiniSandbox Demo',
  GIT_COMMITTER_EMAIL: 'demo@minisandbox.invalid',
  GIT_AUTHOR_DATE: FIXED_DATE,
  GIT_COMMITTER_DATE: FIXED_DATE,
  GIT_CONFIG_NOSYSTEM: '1',
  GIT_CONFIG_GLOBAL: '/dev/null',
  GIT_TERMINAL_PROMPT: '0',
};

const CONFIG = ['-c', 'core.autocrlf=false', '-c', 'commit.gpgsign=false', '-c', 'core.hooksPath=/dev/null'];

/** Runs git in `cwd`; throws an error naming the command, directory and git's stderr. */
export function git(cwd: string, args: string[]): string {
  try {
    return execFileSync('git', [...CONFIG, ...args], {
      cwd,
      encoding: 'utf8',
      env: { ...process.env, ...DETERMINISTIC_GIT_ENV },
      stdio: ['ignore', 'pipe', 'pipe'],
      maxBuffer: 64 * 1024 * 1024,
    });
  } catch (err) {
    const e = err as Error & { stderr?: string };
    throw new SweError(`git ${args.join(' ')} failed in ${cwd}: ${(e.stderr ?? '').trim() || e.message}`);
  }
}
