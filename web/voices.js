/**
 * The page's saved voices: record a reference in the browser (MediaRecorder) or pick an audio file, give
 * it a name and an optional transcript, save it (`POST /v1/audio/voices`, multipart: name, audio,
 * transcript), list the saved voices (`GET /v1/audio/voices`, then `GET /v1/audio/voices/{name}` for the
 * details a bare name lacks), delete one (`DELETE /v1/audio/voices/{name}`), and pick one to speak with.
 *
 * Every request carries the API key when one is typed (`Authorization: Bearer`). A refusal shows the
 * server's own message (OpenAI-shaped `{"error": {"message", "code"}}`), so "too long", "unknown format"
 * and the like read as the server wrote them. The saved voices are kept in `state.saved` (name, duration,
 * transcript...) and handed to `onChange`, which the page uses to offer them in its voice list; `onUse`
 * is called with a name when the listener picks one to speak with (the name is the voice).
 *
 * The list is read defensively: saved voices are the `saved_voices` key of `GET /v1/audio/voices` (as
 * names or as voice objects), or `saved` / `data` in other shapes of that answer.
 */

const NAME_PATTERN = /^[a-z0-9][a-z0-9_-]{0,63}$/;
const RECORDING_MIME_TYPES = ['audio/webm;codecs=opus', 'audio/ogg;codecs=opus', 'audio/webm', 'audio/mp4'];
const MAX_DETAIL_REQUESTS = 50;

/** The HTTP origin of the server the page speaks to: this page's, or that of a `?server=ws://...` URL. */
export function httpBaseUrl(socketUrl, location) {
  if (!socketUrl) return `${location.protocol}//${location.host}`;
  const url = new URL(socketUrl, location.href);
  const scheme = url.protocol === 'wss:' || url.protocol === 'https:' ? 'https:' : 'http:';
  return `${scheme}//${url.host}`;
}

/** Saved voices out of a `GET /v1/audio/voices` body, whatever shape it has: -> [{name, ...}]. */
export function savedVoicesFrom(body) {
  let items = body?.saved_voices ?? body?.saved ?? null;
  if (!Array.isArray(items) && Array.isArray(body?.data)) items = body.data.filter((v) => v?.object === 'voice');
  if (!Array.isArray(items)) return [];
  const seen = new Set();
  const out = [];
  for (const item of items) {
    const voice = typeof item === 'string' ? { name: item } : item && typeof item === 'object' ? { ...item } : null;
    if (voice && typeof voice.name !== 'string' && typeof voice.id === 'string') voice.name = voice.id;
    if (!voice || typeof voice.name !== 'string' || seen.has(voice.name)) continue;
    seen.add(voice.name);
    out.push(voice);
  }
  return out.sort((a, b) => a.name.localeCompare(b.name));
}

/** The message to show for a failed response: the server's `error.message` (and code), or its status. */
async function errorText(response) {
  let body = null;
  try {
    body = await response.json();
  } catch {
    // not JSON: fall back to the status line
  }
  const e = body?.error;
  const message = typeof e === 'string' ? e : e?.message || body?.detail || body?.message;
  const code = typeof e === 'object' && e?.code ? ` (${e.code})` : '';
  return message ? `${message}${code}` : `the server answered ${response.status} ${response.statusText}`.trim();
}

