import { createHash } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { execFileSync } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import {
  BashIncorrectSyntaxError,
  CommandTimeoutError,
  NoExitCodeError,
  NonZeroExitCodeError,
  SessionClosedError,
} from '../../lib/shell/errors.js';
import { MAX_TYPED_LINE, ShellProtocol } from '../../lib/shell/protocol.js';
import type { ShellSession } from '../../lib/shell/session.js';
import { startTestSession } from './helpers.js';
import { waitFor } from '../helpers.js';

let s: ShellSession;
let dir: string;

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'shell-test-'));
  s = await startTestSession();
});

afterAll(async () => {
  await s?.close();
  rmSync(dir, { recursive: true, force: true });
});

describe('state persists across runs', () => {
  test('cd and export', async () => {
    await s.run(`cd ${dir}`);
    await s.run('export MS_FOO="bar baz"');
    expect((await s.run('pwd')).output).toBe(`${dir}\n`);
    expect((await s.run('echo "$MS_FOO"')).output).toBe('bar baz\n');
    // A child process sees the export.
    expect((await s.run('bash -c \'echo "$MS_FOO"\'')).output).toBe('bar baz\n');
  });

  test('shell function', async () => {
    await s.run('greet() { echo "hello $1"; }');
    expect((await s.run('greet world')).output).toBe('hello world\n');
  });

  test('background job is visible with jobs / kill %1 in the next run', async () => {
    const start = await s.run('sleep 30 &');
    expect(start.exitCode).toBe(0);
    expect(start.output).toMatch(/^\[1\] \d+/);
    expect((await s.run('jobs')).output).toMatch(/\[1\]\+\s+Running\s+sleep 30 &/);
    const killed = await s.run('kill %1; wait %1', { check: 'silent' });
    expect(killed.exitCode).toBe(143); // 128 + SIGTERM
    expect((await s.run('jobs')).output).toBe('');
  });
});

describe('exit codes', () => {
  test('simple, subshell, pipelines', async () => {
    expect((await s.run('false', { check: 'silent' })).exitCode).toBe(1);
    expect((await s.run('true')).exitCode).toBe(0);
    expect((await s.run('(exit 3)', { check: 'silent' })).exitCode).toBe(3);
    expect((await s.run('true | false', { check: 'silent' })).exitCode).toBe(1);
    expect((await s.run('false | true', { check: 'silent' })).exitCode).toBe(0);
  });

  test('multi-line and several top-level commands give one result with the last code', async () => {
    const r = await s.run('echo a\nfalse\necho b', { check: 'silent' });
    expect(r).toEqual({ output: 'a\nb\n', exitCode: 0, expectString: '', failureReason: '' });
    const r2 = await s.run('echo a; echo b\n(exit 7) # trailing comment', { check: 'silent' });
    expect(r2.output).toBe('a\nb\n');
    expect(r2.exitCode).toBe(7);
  });

  test("check 'raise' throws NonZeroExitCodeError with output and code", async () => {
    const err = await s.run('echo oops; exit_code_7() { return 7; }; exit_code_7', { errorMsg: 'ctx' }).catch((e) => e);
    expect(err).toBeInstanceOf(NonZeroExitCodeError);
    expect(err.exitCode).toBe(7);
    expect(err.output).toBe('oops\n');
    expect(err.message).toMatch(/^ctx: Command .* failed with exit code 7/);
    expect(err.swerexClassPath).toBe('swerex.exceptions.NonZeroExitCodeError');
    expect(err.toSwerexException().extra_info).toMatchObject({ exit_code: 7 });
  });

  test("check 'ignore' returns exitCode null", async () => {
    const r = await s.run('echo x; false', { check: 'ignore' });
    expect(r.output).toBe('x\n');
    expect(r.exitCode).toBeNull();
  });

  test('a line aborted before the probe reports no exit code', async () => {
    // stdout redirected away from the pty: the probe is lost, the prompt (on stderr) is not.
    const f = join(dir, 'redirected');
    const r = await s.run(`exec 9>&1 >${f}; echo hidden`, { check: 'silent' });
    expect(r.exitCode).toBeNull();
    expect(r.failureReason).toMatch(/without reporting an exit code/);
    await expect(s.run('echo still-hidden')).rejects.toBeInstanceOf(NoExitCodeError);
    await s.run('exec >&9 9>&-', { check: 'silent' });
    expect((await s.run('echo visible')).output).toBe('visible\n');
  });
});

