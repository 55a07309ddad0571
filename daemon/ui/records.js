// Where an event's transcript record ids and markers are read (a port of the Python
// webui_model/records.py). Pure.

import { isObject } from "./events.js";
import { EVENT, HISTORY_TRUNCATED, RECORD_ID_META_KEY } from "./protocol.js";
import { isRecoverableLive, parseTruncation } from "./truncation.js";

export function sessionUpdateOf(event) {
  const data = event.data;
  if (event.type !== EVENT.sessionUpdate || !isObject(data)) return null;
  if (isObject(data.update)) return data.update;
  if (typeof data.sessionUpdate === "string") return data;
  return null;
}

export function metaOf(update) {
  const meta = update === null ? null : update._meta;
  return isObject(meta) ? meta : {};
}

export function recordIds(update) {
  const meta = metaOf(update);
  const ids = [];
  const rid = meta[RECORD_ID_META_KEY];
  if (typeof rid === "string" && rid) ids.push(rid);
  const transcript = meta.qwenTranscript;
  if (isObject(transcript) && Array.isArray(transcript.sourceRecordIds)) {
    for (const s of transcript.sourceRecordIds) {
      if (typeof s === "string" && s && !ids.includes(s)) ids.push(s);
    }
  }
  return ids;
}

export function transcriptRecordIds(event) {
  return recordIds(sessionUpdateOf(event));
}

export function firstRecordId(event) {
  const ids = transcriptRecordIds(event);
  return ids.length ? ids[0] : null;
}

export function validMarkerPayload(event) {
  if (event.type !== HISTORY_TRUNCATED || parseTruncation(event.data) === null) return null;
  return event.data;
}

export function isRecoverableLiveMarker(event) {
  if (event.type !== HISTORY_TRUNCATED) return false;
  return isRecoverableLive(parseTruncation(event.data));
}
