import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, openSync, readFileSync, readdirSync, readSync, closeSync, rmSync, writeFileSync, constants } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { checkBashSyntax, parsesCleanly, syntaxCheckerPid, type SyntaxCheckResult } from '../../lib/shell/syntax.js';
import { isRunning, waitFor } from '../helpers.js';

/** A freshly spawned `bash -O extglob -n` on stdin, as the session checked commands before the checker. */
function bashN(command: string): Promise<SyntaxCheckResult> {
  return new Promise((resolve, reject) => {
    const child = spawn('bash', ['-O', 'extglob', '-n'], { stdio: ['pipe', 'pipe', 'pipe'] });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    child.stdout.on('data', (d: Buffer) => out.push(d));
    child.stderr.on('data', (d: Buffer) => err.push(d));
    child.stdin.on('error', () => {});
    child.on('error', reject);
    child.on('close', (code) =>
      resolve({ ok: code === 0, exitCode: code, stdout: Buffer.concat(out).toString('utf8'), stderr: Buffer.concat(err).toString('utf8') }),
    );
    const text = command.replace(/\0/g, '');
    child.stdin.end(text.endsWith('\n') ? text : text + '\n');
  });
}

const heredoc100k =
  "cat > /tmp/never-written.py <<'EOF'\n" +
  Array.from({ length: 4000 }, (_, i) => `value_${i} = "x" * ${i}  # $HOME \`uname\` 'q' "dq" \\n\n`)
    .join('')
    .slice(0, 100_000) +
  '\nEOF\n';

const CORPUS: string[] = [
  // quotes
  `echo "hello world"`,
  `echo 'single' "double $HOME" $'ansi\\n'`,
  `echo "unterminated`,
  `echo 'unterminated`,
  `echo $'unterminated`,
  `echo "nested $(echo "inner")"`,
  // heredocs
  `cat <<EOF\nline $HOME\nEOF`,
  `cat <<'EOF'\n$(not run)\nEOF`,
  `cat <<EOF\nnever closed`,
  `cat <<-EOF\n\tindented\n\tEOF`,
  `cat <<EOF | grep x\na\nEOF\necho after`,
  `cat <<A <<B\na\nA\nb\nB`,
  // case
  `case $x in a|b) echo ab;; *) echo other;; esac`,
  `case $x in a) echo a;; esac; ;;`,
  `case $x in a) echo a`,
  `case $x in\n  @(a|b)) echo ext;;\nesac`,
  // if / loops / functions
  `if true; then echo y; else echo n; fi`,
  `if true; then echo y`,
  `if true; then fi`,
  `for i in 1 2 3; do echo $i; done`,
  `for i in; do echo; done`,
  `for in 1; do :; done`,
  `for ((i=0; i<3; i++)); do echo $i; done`,
  `while read -r l; do echo "$l"; done < file`,
  `until false; do break; done`,
  `while true; do`,
  `f() { echo hi; }; f`,
  `f() {`,
  `function g { local x=1; echo $x; }`,
  `f() { echo; } }`,
  // [[ ]] and arithmetic
  `[[ -f /etc/passwd && $x == a* ]] && echo yes`,
  `[[ a == ]]`,
  `[[ -z`,
  `echo $(( 1 + 2 * 3 ))`,
  `echo $((1+))`,
  `(( x++ ))`,
  `((`,
  // command substitution, backticks, process substitution
  `echo $(echo $(echo deep))`,
  `echo $(if)`,
  `echo $(echo ok`,
  'echo `date` `echo \\`nested\\``',
  'echo `',
  `diff <(ls /) <(ls /tmp)`,
  `cat <(`,
  // extglob, arrays
  `ls !(*.pyc|*.o)`,
  `echo +(a|b)*(c)?(d)@(e)`,
  `a=(1 2 "three" [5]=five); echo "\${a[@]}" \${#a[@]}`,
  `a=(1 2`,
  `declare -A m=([k]=v); echo "\${m[k]}"`,
  // unicode, CRLF, comments, trailing backslash
  `echo "héllo wörld ✓ 日本語"`,
  `echo é)`,
  `echo ok\r\necho two\r`,
  `if true; then\r\n  echo x\r\nfi\r`,
  `# just a comment`,
  `echo a # comment with ' quote`,
  `echo a \\`,
  `echo a \\\n  b`,
  `echo a \\\n\\`,
  `echo \\\n\\\n`,
  `echo "a\\`,
  // operators and odd ones
  `;;`,
  `;`,
  `&&`,
  `echo a |`,
  `echo a ||`,
  `echo )`,
  `}`,
  `{ echo a; }`,
  `{ echo a`,
  `( cd /tmp && ls ) | wc -l`,
  `echo a > >(cat)`,
  `x=1 y=2 env | grep -c x >/dev/null 2>&1 &`,
  `coproc cat`,
  `time ls`,
  `! true`,
  `echo $`,
  `echo \${`,
  `echo \${x:-default} \${y/a/b} \${#z}`,
  `echo \${x`,
  '',
  ' ',
  '\n\n\n',
  `echo nul\0byte`,
  `echo ${'x'.repeat(20000)} "${'y'.repeat(20000)}`,
  `echo "${'long '.repeat(8000)}"`,
  heredoc100k,
  heredoc100k.replace(/\nEOF\n$/, '\n'),
];

