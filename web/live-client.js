/**
 * The `vivace.speech.v1` WebSocket protocol, client side: open the socket, send events, and hand
 * decoded server events and audio frames to callbacks. No audio or UI knowledge here.
 *
 * Binary audio frame (server -> client), little-endian, 12-byte header then payload:
 *
 *    offset  size  field
 *    0       1     version       (1)
 *    1       1     flags         bit 0: first frame of the context, bit 1: last frame
 *    2       2     stream        u16 from `context.created`
 *    4       4     sequence      u32, 0, 1, 2, ... per stream
 *    8       4     start_sample  u32, first sample's index on the context's 24 kHz timeline
 *    12      ...   payload       PCM s16le samples, or exactly one Opus packet
 *
 * Every sample count in the protocol is in 24 kHz samples of the context's timeline, whatever the
 * encoding.
 */

export const PROTOCOL = 'vivace.speech.v1';
export const AUTH_SUBPROTOCOL_PREFIX = 'vivace.auth.';
export const SAMPLE_RATE = 24000;
export const HEADER_BYTES = 12;
const FLAG_FIRST = 0b01;
const FLAG_LAST = 0b10;

/** Decode one binary frame; throws on a short frame or an unknown version. */
export function parseAudioFrame(buffer) {
  if (buffer.byteLength < HEADER_BYTES) throw new Error(`audio frame of ${buffer.byteLength} bytes is shorter than its header`);
  const view = new DataView(buffer);
  const version = view.getUint8(0);
  if (version !== 1) throw new Error(`unknown audio frame version ${version}`);
  const flags = view.getUint8(1);
  return {
    first: (flags & FLAG_FIRST) !== 0,
    last: (flags & FLAG_LAST) !== 0,
    stream: view.getUint16(2, true),
    sequence: view.getUint32(4, true),
    startSample: view.getUint32(8, true),
    payload: new Uint8Array(buffer, HEADER_BYTES),
  };
}

/** The page's wall clock for `client_time_ms`: milliseconds since the epoch, sub-ms, monotonic. */
export function clientTimeMs() {
  return performance.timeOrigin + performance.now();
}

/** The socket URL that serves this page: ws(s)://<host>/v1/audio/speech/live. */
export function defaultSocketUrl(location) {
  const scheme = location.protocol === 'https:' ? 'wss:' : 'ws:';
  return `${scheme}//${location.host}/v1/audio/speech/live`;
}

export class LiveClient {
  /**
   * @param {string} url
   * @param {{apiKey?: string, onEvent: (e: object) => void, onAudio: (frame: object, receivedAt: number) => void,
   *          onClose: (info: {code: number, reason: string}) => void, onSent?: (e: object) => void}} handlers
   */
  constructor(url, handlers) {
    this.url = url;
    this.handlers = handlers;
    this.socket = null;
    this.pingId = 0;
    this.pingTimer = null;
    this.rttMs = null;
    this.clockOffsetMs = null; // server_time_ms - client time at the midpoint of the last ping
  }

  /** Open the socket; resolves when it is open (session.created arrives as an event). */
  connect() {
    const protocols = [PROTOCOL];
    if (this.handlers.apiKey) protocols.push(AUTH_SUBPROTOCOL_PREFIX + this.handlers.apiKey);
    return new Promise((resolve, reject) => {
      const socket = new WebSocket(this.url, protocols);
      socket.binaryType = 'arraybuffer';
      this.socket = socket;
      socket.onopen = () => {
        // The server's idle timeout closes sockets that say nothing; pings keep this one alive
        // and measure the round trip the server also uses to align our playback clock.
        this.pingTimer = setInterval(() => this.ping(), 15000);
        this.ping();
        resolve();
      };
      socket.onerror = () => reject(new Error(`cannot open ${this.url}`));
      socket.onclose = (ev) => {
        clearInterval(this.pingTimer);
        this.handlers.onClose({ code: ev.code, reason: ev.reason });
      };
      socket.onmessage = (ev) => this.receive(ev.data);
    });
  }

  get open() {
    return this.socket !== null && this.socket.readyState === WebSocket.OPEN;
  }

  receive(data) {
    const receivedAt = performance.now();
    if (typeof data === 'string') {
      let event;
      try {
        event = JSON.parse(data);
      } catch {
        this.handlers.onEvent({ type: 'error', error: { code: 'bad_server_json', message: data.slice(0, 200) } });
        return;
      }
      if (event.type === 'pong' && typeof event.client_time_ms === 'number') {
        const now = clientTimeMs();
        this.rttMs = now - event.client_time_ms;
        this.clockOffsetMs = event.server_time_ms - (event.client_time_ms + this.rttMs / 2);
      }
      this.handlers.onEvent(event, receivedAt);
      return;
    }
    this.handlers.onAudio(parseAudioFrame(data), receivedAt);
  }

  send(event) {
    if (!this.open) throw new Error('not connected');
    this.socket.send(JSON.stringify(event));
    this.handlers.onSent?.(event);
  }

  ping() {
    if (this.open) this.send({ type: 'ping', id: ++this.pingId, client_time_ms: clientTimeMs() });
  }

  close() {
    clearInterval(this.pingTimer);
    if (this.socket) this.socket.close(1000, 'page closed the session');
  }
}
