/**
 * Jitter-buffered player: plays queued 24 kHz mono tracks in order and counts, per track, exactly
 * the samples that reached the output (never silence, never samples dropped by a stop).
 *
 * Runs in the AudioWorkletGlobalScope of an AudioContext created at 24 kHz; the browser resamples
 * to the device. One track is one protocol context. Tracks play one after another, in the order
 * their first audio arrived.
 *
 * Jitter buffer, per track:
 *
 *    waiting ──buffered ≥ target, or all audio in──▶ playing ──queue empty, more audio due──▶ stalled
 *       ▲                                              │  ▲                                       │
 *       │                                  all audio rendered                  buffered ≥ target  │
 *       │                                              ▼  └────────────────────────────────────────┘
 *     (new)                                         drained            (target grows after each stall)
 *
 *   While stalled the output is silence and the stall is counted (underruns, stallSamples).
 *   `stop` (barge-in) drops the queue at once: the very next render quantum is silent.
 *
 * Port messages in:
 *   {type: 'push', id, samples: Float32Array}  audio for track `id` (creates the track)
 *   {type: 'end', id, total}                  the track has exactly `total` samples; extra queued ones are dropped
 *   {type: 'stop', id}                         barge-in: drop the track's queue; answered by 'stopped'
 *   {type: 'config', targetMs, maxTargetMs, record}
 * Port messages out (frame = global sample frame index of this context, i.e. `currentFrame`):
 *   {type: 'state', frame, tracks: [TrackState...], peakSinceStop}   ~every 50 ms and after events
 *   {type: 'started', id, frame}                   first sample of the track is rendered at `frame`
 *   {type: 'audible', id, frame}                   first sample above -60 dBFS is rendered at `frame`
 *   {type: 'stopped', id, track: TrackState}       after a stop; nothing of `id` is rendered any more
 *   {type: 'drained', id, track: TrackState}       every sample of the track has been rendered
 *
 * TrackState: {id, received, rendered, buffered, underruns, stallSamples, targetSamples, phase, hash,
 *              recorded?: Float32Array (when config.record)}
 * `hash` is FNV-1a 32-bit over the rendered samples as int16 (round(x * 32768)), so the page can
 * prove bit-exact playback of PCM16 against what the server sent.
 */

import { fnv1aInt16 } from './pcm-hash.js';

const AUDIBLE = 1 / 1024; // -60 dBFS: the first sample at or above it counts as "heard"
const STATE_EVERY_BLOCKS = 10; // 10 x 128 samples = 53 ms at 24 kHz
const RECORD_LIMIT = 24000 * 120; // keep at most 120 s of rendered audio per track when recording

class Track {
  constructor(id, targetSamples, record) {
    this.id = id;
    this.chunks = []; // Float32Array[], consumed from chunks[0] at `offset`
    this.offset = 0;
    this.received = 0; // samples accepted into the queue
    this.buffered = 0; // samples queued, not yet rendered
    this.rendered = 0; // samples that reached the output
    this.total = -1; // known length once 'end' arrives
    this.phase = 'waiting'; // waiting | playing | stalled | drained | stopped
    this.underruns = 0;
    this.stallSamples = 0;
    this.targetSamples = targetSamples;
    this.hash = 0x811c9dc5;
    this.audible = false;
    this.recorded = record ? [] : null;
    this.recordedCount = 0;
  }

  allIn() {
    return this.total >= 0 && this.received >= this.total;
  }

  push(samples) {
    if (this.phase === 'stopped' || this.phase === 'drained') return;
    let n = samples.length;
    if (this.total >= 0) n = Math.max(0, Math.min(n, this.total - this.received));
    if (n === 0) return;
    this.chunks.push(n === samples.length ? samples : samples.subarray(0, n));
    this.received += n;
    this.buffered += n;
  }

  end(total) {
    this.total = total;
    // Drop anything queued beyond the announced length (for Opus: the encoder's padding tail).
    let excess = this.received - total;
    while (excess > 0 && this.chunks.length > 0) {
      const last = this.chunks[this.chunks.length - 1];
      const usable = last.length - (this.chunks.length === 1 ? this.offset : 0);
      if (usable <= excess) {
        this.chunks.pop();
        excess -= usable;
        this.buffered -= usable;
        this.received -= usable;
      } else {
        this.chunks[this.chunks.length - 1] = last.subarray(0, last.length - excess);
        this.buffered -= excess;
        this.received -= excess;
        excess = 0;
      }
    }
  }

  stop() {
    this.chunks = [];
    this.offset = 0;
    this.buffered = 0;
    this.phase = 'stopped';
  }

  /** Copy up to `count` queued samples into out[at..]; returns how many were copied. */
  render(out, at, count, port) {
    let copied = 0;
    while (copied < count && this.chunks.length > 0) {
      const chunk = this.chunks[0];
      const n = Math.min(count - copied, chunk.length - this.offset);
      const from = this.offset;
      out.set(chunk.subarray(from, from + n), at + copied);
      this.hash = fnv1aInt16(this.hash, chunk, from, from + n);
      if (!this.audible) {
        for (let i = from; i < from + n; i++) {
          if (Math.abs(chunk[i]) >= AUDIBLE) {
            this.audible = true;
            port.postMessage({ type: 'audible', id: this.id, frame: currentFrame + at + copied + (i - from) });
            break;
          }
        }
      }
      if (this.recorded && this.recordedCount < RECORD_LIMIT) {
        const keep = Math.min(n, RECORD_LIMIT - this.recordedCount);
        this.recorded.push(chunk.slice(from, from + keep));
        this.recordedCount += keep;
      }
      this.offset += n;
      copied += n;
      if (this.offset === chunk.length) {
        this.chunks.shift();
        this.offset = 0;
      }
    }
    this.buffered -= copied;
    this.rendered += copied;
    return copied;
  }