export class VoicePanel {
  /**
   * @param {{baseUrl: string, apiKey: () => string, onChange: (saved: object[]) => void,
   *          onUse: (name: string) => void}} options
   */
  constructor({ baseUrl, apiKey, onChange, onUse }) {
    this.baseUrl = baseUrl;
    this.apiKey = apiKey;
    this.onChange = onChange;
    this.onUse = onUse;
    this.state = { saved: [], busy: false, status: '', error: null, recording: null, listed: 0 };
    this.recorder = null;
    this.$ = (id) => document.getElementById(id);
    this.$('voice-form').addEventListener('submit', (ev) => {
      ev.preventDefault();
      this.save();
    });
    this.$('voice-file').addEventListener('change', () => {
      if (this.$('voice-file').files.length) this.setRecording(null);
      this.describeReference();
    });
    this.$('voice-record').addEventListener('click', () => (this.recorder ? this.stopRecording() : this.record()));
    this.$('voice-refresh').addEventListener('click', () => this.refresh());
    if (typeof MediaRecorder === 'undefined' || !navigator.mediaDevices?.getUserMedia) {
      this.$('voice-record').disabled = true;
      this.$('voice-record-note').textContent = '(recording needs a browser with MediaRecorder, on https or localhost)';
    }
    this.describeReference();
  }

  headers() {
    const key = this.apiKey();
    return key ? { Authorization: `Bearer ${key}` } : {};
  }

  setStatus(text, error = false) {
    this.state.status = text;
    this.state.error = error ? text : null;
    const el = this.$('voice-status');
    el.textContent = text;
    el.dataset.kind = error ? 'error' : 'info';
  }

  // ------------------------------------------------------------ listing and deleting

  async refresh() {
    let response;
    try {
      response = await fetch(`${this.baseUrl}/v1/audio/voices`, { headers: this.headers() });
    } catch (err) {
      this.setStatus(`Could not list the saved voices: ${err.message}`, true);
      return;
    }
    if (!response.ok) {
      this.setStatus(`Could not list the saved voices: ${await errorText(response)}`, true);
      return;
    }
    const saved = savedVoicesFrom(await response.json());
    await Promise.all(saved.slice(0, MAX_DETAIL_REQUESTS).filter((v) => v.duration_s === undefined).map(async (v) => {
      try {
        const r = await fetch(`${this.baseUrl}/v1/audio/voices/${encodeURIComponent(v.name)}`, { headers: this.headers() });
        if (r.ok) Object.assign(v, await r.json());
      } catch {
        // the name alone is still worth listing
      }
    }));
    this.state.saved = saved;
    this.state.listed += 1;
    if (this.state.error) this.setStatus(''); // an earlier failure no longer holds
    this.renderList();
    this.onChange(saved);
  }

  renderList() {
    const list = this.$('voice-list');
    const saved = this.state.saved;
    this.$('voice-empty').hidden = saved.length > 0;
    list.replaceChildren(...saved.map((v) => {
      const item = document.createElement('li');
      item.dataset.voice = v.name;
      const name = document.createElement('strong');
      name.textContent = v.name;
      const details = document.createElement('span');
      details.className = 'hint';
      const parts = [];
      if (typeof v.duration_s === 'number') parts.push(`${v.duration_s.toFixed(1)} s`);
      if (v.transcript) parts.push(`transcript: “${v.transcript}”`);
      details.textContent = parts.length ? ` ${parts.join(' · ')}` : '';
      const use = document.createElement('button');
      use.type = 'button';
      use.className = 'secondary';
      use.textContent = 'Speak with it';
      use.setAttribute('aria-label', `Speak with ${v.name}`);
      use.addEventListener('click', () => this.onUse(v.name));
      const remove = document.createElement('button');
      remove.type = 'button';
      remove.className = 'secondary';
      remove.textContent = 'Delete';
      remove.setAttribute('aria-label', `Delete ${v.name}`);
      remove.addEventListener('click', () => this.remove(v.name));
      item.append(name, details, ' ', use, ' ', remove);
      return item;
    }));
  }

  async remove(name) {
    this.setStatus(`Deleting ${name}…`);
    try {
      const r = await fetch(`${this.baseUrl}/v1/audio/voices/${encodeURIComponent(name)}`, {
        method: 'DELETE', headers: this.headers(),
      });
      if (!r.ok) {
        this.setStatus(`Could not delete ${name}: ${await errorText(r)}`, true);
        return;
      }
    } catch (err) {
      this.setStatus(`Could not delete ${name}: ${err.message}`, true);
      return;
    }
    this.setStatus(`Deleted ${name}.`);
    await this.refresh();
  }