describe('command text', () => {
  test('heredoc and multi-line for loop', async () => {
    const f = join(dir, 'heredoc.txt');
    const r = await s.run(`cat > ${f} <<'EOF'\nliteral $HOME\n\tTabbed!\nEOF\ncat ${f}`);
    expect(r.output).toBe('literal $HOME\n\tTabbed!\n');
    const loop = await s.run('for i in 1 2 3; do\n  echo "n=$i"\ndone');
    expect(loop.output).toBe('n=1\nn=2\nn=3\n');
  });

  test('quotes, backslashes, history characters, tabs and non-ASCII pass through unchanged', async () => {
    const r = await s.run(`printf '%s|' 'it'"'"'s' "a\\\\b" 'wow!' "!!" $'t\\tx' 'héllo ✓'; echo`);
    expect(r.output).toBe("it's|a\\b|wow!|!!|t\tx|héllo ✓|\n");
  });

  test('set -x shows the command, not the wrapper', async () => {
    const r = await s.run('set -x; echo "a\nb"; set +x');
    expect(r.output).toBe("++ echo 'a\nb'\na\nb\n++ set +x\n");
  });

  test('output without a trailing newline', async () => {
    expect((await s.run('printf red')).output).toBe('red');
  });

  test('a large command (200 KB heredoc)', async () => {
    const body = Array.from({ length: 4000 }, (_, i) => `line ${i} ${'x'.repeat(40)}`).join('\n');
    const f = join(dir, 'big.txt');
    const r = await s.run(`cat > ${f} <<'EOF'\n${body}\nEOF\nwc -l < ${f}`);
    expect(r.output.trim()).toBe('4000');
  });

  test('syntax errors are detected before running', async () => {
    for (const bad of ['echo "unclosed', 'if true; then echo x', 'for i in; do']) {
      const err = await s.run(bad).catch((e) => e);
      expect(err).toBeInstanceOf(BashIncorrectSyntaxError);
      expect(err.bashStderr).toMatch(/syntax error|unexpected EOF/);
      expect(err.extraInfo).toHaveProperty('bash_stderr');
      expect(err.swerexClassPath).toBe('swerex.exceptions.BashIncorrectSyntaxError');
    }
    expect((await s.run('echo fine')).output).toBe('fine\n');
  });
});

describe('terminal output', () => {
  test('ANSI colours are stripped', async () => {
    expect((await s.run(`printf '\\e[31mred\\e[0m \\e[1;32mgreen\\e[0m\\n'`)).output).toBe('red green\n');
    expect((await s.run(`printf '\\e]0;title\\a%s\\n' x`)).output).toBe('x\n');
  });

  test('\\r\\n is normalised', async () => {
    const r = await s.run("printf 'a\\r\\nb\\n'; echo c");
    expect(r.output).toBe('a\nb\nc\n');
    expect(r.output).not.toContain('\r');
  });
});