  snapshot(withRecording) {
    const s = {
      id: this.id,
      received: this.received,
      rendered: this.rendered,
      buffered: this.buffered,
      total: this.total,
      underruns: this.underruns,
      stallSamples: this.stallSamples,
      targetSamples: this.targetSamples,
      phase: this.phase,
      hash: this.hash >>> 0,
    };
    if (withRecording && this.recorded) {
      const all = new Float32Array(this.recordedCount);
      let at = 0;
      for (const part of this.recorded) {
        all.set(part, at);
        at += part.length;
      }
      s.recorded = all;
    }
    return s;
  }
}

class JitterPlayer extends AudioWorkletProcessor {
  constructor() {
    super();
    this.tracks = new Map(); // id -> Track, in arrival order (Map keeps insertion order)
    this.finished = new Set(); // ids already drained or stopped: late messages for them are ignored
    this.targetSamples = Math.round(0.06 * sampleRate);
    this.maxTargetSamples = Math.round(0.3 * sampleRate);
    this.record = false;
    this.blocks = 0;
    this.dirty = false;
    this.peakSinceStop = 0; // largest |sample| output since the last stop: 0 proves silence
    this.port.onmessage = (event) => this.onMessage(event.data);
  }

  track(id) {
    if (this.finished.has(id)) return null;
    let t = this.tracks.get(id);
    if (!t) {
      t = new Track(id, this.targetSamples, this.record);
      this.tracks.set(id, t);
    }
    return t;
  }

  onMessage(msg) {
    switch (msg.type) {
      case 'push':
        this.track(msg.id)?.push(msg.samples);
        break;
      case 'end':
        this.track(msg.id)?.end(msg.total);
        break;
      case 'stop': {
        const t = this.track(msg.id);
        if (t && t.phase !== 'drained') t.stop();
        this.peakSinceStop = 0;
        const track = t ? t.snapshot(true) : null;
        this.port.postMessage({ type: 'stopped', id: msg.id, frame: currentFrame, track });
        break;
      }
      case 'config':
        if (msg.targetMs) this.targetSamples = Math.round((msg.targetMs / 1000) * sampleRate);
        if (msg.maxTargetMs) this.maxTargetSamples = Math.round((msg.maxTargetMs / 1000) * sampleRate);
        if (msg.record !== undefined) this.record = Boolean(msg.record);
        break;
      default:
        break;
    }
    this.dirty = true;
  }

  /** The track that owns the output now: the oldest one that is neither drained nor stopped. */
  current() {
    for (const t of this.tracks.values()) {
      if (t.phase !== 'drained' && t.phase !== 'stopped') return t;
    }
    return null;
  }

  process(_inputs, outputs) {
    const out = outputs[0][0];
    out.fill(0);
    let at = 0;
    while (at < out.length) {
      const t = this.current();
      if (!t) break;
      if (t.phase === 'waiting' || t.phase === 'stalled') {
        if (t.buffered < t.targetSamples && !t.allIn()) {
          if (t.phase === 'stalled') t.stallSamples += out.length - at;
          break;
        }
        if (t.phase === 'waiting' && t.buffered > 0) {
          this.port.postMessage({ type: 'started', id: t.id, frame: currentFrame + at });
        }
        t.phase = 'playing';
      }
      at += t.render(out, at, out.length - at, this.port);
      if (t.buffered === 0) {
        if (t.allIn()) {
          t.phase = 'drained';
          this.port.postMessage({ type: 'drained', id: t.id, frame: currentFrame + at, track: t.snapshot(true) });
          this.dirty = true;
          continue; // the next queued track may start in this same quantum
        }
        // Ran dry before the announced end (or before the end is known): an underrun.
        t.phase = 'stalled';
        t.underruns += 1;
        t.stallSamples += out.length - at;
        t.targetSamples = Math.min(this.maxTargetSamples, Math.round(t.targetSamples * 1.5) + 240);
        this.dirty = true;
        break;
      }
    }
    for (let i = 0; i < out.length; i++) {
      const a = Math.abs(out[i]);
      if (a > this.peakSinceStop) this.peakSinceStop = a;
    }
    for (let c = 1; c < outputs[0].length; c++) outputs[0][c].set(out);
    this.blocks += 1;
    if (this.dirty || this.blocks % STATE_EVERY_BLOCKS === 0) {
      this.postState();
      this.dirty = false;
    }
    return true; // never stop the node: a network gap is a stall, not the end of playback
  }

  postState() {
    const tracks = [];
    for (const t of this.tracks.values()) tracks.push(t.snapshot(false));
    this.port.postMessage({ type: 'state', frame: currentFrame, tracks, peakSinceStop: this.peakSinceStop });
    // Forget finished tracks once reported, so a long session does not grow without bound.
    for (const [id, t] of this.tracks) {
      if (t.phase === 'drained' || t.phase === 'stopped') {
        this.tracks.delete(id);
        this.finished.add(id);
      }
    }
    if (this.finished.size > 4096) this.finished.delete(this.finished.values().next().value);
  }
}

registerProcessor('vivace-jitter-player', JitterPlayer);
