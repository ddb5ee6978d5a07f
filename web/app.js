/**
 * The demo page: wires the form to a `vivace.speech.v1` session, plays each context through the
 * jitter-buffer worklet, reports the playback clock to the server, and shows what the listener
 * actually got (TTFA as heard, buffer, underruns, stalls, chunk arrivals).
 *
 * Everything the page knows is kept in one object, `window.vivace`, which the UI renders from and
 * tests read (see `newContext` for the per-context fields). Sample counts are 24 kHz samples.
 *
 * Saved voices (record or upload a reference, list, delete, speak with one) live in `voices.js`; their
 * names join the voice list, and its state is `window.vivace.savedVoices` / `window.vivace.voicePanel`.
 *
 * URL parameters: `record=1` keeps a copy of rendered audio per context (tests, debugging);
 * `target_ms=N` the jitter buffer's starting target; `server=ws://...` another gateway.
 */

import { LiveClient, clientTimeMs, defaultSocketUrl } from './live-client.js';
import { OpusStream, opusSupported } from './opus-stream.js';
import { Player } from './player.js';
import { fnv1aInt16 } from './pcm-hash.js';
import { drawTimeline } from './timeline.js';
import { VoicePanel, httpBaseUrl } from './voices.js';

const REPORT_EVERY_MS = 200;
const EVENT_LOG_LIMIT = 300;
const HASH_HOLDBACK_SAMPLES = 4096; // newest samples kept unhashed until the context's length is known

const params = new URLSearchParams(location.search);
const $ = (id) => document.getElementById(id);

const vivace = {
  state: 'connecting', // connecting | ready | speaking | closed | error
  sessionId: null,
  model: null, // {id, random_weights}
  randomWeights: null,
  voices: [], // the model's built-in voices (session.created)
  voiceKind: 'built_in', // session.created voice_kind: built_in | saved | described (the instructions are the voice)
  savedVoices: [], // names of the saved voices (GET /v1/audio/voices), offered after the built-ins
  voicePanel: null, // the saved-voices panel's state (voices.js)
  languages: [],
  limits: null,
  opusSupported: false,
  contexts: {}, // context_id -> context record (newContext)
  lastContextId: null,
  samplesReceived: 0, // over the whole session
  reportsSent: 0, // playback.position events sent, whole session
  events: [], // recent server events (JSON), newest last
  sent: [], // recent client events, newest last
  errors: [],
  rttMs: null,
  peakSinceStop: 0, // largest output sample since the last Stop, from the worklet
  lastStop: null, // {contextId, atMs, renderedAtStop}
  recorded(contextId) {
    // Rendered samples as base64 little-endian int16 (only with ?record=1).
    const rec = this.contexts[contextId]?.recorded;
    if (!rec) return null;
    const pcm = new Int16Array(rec.length);
    for (let i = 0; i < rec.length; i++) pcm[i] = Math.max(-32768, Math.min(32767, Math.round(rec[i] * 32768)));
    let s = '';
    const bytes = new Uint8Array(pcm.buffer);
    for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
    return btoa(s);
  },
};
window.vivace = vivace;

let client = null;
let contextSeq = 0;
// Context ids are unique across pages too, so server logs and records never mix two pages' contexts.
const contextPrefix = Math.random().toString(36).slice(2, 8);
const streams = new Map(); // stream number -> context record
let activeId = null; // the context the Stop button acts on

const player = new Player({ onTrackEvent: onTrackEvent, onState: onPlayerState });

// ---------------------------------------------------------------- state helpers

function newContext(id, mode, format) {
  return {
    id,
    mode, // 'speak' | 'stream'
    format, // 'pcm16' | 'opus'
    phase: 'requested', // requested | receiving | playing | drained | stopped | failed
    stream: null,
    audio: null, // context.created.audio
    requestStartMs: performance.now(),
    firstAudioMs: null, // first audio frame arrived, ms after request start
    ttfaMs: null, // first audible sample heard, ms after request start
    startedMs: null, // first sample (audible or not) heard, ms after request start
    frames: 0, // binary frames received
    bytesReceived: 0,
    serverSamples: 0, // PCM: samples in frames; Opus: packets x samples_per_packet (before trimming)
    samplesReceived: 0, // samples handed to the player (decoded, pre-skip dropped, clipped to the length)
    gaps: 0, // frames whose start_sample or sequence did not follow the previous one
    nextSequence: 0,
    renderedSamples: 0,
    bufferedSamples: 0,
    underruns: 0,
    stallMs: 0,
    receivedHash: 0x811c9dc5,
    renderedHash: null,
    unhashed: [], // newest received chunks not yet in receivedHash (Opus tail may be clipped)
    unhashedCount: 0,
    reportsSent: 0,
    reports: [], // playback.position events sent for this context
    done: null, // context.done {reason, samples}
    cancelled: null, // context.cancelled
    cancelSent: null, // the context.cancel we sent
    wordsSent: 0,
    textEnded: false,
    arrivals: [], // {t, samples, total} per frame, t in ms since request start
    played: [], // {t, samples} rendered count over time
    recorded: null, // Float32Array of rendered audio, with ?record=1
    opus: null,
    wordTimer: null,
    error: null,
  };
}

