/**
 * Syntax check of a command before it is typed into the session, as SWE-ReX
 * does with `bash -n`. It runs on the host (parsing needs no sandbox): a
 * command that does not parse would otherwise leave the interactive shell
 * waiting for more input (an unclosed quote), which only a timeout reveals.
 */
import { spawn } from 'node:child_process';

export interface SyntaxCheckResult {
  ok: boolean;
  exitCode: number | null;
  stdout: string;
  stderr: string;
}

// Words that can make an otherwise plain command line fail to parse.
const RESERVED = new Set(
  'if then else elif fi case esac for select while until do done in function time coproc { } ! [[ ]]'.split(' '),
);

/**
 * True when the text cannot contain a syntax error: one line of plain words
 * (no quotes, operators, expansions or reserved words). Spawning `bash -n`
 * costs a few milliseconds, most of a simple command's round trip.
 */
export function isTriviallyValid(command: string): boolean {
  if (!/^[A-Za-z0-9_./=:,@%+ -]*$/.test(command)) return false;
  return command.split(' ').every((w) => !RESERVED.has(w));
}

export function checkBashSyntax(command: string, bashPath = 'bash'): Promise<SyntaxCheckResult> {
  if (isTriviallyValid(command)) return Promise.resolve({ ok: true, exitCode: 0, stdout: '', stderr: '' });
  return new Promise((resolve, reject) => {
    // The script comes on stdin, so no heredoc delimiter can clash with it.
    // extglob is on in most interactive shells (bash-completion enables it),
    // so accept its patterns rather than report a false syntax error.
    const child = spawn(bashPath, ['-O', 'extglob', '-n'], { stdio: ['pipe', 'pipe', 'pipe'] });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    child.stdout.on('data', (d: Buffer) => out.push(d));
    child.stderr.on('data', (d: Buffer) => err.push(d));
    child.stdin.on('error', () => {}); // bash may exit before reading everything
    child.on('error', reject);
    child.on('close', (code) => {
      resolve({
        ok: code === 0,
        exitCode: code,
        stdout: Buffer.concat(out).toString('utf8'),
        stderr: Buffer.concat(err).toString('utf8'),
      });
    });
    child.stdin.end(command.endsWith('\n') ? command : command + '\n');
  });
}