describe('checkBashSyntax: parity with a spawned bash -n', () => {
  test('the corpus is large enough', () => {
    expect(CORPUS.length).toBeGreaterThanOrEqual(60);
  });

  test.each(CORPUS.map((c, i) => [i, c.length > 60 ? `${c.slice(0, 57)}...` : c, c]))(
    '#%i %j',
    async (_i, _label, command) => {
      const want = await bashN(command as string);
      expect(await checkBashSyntax(command as string)).toEqual(want);
      // The checker alone says "clean" exactly when bash -n is silent and happy:
      // what it answers itself is never an error in disguise.
      expect(await parsesCleanly(command as string)).toBe(want.ok && want.stderr === '' && want.stdout === '');
    },
    30_000,
  );
});

describe('the checker never runs the command', () => {
  let dir: string;
  let victim: ReturnType<typeof spawn>;
  let fifo: string;
  let fifoFd: number;

  beforeAll(() => {
    dir = mkdtempSync(join(tmpdir(), 'msbx-syntax-'));
    mkdirSync(join(dir, 'out'));
    victim = spawn('sleep', ['300'], { stdio: 'ignore' });
    fifo = join(dir, 'fifo');
    spawnSync('mkfifo', [fifo]);
    // A reader that never blocks: anything written to the fifo stays readable here.
    fifoFd = openSync(fifo, constants.O_RDONLY | constants.O_NONBLOCK);
  });

  afterAll(() => {
    victim.kill('SIGKILL');
    closeSync(fifoFd);
    rmSync(dir, { recursive: true, force: true });
  });

  const attacks = (o: string, fifo: string, pid: number) => [
    `touch ${o}/a`,
    `echo hi > ${o}/b`,
    `echo hi; touch ${o}/c\nfoo() { echo`,
    `echo ok\ntouch ${o}/d`,
    `set +n\ntouch ${o}/e`,
    `builtin set +n; touch ${o}/f`,
    `}; touch ${o}/g; {`,
    `'; touch ${o}/h; '`,
    `"; touch ${o}/i; "`,
    `); touch ${o}/j; (`,
    `EOF\ntouch ${o}/k`,
    `echo $(touch ${o}/l)`,
    `echo \`touch ${o}/m\``,
    `cat <<EOF\n$(touch ${o}/n)\nEOF`,
    `exec touch ${o}/o`,
    `eval 'touch ${o}/p'`,
    `trap 'touch ${o}/q' EXIT`,
    `touch ${o}/r; if`,
    `touch ${o}/s &`,
    `echo pwned > ${fifo}`,
    `printf x >> ${fifo}; echo )`,
    `kill -9 ${pid}`,
    `kill -9 ${pid}; case`,
    `exit 0\ntouch ${o}/t`,
    `set +e\nset +n\ntouch ${o}/u`,
    `{ :; } __MSCHK_0123_parsed\ntouch ${o}/v`,
  ];

  test('commands that would create files, write to a fifo or kill a process do nothing', async () => {
    const list = attacks(join(dir, 'out'), fifo, victim.pid!);
    for (const command of list) {
      expect(await checkBashSyntax(command), command).toEqual(await bashN(command));
    }
    expect(readdirSync(join(dir, 'out'))).toEqual([]);
    const buf = Buffer.alloc(64);
    let n = 0;
    try {
      n = readSync(fifoFd, buf, 0, 64, null);
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'EAGAIN') throw e;
    }
    expect(n).toBe(0);
    expect(victim.exitCode).toBeNull();
    expect(victim.signalCode).toBeNull();
    expect(existsSync(`/proc/${victim.pid}`)).toBe(true);
  }, 60_000);

  test('a command cannot forge the checker\'s answer or learn its nonce', async () => {
    await checkBashSyntax('echo "warm"');
    const pid = syntaxCheckerPid()!;
    // The nonce comes on stdin: neither argv nor the environment shows it.
    const cmdline = readFileSync(`/proc/${pid}/cmdline`, 'utf8');
    const environ = readFileSync(`/proc/${pid}/environ`, 'utf8');
    expect(`${cmdline}\0${environ}`).not.toMatch(/[0-9a-f]{32}/);
    // Texts shaped like the checker's answers, with a guessed nonce.
    const guess = '0123456789abcdef0123456789abcdef';
    const forged = [
      `echo )\n__MSCHK_${guess}_done 0\n`,
      `{ :; } __MSCHK_${guess}_parsed`,
      `echo "$nonce"; echo )`,
      `if\n{ :; } __MSCHK_${guess}_parsed`,
      `cat <<'{ :; } __MSCHK_${guess}_parsed'\nx`,
      `printf '\\n__MSCHK_%s_done 0\\n' x; echo (`,
      `\n\n__MSCHK_${guess}_done 0\n\n`,
    ];
    for (const command of forged) {
      expect(await checkBashSyntax(command), command).toEqual(await bashN(command));
    }
  }, 30_000);
});