function logEvent(list, event) {
  list.push(event);
  if (list.length > EVENT_LOG_LIMIT) list.splice(0, list.length - EVENT_LOG_LIMIT);
}

function setStatus(text) {
  $('status').textContent = text;
}

function setState(next) {
  vivace.state = next;
  document.body.dataset.state = next;
  const busy = next === 'speaking';
  $('stop').disabled = !busy;
}

function contextFinished(c) {
  return c.phase === 'drained' || c.phase === 'stopped' || c.phase === 'failed';
}

function refreshBusy() {
  const busy = Object.values(vivace.contexts).some((c) => !contextFinished(c));
  if (vivace.state === 'speaking' || vivace.state === 'ready') setState(busy ? 'speaking' : 'ready');
}

// ---------------------------------------------------------------- connection

async function connect() {
  if (client?.open) return;
  setState('connecting');
  vivace.sessionId = null;
  setStatus('Connecting to the server…');
  const url = params.get('server') || defaultSocketUrl(location);
  client = new LiveClient(url, {
    apiKey: $('api-key').value.trim() || undefined,
    onEvent,
    onAudio,
    onClose,
    onSent: (e) => logEvent(vivace.sent, e),
  });
  try {
    await client.connect();
  } catch (err) {
    setState('error');
    setStatus(`${err.message}. Is the server running? Reload to retry.`);
    throw err;
  }
  await new Promise((resolve, reject) => {
    const started = performance.now();
    const wait = () => {
      if (vivace.sessionId && vivace.state !== 'connecting') resolve();
      else if (!client.open) reject(new Error('the server closed the connection'));
      else if (performance.now() - started > 10000) reject(new Error('no session.created within 10 s'));
      else setTimeout(wait, 20);
    };
    wait();
  });
}

function onClose({ code, reason }) {
  for (const c of Object.values(vivace.contexts)) {
    if (!contextFinished(c) && !c.done) failContext(c, `connection closed (${code})`);
  }
  streams.clear(); // stream numbers belong to the socket that announced them
  setState('closed');
  const why = reason ? `: ${reason}` : '';
  setStatus(`Disconnected (code ${code}${why}). Speak again to reconnect.`);
  $('reconnect').hidden = false;
}

function onEvent(event) {
  logEvent(vivace.events, event);
  const c = event.context_id !== undefined ? vivace.contexts[event.context_id] : undefined;
  switch (event.type) {
    case 'session.created':
      onSessionCreated(event);
      break;
    case 'context.created':
      if (c) {
        c.stream = event.stream;
        c.audio = event.audio;
        streams.set(event.stream, c);
        if (c.format === 'opus') {
          c.opus = new OpusStream(
            event.audio?.pre_skip || 0,
            (samples) => deliver(c, samples),
            (err) => failContext(c, `Opus decoding failed: ${err.message}`),
          );
        }
      }
      break;
    case 'context.done':
      if (c) onContextDone(c, event);
      break;
    case 'context.cancelled':
      if (c) {
        c.cancelled = event;
        if (!contextFinished(c)) c.phase = 'stopped';
        streams.delete(c.stream);
        refreshBusy();
      }
      break;
    case 'error':
      onServerError(event, c);
      break;
    case 'pong':
      vivace.rttMs = client.rttMs;
      break;
    default:
      break;
  }
}

