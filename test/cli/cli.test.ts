import { spawnSync } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { cli as runCli } from './helpers.js';

const cli = (...args: string[]) => runCli(args);

describe('minisandbox run', () => {
  it('passes the exit code through and applies bwrap-style options', () => {
    const r = cli('run', '--ro-bind', '/etc/os-release', '/info', '--env', 'GREETING=hi', '--hostname', 'box', '--', 'sh', '-c', 'head -c 5 /info; echo; echo $GREETING $(hostname); exit 42');
    expect(r.status).toBe(42);
    expect(r.stdout).toMatch(/^\S{1,5}\nhi box\n$/);
  });

  it('reports a signal as 128+N', () => {
    expect(cli('run', '--', 'sh', '-c', 'kill -9 $$').status).toBe(137);
  });

  it('kills the sandbox at --timeout', () => {
    const r = cli('run', '--timeout', '0.3', '--', 'sleep', '30');
    expect(r.status).toBe(137);
    expect(r.stderr).toContain('timed out');
  });

  it('sets the seccomp filter and nesting', () => {
    const denied = cli('run', '--seccomp-deny', 'mkdir', '--seccomp-deny', 'mkdirat', '--', 'mkdir', '/tmp/x');
    expect(denied.status).toBe(1);
    expect(denied.stderr).toContain('Operation not permitted');
    expect(cli('run', '--', 'unshare', '-U', 'true').status).toBe(1);
    const nested = cli('run', '--nesting', '--', 'unshare', '-Ur', 'id', '-u');
    expect({ status: nested.status, stdout: nested.stdout }).toEqual({ status: 0, stdout: '0\n' });
    expect(cli('run', '--seccomp', 'none', '--', 'grep', '-q', 'Seccomp:.0', '/proc/self/status').status).toBe(0);
    const unknown = cli('run', '--seccomp-deny', 'nosuch', '--', 'true');
    expect(unknown.status).toBe(125);
    expect(unknown.stderr).toContain("--seccomp-deny: unknown syscall 'nosuch'");
    expect(cli('run', '--seccomp', 'strict', '--', 'true').stderr).toContain("--seccomp: expected default or none, got 'strict'");
  });

  it('explains each option in --help', () => {
    const r = cli('run', '--help');
    expect(r.status).toBe(0);
    for (const opt of ['--ro-bind', '--bind', '--tmpfs', '--overlay', '--net', '--chdir', '--env', '--seccomp', '--nesting']) expect(r.stdout).toContain(opt);
  });

  it('gives clear errors for bad usage and bad sandboxes', () => {
    const unknown = cli('run', '--frobnicate', '--', 'true');
    expect(unknown.status).toBe(2);
    expect(unknown.stderr).toContain("unknown option '--frobnicate'");
    const missing = cli('run', '--bind', '/does/not/exist', '/x', '--', 'true');
    expect(missing.status).toBe(125);
    expect(missing.stderr).toContain('bind source /does/not/exist does not exist');
    expect(cli('run', '--ro-bind', '/etc').stderr).toContain('--ro-bind needs 2 values');
    // A command's own --help is the command's, not run's.
    expect(cli('run', '--', 'sh', '-c', 'echo "$1"', 'sh', '--help').stdout).toBe('--help\n');
  });
});

describe('minisandbox doctor', () => {
  it('reports each kernel feature as JSON', () => {
    const r = cli('doctor', '--json');
    const checks = JSON.parse(r.stdout) as { name: string; ok: boolean }[];
    expect(checks.map((c) => c.name)).toEqual(expect.arrayContaining(['kernel', 'overlayfs (userxattr)', 'cgroups']));
    expect(checks.find((c) => c.name.startsWith('user+mount'))?.ok).toBe(true);
    expect(r.status).toBe(0);
  });
});

describe('minisandbox env and store', () => {
  it('builds an env into a store, lists it with its users, and gc keeps what is used', () => {
    const store = mkdtempSync(join(tmpdir(), 'msbx-cli-store-'));
    try {
      const python = ['3.11', '3.12', '3.13', '3.10'].find((v) => spawnSync('sh', ['-c', `ls -d /root/.pyenv/versions/${v}.* /usr/bin/python${v} 2>/dev/null`]).stdout.length > 0);
      if (!python) return; // no Python on this machine: nothing to build from
      const built = cli('env', 'build', '--python', python, '--name', 'cli-test', '--run', 'python -c "print(1)"', '--store', store, '--json');
      expect(built.stderr).toBe('');
      expect(built.status).toBe(0);
      const env = JSON.parse(built.stdout) as { id: string; venv: string; reused: boolean };
      expect(env.reused).toBe(false);
      // The same recipe again: the env of the first build, nothing new stored.
      const again = cli('env', 'build', '--python', python, '--name', 'other label', '--run', 'python -c "print(1)"', '--store', store);
      expect(again.status).toBe(0);
      expect(again.stdout).toMatch(new RegExp(`^reused env ${env.id}, built \\d{4}-`));
      const ls = JSON.parse(cli('store', 'ls', '--store', store, '--json').stdout) as { digest: string; users: string[] }[];
      expect(ls).toHaveLength(1);
      expect(ls[0]!.users.join()).toContain(env.id);
      expect(cli('store', 'gc', '--store', store).stdout).toContain('removed 0 unused layer');
      expect(cli('store', 'du', '--store', store).stdout).toMatch(/1 layers/);
      expect(cli('store', 'frob').status).toBe(2);
    } finally {
      spawnSync('sh', ['-c', `chmod -R u+w '${store}' && rm -rf '${store}'`]);
    }
  }, 120_000);
});