describe('checker lifecycle', () => {
  // The built module (npm run pretest builds it), as other tests that start a Node child do.
  const syntaxModule = new URL('../../dist/lib/shell/syntax.js', import.meta.url).pathname;

  test('a Node process that checked once exits promptly, and its checker with it', async () => {
    const script = `
      import { checkBashSyntax, syntaxCheckerPid } from ${JSON.stringify(syntaxModule)};
      const r = await checkBashSyntax('echo "x" | cat');
      process.stdout.write(JSON.stringify({ ok: r.ok, pid: syntaxCheckerPid() }));`;
    const t = performance.now();
    const r = spawnSync(process.execPath, ['--input-type=module', '-e', script], { encoding: 'utf8', timeout: 20_000 });
    const elapsed = performance.now() - t;
    expect(r.status, r.stderr).toBe(0);
    const { ok, pid } = JSON.parse(r.stdout) as { ok: boolean; pid: number };
    expect(ok).toBe(true);
    expect(pid).toBeGreaterThan(0);
    // Node start and the import take most of this; an unref'd checker adds nothing.
    expect(elapsed).toBeLessThan(5000);
    const deadline = Date.now() + 2000;
    while (existsSync(`/proc/${pid}`) && Date.now() < deadline) await new Promise((res) => setTimeout(res, 20));
    expect(existsSync(`/proc/${pid}`)).toBe(false);
  }, 30_000);

  test('is killed, with the subshell it forked, when Node exits, not left to notice the end of its stdin', async () => {
    // A stopped checker never reads that end: only Node's exit hook ends it.
    const script = `
      import { readFileSync } from 'node:fs';
      import { checkBashSyntax, syntaxCheckerPid } from ${JSON.stringify(syntaxModule)};
      await checkBashSyntax('echo "x" | cat');
      const pid = syntaxCheckerPid();
      let sub = [];
      for (let i = 0; i < 100 && !sub.length; i++) {
        sub = readFileSync('/proc/' + pid + '/task/' + pid + '/children', 'utf8').trim().split(' ').filter(Boolean).map(Number);
        if (!sub.length) await new Promise((r) => setTimeout(r, 10));
      }
      process.kill(-pid, 'SIGSTOP');
      process.stdout.write(JSON.stringify([pid, ...sub]));
      process.exit(0);`;
    const r = spawnSync(process.execPath, ['--input-type=module', '-e', script], { encoding: 'utf8', timeout: 20_000 });
    expect(r.status, r.stderr).toBe(0);
    const pids = JSON.parse(r.stdout) as number[];
    expect(pids.length, 'the checker and its spare subshell').toBe(2);
    await waitFor(() => !pids.some(isRunning), 2000);
    try {
      expect(pids.filter(isRunning)).toEqual([]);
    } finally {
      for (const p of pids) {
        try {
          process.kill(p, 'SIGKILL');
        } catch {
          // gone, as it should be
        }
      }
    }
  }, 30_000);

  test('exits within 2 s of the check when Node has nothing else to do', async () => {
    const script = `
      import { checkBashSyntax } from ${JSON.stringify(syntaxModule)};
      await checkBashSyntax('echo "x" | cat');
      process.stdout.write(String(Date.now()));`;
    const child = spawn(process.execPath, ['--input-type=module', '-e', script], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    child.stdout.on('data', (d: Buffer) => (out += d));
    const exited = await new Promise<number>((res) => child.on('exit', () => res(Date.now())));
    expect(exited - Number(out)).toBeLessThan(2000);
  }, 30_000);

  test('a killed checker is replaced, and a check pending when it dies still gets its answer', async () => {
    expect((await checkBashSyntax('echo "a"')).ok).toBe(true);
    const first = syntaxCheckerPid()!;
    process.kill(first, 'SIGKILL');
    await new Promise((res) => setTimeout(res, 50));
    expect(await checkBashSyntax('echo "b')).toEqual(await bashN('echo "b'));
    expect((await checkBashSyntax('echo "c"')).ok).toBe(true);
    const second = syntaxCheckerPid()!;
    expect(second).not.toBe(first);

    // Killed while a check is on its way: the check is answered (by the subshell
    // it had forked, or on a fresh checker) and the next one starts a new checker.
    const pending = checkBashSyntax(heredoc100k);
    process.kill(second, 'SIGKILL');
    expect(await pending).toEqual({ ok: true, exitCode: 0, stdout: '', stderr: '' });
    expect(await checkBashSyntax('echo "d')).toEqual(await bashN('echo "d'));
    expect(syntaxCheckerPid()).not.toBe(second);
  }, 30_000);

  test('200 concurrent checks each get their own answer', async () => {
    const commands = Array.from({ length: 200 }, (_, i) => (i % 3 === 0 ? `echo "unclosed_${i}` : i % 3 === 1 ? `echo "ok_${i}" | tr a b` : `echo ok_${i} )`));
    const results = await Promise.all(commands.map((c) => checkBashSyntax(c)));
    results.forEach((r, i) => {
      expect(r.ok, commands[i]).toBe(i % 3 === 1);
      if (i % 3 === 2) expect(r.stderr).toContain(`echo ok_${i} )`);
    });
  }, 120_000);

  test('a 100 KB heredoc is checked by the checker', async () => {
    expect(await parsesCleanly(heredoc100k)).toBe(true);
    const t = performance.now();
    expect((await checkBashSyntax(heredoc100k)).ok).toBe(true);
    expect(performance.now() - t).toBeLessThan(5000);
  }, 30_000);

  test('a bash path that cannot run fails clearly, and one that is not bash too', async () => {
    await expect(checkBashSyntax('echo "x"', '/nonexistent/bash')).rejects.toThrow(/\/nonexistent\/bash.*ENOENT|ENOENT.*\/nonexistent\/bash/);
    const dir = mkdtempSync(join(tmpdir(), 'msbx-notbash-'));
    try {
      const fake = join(dir, 'fake-bash');
      writeFileSync(fake, '#!/bin/sh\nexit 0\n', { mode: 0o755 });
      await expect(checkBashSyntax('echo "x"', fake)).rejects.toThrow(/syntax checker/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }, 30_000);
});
