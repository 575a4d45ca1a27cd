/**
 * What the suite's workload is made of: real Python projects at released
 * versions, their environments, and the bugs its tasks fix.
 *
 * The sources come from the projects' released wheels in the machine's
 * local package indexes: these projects ship their test suites inside the
 * package (toolz/tests, mpmath/tests, ...), so a release's wheel is its
 * source tree with its real tests. A repository's history is one commit per
 * release (tagged v<version>); each task's base_commit is a commit on top of
 * a release that introduces a realistic bug into a function the project's
 * tests cover and holds back the project's own test of it, which the task's
 * test_patch puts back (as a SWE-bench fix brings its regression test).
 */

import { SweError } from '../../lib/swe/errors.js';

export interface RepoSpec {
  /** Folder under reposDir, and the package's import name. */
  name: string;
  /** SWE-bench's "owner/name" of the upstream repository. */
  repo: string;
  /** PyPI project name (wheel file prefix: lower case, "-" as "_"). */
  project: string;
  /** Releases, oldest first: each is one commit of the history. */
  releases: string[];
}

export interface EnvSpec {
  /** `<repo>-<version>`, the WorkloadEnv key. */
  key: string;
  repo: string;
  version: string;
  python: string;
  /**
   * Requirements installed into the venv from the local indexes: what a
   * project of this kind pulls in (numpy/pandas/scipy class), pinned, so two
   * versions of one repository share most of their packages as in SWE-bench.
   */
  packages: string[];
}

export interface BugSpec {
  /** Task number within the repository (instance_id `<owner>__<name>-<n>`). */
  n: number;
  repo: string;
  version: string;
  /** Source file (relative to the repository root) the bug is put in. */
  file: string;
  /** Exact text, occurring once in `file`, and what the bug turns it into. */
  find: string;
  replace: string;
  /** The project's test that exposes the bug: held back at base_commit, restored by test_patch. */
  testFile: string;
  testName: string;
  /** Other test files run by the task's test command (PASS_TO_PASS). */
  alsoRun?: string[];
  statement: string;
}

export const PYTHON = '3.11';

export const REPOS: readonly RepoSpec[] = [
  { name: 'toolz', repo: 'pytoolz/toolz', project: 'toolz', releases: ['1.1.0'] },
  { name: 'mpmath', repo: 'mpmath/mpmath', project: 'mpmath', releases: ['1.3.0', '1.4.1'] },
  { name: 'dill', repo: 'uqfoundation/dill', project: 'dill', releases: ['0.4.1'] },
  { name: 'jsonschema', repo: 'python-jsonschema/jsonschema', project: 'jsonschema', releases: ['4.25.1'] },
  { name: 'networkx', repo: 'networkx/networkx', project: 'networkx', releases: ['3.6.1'] },
];

// Common scientific stack; versions differ between a repository's two
// environments where SWE-bench's would (numpy), the rest is shared.
const SCIENTIFIC = ['pandas==2.3.3', 'python-dateutil==2.9.0.post0', 'pytz', 'tzdata'];

export const ENVS: readonly EnvSpec[] = [
  { key: 'toolz-1.1', repo: 'toolz', version: '1.1', python: PYTHON, packages: ['numpy==2.3.5', ...SCIENTIFIC] },
  { key: 'mpmath-1.3', repo: 'mpmath', version: '1.3', python: PYTHON, packages: ['numpy==2.2.6', ...SCIENTIFIC] },
  { key: 'mpmath-1.4', repo: 'mpmath', version: '1.4', python: PYTHON, packages: ['numpy==2.3.5', ...SCIENTIFIC] },
  { key: 'dill-0.4', repo: 'dill', version: '0.4', python: PYTHON, packages: ['numpy==2.3.5', ...SCIENTIFIC] },
  { key: 'jsonschema-4.25', repo: 'jsonschema', version: '4.25', python: PYTHON, packages: ['numpy==2.3.5', ...SCIENTIFIC] },
  { key: 'networkx-3.6', repo: 'networkx', version: '3.6', python: PYTHON, packages: ['numpy==2.3.5', 'scipy==1.16.3', ...SCIENTIFIC] },
];

/** Release of a repository an env version is built from ("1.4" -> "1.4.1"). */
export function releaseOf(repo: RepoSpec, version: string): string {
  const release = repo.releases.find((r) => r === version || r.startsWith(`${version}.`));
  if (!release) throw new SweError(`workload spec: ${repo.name} has no release for version ${version}`);
  return release;
}