describe('timeouts and interrupts', () => {
  test('sleep 10 with a 300 ms timeout, then interrupt, then echo ok quickly', async () => {
    const t0 = Date.now();
    const err = await s.run('sleep 10', { timeoutMs: 300 }).catch((e) => e);
    expect(err).toBeInstanceOf(CommandTimeoutError);
    expect(err.swerexClassPath).toBe('swerex.exceptions.CommandTimeoutError');
    expect(Date.now() - t0).toBeLessThan(2000);
    const intr = await s.interrupt();
    expect(intr.exitCode).toBe(0);
    const t1 = Date.now();
    expect((await s.run('echo ok')).output).toBe('ok\n');
    expect(Date.now() - t1).toBeLessThan(1000);
    expect(Date.now() - t0).toBeLessThan(3000);
  });

  test('interruptOnTimeout interrupts and still reports the timeout', async () => {
    const err = await s.run('echo started; sleep 10', { timeoutMs: 300, interruptOnTimeout: true }).catch((e) => e);
    expect(err).toBeInstanceOf(CommandTimeoutError);
    expect(err.interrupted).toBe(true);
    expect(err.output).toContain('started');
    expect((await s.run('echo ok')).output).toBe('ok\n');
  });

  test('a program that ignores Ctrl-C is stopped and killed (Ctrl-Z + kill -9)', async () => {
    await expect(s.run(`sh -c 'trap "" INT; sleep 30'`, { timeoutMs: 200 })).rejects.toBeInstanceOf(
      CommandTimeoutError,
    );
    const r = await s.interrupt({ timeoutMs: 200, retries: 2 });
    expect(r.output).toMatch(/Stopped/);
    expect((await s.run('echo ok')).output).toBe('ok\n');
    expect((await s.run('jobs')).output).toBe('');
  });

  test('a stale command that finishes late does not confuse the next run', async () => {
    await expect(s.run('sleep 0.4; echo late', { timeoutMs: 100 })).rejects.toBeInstanceOf(CommandTimeoutError);
    // Typed while the old line still runs; SWE-ReX semantics: it waits behind it.
    const r = await s.run('echo fresh', { timeoutMs: 3000 });
    expect(r.output).toBe('late\nfresh\n');
    expect(r.exitCode).toBe(0);
  });
});

describe('bounded output', () => {
  test('yes with a short timeout stays bounded and is interrupted', async () => {
    const small = await startTestSession({ maxOutputBytes: 64 * 1024 });
    try {
      const before = process.memoryUsage().rss;
      const err = await small.run('yes', { timeoutMs: 1500, interruptOnTimeout: true }).catch((e) => e);
      expect(err).toBeInstanceOf(CommandTimeoutError);
      expect(err.interrupted).toBe(true);
      const m = /\[\.\.\. (\d+) bytes truncated \.\.\.\]/.exec(err.output);
      expect(m).not.toBeNull();
      expect(Number(m![1])).toBeGreaterThan(64 * 1024);
      expect(err.output.length).toBeLessThan(64 * 1024 + 200);
      expect(err.output.startsWith('y\ny\n')).toBe(true);
      const grew = (process.memoryUsage().rss - before) / 2 ** 20;
      console.log(`yes: ${m![1]} bytes dropped, output kept ${err.output.length} chars, rss +${grew.toFixed(1)} MiB`);
      expect((await small.run('echo ok')).output).toBe('ok\n');
    } finally {
      await small.close();
    }
  });

  test('large finite output is truncated in the middle, exit code intact', async () => {
    const small = await startTestSession({ maxOutputBytes: 32 * 1024 });
    try {
      const r = await small.run('seq 1 200000; echo END');
      expect(r.exitCode).toBe(0);
      expect(r.output.startsWith('1\n2\n3\n')).toBe(true);
      expect(r.output.endsWith('199999\n200000\nEND\n')).toBe(true);
      expect(r.output).toMatch(/\n\[\.\.\. \d+ bytes truncated \.\.\.\]\n/);
      expect(r.output.length).toBeLessThan(32 * 1024 + 100);
    } finally {
      await small.close();
    }
  });

  test("truncate: 'head' keeps only the tail", async () => {
    const small = await startTestSession({ maxOutputBytes: 32 * 1024, truncate: 'head' });
    try {
      const r = await small.run('seq 1 200000');
      expect(r.output.startsWith('\n[... ')).toBe(true);
      expect(r.output.endsWith('200000\n')).toBe(true);
    } finally {
      await small.close();
    }
  });
});