function onSessionCreated(event) {
  vivace.sessionId = event.session_id;
  vivace.model = event.model || null;
  vivace.randomWeights = Boolean(event.model?.random_weights);
  vivace.voices = (event.voices || []).map(nameOf);
  vivace.voiceKind = event.voice_kind || 'built_in';
  vivace.languages = (event.languages || []).map(nameOf);
  vivace.limits = event.limits || null;
  renderVoiceSelect();
  renderInstructions();
  fillSelect($('language'), vivace.languages, 'auto');
  const notice = $('weights-notice');
  if (vivace.randomWeights) {
    notice.textContent =
      `Notice: the server runs ${event.model?.id || 'its model'} with random weights, so what you hear is ` +
      'noise, not speech. Timing, buffering and barge-in behave as they would with real weights.';
    notice.hidden = false;
  } else {
    notice.hidden = true;
  }
  $('model').textContent = event.model ? `${event.model.id}${vivace.randomWeights ? ' (random weights)' : ''}` : 'unknown';
  $('session').textContent = event.session_id;
  $('reconnect').hidden = true;
  setState('ready');
  setStatus('Ready. Type some text and press Speak.');
}

function nameOf(item) {
  if (typeof item === 'string') return item;
  return item?.id ?? item?.name ?? String(item);
}

function fillSelect(select, names, preferred) {
  const previous = select.value;
  select.replaceChildren(
    ...names.map((n) => {
      const o = document.createElement('option');
      o.value = n;
      o.textContent = n;
      return o;
    }),
  );
  if (names.includes(previous)) select.value = previous;
  else if (preferred && names.includes(preferred)) select.value = preferred;
}

/** The voice list: the built-in voices, then the saved ones in their own group (a name is the voice). */
function renderVoiceSelect() {
  const select = $('voice');
  const previous = select.value;
  fillSelect(select, vivace.voices);
  const saved = vivace.savedVoices.filter((n) => !vivace.voices.includes(n));
  if (saved.length) {
    const group = document.createElement('optgroup');
    group.label = 'Saved voices';
    for (const n of saved) {
      const o = document.createElement('option');
      o.value = n;
      o.textContent = n;
      group.append(o);
    }
    select.append(group);
  }
  if ([...vivace.voices, ...saved].includes(previous)) select.value = previous;
}

/** What the instructions field means for the served model: a style (built-in voices), nothing (Base models
 * take none), or the voice itself (VoiceDesign: required, and there is no voice to pick). */
function renderInstructions() {
  const kind = vivace.voiceKind;
  const input = $('instructions');
  const described = kind === 'described';
  $('voice').closest('.field').hidden = described;
  input.disabled = kind === 'saved';
  input.required = described;
  $('instructions-label').textContent = described ? 'Voice description (required)'
    : kind === 'saved' ? 'Style instructions (not taken by this model)' : 'Style instructions (optional)';
  $('instructions-hint').textContent = described
    ? 'Describe the voice, e.g. "a calm, low female voice, speaking slowly".'
    : kind === 'saved' ? 'Voice-cloning (Base) models speak like their reference and take no instructions.'
      : 'How to speak, e.g. "cheerful, a little faster".';
}

function onServerError(event, c) {
  const e = event.error || {};
  const text = `Server error ${e.code || ''}: ${e.message || 'unknown'}`;
  logEvent(vivace.errors, event);
  setStatus(text);
  if (c && !contextFinished(c)) failContext(c, text);
}

function failContext(c, why) {
  c.error = why;
  c.phase = 'failed';
  clearInterval(c.wordTimer);
  if (c.stream !== null) streams.delete(c.stream);
  c.opus?.close();
  if (player.ready) player.stop(c.id);
  refreshBusy();
}

// ---------------------------------------------------------------- audio in

function onAudio(frame, receivedAt) {
  const c = streams.get(frame.stream);
  if (!c || c.phase === 'stopped' || c.phase === 'failed') return; // cancelled: drop late frames
  if (c.firstAudioMs === null) c.firstAudioMs = receivedAt - c.requestStartMs;
  if (frame.sequence !== c.nextSequence) c.gaps += 1;
  c.nextSequence = frame.sequence + 1;
  c.frames += 1;
  c.bytesReceived += frame.payload.byteLength;
  if (c.phase === 'requested') c.phase = 'receiving';
  let samplesInFrame;
  if (c.format === 'opus') {
    samplesInFrame = c.audio?.samples_per_packet || 480;
    c.opus.decode(frame.payload, frame.startSample);
  } else {
    if (frame.startSample !== c.serverSamples) c.gaps += 1;
    const n = frame.payload.byteLength >> 1;
    const view = new DataView(frame.payload.buffer, frame.payload.byteOffset, n * 2);
    const samples = new Float32Array(n);
    for (let i = 0; i < n; i++) samples[i] = view.getInt16(i * 2, true) / 32768;
    samplesInFrame = n;
    deliver(c, samples);
  }
  c.serverSamples += samplesInFrame;
  c.arrivals.push({ t: receivedAt - c.requestStartMs, samples: samplesInFrame, total: c.serverSamples });
}

