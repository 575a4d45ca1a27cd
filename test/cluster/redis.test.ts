/**
 * Queue URLs and credentials (lib/cluster/redis.ts), payload checks
 * (lib/cluster/jobs.ts), and a worker against a real Redis: it refuses a
 * payload that is not what the coordinator sends, runs nothing for it, and
 * announces itself.
 */
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { spawn, type ChildProcess } from 'node:child_process';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Queue, type ConnectionOptions } from 'bullmq';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { ClusterError, checkEvalJob, connectRedis, evalJobId, listWorkers, parseQueueUrl, predictionDigest, REDIS_PASSWORD_ENV, startWorker, waitForRedis } from '../../lib/cluster/index.js';
import { MinisandboxError } from '../../lib/errors.js';
import { NO_REDIS_REASON, REDIS_SERVER } from './queueHelpers.js';

const dir = mkdtempSync(join(tmpdir(), 'msbx-cluster-redis-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
afterEach(() => {
  delete process.env[REDIS_PASSWORD_ENV];
});

describe('parseQueueUrl', () => {
  it('reads host, port, queue name and user; the display hides the password', () => {
    const t = parseQueueUrl('redis://alice:s3cr%40t@redis.example:6380/evals.v1');
    expect(t.queueName).toBe('evals.v1');
    expect(t.display).toBe('redis://alice@redis.example:6380/evals.v1');
    expect(t.connection).toMatchObject({ host: 'redis.example', port: 6380, username: 'alice', password: 's3cr@t', maxRetriesPerRequest: null });
    expect(t.connection.tls).toBeUndefined();
    expect(parseQueueUrl('redis://h/q').connection.port).toBe(6379);
  });

  it('rediss:// is TLS, with the CA and the host name checked', () => {
    const t = parseQueueUrl('rediss://h:6390/q', { tls: { ca: 'PEM' } });
    expect(t.connection.tls).toEqual({ servername: 'h', ca: 'PEM' });
  });

  it('refuses what cannot name a queue, saying why and never showing the password', () => {
    const cases: Array<[string, RegExp]> = [
      ['http://h/q', /the scheme must be redis:\/\/ or rediss:\/\/ \(TLS\), not http:/],
      ['redis://h:6379', /no queue name/],
      ['redis://h:6379/', /no queue name/],
      ['redis://h/a/b', /queue name "a\/b": only letters/],
      ['redis://h/q?db=2', /takes no \?query/],
      ['not a url :pw@', /not a URL/],
    ];
    for (const [url, why] of cases) {
      let err: unknown;
      try {
        parseQueueUrl(url);
      } catch (e) {
        err = e;
      }
      expect(err, url).toBeInstanceOf(ClusterError);
      expect(err, url).toBeInstanceOf(MinisandboxError);
      expect((err as Error).message, url).toMatch(why);
    }
    expect(() => parseQueueUrl('http://u:hunter2@h/q')).toThrow(/^queue URL http:\/\/u@h\/q: /);
  });

  it('takes the password from one source: a private file or the environment (then removed)', () => {
    const file = join(dir, 'pw');
    writeFileSync(file, 'from-file\n', { mode: 0o600 });
    expect(parseQueueUrl('redis://h/q', { passwordFile: file }).connection.password).toBe('from-file');
    process.env[REDIS_PASSWORD_ENV] = 'from-env';
    expect(parseQueueUrl('redis://h/q').connection.password).toBe('from-env');
    expect(process.env[REDIS_PASSWORD_ENV]).toBeUndefined();
    process.env[REDIS_PASSWORD_ENV] = 'x';
    expect(() => parseQueueUrl('redis://:p@h/q')).toThrow(/the URL and MINISANDBOX_REDIS_PASSWORD both give the password; give one/);
    expect(process.env[REDIS_PASSWORD_ENV]).toBeUndefined();
    process.env[REDIS_PASSWORD_ENV] = '';
    expect(() => parseQueueUrl('redis://h/q')).toThrow(/MINISANDBOX_REDIS_PASSWORD gives an empty password/);
    chmodSync(file, 0o644);
    expect(() => parseQueueUrl('redis://h/q', { passwordFile: file })).toThrow(`password file ${file}: mode 0644 lets group or others read or replace the password; chmod 600 ${file}`);
    expect(() => parseQueueUrl('redis://h/q', { passwordFile: join(dir, 'none') })).toThrow(/no such file/);
  });
});

describe('checkEvalJob', () => {
  const task = {
    instance_id: 'o__r-1', repo: 'o/r', base_commit: 'abcdef1', version: '1', patch: '', test_patch: 'diff', FAIL_TO_PASS: ['t'], PASS_TO_PASS: [],
    python: '3.11', install: ['true'], test_cmd: 'pytest', repo_path: '/srv/r',
  };
  const prediction = { instance_id: 'o__r-1', model_patch: 'diff --git', model_name_or_path: 'm' };
  const good = { format: 1, runId: 'r1', task, prediction, predictionDigest: predictionDigest(prediction), timeoutMs: 1000 };

  it('accepts what the coordinator sends', () => {
    expect(checkEvalJob(good, 'j').task.instance_id).toBe('o__r-1');
    const { repo_path: _, ...byUrl } = task;
    for (const url of ['https://github.com/o/r.git', 'git@github.com:o/r.git', 'ssh://git@h/o/r']) expect(checkEvalJob({ ...good, task: { ...byUrl, repo_url: url } }, 'j').task.repo_url).toBe(url);
  });

  it("refuses a payload lib/swe's loaders would refuse, or one that does not hold together", () => {
    const bad: Array<[unknown, RegExp]> = [
      [{ ...good, format: 2 }, /payload format 2, this worker reads 1/],
      [{ ...good, runId: 'a:b' }, /runId "a:b" is not a run id/],
      [{ ...good, task: { ...task, FAIL_TO_PASS: 'x' } }, /FAIL_TO_PASS/],
      [{ ...good, task: { ...task, repo_path: 'rel/path' } }, /repo_path "rel\/path" is relative/],
      [{ ...good, task: { ...task, repo_path: undefined, repo_url: 'ext::sh -c touch% a@b:' } }, /repo_url "ext::sh -c touch% a@b:": a queued task's repository is fetched over https:/],
      [{ ...good, prediction: { ...prediction, instance_id: 'other' } }, /the prediction is for "other", the task is "o__r-1"/],
      [{ ...good, predictionDigest: 'x' }, /predictionDigest does not match the patch/],
      [{ ...good, timeoutMs: -1 }, /timeoutMs -1 is not a positive number/],
      [{ ...good, isolation: 'host' }, /isolation "host"/],
      ['a string', /not a JSON object/],
    ];
    for (const [payload, why] of bad) expect(() => checkEvalJob(payload, 'job-x'), String(why)).toThrow(why);
  });

  it('job ids carry no ":" (BullMQ refuses it) and are the same for the same run and instance', () => {
    expect(evalJobId('r1', 'a:b/c.d')).toBe('r1.a%3Ab%2Fc%2Ed');
    expect(evalJobId('r1', 'x')).toBe(evalJobId('r1', 'x'));
  });
});

describe.skipIf(!REDIS_SERVER)('a worker on a real Redis', () => {
  let redis: ChildProcess;
  let port: number;
  const password = 'pw-test';

  beforeAll(async () => {
    port = 20000 + (process.pid % 20000);
    redis = spawn(REDIS_SERVER!, ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--requirepass', password], { stdio: 'ignore' });
    const t = parseQueueUrl(`redis://:${password}@127.0.0.1:${port}/q`);
    const c = connectRedis(t);
    await waitForRedis(c, t);
    c.disconnect();
  });
  afterAll(() => {
    redis?.kill('SIGKILL');
  });

  it('a wrong password or no Redis is a ClusterError naming the URL and the reason', async () => {
    const t = parseQueueUrl(`redis://:wrong@127.0.0.1:${port}/q`);
    const c = connectRedis(t);
    await expect(waitForRedis(c, t, 3000)).rejects.toThrow(new RegExp(`^Redis at redis://127.0.0.1:${port}/q: .*(WRONGPASS|invalid)`));
    c.disconnect();
    const none = parseQueueUrl('redis://127.0.0.1:1/q');
    const d = connectRedis(none);
    await expect(waitForRedis(d, none, 1500)).rejects.toThrow(/^Redis at redis:\/\/127.0.0.1:1\/q: no answer within 1.5s \(.*ECONNREFUSED/);
    d.disconnect();
  });

  it('announces itself, refuses a payload that is not data it can check, and never retries it', async () => {
    const target = parseQueueUrl(`redis://:${password}@127.0.0.1:${port}/refuse`);
    const lines: string[] = [];
    const worker = await startWorker({ target, slots: 1, storeDir: join(dir, 'store'), onLog: (l) => lines.push(l), id: 'w-test' });
    const queue = new Queue('refuse', { connection: target.connection as ConnectionOptions });
    try {
      const [a] = await listWorkers(target);
      expect(a).toMatchObject({ id: 'w-test', slots: 1, busy: 0, store: { dir: join(dir, 'store'), envRecipes: [] } });
      expect(a!.store.id).toMatch(/^[0-9a-f-]{36}$/);
      // A payload with code where a task should be: refused on the worker, failed for good.
      const job = await queue.add('eval', { format: 1, runId: 'r', task: { instance_id: 'x', test_cmd: { $function: 'process.exit()' } } }, { attempts: 3 });
      const until = Date.now() + 20_000;
      while (!(await job.isFailed()) && Date.now() < until) await new Promise((r) => setTimeout(r, 100));
      const failed = (await queue.getJob(job.id!))!;
      expect(failed.failedReason).toMatch(/^job \d+: /);
      expect(failed.attemptsMade).toBe(1);
      expect(lines.some((l) => l.includes('started'))).toBe(false);
    } finally {
      await queue.close();
      await worker.close();
    }
    expect(await listWorkers(target)).toEqual([]);
  });
});