const T = 'toolz/tests/';
const M = 'mpmath/tests/';
const J = 'jsonschema/tests/';
const N = 'networkx/';
const trailing = { file: 'mpmath/libmp/libintmath.py', find: '        t += 8\n    return t + small_trailing', replace: '        t += 4\n    return t + small_trailing' };

export const BUGS: readonly BugSpec[] = [
  // toolz 1.1.0
  { n: 1, repo: 'toolz', version: '1.1', file: 'toolz/itertoolz.py', find: 'd[item] += 1', replace: 'd[item] = 1', testFile: `${T}test_itertoolz.py`, testName: 'test_frequencies', statement: 'frequencies() reports 1 for every value, whatever its number of occurrences.' },
  { n: 2, repo: 'toolz', version: '1.1', file: 'toolz/itertoolz.py', find: 'itertools.islice(seq, 0, None, n)', replace: 'itertools.islice(seq, 1, None, n)', testFile: `${T}test_itertoolz.py`, testName: 'test_take_nth', statement: 'take_nth(n, seq) skips the first element: take_nth(2, [10, 20, 30, 40, 50]) gives [20, 40] instead of [10, 30, 50].' },
  { n: 3, repo: 'toolz', version: '1.1', file: 'toolz/itertoolz.py', find: '    next(inposed)\n    return inposed', replace: '    return inposed', testFile: `${T}test_itertoolz.py`, testName: 'test_interpose', statement: 'interpose(el, seq) starts with the separator: interpose("a", [1, 2, 3]) yields "a", 1, "a", 2, "a", 3.' },
  { n: 4, repo: 'toolz', version: '1.1', file: 'toolz/itertoolz.py', find: 'return tail(1, seq)[0]', replace: 'return tail(2, seq)[0]', testFile: `${T}test_itertoolz.py`, testName: 'test_last', statement: 'last(seq) returns the second-to-last element.' },
  { n: 5, repo: 'toolz', version: '1.1', file: 'toolz/dicttoolz.py', find: '        if predicate(v):\n            rv[k] = v', replace: '        if not predicate(v):\n            rv[k] = v', testFile: `${T}test_dicttoolz.py`, testName: 'TestDict::test_valfilter', statement: 'valfilter(predicate, d) keeps the items whose value does NOT satisfy the predicate.' },
  { n: 6, repo: 'toolz', version: '1.1', file: 'toolz/dicttoolz.py', find: '    values = collections.defaultdict(lambda: [].append)\n    for d in dicts:', replace: '    values = collections.defaultdict(lambda: [].append)\n    for d in dicts[1:]:', testFile: `${T}test_dicttoolz.py`, testName: 'TestDict::test_merge_with', statement: 'merge_with(func, *dicts) ignores the first dictionary.' },
  // mpmath 1.3.0
  { n: 1, repo: 'mpmath', version: '1.3', ...trailing, testFile: `${M}test_bitwise.py`, testName: 'test_trailing', statement: 'libmp.trailing() miscounts the trailing zero bits of numbers with more than 8 of them (trailing(2**100) is not 100).' },
  { n: 2, repo: 'mpmath', version: '1.3', file: 'mpmath/ctx_iv.py', find: '(self.a <= t.a) and (t.b <= self.b)', replace: '(self.a <= t.a) and (t.b < self.b)', testFile: `${M}test_interval.py`, testName: 'test_interval_identity', statement: 'An interval does not contain its own upper end point: `mpi(1, 2) in mpi(1, 2)` is False.' },
  // mpmath 1.4.1
  { n: 3, repo: 'mpmath', version: '1.4', ...trailing, testFile: `${M}test_bitwise.py`, testName: 'test_trailing', statement: 'libmp.trailing() miscounts the trailing zero bits of numbers with more than 8 of them (trailing(2**100) is not 100).' },
  { n: 4, repo: 'mpmath', version: '1.4', file: 'mpmath/ctx_iv.py', find: '(self.a <= t.a) and (t.b <= self.b)', replace: '(self.a <= t.a) and (t.b < self.b)', testFile: `${M}test_interval.py`, testName: 'test_interval_identity', statement: 'An interval does not contain its own upper end point: `mpi(1, 2) in mpi(1, 2)` is False.' },
  { n: 5, repo: 'mpmath', version: '1.4', file: 'mpmath/matrices/matrices.py', find: 'absolute=1) for j in range(n)', replace: 'absolute=0) for j in range(n)', testFile: `${M}test_matrices.py`, testName: 'test_norms', statement: "mnorm(A, 1) sums the columns' signed entries instead of their absolute values." },
  // dill 0.4.1
  { n: 1, repo: 'dill', version: '0.4', file: 'dill/source.py', find: '    if spaces is None or spaces > indent or spaces < 0: spaces = indent\n    for i in range(len(lines) if all else 1):', replace: '    if spaces is None or spaces > indent or spaces < 0: spaces = indent\n    for i in range(1, len(lines) if all else 1):', testFile: 'dill/tests/test_source.py', testName: 'test_importable', statement: "source._outdent() leaves the first line indented, so importable() of a method returns code that does not compile." },
  // jsonschema 4.25.1
  { n: 1, repo: 'jsonschema', version: '4.25', file: 'jsonschema/_utils.py', find: '    if len(one) != len(two):\n        return False\n    return all(\n        key in two', replace: '    return all(\n        key in two', testFile: `${J}test_utils.py`, testName: 'TestDictEqual::test_additional_key', statement: '_utils.equal() says a mapping equals any mapping that has all of its keys and more.' },
  { n: 2, repo: 'jsonschema', version: '4.25', file: 'jsonschema/_utils.py', find: '    if len(one) != len(two):\n        return False\n    return all(equal(i, j)', replace: '    return all(equal(i, j)', testFile: `${J}test_utils.py`, testName: 'TestListEqual::test_first_list_larger', statement: '_utils.equal() says [1, 2] equals [1]: sequences of different lengths compare equal on their common prefix.' },
  { n: 3, repo: 'jsonschema', version: '4.25', file: 'jsonschema/_utils.py', find: "']['.join(repr(index) for index in indices)", replace: "']['.join(str(index) for index in indices)", testFile: `${J}test_exceptions.py`, testName: 'TestErrorInitReprStr::test_multiple_item_paths', statement: 'Error messages show string path items unquoted: On instance[0][foo] instead of On instance[0][\'foo\'].' },
  { n: 4, repo: 'jsonschema', version: '4.25', file: 'jsonschema/_utils.py', find: 'verb = "was" if len(extras) == 1 else "were"', replace: 'verb = "were" if len(extras) == 1 else "was"', testFile: `${J}test_validators.py`, testName: 'TestValidationErrorMessages::test_additionalItems_single_failure', statement: 'Messages about unexpected extra items get the verb wrong: "(3 were unexpected)" for one, "was" for several.' },
  // networkx 3.6.1
  { n: 1, repo: 'networkx', version: '3.6', file: 'networkx/classes/function.py', find: '    if not G.is_directed():\n        d *= 2', replace: '    if G.is_directed():\n        d *= 2', testFile: `${N}classes/tests/test_function.py`, testName: 'TestFunction::test_density', statement: 'nx.density() doubles the density of directed graphs instead of undirected ones.' },
  { n: 2, repo: 'networkx', version: '3.6', file: 'networkx/classes/function.py', find: 'range(max(counts) + 1 if counts else 0)', replace: 'range(max(counts) if counts else 0)', testFile: `${N}classes/tests/test_function.py`, testName: 'TestFunction::test_degree_histogram', statement: 'nx.degree_histogram() leaves out the count of the highest degree.' },
  { n: 3, repo: 'networkx', version: '3.6', file: 'networkx/utils/misc.py', find: '    return zip(a, chain(b, (first,)))', replace: '    return zip(a, b)', testFile: `${N}utils/tests/test_misc.py`, testName: 'test_pairwise', statement: 'nx.utils.pairwise(iterable, cyclic=True) does not close the cycle: the (last, first) pair is missing.' },
  { n: 4, repo: 'networkx', version: '3.6', file: 'networkx/classes/function.py', find: '    return not any(G._adj.values())', replace: '    return not all(G._adj.values())', testFile: `${N}classes/tests/test_function.py`, testName: 'test_is_empty', statement: 'nx.is_empty(G) is True for a graph with edges as soon as one node is isolated.' },
];

/** The quick workload: two repositories, one environment each, two tasks each. */
export const QUICK = { envs: ['toolz-1.1', 'mpmath-1.4'], tasks: ['pytoolz__toolz-1', 'pytoolz__toolz-2', 'mpmath__mpmath-3', 'mpmath__mpmath-5'] };

export function instanceId(bug: Pick<BugSpec, 'repo' | 'n'>): string {
  const repo = REPOS.find((r) => r.name === bug.repo)!;
  return `${repo.repo.replace('/', '__')}-${bug.n}`;
}