/** Hand decoded 24 kHz samples to the player, clipped to the context's announced length. */
function deliver(c, samples) {
  if (c.phase === 'stopped' || c.phase === 'failed') return;
  if (c.done) {
    const room = Math.max(0, c.done.samples - c.samplesReceived);
    if (room < samples.length) samples = samples.subarray(0, room);
  }
  if (samples.length === 0) return;
  const copy = samples.slice(); // the original's buffer is transferred to the worklet
  c.unhashed.push(copy);
  c.unhashedCount += copy.length;
  while (c.unhashed.length > 1 && c.unhashedCount - c.unhashed[0].length >= HASH_HOLDBACK_SAMPLES) {
    const old = c.unhashed.shift();
    c.unhashedCount -= old.length;
    c.receivedHash = fnv1aInt16(c.receivedHash, old, 0, old.length);
  }
  c.samplesReceived += samples.length;
  vivace.samplesReceived += samples.length;
  player.push(c.id, samples.slice());
}

async function onContextDone(c, event) {
  c.done = { reason: event.reason, samples: event.samples };
  clearInterval(c.wordTimer);
  if (event.reason !== 'completed') {
    if (event.reason === 'error' && !contextFinished(c)) failContext(c, 'the server ended this context with an error');
    else if (!contextFinished(c)) c.phase = 'stopped';
    refreshBusy();
    return;
  }
  if (c.opus) {
    try {
      await c.opus.flush(); // every packet decoded before the length is applied
    } catch (err) {
      failContext(c, `Opus decoding failed: ${err.message}`);
      return;
    }
    c.opus.close();
  }
  // Clip the held-back tail to the announced length, then fold it into the hash.
  let excess = c.samplesReceived - event.samples;
  while (excess > 0 && c.unhashed.length > 0) {
    const last = c.unhashed[c.unhashed.length - 1];
    const cut = Math.min(excess, last.length);
    c.unhashed[c.unhashed.length - 1] = last.subarray(0, last.length - cut);
    if (cut === last.length) c.unhashed.pop();
    excess -= cut;
    c.samplesReceived -= cut;
    vivace.samplesReceived -= cut;
  }
  for (const part of c.unhashed) c.receivedHash = fnv1aInt16(c.receivedHash, part, 0, part.length);
  c.unhashed = [];
  c.unhashedCount = 0;
  streams.delete(c.stream);
  player.end(c.id, event.samples);
}

// ---------------------------------------------------------------- playback events and reports

function onTrackEvent(msg) {
  const c = vivace.contexts[msg.id];
  if (!c) return;
  if (msg.type === 'started') {
    c.startedMs = player.heardAtMs(msg.frame) - c.requestStartMs;
    if (c.phase === 'receiving' || c.phase === 'requested') c.phase = 'playing';
  } else if (msg.type === 'audible') {
    c.ttfaMs = player.heardAtMs(msg.frame) - c.requestStartMs;
  } else if (msg.type === 'drained' || msg.type === 'stopped') {
    if (msg.track) applyTrack(c, msg.track);
    if (msg.track?.recorded) c.recorded = msg.track.recorded;
    if (msg.type === 'drained') {
      if (c.ttfaMs === null && c.startedMs !== null) c.ttfaMs = c.startedMs; // an all-quiet context
      c.phase = 'drained';
      sendReport(c);
      refreshBusy();
      if (c.id === vivace.lastContextId) {
        setStatus(`Done: ${(c.renderedSamples / 24000).toFixed(2)} s played, first heard after ${fmtMs(c.ttfaMs)}, ` +
          `${c.underruns} underrun${c.underruns === 1 ? '' : 's'}.`);
        renderReadouts();
      }
    }
  }
}

function applyTrack(c, t) {
  c.renderedSamples = t.rendered;
  c.bufferedSamples = t.buffered;
  c.underruns = t.underruns;
  c.stallMs = (t.stallSamples / 24000) * 1000;
  c.renderedHash = t.hash;
}