describe('interactive programs', () => {
  const hasPython = (() => {
    try {
      execFileSync('python3', ['-c', 'pass'], { stdio: 'ignore' });
      return true;
    } catch {
      return false;
    }
  })();

  test.skipIf(!hasPython)('python3 -i driven with expect strings', async () => {
    const start = await s.run('python3 -i -q', { expect: ['>>> '], timeoutMs: 10_000 });
    expect(start.expectString).toBe('>>> ');
    expect(start.exitCode).toBeNull(); // still running
    const r = await s.runInteractive('print(6 * 7)', { expect: ['>>> '], timeoutMs: 5000 });
    expect(r).toEqual({ output: '42', exitCode: 0, expectString: '>>> ', failureReason: '' });
    const multi = await s.runInteractive('for i in range(2):\n    print("i", i)\n', { expect: ['>>> '], timeoutMs: 5000 });
    expect(multi.output).toMatch(/i 0\ni 1$/);
    const q = await s.quitInteractive('exit()', { timeoutMs: 5000 });
    expect(q.exitCode).toBe(0);
    expect((await s.run('echo back')).output).toBe('back\n');
  });

  test('a read loop (cat-like) driven with expect strings, quit with Ctrl-D', async () => {
    await s.run(`while IFS= read -r -p 'ask> ' l; do echo "got:$l"; done`, { expect: ['ask> '], timeoutMs: 5000 });
    const r = await s.runInteractive('hello world', { expect: ['ask> '], timeoutMs: 5000 });
    expect(r.output).toBe('got:hello world');
    const q = await s.quitInteractive('\x04', { timeoutMs: 5000 });
    expect(q.exitCode).toBe(0);
    expect((await s.run('echo $((1+1))')).output).toBe('2\n');
  });

  test('interactive timeout raises CommandTimeoutError', async () => {
    await s.run('cat', { expect: ['never-printed'], timeoutMs: 200 }).catch((e) => e);
    const err = await s.runInteractive('abc', { expect: ['zzz'], timeoutMs: 200 }).catch((e) => e);
    expect(err).toBeInstanceOf(CommandTimeoutError);
    await s.interrupt();
    expect((await s.run('echo ok')).output).toBe('ok\n');
  });
});

describe('concurrency and speed', () => {
  test('two runs issued at once are serialized', async () => {
    const order: string[] = [];
    const a = s.run('sleep 0.2; echo a').then((r) => (order.push('a'), r));
    const b = s.run('echo b').then((r) => (order.push('b'), r));
    const [ra, rb] = await Promise.all([a, b]);
    expect(ra.output).toBe('a\n');
    expect(rb.output).toBe('b\n');
    expect(order).toEqual(['a', 'b']);
  });

  test('many concurrent runs keep their own output', async () => {
    const rs = await Promise.all(Array.from({ length: 20 }, (_, i) => s.run(`echo n${i}`)));
    rs.forEach((r, i) => expect(r.output).toBe(`n${i}\n`));
  });

  test('round trip of `true` (median of 200)', async () => {
    const times: number[] = [];
    for (let i = 0; i < 200; i++) {
      const t = process.hrtime.bigint();
      await s.run('true');
      times.push(Number(process.hrtime.bigint() - t) / 1e6);
    }
    times.sort((x, y) => x - y);
    const median = times[100]!;
    console.log(`round trip of \`true\`: median ${median.toFixed(2)} ms, p90 ${times[180]!.toFixed(2)} ms`);
    // A command with quotes goes through the host `bash -n` check (a process spawn).
    const t3: number[] = [];
    for (let i = 0; i < 50; i++) {
      const t = process.hrtime.bigint();
      await s.run("true 'x'");
      t3.push(Number(process.hrtime.bigint() - t) / 1e6);
    }
    t3.sort((x, y) => x - y);
    console.log(`round trip of \`true 'x'\` (with bash -n spawn): median ${t3[25]!.toFixed(2)} ms`);
  });
});

