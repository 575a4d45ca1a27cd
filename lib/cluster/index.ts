/**
 * Evaluation across nodes on BullMQ (Redis): workers that take jobs from a
 * queue (`startWorker`), and the coordinator's runs (`evaluateOnQueue`,
 * `prepareOnQueue`). See docs/cluster.md.
 */
export { ClusterError } from './errors.js';
export { parseQueueUrl, connectRedis, waitForRedis, redisProblem, REDIS_PASSWORD_ENV, type QueueTarget, type RedisClientOptions } from './redis.js';
export { startWorker, listWorkers, type WorkerOptions, type ClusterWorker, type WorkerAnnouncement, type StoreContents } from './worker.js';
export { evaluateOnQueue, prepareOnQueue, KEEP_JOBS_S, type EvaluateOnQueueOptions, type EvaluateOnQueueResult, type PrepareOnQueueOptions, type PrepareOnQueueResult, type QueueRunProgress } from './run.js';
export { evalJobId, defaultRunId, predictionDigest, checkEvalJob, checkPrepareJob, type EvalJobData, type EvalJobResult } from './jobs.js';