function onPlayerState(msg) {
  vivace.peakSinceStop = msg.peakSinceStop;
  const now = performance.now();
  for (const t of msg.tracks) {
    const c = vivace.contexts[t.id];
    if (!c || c.phase === 'stopped' || c.phase === 'failed') continue;
    applyTrack(c, t);
    const last = c.played[c.played.length - 1];
    if (!last || last.samples !== t.rendered) c.played.push({ t: now - c.requestStartMs, samples: t.rendered });
  }
}

/** Send the playback clock for `c`: what the worklet has rendered, and what is still buffered. */
function sendReport(c) {
  if (!client?.open || c.reportsClosed) return;
  const report = {
    type: 'playback.position',
    context_id: c.id,
    played_samples: c.renderedSamples,
    client_time_ms: clientTimeMs(),
    buffered_samples: c.bufferedSamples,
    underruns: c.underruns,
  };
  client.send(report);
  c.reportsSent += 1;
  vivace.reportsSent += 1;
  c.reports.push(report);
  if (c.reports.length > 2000) c.reports.shift();
}

setInterval(() => {
  for (const c of Object.values(vivace.contexts)) {
    if (c.phase === 'playing' || (c.phase === 'receiving' && c.startedMs !== null)) sendReport(c);
  }
}, REPORT_EVERY_MS);

// ---------------------------------------------------------------- actions

function selectedFormat() {
  return document.querySelector('input[name="format"]:checked')?.value || 'pcm16';
}

async function begin(mode) {
  const text = $('text').value;
  if (!text.trim()) {
    setStatus('Type some text first.');
    $('text').focus();
    return;
  }
  try {
    await player.start({ targetMs: Number(params.get('target_ms')) || 60, record: params.get('record') === '1' });
    await connect();
  } catch (err) {
    setStatus(err.message);
    return;
  }
  const instructions = $('instructions').value.trim();
  if (vivace.voiceKind === 'described' && !instructions) {
    setStatus('Describe the voice first: this model speaks with the voice its instructions describe.');
    $('instructions').focus();
    return;
  }
  if (activeId && !contextFinished(vivace.contexts[activeId])) await stop();
  const format = selectedFormat();
  const id = `${contextPrefix}-${++contextSeq}`;
  const c = newContext(id, mode, format);
  vivace.contexts[id] = c;
  vivace.lastContextId = id;
  activeId = id;
  setState('speaking');
  const voice = vivace.voiceKind === 'described' ? undefined : $('voice').value || undefined;
  const language = $('language').value || undefined;
  const styled = vivace.voiceKind !== 'saved' && instructions ? { instructions } : {};
  try {
    client.send({ type: 'context.create', context_id: id, voice, language, ...styled, audio: { format } });
    if (mode === 'speak') {
      client.send({ type: 'input_text.append', context_id: id, text });
      client.send({ type: 'input_text.end', context_id: id });
      c.wordsSent = text.split(/\s+/).filter(Boolean).length;
      c.textEnded = true;
      setStatus('Speaking…');
    } else {
      streamWords(c, text, Number($('rate').value) || 8);
    }
  } catch (err) {
    failContext(c, err.message);
    setStatus(err.message);
  }
}

/** Send the text word by word, like an LLM producing tokens, then end it. */
function streamWords(c, text, wordsPerSecond) {
  const words = text.match(/\S+\s*/g) || [];
  let next = 0;
  setStatus(`Streaming ${words.length} words at ${wordsPerSecond} per second…`);
  const sendOne = () => {
    if (c.phase === 'stopped' || c.phase === 'failed' || !client.open) {
      clearInterval(c.wordTimer);
      return;
    }
    if (next < words.length) {
      client.send({ type: 'input_text.append', context_id: c.id, text: words[next] });
      next += 1;
      c.wordsSent = next;
    }
    if (next >= words.length) {
      clearInterval(c.wordTimer);
      client.send({ type: 'input_text.end', context_id: c.id });
      c.textEnded = true;
    }
  };
  sendOne();
  c.wordTimer = setInterval(sendOne, 1000 / Math.max(0.5, Math.min(100, wordsPerSecond)));
}

