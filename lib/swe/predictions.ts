/**
 * Model predictions in SWE-bench's format: JSONL, a JSON array, or a JSON
 * object keyed by instance id (all three are accepted by SWE-bench).
 */
import {
  describeLocation,
  describeType,
  FieldReader,
  guessFormat,
  readTextFile,
  splitRecords,
  type RawRecord,
  type RecordFileFormat,
} from './records.js';

export interface Prediction {
  instance_id: string;
  /** The model's diff; null means the model produced no patch at all. */
  model_patch: string | null;
  model_name_or_path: string;
}

export interface PredictionLoadError {
  instance_id?: string;
  line?: number;
  index: number;
  problems: string[];
  message: string;
}

export interface PredictionLoadResult {
  predictions: Prediction[];
  errors: PredictionLoadError[];
}

export function loadPredictions(path: string, format?: RecordFileFormat): PredictionLoadResult {
  const text = readTextFile(path, 'predictions');
  return parsePredictions(text, format ?? guessFormat(path, text));
}

export function parsePredictions(text: string, format: RecordFileFormat): PredictionLoadResult {
  const predictions: Prediction[] = [];
  const errors: PredictionLoadError[] = [];
  const seen = new Map<string, string>();
  for (const record of splitRecords(text, format, 'predictions', true)) {
    const { prediction, problems } = readPrediction(record);
    const id = prediction?.instance_id;
    if (id && seen.has(id)) problems.push(`duplicate instance_id (first defined at ${seen.get(id)})`);
    if (prediction && problems.length === 0) {
      seen.set(prediction.instance_id, describeLocation(record));
      predictions.push(prediction);
      continue;
    }
    const subject = id ? `prediction "${id}" (${describeLocation(record)})` : `prediction at ${describeLocation(record)}`;
    errors.push({
      ...(id ? { instance_id: id } : {}),
      ...(record.line !== undefined ? { line: record.line } : {}),
      index: record.index,
      problems,
      message: `${subject}: ${problems.join('; ')}`,
    });
  }
  return { predictions, errors };
}

function readPrediction(record: RawRecord): { prediction?: Prediction; problems: string[] } {
  if (record.parseError) return { problems: [record.parseError] };
  const value = record.value;
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    return { problems: [`must be a JSON object, got ${describeType(value)}`] };
  }
  // In the keyed-object form the key is the instance id.
  const raw = { instance_id: record.key, ...(value as Record<string, unknown>) };
  const fields = new FieldReader(raw);
  const instanceId = fields.string('instance_id');
  const modelName = fields.string('model_name_or_path');
  let modelPatch: string | null = null;
  if (!('model_patch' in raw)) {
    fields.problems.push('missing field "model_patch" (use null for "no patch")');
  } else if (raw.model_patch !== null) {
    modelPatch = fields.string('model_patch', true);
  }
  if (record.key !== undefined && instanceId && instanceId !== record.key) {
    fields.problems.push(`instance_id "${instanceId}" does not match its key "${record.key}"`);
  }
  return {
    prediction: { instance_id: instanceId, model_patch: modelPatch, model_name_or_path: modelName },
    problems: fields.problems,
  };
}
