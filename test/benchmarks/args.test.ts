/**
 * The benchmarks' shared command-line parser (benchmarks/lib/args.ts): typed
 * values with defaults, aliases and --no- toggles (the last given wins), and a
 * UsageError naming the flag and the reason for every kind of bad input.
 */
import { describe, expect, it } from 'vitest';
import { count, counts, file, flag, oneOf, parseFlags, seconds, text, toggle, UsageError } from '../../benchmarks/lib/args.js';

const USAGE = 'usage: bench [--iterations N] ...';
const spec = {
  iterations: count(200),
  'site-packages': count(undefined, ['mb']),
  sizes: counts([60, 1024]),
  'wait-s': seconds(2),
  only: oneOf(['cpu', 'wait']),
  walks: toggle(false),
  dir: file('rel'),
  python: text('3.11'),
  json: flag(),
};
const parse = (...argv: string[]) => parseFlags(argv, USAGE, spec);
const failure = (...argv: string[]): string => {
  try {
    parse(...argv);
  } catch (err) {
    expect(err).toBeInstanceOf(UsageError);
    return (err as Error).message;
  }
  throw new Error(`${argv.join(' ')} was accepted`);
};

describe('benchmarks/lib/args', () => {
  it('gives the defaults, and the values given', () => {
    expect(parse()).toEqual({ iterations: 200, 'site-packages': undefined, sizes: [60, 1024], 'wait-s': 2, only: undefined, walks: false, dir: `${process.cwd()}/rel`, python: '3.11', json: false });
    expect(parse('--iterations', '3', '--sizes', '1, 2', '--wait-s=0.5', '--only', 'wait', '--walks', '--dir', '/x', '--python', '3.12', '--json')).toMatchObject({
      iterations: 3, sizes: [1, 2], 'wait-s': 0.5, only: 'wait', walks: true, dir: '/x', python: '3.12', json: true,
    });
  });

  it('takes the last of a flag and its alias or its --no- form', () => {
    expect(parse('--site-packages', '5', '--mb', '7')['site-packages']).toBe(7);
    expect(parse('--mb', '7', '--site-packages', '5')['site-packages']).toBe(5);
    expect(parse('--walks', '--no-walks').walks).toBe(false);
    expect(parse('--no-walks', '--walks').walks).toBe(true);
  });

  it('names the flag as typed and the reason, then the usage line', () => {
    expect(failure('--iterations', '0')).toBe(`--iterations needs a positive integer, got "0"\n${USAGE}`);
    expect(failure('--mb', '1.5')).toMatch(/^--mb needs a positive integer, got "1.5"\n/);
    expect(failure('--iterations', '')).toMatch(/^--iterations needs a positive integer, got ""/);
    expect(failure('--sizes', '60,,4096')).toMatch(/^--sizes needs a comma-separated list of positive integers, got "60,,4096"/);
    expect(failure('--wait-s', '-1')).toMatch(/^--wait-s needs a value \(one starting with "-" is written --wait-s=VALUE\)/);
    expect(failure('--wait-s=-1')).toMatch(/^--wait-s needs a number of seconds >= 0, got "-1"/);
    expect(failure('--only', 'gpu')).toMatch(/^--only must be cpu or wait, got "gpu"/);
    expect(failure('--bogus')).toMatch(/^unknown flag --bogus\n/);
    expect(failure('--no-json')).toMatch(/^unknown flag --no-json\n/);
    expect(failure('--iterations')).toMatch(/^--iterations needs a value\n/);
    expect(failure('--json=yes')).toMatch(/^--json takes no value\n/);
    expect(failure('stray')).toMatch(/^unexpected argument "stray"\n/);
  });
});