/** Barge-in: silence the page at once, then tell the server what was heard and cancel. */
async function stop() {
  const c = activeId ? vivace.contexts[activeId] : null;
  if (!c || contextFinished(c)) return;
  clearInterval(c.wordTimer);
  const serverStillWorking = !c.done && client?.open;
  const stopAt = performance.now();
  c.phase = 'stopped'; // late audio frames for this context are dropped from here on
  c.opus?.close();
  const track = await player.stop(c.id); // the worklet renders nothing of it from the next quantum
  if (track) applyTrack(c, track);
  if (track?.recorded) c.recorded = track.recorded;
  // ackMs: from the click to the worklet confirming that it renders nothing more of this context.
  vivace.lastStop = { contextId: c.id, atMs: stopAt, ackMs: performance.now() - stopAt, renderedAtStop: c.renderedSamples };
  const heard = Math.max(0, c.renderedSamples - player.latencySamples());
  if (client?.open) {
    sendReport(c);
    c.reportsClosed = true;
    if (serverStillWorking) {
      c.cancelSent = { heard_samples: heard };
      client.send({ type: 'context.cancel', context_id: c.id, heard_samples: heard });
    }
  }
  setStatus(`Stopped after ${(c.renderedSamples / 24000).toFixed(2)} s of audio.`);
  refreshBusy();
  renderReadouts();
}

// ---------------------------------------------------------------- readouts

function fmtMs(v) {
  return v === null || v === undefined ? '–' : `${Math.round(v)} ms`;
}

function renderReadouts() {
  const c = vivace.lastContextId ? vivace.contexts[vivace.lastContextId] : null;
  $('ttfa').textContent = fmtMs(c?.ttfaMs);
  $('first-audio').textContent = fmtMs(c?.firstAudioMs);
  $('buffered').textContent = c ? fmtMs((c.bufferedSamples / 24000) * 1000) : '–';
  $('underruns').textContent = c ? String(c.underruns) : '–';
  $('stall').textContent = c ? fmtMs(c.stallMs) : '–';
  $('samples').textContent = c ? `${c.renderedSamples} / ${c.samplesReceived}` : '–';
  $('reports').textContent = String(vivace.reportsSent);
  $('rtt').textContent = fmtMs(vivace.rttMs);
  $('phase').textContent = c ? `${c.id}: ${c.phase}${c.error ? ` (${c.error})` : ''}` : 'idle';
  const canvas = $('timeline');
  const view = c
    ? { arrivals: c.arrivals, played: c.played, ttfaMs: c.ttfaMs, nowMs: contextFinished(c) && c.played.length
        ? c.played[c.played.length - 1].t : performance.now() - c.requestStartMs }
    : null;
  drawTimeline(canvas, view);
  canvas.setAttribute(
    'aria-label',
    c ? `Timeline of ${c.id}: ${c.frames} chunks arrived, first after ${fmtMs(c.firstAudioMs)}; ` +
        `${(c.renderedSamples / 24000).toFixed(2)} s played, first heard after ${fmtMs(c.ttfaMs)}.`
      : 'Timeline: no audio yet.',
  );
}

// ---------------------------------------------------------------- wiring

$('speak').addEventListener('click', () => begin('speak'));
$('stream').addEventListener('click', () => begin('stream'));
$('stop').addEventListener('click', () => stop());
$('reconnect').addEventListener('click', () => connect().catch(() => {}));
const voicePanel = new VoicePanel({
  baseUrl: httpBaseUrl(params.get('server'), location),
  apiKey: () => $('api-key').value.trim(),
  onChange: (saved) => {
    vivace.savedVoices = saved.map((v) => v.name);
    renderVoiceSelect();
  },
  onUse: (name) => {
    $('voice').value = name;
    setStatus(`Voice ${name} selected. Press Speak.`);
    $('text').focus();
  },
});
vivace.voicePanel = voicePanel.state;
$('api-key').addEventListener('change', () => voicePanel.refresh());
$('text').addEventListener('keydown', (ev) => {
  if (ev.key === 'Enter' && (ev.ctrlKey || ev.metaKey)) {
    ev.preventDefault();
    begin('speak');
  }
});
document.addEventListener('keydown', (ev) => {
  if (ev.key === 'Escape' && vivace.state === 'speaking') {
    ev.preventDefault();
    stop();
  }
});
setInterval(renderReadouts, 100);
renderReadouts();

opusSupported().then((ok) => {
  vivace.opusSupported = ok;
  const opus = $('format-opus');
  opus.disabled = !ok;
  if (!ok) $('format-opus-note').textContent = '(needs WebCodecs on https or localhost)';
});
if (typeof AudioWorkletNode === 'undefined') {
  setStatus('This page needs AudioWorklet, which browsers give only to secure pages: open it via localhost or https.');
}
connect().catch(() => {});
voicePanel.refresh();