describe('long commands (typed as a chain of lines, each under the terminal\'s line limit)', () => {
  // Every byte value but NUL, multi-byte characters, quotes, `!`, and
  // control characters the line discipline would act on if typed raw.
  const body = Array.from({ length: 2500 }, (_, i) => `${i}: 'q' "d" \\ $HOME !x é€😀 ${String.fromCharCode(1 + (i % 126))}\r\x03\x04\x15`).join('\n');
  const heredoc = (file: string) => `cat > ${file} <<'MSBX_EOF'\n${body}\nMSBX_EOF\nsha256sum < ${file} | cut -c1-64; wc -c < ${file}`;
  const expected = () => {
    const bytes = Buffer.from(body + '\n', 'utf8');
    return `${createHash('sha256').update(bytes).digest('hex')}\n${bytes.length}\n`;
  };

  for (const readline of [false, true]) {
    test(`a ${Math.round(body.length / 1024)} KB heredoc arrives byte for byte (${readline ? 'with' : 'without'} readline)`, async () => {
      const t = readline ? await startTestSession({ readline: true }) : s;
      try {
        const cmd = heredoc(join(dir, `heredoc-${readline}`));
        expect(protocolLines(cmd).length).toBeGreaterThan(20);
        const started = performance.now();
        const r = await t.run(cmd, { timeoutMs: 60_000 });
        console.log(`${Buffer.byteLength(cmd)} B heredoc ${readline ? 'with' : 'without'} readline: ${(performance.now() - started).toFixed(0)} ms`);
        expect(r.output).toBe(expected());
        expect((await t.run('echo "[$__ms_c][$__ms_k]"')).output).toBe('[][]\n');
      } finally {
        if (readline) await t.close();
      }
    });
  }

  test('a chain partly read by a program still running on the terminal runs nothing of it, and says so', async () => {
    const t = await startTestSession();
    try {
      const eaten = join(dir, 'eaten');
      const ran = join(dir, 'ran');
      await expect(t.run(`head -n 2 > ${eaten}`, { timeoutMs: 300 })).rejects.toThrow(CommandTimeoutError);
      // Its first two lines go to head; the rest reach the shell.
      const cmd = `touch ${ran}; : ${'x'.repeat(3 * MAX_TYPED_LINE)}`;
      expect(protocolLines(cmd).length).toBeGreaterThan(3);
      const r = await t.run(cmd, { check: 'silent', timeoutMs: 10_000 });
      expect(r.exitCode).toBe(1);
      expect(r.output).toContain('part of this command was read by a program still running on the terminal; nothing of it was run');
      expect(existsSync(ran)).toBe(false);
      expect(readFileSync(eaten, 'utf8').split('\n')).toHaveLength(3); // two lines, then the end
      // The session goes on as before.
      expect((await t.run(`touch ${ran} && echo ok`)).output).toBe('ok\n');
      expect(existsSync(ran)).toBe(true);
    } finally {
      await t.close();
    }
  });

  test('an environment variable longer than a typed line, and every startup line under the limit', async () => {
    const big = `${'é'.repeat(4000)}'\n!\\$x`;
    const t = await startTestSession({ env: { MS_BIG: big, MS_SMALL: 'a b' } });
    try {
      expect((await t.run('printf %s "$MS_BIG" | sha256sum | cut -c1-64')).output).toBe(`${createHash('sha256').update(big).digest('hex')}\n`);
      // Bytes, not ${#MS_BIG}: that counts characters in the locale, which is C for an unprivileged user's env -i.
      expect((await t.run('bash -c \'printf %s "$MS_BIG" | wc -c; echo "$MS_SMALL"\'')).output).toBe(`${Buffer.byteLength(big)}\na b\n`);
      expect(t.startupOutput).toBe('');
    } finally {
      await t.close();
    }
    const lines = new ShellProtocol('n').startupLines({ env: { MS_BIG: big, A: 'x'.repeat(10_000) }, startupSource: ['/x'] });
    expect(lines.length).toBeGreaterThan(3);
    for (const l of lines) expect(l.length).toBeLessThanOrEqual(MAX_TYPED_LINE);
  });

  test('every typed line stays under the limit, whatever the command and run number', () => {
    const p = new ShellProtocol('0123456789ab');
    for (const n of [0, 1, 3700, 3800, 3900, 20_000]) {
      for (const id of [1, 99_999_999]) {
        for (const ch of ['x', '\x01', 'é']) {
          const lines = p.commandLines(ch.repeat(n), id);
          for (const l of lines) expect(l.length).toBeLessThanOrEqual(MAX_TYPED_LINE);
          if (lines.length === 1) expect(lines[0]).toContain(`__ms_id=${id}; builtin eval $'`);
        }
      }
    }
  });
});