  // ------------------------------------------------------------ the reference: a file or a recording

  setRecording(recording) {
    if (this.state.recording?.url) URL.revokeObjectURL(this.state.recording.url);
    this.state.recording = recording;
    const preview = this.$('voice-preview');
    preview.hidden = !recording;
    if (recording) preview.src = recording.url;
    else preview.removeAttribute('src');
  }

  describeReference() {
    const file = this.$('voice-file').files[0];
    const rec = this.state.recording;
    this.$('voice-reference').textContent = rec
      ? `Reference: your recording, ${rec.seconds.toFixed(1)} s.`
      : file ? `Reference: ${file.name}.` : 'Reference: none yet. Record one or choose a file.';
  }

  async record() {
    let stream;
    try {
      stream = await navigator.mediaDevices.getUserMedia({ audio: true });
    } catch (err) {
      this.setStatus(`No microphone: ${err.message}`, true);
      return;
    }
    const mimeType = RECORDING_MIME_TYPES.find((t) => MediaRecorder.isTypeSupported(t)) || '';
    const recorder = new MediaRecorder(stream, mimeType ? { mimeType } : {});
    const chunks = [];
    const started = performance.now();
    recorder.addEventListener('dataavailable', (ev) => ev.data.size && chunks.push(ev.data));
    recorder.addEventListener('stop', () => {
      for (const track of stream.getTracks()) track.stop();
      const type = recorder.mimeType || mimeType || 'audio/webm';
      const blob = new Blob(chunks, { type });
      const ext = type.includes('ogg') ? 'ogg' : type.includes('mp4') ? 'm4a' : 'webm';
      this.$('voice-file').value = '';
      this.setRecording({ blob, filename: `recording.${ext}`, seconds: (performance.now() - started) / 1000,
                          url: URL.createObjectURL(blob) });
      this.recorder = null;
      this.$('voice-record').textContent = 'Record';
      this.describeReference();
      this.setStatus('Recorded. Name it and save it.');
    });
    recorder.start();
    this.recorder = recorder;
    this.$('voice-record').textContent = 'Stop recording';
    this.setStatus('Recording… speak for a few seconds (at least one), then stop.');
  }

  stopRecording() {
    if (this.recorder?.state === 'recording') this.recorder.stop();
  }

  // ------------------------------------------------------------ saving

  async save() {
    if (this.state.busy) return;
    const name = this.$('voice-name').value.trim();
    const transcript = this.$('voice-transcript').value.trim();
    const file = this.$('voice-file').files[0];
    const rec = this.state.recording;
    if (!NAME_PATTERN.test(name)) {
      this.setStatus('A voice name is lower-case letters, digits, "-" and "_", starting with a letter or digit.', true);
      this.$('voice-name').focus();
      return;
    }
    if (!rec && !file) {
      this.setStatus('Record a reference or choose an audio file first.', true);
      return;
    }
    const form = new FormData();
    form.append('name', name);
    if (rec) form.append('audio', rec.blob, rec.filename);
    else form.append('audio', file, file.name);
    if (transcript) form.append('transcript', transcript);
    this.state.busy = true;
    this.$('voice-save').disabled = true;
    this.setStatus(`Saving ${name}… (the server computes the voice; this takes a few seconds)`);
    try {
      const r = await fetch(`${this.baseUrl}/v1/audio/voices`, { method: 'POST', headers: this.headers(), body: form });
      if (!r.ok) {
        this.setStatus(`Could not save ${name}: ${await errorText(r)}`, true);
        return;
      }
      this.$('voice-form').reset();
      this.setRecording(null);
      this.describeReference();
      this.setStatus(`Saved ${name}.`);
      await this.refresh();
    } catch (err) {
      this.setStatus(`Could not save ${name}: ${err.message}`, true);
    } finally {
      this.state.busy = false;
      this.$('voice-save').disabled = false;
    }
  }
}