function protocolLines(cmd: string): string[] {
  return new ShellProtocol('n').commandLines(cmd, 1);
}

describe('startup and close', () => {
  test('startup files are sourced and env is exported', async () => {
    const rc = join(dir, 'rc.sh');
    writeFileSync(rc, 'echo sourcing; export FROM_RC=1; PS1="user> "; PROMPT_COMMAND="echo pc"\n');
    const t = await startTestSession({ startupSource: [rc], env: { MS_ENV: "a b'c" } });
    try {
      expect(t.startupOutput).toBe('sourcing\n');
      expect((await t.run('echo "$FROM_RC $MS_ENV"')).output).toBe("1 a b'c\n");
    } finally {
      await t.close();
    }
  });

  test('close is idempotent and later calls reject with SessionClosedError', async () => {
    const t = await startTestSession();
    // Jobs must neither keep the shell alive nor outlive the session.
    const running = Number((await t.run('sleep 60 & echo $!')).output.split('\n').at(-2));
    const stopped = Number((await t.run('sleep 61 & kill -STOP $!; echo $!')).output.split('\n').at(-2));
    await Promise.all([t.close(), t.close()]);
    const gone = (pid: number) => {
      try {
        process.kill(pid, 0);
        return false;
      } catch {
        return true;
      }
    };
    // Killed at close; a loaded machine may take a moment to reap them.
    for (const pid of [running, stopped]) expect(await waitFor(() => gone(pid), 5000)).toBe(true);
    await t.close();
    expect(t.isClosed).toBe(true);
    const err = await t.run('echo x').catch((e) => e);
    expect(err).toBeInstanceOf(SessionClosedError);
    expect(err.swerexClassPath).toBe('swerex.exceptions.SessionNotInitializedError');
  });

  test('close while a command runs rejects it and queued calls', async () => {
    const t = await startTestSession();
    const running = t.run('sleep 30').catch((e) => e);
    const queued = t.run('echo never').catch((e) => e);
    await new Promise((r) => setTimeout(r, 100));
    const t0 = Date.now();
    await t.close();
    expect(Date.now() - t0).toBeLessThan(3000);
    expect(await running).toBeInstanceOf(SessionClosedError);
    expect(await queued).toBeInstanceOf(SessionClosedError);
  });

  test('`exit` ends the session', async () => {
    const t = await startTestSession();
    const err = await t.run('exit 0').catch((e) => e);
    expect(err).toBeInstanceOf(SessionClosedError);
    await expect(t.run('true')).rejects.toBeInstanceOf(SessionClosedError);
    await t.close();
  });
});

describe('syntax fast path', async () => {
  const { isTriviallyValid } = await import('../../lib/shell/syntax.js');
  test('only plain one-line word lists skip bash -n', () => {
    expect(isTriviallyValid('true')).toBe(true);
    expect(isTriviallyValid('ls -la /tmp')).toBe(true);
    for (const t of ['done', 'if', 'echo "x', 'a; b', 'echo $x', 'a\nb', 'f()', 'x && y', '{', 'echo `x`']) {
      expect(isTriviallyValid(t)).toBe(false);
    }
  });
});
